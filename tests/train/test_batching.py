"""Token-budget batching: every pair once per epoch, the budget kept, less padding than
unsorted batches, one seed one order, a new order each epoch."""
import numpy as np
import pytest

from fastattn.train.batching import collate, epoch_batches, padding_fraction
from conftest import assert_close
from tolerances import TOL


@pytest.fixture
def lengths(rng):
    src = rng.integers(1, 40, size=3000)
    tgt = np.clip(src + rng.integers(-5, 6, size=3000), 1, None)
    return src, tgt


def total_padding(batches, src, tgt):
    sizes = [len(b) * (src[b].max() + tgt[b].max()) for b in batches]
    real = src.sum() + tgt.sum()
    return 1 - real / sum(sizes)


@pytest.mark.parametrize("budget", [64, 500, 4096])
def test_every_pair_once_per_epoch_under_the_budget(lengths, budget):
    src, tgt = lengths
    for epoch in range(2):
        batches = epoch_batches(src, tgt, budget, seed=1, epoch=epoch)
        flat = np.concatenate(batches)
        assert np.array_equal(np.sort(flat), np.arange(len(src)))
        for b in batches:
            assert b.dtype == np.int64
            top = max(src[b].max(), tgt[b].max())
            assert len(b) * top <= budget or len(b) == 1


def test_an_over_long_pair_is_a_batch_of_its_own():
    src, tgt = np.array([3, 50, 4, 3]), np.array([3, 2, 60, 3])
    batches = epoch_batches(src, tgt, 20, seed=0)
    assert sorted(map(len, batches)) == [1, 1, 2]
    assert {int(b[0]) for b in batches if len(b) == 1} == {1, 2}


def test_sorting_lowers_padding(lengths):
    src, tgt = lengths
    sorted_ = epoch_batches(src, tgt, 1024, seed=0)
    unsorted = epoch_batches(src, tgt, 1024, seed=0, sort=False)
    assert total_padding(sorted_, src, tgt) < 0.1
    assert total_padding(sorted_, src, tgt) < total_padding(unsorted, src, tgt) / 3
    fractions = [padding_fraction(b, src, tgt) for b in sorted_]
    assert all(0.0 <= f < 1.0 for f in fractions)


def test_deterministic_per_seed_and_new_each_epoch(lengths):
    src, tgt = lengths
    a = epoch_batches(src, tgt, 512, seed=5, epoch=2)
    b = epoch_batches(src, tgt, 512, seed=5, epoch=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    for other in (epoch_batches(src, tgt, 512, seed=6, epoch=2),
                  epoch_batches(src, tgt, 512, seed=5, epoch=3)):
        assert [x.tolist() for x in other] != [x.tolist() for x in a]


def test_batch_order_is_shuffled_not_sorted(lengths):
    src, tgt = lengths
    tops = [max(src[b].max(), tgt[b].max()) for b in epoch_batches(src, tgt, 512, seed=0)]
    assert tops != sorted(tops) and tops != sorted(tops, reverse=True)


def test_evaluation_order_is_sorted_and_unshuffled(lengths):
    src, tgt = lengths
    batches = epoch_batches(src, tgt, 512, shuffle=False, window=len(src))
    tops = [max(src[b].max(), tgt[b].max()) for b in batches]
    assert tops == sorted(tops)


def test_padding_fraction_and_collate():
    seqs = [np.array([5, 6, 7]), np.array([8]), np.array([9, 9])]
    out = collate(seqs, [0, 1], pad_id=0)
    assert out.tolist() == [[5, 6, 7], [8, 0, 0]] and out.dtype == np.int64
    src, tgt = np.array([3, 1, 2]), np.array([2, 2, 2])
    assert_close(padding_fraction([0, 1], src, tgt), 1 - (3 + 1 + 2 + 2) / 10,
                 **TOL["float64_figure"], name="padding fraction", dtype=None)
    assert padding_fraction([], src, tgt) == 0.0


def test_bad_budget_and_lengths():
    with pytest.raises(ValueError, match="batch_tokens must be an int >= 1"):
        epoch_batches([1], [1], 0)
    with pytest.raises(ValueError, match="one entry per pair"):
        epoch_batches([1, 2], [1], 10)
    assert epoch_batches([], [], 10) == []
