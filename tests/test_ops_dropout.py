"""fastattn.ops.dropout / dropout_backward: the counter-based mask (csrc/fa_rng.h) equals the
twin's reference.dropout_keep bit for bit on every SIMD level and thread count; its statistics
(keep fraction 1 - p, mean over seeds = x); the backward regenerates the forward's mask.

torch's RNG differs, so torch is used only for the convention (kept values x / (1 - p)).
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from conftest import TILES, assert_close, child_isa_tests, requires_torch, to_torch
from fastattn import _fast, ops, reference
from strategies import features, rand, rows
from tolerances import TOL

VL = TILES["vector_width"]
u64 = st.integers(min_value=0, max_value=2**64 - 1)


def keep_of(shape, p, seed):
    """The twin's mask for an array of `shape`: rows are the flattened leading index."""
    C = shape[-1]
    N = math.prod(shape[:-1])
    return reference.dropout_keep(seed, np.arange(N), np.arange(C), p).reshape(shape)


def check_dropout(x, p, seed):
    y = ops.dropout(x, p, seed=seed)
    ry = reference.dropout(x, p, seed=seed)
    assert y.shape == np.shape(x) and y.dtype == np.float32
    keep = keep_of(np.shape(x), p, seed)
    x32 = np.asarray(x, np.float32)
    finite = np.isfinite(x32)
    # the mask, exactly: zeros where dropped, nonzero kept values where x is nonzero
    np.testing.assert_array_equal(y[finite & ~keep], 0.0)
    np.testing.assert_array_equal(y[keep & (x32 != 0) & finite] != 0, True)
    # kept values: x * (1 / (1 - p)) in float32, within an ulp of the float64 twin
    assert_close(y, ry, **TOL["dropout_scale"], name="y")
    return y


@given(N=rows(0, 300), C=features(1, 600), p=st.sampled_from([1e-9, 0.1, 0.5, 0.9, 0.999]),
       seed=u64)
def test_mask_is_the_twins(N, C, p, seed):
    x = rand(np.random.default_rng(seed % 2**32), (N, C)) + np.float32(0.1)
    check_dropout(x, p, seed)


@pytest.mark.parametrize("C", sorted({1, VL - 1, VL, VL + 1, 2 * VL + 3, 1025}))
def test_vector_tails_and_leading_dims(rng, C):
    x = rand(rng, (3, 5, C))
    y = check_dropout(x, 0.3, 42)
    np.testing.assert_array_equal(y.reshape(15, C), ops.dropout(x.reshape(15, C), 0.3, seed=42))
    check_dropout(rand(rng, (C,)), 0.3, 42)                       # 1-D: one row


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_fraction(p):
    x = np.ones((1000, 1000), np.float32)
    frac = float((ops.dropout(x, p, seed=3) != 0).mean())
    sigma = math.sqrt(p * (1 - p) / x.size)
    assert abs(frac - (1 - p)) < 6 * sigma, (frac, 1 - p)
    # and every row and column is dropped at about the same rate (no structure)
    kept = ops.dropout(x, p, seed=4) != 0
    for frac_line, n in ((kept.mean(axis=0), 1000), (kept.mean(axis=1), 1000)):
        s = math.sqrt(p * (1 - p) / n)
        assert np.all(np.abs(frac_line - (1 - p)) < 6 * s)


def test_mean_over_seeds_tends_to_x(rng):
    x, p, S = rand(rng, (4, 33)), 0.5, 4000
    acc = np.zeros(x.shape)
    for seed in range(S):
        acc += ops.dropout(x, p, seed=seed)
    mean = acc / S
    sd = np.abs(x) * math.sqrt(p / (1 - p) / S)     # std of the mean of x * keep / (1 - p)
    assert np.all(np.abs(mean - x) <= 6 * sd + 1e-7)


def test_seeds_differ_and_repeat(rng):
    x = rand(rng, (64, 64))
    a, b = ops.dropout(x, 0.5, seed=1), ops.dropout(x, 0.5, seed=2)
    assert (a != 0).mean() != 0 and not np.array_equal(a != 0, b != 0)
    np.testing.assert_array_equal(a, ops.dropout(x, 0.5, seed=1))


def test_backward_regenerates_the_forward_mask(rng):
    x, dy = rand(rng, (37, 129)) + np.float32(0.01), rand(rng, (37, 129))
    for p, seed in ((0.2, 0), (0.7, 2**64 - 1), (0.5, 123456789)):
        y = ops.dropout(x, p, seed=seed)
        forward_mask = y != 0                                   # what the forward kept
        dx = ops.dropout_backward(dy, p, seed=seed)
        np.testing.assert_array_equal(dx != 0, forward_mask & (dy != 0))
        np.testing.assert_array_equal(dx, ops.dropout(dy, p, seed=seed))
        # the twin stores the mask explicitly
        keep = reference.dropout_keep(seed, np.arange(37), np.arange(129), p)
        np.testing.assert_array_equal(forward_mask, keep)
        assert_close(dx, reference.dropout_backward(dy, p, seed=seed), **TOL["dropout_scale"],
                     name="dx")


def test_p_zero_is_the_identity(rng):
    x = rand(rng, (5, 7))
    for fn in (ops.dropout, reference.dropout, ops.dropout_backward, reference.dropout_backward):
        y = fn(x, 0.0)
        np.testing.assert_array_equal(y, x)
        assert y is not x and not np.shares_memory(y, x)
    np.testing.assert_array_equal(ops.dropout(x, 0, seed=5), x)


def test_special_values():
    """A dropped NaN or inf is x * 0 = NaN (torch's x * mask * scale); kept ones stay."""
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0, 1e38, 1e-45] * 20], np.float32)
    y = ops.dropout(x, 0.5, seed=9)
    ry = reference.dropout(x, 0.5, seed=9)
    assert_close(y, ry, **TOL["dropout_scale"], name="specials")


def test_in_place_entry_point(rng):
    x = rand(rng, (50, 70))
    want = ops.dropout(x, 0.25, seed=6)
    buf = x.copy()
    assert _fast.dropout_into(buf, buf, 0.25, 6) is buf
    np.testing.assert_array_equal(buf, want)
    _fast.dropout_into(buf, x, 0.0, None)                     # p = 0: a copy
    np.testing.assert_array_equal(buf, x)


def test_empty():
    for shape in ((0, 4), (3, 0), (0,)):
        x = np.zeros(shape, np.float32)
        assert ops.dropout(x, 0.5, seed=1).shape == shape
        assert reference.dropout(x, 0.5, seed=1).shape == shape


def test_convention_matches_torch(rng):
    """Kept elements are x / (1 - p), as torch's dropout scales them (torch's mask differs)."""
    torch = requires_torch()
    x, p = rand(rng, (200, 300)) + np.float32(2.0), 0.3
    t = torch.nn.functional.dropout(to_torch(x), p, training=True).numpy()
    ours = ops.dropout(x, p, seed=1)
    for y in (t, ours):
        kept = y != 0
        assert_close(y[kept], (x / np.float32(1 - p))[kept], **TOL["dropout_scale"], name="kept")
        assert abs(kept.mean() - (1 - p)) < TOL["dropout_fraction"]


# ---- threads, teams and SIMD levels --------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3])
def test_bit_identical_for_every_thread_count(restore_threads, rng, n):
    x = rand(rng, (1001, 515))
    fastattn.set_num_threads(1)
    one = ops.dropout(x, 0.4, seed=77)
    fastattn.set_num_threads(n)
    np.testing.assert_array_equal(ops.dropout(x, 0.4, seed=77), one)


def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA (and under small OpenMP teams): the mask is
    the twin's bit for bit."""
    rng = np.random.default_rng(13)
    vl = fastattn.build_info()["tiles"]["vector_width"]
    for N, C in ((1, vl - 1), (3, vl), (7, vl + 1), (600, 4 * vl + 3), (2000, 256)):
        for p, seed in ((0.1, 0), (0.5, 2**64 - 1), (0.9, 31337)):
            check_dropout(rand(rng, (N, C)) + np.float32(0.1), p, seed)


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_ops_dropout")


# ---- bad input: both twins raise the same errors -------------------------------------------


@pytest.mark.parametrize("twin", [ops, reference], ids=["ops", "reference"])
@pytest.mark.parametrize("kwargs,error,pattern", [
    (dict(p=1.0, seed=1), ValueError, r"\bp\b.*\[0, 1\).*1\.0"),
    (dict(p=1.5, seed=1), ValueError, r"\bp\b.*\[0, 1\)"),
    (dict(p=-0.1, seed=1), ValueError, r"\bp\b.*\[0, 1\)"),
    (dict(p=math.nan, seed=1), ValueError, r"\bp\b.*\[0, 1\)"),
    (dict(p=True, seed=1), TypeError, r"\bp\b.*real number"),
    (dict(p="0.5", seed=1), TypeError, r"\bp\b.*real number"),
    (dict(p=0.5), ValueError, r"seed.*required"),
    (dict(p=0.5, seed=-1), ValueError, r"seed.*\[0, 2\*\*64\)"),
    (dict(p=0.5, seed=2**64), ValueError, r"seed.*\[0, 2\*\*64\)"),
    (dict(p=0.5, seed=1.0), TypeError, r"seed.*int"),
    (dict(p=0.5, seed=True), TypeError, r"seed.*int"),
])
def test_bad_arguments(twin, kwargs, error, pattern):
    x = np.zeros((2, 3), np.float32)
    kwargs = dict(kwargs)
    p = kwargs.pop("p")
    for fn in (twin.dropout, twin.dropout_backward):
        with pytest.raises(error, match=pattern):
            fn(x, p, **kwargs)


@pytest.mark.parametrize("twin", [ops, reference], ids=["ops", "reference"])
def test_scalar_input(twin):
    with pytest.raises(ValueError, match=r"\bx\b.*scalar"):
        twin.dropout(np.float32(1.0), 0.5, seed=1)
    with pytest.raises(ValueError, match=r"\bdy\b.*scalar"):
        twin.dropout_backward(np.float32(1.0), 0.5, seed=1)


def test_numpy_integer_seed_and_float_p(rng):
    x = rand(rng, (9, 40))
    np.testing.assert_array_equal(ops.dropout(x, np.float32(0.5), seed=np.uint64(2**64 - 1)),
                                  ops.dropout(x, 0.5, seed=2**64 - 1))
