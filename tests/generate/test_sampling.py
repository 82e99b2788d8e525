"""Sampling (and beam_size=1) against greedy, reproducibility, top_k / top_p.
"""

import numpy as np
import pytest

from gen_util import *  # noqa: F401,F403  (models, batches, oracles)
from gen_util import TORCH_WARNINGS

pytestmark = TORCH_WARNINGS


# beam_size=1 and sampling against greedy


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.5])
def test_beam_size_1_is_greedy(backend, length_penalty):
    m = model(backend, seed=24)
    src, kpm = source_batch(seed=6)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    end = ending_token(m.generate(src, **kw))
    for e in (None, end):
        greedy = m.generate(src, end_id=e, **kw)
        beam = m.generate(src, end_id=e, method="beam", beam_size=1,
                          length_penalty=length_penalty, **kw)
        assert_tokens(beam, greedy, name=f"end_id={e}")


def test_sampling_is_reproducible_per_seed():
    m = flat_model()
    src, kpm = source_batch(seed=7)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm, method="sample")
    a = m.generate(src, seed=11, **kw)
    assert_tokens(m.generate(src, seed=11, **kw), a)
    assert_tokens(m.generate(src, seed=np.int64(11), **kw), a)
    others = [m.generate(src, seed=s, **kw) for s in (12, 13)]
    assert all(not np.array_equal(o, a) for o in others)
    assert len({tuple(r) for r in a}) > 1                   # rows draw different tokens
    assert np.unique(a[:, 1:]).size > 10                    # flat: many tokens appear
    unseeded = m.generate(src, **kw)                        # seed=None: fresh entropy
    assert unseeded.shape == a.shape and (unseeded[:, 0] == START).all()


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("options", [dict(top_k=1), dict(temperature=1e-4), dict(top_p=1e-6),
                                     dict(top_k=1, temperature=3.0, top_p=0.5)],
                         ids=["top_k=1", "temperature=1e-4", "top_p=1e-6", "combined"])
def test_sampling_that_keeps_one_token_is_greedy(backend, options):
    m = model(backend, seed=26)
    src, kpm = source_batch(seed=8)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    end = ending_token(m.generate(src, **kw))
    greedy = m.generate(src, end_id=end, **kw)
    for seed in (0, 1):
        assert_tokens(m.generate(src, end_id=end, method="sample", seed=seed, **options, **kw),
                      greedy)


def test_sampling_top_k_and_top_p_restrict_the_tokens():
    """With a fixed distribution (generator weight 0, chosen bias), only the kept tokens are
    ever drawn: top_k=2 -> the two likeliest; top_p=0.5 -> the smallest set reaching 0.5."""
    p = np.array([0.0, 0.0, 0.05, 0.4, 0.3, 0.2, 0.05])      # tokens 3 > 4 > 5 > 2 = 6
    m = constant_model(p)
    src = np.array([[1, 2, 3]] * 16)
    kw = dict(max_new_tokens=12, start_id=1, method="sample", seed=3)
    assert set(np.unique(m.generate(src, **kw)[:, 1:])) == {2, 3, 4, 5, 6}
    assert set(np.unique(m.generate(src, top_k=2, **kw)[:, 1:])) == {3, 4}
    assert set(np.unique(m.generate(src, top_p=0.5, **kw)[:, 1:])) == {3, 4}   # 0.4 < 0.5
    assert set(np.unique(m.generate(src, top_p=0.39, **kw)[:, 1:])) == {3}     # 0.4 >= 0.39
    draws = m.generate(src, temperature=1e-3, **kw)[:, 1:]
    assert (draws == 3).all()


# ----------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------
# degenerate temperatures, NaN logits, and the draw that lands on the rounded total


@pytest.mark.parametrize("temperature", [1e-310, 1e-300, 1e-30, 5e-324])
def test_tiny_temperature_is_greedy(temperature):
    """(logits - max) / temperature: however small the temperature, the most likely token
    (it once overflowed to NaN and drew the least likely one)."""
    m = model(seed=26)
    src, kpm = source_batch(seed=8)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    with np.errstate(over="raise", invalid="raise"):        # and no overflow or NaN on the way
        out = m.generate(src, method="sample", temperature=temperature, seed=0, **kw)
    assert_tokens(out, m.generate(src, **kw))


@pytest.mark.parametrize("method", ["greedy", "sample", "beam"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_logits_raise_in_every_method(method, bad):
    m = model(seed=27)
    m.generator.bias[5] = bad                  # every row's logit for token 5
    src, kpm = source_batch(seed=9)
    with pytest.raises(ValueError, match=r"NaN or infinite logits at step 0 \(rows \[0, 1"):
        m.generate(src, src_key_padding_mask=kpm, max_new_tokens=3, start_id=START,
                   method=method, beam_size=2)


def test_neg_inf_logits_are_never_chosen_and_an_all_neg_inf_row_raises():
    from fastattn.generate import sampling

    logits = np.array([[0.0, -np.inf, 1.0, -np.inf]])
    rng = np.random.default_rng(0)
    draws = {int(sampling.sample(logits, rng)[0]) for _ in range(200)}
    assert draws == {0, 2}
    assert sampling.greedy(sampling.check_logits(logits, 0))[0] == 2
    with pytest.raises(ValueError, match="step 4"):
        sampling.check_logits(np.full((2, 3), -np.inf), 4)


class _TopDraw:
    """A Generator stand-in whose draws are the largest double below 1 (or a given u)."""

    def __init__(self, u=1.0 - 2.0 ** -53):
        self.u = u

    def random(self, n):
        return np.full(n, self.u)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("top_k,top_p", [(3, None), (None, 0.3), (5, 0.7), (1, None),
                                         (None, None)])
def test_the_draw_only_lands_on_kept_tokens(seed, top_k, top_p):
    """At u = 1 - 2**-53 the draw reaches the rounded cumulative total; it must still pick a
    kept token (it once clamped to the last token of the vocabulary, which top_k / top_p had
    removed; tokens whose probability is below the total's rounding may be skipped, never a
    removed one). At u = 0 it picks the first kept token."""
    from fastattn.generate import sampling

    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((16, 50)) * rng.uniform(0.1, 20)
    z = logits - logits.max(axis=1, keepdims=True)
    kept = np.ones(z.shape, bool)                      # the restriction, computed apart
    if top_k is not None:
        kept &= z >= np.sort(z, axis=1)[:, -top_k][:, None]
    if top_p is not None:
        p = np.where(kept, np.exp(z), 0.0)
        p /= p.sum(axis=1, keepdims=True)
        order = np.argsort(-p, axis=1, kind="stable")
        sp = np.take_along_axis(p, order, axis=1)
        keep_sorted = np.cumsum(sp, axis=1) - sp < top_p
        k2 = np.zeros_like(kept)
        np.put_along_axis(k2, order, keep_sorted, axis=1)
        kept &= k2
    last = sampling.sample(logits, _TopDraw(), top_k=top_k, top_p=top_p)
    first = sampling.sample(logits, _TopDraw(0.0), top_k=top_k, top_p=top_p)
    rows = np.arange(len(logits))
    assert kept[rows, last].all(), (last, np.flatnonzero(kept[0]))
    assert kept[rows, first].all()
    assert (first == np.argmax(kept, axis=1)).all()
