"""fastattn.ops.softmax (the C kernel) against the NumPy twin, and torch when installed."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import TILES, assert_close, requires_torch, to_torch
from fastattn import ops, reference
from strategies import features, rand, rows, seeds
from tolerances import TOL, softmax_tol

# row lengths around the vector width and the read pass's chunk (the vector tails)
VL, CHUNK = TILES["vector_width"], TILES["softmax_chunk"]
EDGE_C = sorted({1, VL - 1, VL, VL + 1, CHUNK - 1, CHUNK, CHUNK + 1, 8 * CHUNK + 1})


def make_scores(rng, shape, magnitude, p_neg_inf, p_dead_row):
    x = rand(rng, shape, magnitude)
    if p_neg_inf:
        x[rng.random(shape) < p_neg_inf] = -np.inf
    if p_dead_row and x.ndim >= 1 and x.size:
        flat = x.reshape(-1, shape[-1])
        flat[rng.random(flat.shape[0]) < p_dead_row] = -np.inf     # all -inf rows
    return x


def check_softmax(x, axis=-1):
    y = ops.softmax(x, axis=axis)
    assert_close(y, reference.softmax(x, axis=axis), name=f"softmax(axis={axis})",
                 **softmax_tol(x))
    return y


@given(N=rows(), C=features(), magnitude=st.sampled_from([1.0, 30.0]),
       p_neg_inf=st.sampled_from([0.0, 0.3, 0.95]), p_dead_row=st.sampled_from([0.0, 0.2]),
       seed=seeds)
def test_softmax_matches_reference(N, C, magnitude, p_neg_inf, p_dead_row, seed):
    x = make_scores(np.random.default_rng(seed), (N, C), magnitude, p_neg_inf, p_dead_row)
    y = check_softmax(x)
    dead = np.all(x == -np.inf, axis=-1)
    assert np.all(y[dead] == 0), "an all -inf row must give zeros"
    if (~dead).any():
        assert_close(y[~dead].sum(-1), np.ones(int((~dead).sum())), **TOL["row_sums"],
                     name="row sums")


@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=4), data=st.data(), seed=seeds)
def test_softmax_any_axis(shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = make_scores(np.random.default_rng(seed), tuple(shape), 3.0, 0.1, 0.0)
    y = check_softmax(x, axis=axis)
    assert y.shape == x.shape


@pytest.mark.parametrize("C", EDGE_C)
def test_all_neg_inf_row_gives_zeros(C):
    x = np.zeros((3, C), np.float32)
    x[1] = -np.inf
    y = check_softmax(x)
    assert np.all(y[1] == 0) and not np.isnan(y).any()
    assert_close(y[[0, 2]], np.full((2, C), 1.0 / C), **TOL["softmax_uniform"], name="uniform rows")


@pytest.mark.parametrize("C", [2, VL + 1, 8 * CHUNK + 1])
def test_neg_inf_entries_get_zero_weight(rng, C):
    x = rand(rng, (5, C), 4.0)
    x[:, 1::2] = -np.inf
    y = check_softmax(x)
    assert np.all(y[:, 1::2] == 0)
    assert_close(y.sum(-1), np.ones(5), **TOL["softmax_row_sums"], name="row sums")


def test_single_finite_entry_is_one(rng):
    x = np.full((4, 100), -np.inf, np.float32)
    x[np.arange(4), [0, 31, 64, 99]] = [1e30, -1e30, 0.0, 5.0]
    y = check_softmax(x)
    np.testing.assert_array_equal(y, (x > -np.inf).astype(np.float32))


def test_large_values_do_not_overflow(rng):
    x = rand(rng, (7, 33), 1.0) + np.float32(1e4)
    y = check_softmax(x)
    assert np.isfinite(y).all()
    assert_close(y, ops.softmax(x - np.float32(1e4)), **TOL["softmax_shifted"], name="shifted")


@pytest.mark.parametrize("C", [2, VL + 1, 2 * CHUNK + 1])
def test_exp_over_its_whole_input_range(C):
    """Gaps from 0 to 3e38 below the row max, in every lane position: exp underflows to exactly
    0 below 2^-126 (never a wrapped exponent), -inf gives 0 and NaN stays NaN, on every path."""
    gaps = np.concatenate([np.linspace(0, 100, 401), [87.3, 87.4, 88.7, 89.0, 200.0, 1e4, 1e30,
                                                      3e38, np.inf]]).astype(np.float32)
    x = np.zeros((gaps.size, C), np.float32)
    for i, g in enumerate(gaps):
        x[i, 1:] = -g                                  # one row: 0 and C - 1 copies of -gap
    y = check_softmax(x)
    assert np.all(y[gaps > 88.8, 1:] == 0) and np.all(y[gaps > 88.8, 0] == 1)
    x[::3, C // 2] = np.nan
    y = ops.softmax(x)
    assert np.isnan(y[::3]).all() and not np.isnan(np.delete(y, np.s_[::3], axis=0)).any()


def test_nan_propagates_to_its_row(rng):
    x = rand(rng, (4, 37))
    x[2, 5] = np.nan
    y = check_softmax(x)
    assert np.isnan(y[2]).all() and not np.isnan(y[[0, 1, 3]]).any()


def test_empty_and_noncontiguous(rng):
    assert ops.softmax(np.zeros((0, 5), np.float32)).shape == (0, 5)
    assert ops.softmax(np.zeros((3, 0), np.float32)).shape == (3, 0)
    x = rand(rng, (40, 30))
    for view in (x.T, x[::3], x[:, ::2], np.broadcast_to(x[0], (4, 30))):
        y = check_softmax(view)
        np.testing.assert_array_equal(y, ops.softmax(np.ascontiguousarray(view)))
    y = ops.softmax(x.astype(np.float64))
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, ops.softmax(x))


def test_large_rows_multithreaded(rng):
    check_softmax(make_scores(rng, (1000, 1025), 5.0, 0.05, 0.01))


@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((2, 3, 513), 1), ((600,), 0),
                                        ((17, 33), 0), ((3, 5, 129), -1)])
def test_softmax_vs_torch(rng, shape, axis):
    torch = requires_torch()
    x = rand(rng, shape, 5.0)
    assert_close(ops.softmax(x, axis=axis), torch.softmax(to_torch(x), dim=axis).numpy(),
                 name="softmax vs torch", **TOL["torch"])
