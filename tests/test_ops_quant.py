"""Quantised weights: ops.quantize_int8 / to_bfloat16 and linear / ffn with a QuantizedWeight
(int8 per-row scales with dynamic per-row activation quantisation; bf16 widened to float32)
against the NumPy twin.

The int8 product is exact integer arithmetic followed by a float32 epilogue that the twin
computes the same way (reference._linear_quantized), so ops and reference agree bit for bit
without an activation and with relu; any error in the integer sums or in the quantisation of
the activations fails those comparisons. gelu differs only by the gelu kernel's accuracy. The
bf16 product sums in float32 and is held to the fp32 linear's tolerance (dot_atol) against the
twin's float64 on the same widened weights.
"""
import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from conftest import assert_close, child_isa_tests, run_checks, run_child, run_in_threads
from fastattn import _fast, kinds, ops, quant, reference
from strategies import features, rand, seeds
from tolerances import TOL, dot_atol

ACTIVATIONS = [None, "relu", "gelu", "silu"]
QW = ops.QuantizedWeight
GELU_RTOL, GELU_ATOL = TOL["quantized_gelu"]["rtol"], TOL["quantized_gelu"]["atol"]


def holds_packed_only(w):
    """w keeps no array but its packed copy (and its scales): the stored values are not held
    a second time."""
    held = [getattr(w, n) for c in type(w).__mro__ for n in getattr(c, "__slots__", ())
            if hasattr(w, n)]
    arrays = [a for a in held if isinstance(a, np.ndarray)]
    return all(a is w.scale for a in arrays) and isinstance(w._packed[1], np.ndarray)


def quantized(w, dtype):
    return QW.from_float(w, dtype)


def check_int8_linear(x, w, b=None, activation=None, qw=None):
    """ops vs reference with an int8 weight: bit for bit, or to gelu's / silu's accuracy."""
    qw = qw if qw is not None else quantized(w, "int8")
    y = ops.linear(x, qw, b, activation=activation)
    ref = reference.linear(x, qw, b, activation=activation)
    assert y.dtype == np.float32 and y.shape == ref.shape
    if activation in ("gelu", "silu"):
        assert_close(y, ref, rtol=GELU_RTOL, atol=GELU_ATOL, name=f"int8 linear {activation}")
    else:
        np.testing.assert_array_equal(y, ref, err_msg=f"int8 linear ({activation})")
    return y


def check_bf16_linear(x, w, b=None, activation=None, qw=None):
    qw = qw if qw is not None else quantized(w, "bf16")
    y = ops.linear(x, qw, b, activation=activation)
    ref = reference.linear(x, qw, b, activation=activation)
    assert_close(y, ref, rtol=TOL["linear"]["rtol"], atol=dot_atol(x, qw.dequantize(), bias=b),
                 name=f"bf16 linear ({activation})")
    return y


# ----------------------------------------------------------------------------------------------
# quantize_int8, to_bfloat16: bit for bit


def special_rows(rng, K):
    """Rows that hit the rule's corners: zeros, exact .5 ties after scaling, huge and tiny
    magnitudes (127 / amax overflowing), a single non-zero."""
    rows = [np.zeros(K, np.float32),
            (np.arange(K, dtype=np.float32) - K // 2) * np.float32(0.5),    # ties when amax=127/2
            rand(rng, (K,)) * np.float32(5e37),
            rand(rng, (K,)) * np.float32(1e-39),                             # subnormal amax
            np.full(K, -2.5, np.float32)]
    one = np.zeros(K, np.float32)
    one[K // 2] = -7.0
    rows.append(one)
    ties = np.float32(127.0) * (np.arange(K, dtype=np.float32) % 9 - 4) / np.float32(8.0)
    ties[0] = 127.0                                           # amax 127: inv = 1, x.5 ties
    rows.append(ties)
    return np.stack(rows)


@given(N=st.integers(0, 9), K=features(1, 300), seed=seeds, scale=st.sampled_from(
    [1.0, 1e-3, 1e30, 1e-30]))
def test_quantize_int8_bit_exact(N, K, seed, scale):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rand(rng, (N, K)) * np.float32(scale), special_rows(rng, K)])
    q, s = ops.quantize_int8(x)
    q_ref, s_ref = reference.quantize_int8(x)
    assert q.dtype == np.int8 and s.dtype == np.float32 and q.shape == x.shape
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_array_equal(s, s_ref)
    assert np.abs(q.astype(np.int32)).max(initial=0) <= 127
    # dequantised: within half a step of x (rows below 2^-121 become zero rows)
    err = np.abs(ops.dequantize_int8(q, s).astype(np.float64) - x)
    amax = np.abs(x).max(axis=1, initial=0)[:, None]
    tiny = np.where(amax < 2.0**-121, amax, 0.0)
    assert (err <= 0.5 * s[:, None] * (1 + 1e-6) + tiny + 1e-45).all()


def test_quantize_int8_rule_by_hand():
    x = np.array([[0.0, 0.5, -1.0, 2.0, 127.0, 63.5, -0.5, 1.5],
                  [0, 0, 0, 0, 0, 0, 0, 0]], np.float32)
    q, s = ops.quantize_int8(x)
    # row 0: amax 127 -> inv 1, rint ties to even (0.5 -> 0, 63.5 -> 64, -0.5 -> -0, 1.5 -> 2)
    np.testing.assert_array_equal(q[0], [0, 0, -1, 2, 127, 64, 0, 2])
    assert s[0] == np.float32(1.0) and s[1] == 0.0 and not q[1].any()


def test_quantize_int8_shapes_and_errors():
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    q, s = ops.quantize_int8(x)
    assert q.shape == (2, 3, 4) and s.shape == (2, 3)
    assert ops.quantize_int8(np.zeros((0, 5)))[0].shape == (0, 5)
    q1, s1 = ops.quantize_int8(np.float32([3.0]))                   # 1-D: one row
    assert q1.tolist() == [127] and s1.shape == ()
    bad = x.copy()
    bad[1, 2, 0] = np.nan
    for twin in (ops, reference):
        with pytest.raises(ValueError, match=r"x row \(1, 2\) is not finite"):
            twin.quantize_int8(bad)
        with pytest.raises(ValueError, match="at least 1 dimension"):
            twin.quantize_int8(np.float32(1.0))
    with pytest.raises(TypeError, match="real numeric"):
        ops.quantize_int8(np.array(["a"]))
    with pytest.raises(TypeError, match="int8"):
        ops.dequantize_int8(np.zeros((2, 3), np.int16), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=r"scale must have shape \(2,\)"):
        ops.dequantize_int8(np.zeros((2, 3), np.int8), np.zeros(3, np.float32))


def test_bfloat16_bit_exact():
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                         0xFFFFFFFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000,
                         0x3F808000, 0x3F818000, 0x00000001], np.uint32)
    x = np.concatenate([bits, specials]).view(np.float32)
    b = ops.to_bfloat16(x)
    np.testing.assert_array_equal(b, reference.to_bfloat16(x))
    back = ops.from_bfloat16(b)
    nan = np.isnan(x)
    assert np.isnan(back[nan]).all() and (b[nan] & 0x0040).all()           # quiet NaN
    assert np.array_equal(np.signbit(back[nan]), np.signbit(x[nan]))
    fin = np.isfinite(x) & (np.abs(x) < np.float32(3.38e38)) & (np.abs(x) >= 2.0**-126)
    rel = np.abs(back[fin].astype(np.float64) - x[fin]) / np.maximum(np.abs(x[fin]), 1e-38)
    assert rel.max() <= 2.0**-8
    # ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1; 1 + 3 * 2^-8 -> 1 + 2^-6
    assert ops.to_bfloat16(np.float32([1 + 2**-8, 1 + 3 * 2**-8])).tolist() == [0x3F80, 0x3F82]
    assert ops.to_bfloat16(np.float32(3.4e38)) == 0x7F80                       # rounds to inf
    with pytest.raises(TypeError, match="uint16"):
        ops.from_bfloat16(np.zeros(3, np.int16))


# ----------------------------------------------------------------------------------------------
# linear with int8 and bf16 weights


@given(N=st.integers(1, 40), K=features(1, 600), M=features(1, 300),
       activation=st.sampled_from(ACTIVATIONS), with_bias=st.booleans(), seed=seeds)
def test_int8_linear_matches_twin(N, K, M, activation, with_bias, seed):
    rng = np.random.default_rng(seed)
    x, w = rand(rng, (N, K)), rand(rng, (M, K), 1.0 / math.sqrt(K))
    b = rand(rng, (M,)) if with_bias else None
    check_int8_linear(x, w, b, activation)


@given(N=st.integers(1, 40), K=features(1, 600), M=features(1, 300),
       activation=st.sampled_from(ACTIVATIONS), seed=seeds)
def test_bf16_linear_matches_twin(N, K, M, activation, seed):
    rng = np.random.default_rng(seed)
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K), 1.0 / math.sqrt(K)), rand(rng, (M,))
    check_bf16_linear(x, w, b, activation)


ROW_COUNTS = list(range(1, 34)) + [63, 64, 65, 200, 513, 1100]


@pytest.mark.parametrize("K,M", [(1, 1), (3, 5), (64, 64), (67, 129), (256, 63), (515, 200)])
def test_int8_linear_rows_around_the_few_row_kernel(K, M):
    """N = 1..33 (the decode kernel and the switch to the blocked GEMM), then many rows; K
    not a multiple of the int8 groups (2 or 4) or vectors, M not a multiple of the panels."""
    rng = np.random.default_rng(K * 1000 + M)
    w, b = rand(rng, (M, K), 1.0 / math.sqrt(K)), rand(rng, (M,))
    qw = quantized(w, "int8")
    x_all = rand(rng, (max(ROW_COUNTS), K))
    for N in ROW_COUNTS:
        for activation in ([None, "relu", "gelu"] if N in (1, 9, 33, 513) else [None]):
            check_int8_linear(x_all[:N], w, b, activation, qw=qw)


@pytest.mark.parametrize("K,M", [(1, 1), (67, 129), (515, 200)])
def test_bf16_linear_rows_around_the_few_row_kernel(K, M):
    rng = np.random.default_rng(K * 1000 + M)
    w, b = rand(rng, (M, K), 1.0 / math.sqrt(K)), rand(rng, (M,))
    qw = quantized(w, "bf16")
    x_all = rand(rng, (max(ROW_COUNTS), K))
    for N in ROW_COUNTS:
        check_bf16_linear(x_all[:N], w, b, "relu" if N % 2 else None, qw=qw)


def test_rows_are_batch_invariant(rng):
    """A row's result does not depend on the other rows (a beam's on the other beams): int8
    for any number of rows (exact sums, one epilogue), bf16 up to BF16_PACKED_MAX_ROWS (one
    kernel; more rows go through sgemm, which sums in its own order)."""
    x, w = rand(rng, (300, 96)), rand(rng, (130, 96))
    q8, b16 = quantized(w, "int8"), quantized(w, "bf16")
    full = ops.linear(x, q8)
    for n in (1, 5, 17, 32, 33, 200):
        np.testing.assert_array_equal(ops.linear(x[:n], q8), full[:n])
    most = kinds.BF16_PACKED_MAX_ROWS
    full = ops.linear(x[:most], b16)
    for n in (1, 5, 12, 13, most - 1):
        np.testing.assert_array_equal(ops.linear(x[:n], b16), full[:n])


@pytest.mark.parametrize("K", [300, 2048])
def test_int8_error_against_float_is_bounded(rng, K):
    """The documented accuracy: |y - x @ dequantize(w).T| <= sx[n] / 2 * sum_k |wq[m, k]|
    (activation rounding, sx = max |x[n]| / L with L the levels of K) + float32 rounding."""
    N, M = 50, 70
    x, w = rand(rng, (N, K)), rand(rng, (M, K), 1.0 / math.sqrt(K))
    qw = quantized(w, "int8")
    wd = qw.dequantize().astype(np.float64)
    y = ops.linear(x, qw)
    exact = x.astype(np.float64) @ wd.T
    L = {300: 32767, 2048: 8256}[K]
    sx = np.abs(x).max(axis=1).astype(np.float64) / L
    bound = 0.5 * sx[:, None] * np.abs(wd).sum(axis=1)[None, :] + 1e-6 * np.abs(exact) + 1e-7
    assert (np.abs(y - exact) <= bound).all()
    # and the weights: within half a step of w
    assert (np.abs(wd - w) <= 0.5 * qw.scale[:, None] * (1 + 1e-6)).all()


HEADROOM = [(1, 32767), (516, 32767), (517, 32706), (2048, 8256), (8192, 2064),
            (ops.INT8_MAX_K, 127)]


@pytest.mark.parametrize("K, levels", HEADROOM)
def test_int8_activations_use_the_int32_headroom(K, levels):
    """A product's inputs get L = min(32767, (2^31 - 1) // (127 K)) levels: full-scale rows
    against full-scale weights of one sign reach |acc| = 127 L K, the most the int32 sums
    hold, and must come out exact (an overflow, or one level too many, fails here); a row
    of steps 1/L of its largest value is quantised without loss."""
    assert reference._act_levels(K) == levels
    M = 3
    w = np.ones((M, K), np.float32)
    w[1] = -1.0
    w[2, ::2] = -1.0
    qw = quantized(w, "int8")
    x = np.ones((2, K), np.float32)
    x[1] = -3.0
    y = check_int8_linear(x, w)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    assert_close(y, want, **TOL["quantized_on_levels"], name="y")
    if K > 1:
        x = np.zeros((1, K), np.float32)
        steps = np.arange(K) % (2 * levels + 1) - levels     # every level -L .. L, in turn
        x[0] = steps.astype(np.float32) / np.float32(levels)
        y = check_int8_linear(x, w)
        assert_close(y, x.astype(np.float64) @ w.T, **TOL["quantized_on_levels"], name="y")


@pytest.mark.parametrize("K", [5, 516, 517, 2049])
def test_int8_activation_rule_corners(K):
    """Rows at the activation rule's corners, bit for bit against the twin: ties at the L
    levels, huge rows (L / amax near the float32 limits), rows just above and below the
    zero threshold 2^-110, subnormals, single non-zeros."""
    rng = np.random.default_rng(K)
    L = reference._act_levels(K)
    rows = list(special_rows(rng, K))
    ties = np.float32(L) * (np.arange(K, dtype=np.float32) % 9 - 4) / np.float32(8.0)
    ties[0] = L                                               # amax = L: inv = 1, x.5 ties
    rows.append(ties)
    for amax in (2.0**-110, np.nextafter(np.float32(2.0**-110), np.float32(0)), 2.0**-100):
        r = rand(rng, (K,))
        r = r / np.abs(r).max() * np.float32(amax)
        r[np.argmax(np.abs(r))] = np.float32(amax)
        rows.append(r)
    x = np.stack(rows).astype(np.float32)
    w = rand(rng, (37, K), 1.0 / math.sqrt(K))
    y = check_int8_linear(x, w, rand(rng, (37,)), "relu")
    assert np.isfinite(y).all()
    for n in (1, 2):                                          # the few-row kernels
        check_int8_linear(x[-3:][:n], w)


def test_bf16_products_take_the_float32_inputs_whole(rng):
    """bf16 is the weight's type only: a product with an identity weight (exact in bf16) gives
    its float32 input back bit for bit, few rows and many, whatever the path (a rounding of
    the inputs to bf16, or to two bf16 terms, would show here); and x @ diag(2^e) too."""
    for K, N in ((40, 1), (40, 33), (71, 130)):
        x = rand(rng, (N, K)) * np.float32(3.0)
        x[0, :3] = (np.float32(1.0 + 2.0**-23), np.float32(-1.0 - 2.0**-22), np.float32(1e-30))
        eye = quantized(np.eye(K, dtype=np.float32), "bf16")
        np.testing.assert_array_equal(ops.linear(x, eye), x)
        scaled = np.diag(np.float32(2.0) ** (np.arange(K) % 7 - 3)).astype(np.float32)
        want = x * np.diag(scaled)[None, :]
        np.testing.assert_array_equal(ops.linear(x, quantized(scaled, "bf16")), want)
    # a NaN whose payload is all in its low 16 bits stays a NaN (its top bits read as inf),
    # and an inf stays an inf
    x = rand(rng, (40, 8))
    x[3, 2] = np.uint32(0x7F800001).view(np.float32)
    x[5, 1] = np.uint32(0xFF80ABCD).view(np.float32)
    x[7, 4] = np.inf
    y = ops.linear(x, quantized(np.eye(8, dtype=np.float32), "bf16"))
    assert np.isnan(y[3]).all() and np.isnan(y[5]).all() and np.isnan(y[7]).sum() == 7
    assert y[7, 4] == np.inf


def test_non_finite_activation_rows_give_nan_rows(rng):
    x, w, b = rand(rng, (40, 33)), rand(rng, (20, 33)), rand(rng, (20,))
    x[3, 5], x[17, 0], x[39, 32] = np.nan, np.inf, -np.inf
    qw = quantized(w, "int8")
    for activation in ACTIVATIONS:
        y = ops.linear(x, qw, b, activation=activation)
        for n in (3, 17, 39):
            assert np.isnan(y[n]).all()
        ok = np.ones(40, bool)
        ok[[3, 17, 39]] = False
        assert np.isfinite(y[ok]).all()
        ref = reference.linear(x, qw, b, activation=activation)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    for n in (1, 2, 8):                                   # the few-row kernel too
        y = ops.linear(x[3:3 + n], qw, b)
        assert np.isnan(y[0]).all() and np.isfinite(y[1:]).all()


def test_zero_weight_rows_and_zero_inputs(rng):
    w = rand(rng, (9, 20))
    w[4] = 0.0
    qw = quantized(w, "int8")
    assert qw.scale[4] == 0 and not qw.data[4].any()
    x = rand(rng, (3, 20))
    x[1] = 0.0
    b = rand(rng, (9,))
    y = check_int8_linear(x, w, b)
    np.testing.assert_array_equal(y[:, 4], np.broadcast_to(b[4], (3,)))
    np.testing.assert_array_equal(y[1], b)


def test_leading_dims_noncontiguous_and_dtypes(rng):
    w = rand(rng, (13, 24))
    for dtype in ("int8", "bf16"):
        qw = quantized(w, dtype)
        x = rand(rng, (2, 3, 24))
        y = ops.linear(x, qw)
        assert y.shape == (2, 3, 13)
        np.testing.assert_array_equal(y, ops.linear(x.reshape(6, 24), qw).reshape(2, 3, 13))
        x_t = rand(rng, (24, 7)).T                                   # non-contiguous (7, 24)
        np.testing.assert_array_equal(ops.linear(x_t, qw), ops.linear(x_t.copy(), qw))
        np.testing.assert_array_equal(ops.linear(x_t.astype(np.float64), qw),
                                      ops.linear(x_t.copy(), qw))
        raw = np.frombuffer(b"\0" + x_t.copy().tobytes(), np.float32, offset=1)  # misaligned
        np.testing.assert_array_equal(ops.linear(raw.reshape(7, 24), qw),
                                      ops.linear(x_t.copy(), qw))
        assert ops.linear(np.zeros((0, 24), np.float32), qw).shape == (0, 13)
        assert ops.linear(np.zeros((2, 0, 24), np.float32), qw).shape == (2, 0, 13)


def test_zero_in_features(rng):
    b = rand(rng, (5,))
    for dtype in ("int8", "bf16"):
        qw = quantized(np.zeros((5, 0), np.float32), dtype)
        y = ops.linear(np.zeros((3, 0), np.float32), qw, b, activation="relu")
        np.testing.assert_array_equal(y, np.broadcast_to(np.maximum(b, 0), (3, 5)))
        np.testing.assert_array_equal(y, reference.linear(np.zeros((3, 0)), qw, b,
                                                          activation="relu"))



@pytest.mark.parametrize("dtype", ["int8", "bf16"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_kernels_over_zero_in_features(dtype, activation):
    """The kernels' own K = 0 branch (ops answers K = 0 with the twin; the C entry points
    handle it for any caller): act(0 + bias), a -0 bias giving +0 as in the twin; no bias,
    act(0)."""
    from fastattn import _kernels

    M = 5
    qw = quantized(np.zeros((M, 0), np.float32), dtype)
    wp = qw._kernel_arrays()[1]
    x = np.zeros((3, 0), np.float32)
    for b in (np.array([1.0, -0.0, -2.0, 3.0, 0.5], np.float32), None):
        y = np.full((3, M), np.nan, np.float32)
        act = ops.ACTIVATIONS[activation]
        if dtype == "int8":
            _kernels.linear_int8_forward(y, x, wp, qw.scale, b, act, 2)
        else:
            _kernels.linear_bf16_forward(y, x, wp, b, act, 2)
        ref = reference.linear(x, qw, b, activation=activation)
        if activation in ("gelu", "silu"):
            assert_close(y, ref, rtol=GELU_RTOL, atol=GELU_ATOL,
                         name=f"{dtype} K = 0 {activation}")
        else:
            np.testing.assert_array_equal(y, ref)
            np.testing.assert_array_equal(np.signbit(y), np.signbit(ref))

def test_threads_bit_identical(restore_threads, rng):
    """1, 2 and 8 threads: the same bits. (8 threads on 300 rows split the panels, each thread
    taking all 300 rows: more than one row block per panel.)"""
    x, w, b = rand(rng, (700, 600)), rand(rng, (300, 600)), rand(rng, (300,))
    for dtype in ("int8", "bf16"):
        qw = quantized(w, dtype)
        out = {}
        for n in (1, 2, 8):
            fastattn.set_num_threads(n)
            out[n] = [ops.linear(x[:rows], qw, b, activation="gelu")
                      for rows in (1, 7, 32, 300, 700)]
        for n in (2, 8):
            for a, c in zip(out[1], out[n]):
                np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("dtypes", [("int8", "int8"), ("bf16", "bf16"), ("int8", None),
                                    (None, "bf16")])
def test_ffn_with_quantized_weights(rng, dtypes):
    x = rand(rng, (2, 7, 32))
    w1, b1, w2, b2 = rand(rng, (80, 32), 0.2), rand(rng, (80,)), rand(rng, (32, 80), 0.1), \
        rand(rng, (32,))
    q1 = quantized(w1, dtypes[0]) if dtypes[0] else w1
    q2 = quantized(w2, dtypes[1]) if dtypes[1] else w2
    for activation in ("relu", "gelu"):
        y = ops.ffn(x, q1, b1, q2, b2, activation=activation)
        composed = ops.linear(ops.linear(x, q1, b1, activation=activation), q2, b2)
        np.testing.assert_array_equal(y, composed)
        into = np.full((14, 32), np.nan, np.float32)
        kinds.ffn_product(q1, b1, q2, b2, ops.ACTIVATIONS[activation], 14)(
            x.reshape(14, 32), into)
        np.testing.assert_array_equal(into, y.reshape(14, 32))
        ref = reference.ffn(x, q1, b1, q2, b2, activation=activation)
        exact = dtypes == ("int8", "int8") and activation == "relu"
        if exact:
            np.testing.assert_array_equal(y, ref)
        else:
            assert_close(y, ref, **TOL["quantized_ffn"], name="ffn quantised")


# ----------------------------------------------------------------------------------------------
# QuantizedWeight


def test_quantized_weight_attributes_and_readonly(rng):
    w = rand(rng, (10, 6))
    q8, b16 = quantized(w, "int8"), quantized(w, "bf16")
    assert q8.dtype == "int8" and q8.shape == (10, 6) and q8.data.dtype == np.int8
    assert q8.scale.shape == (10,) and q8.scale.dtype == np.float32
    assert q8.nbytes == 10 * 6 + 10 * 4
    assert b16.dtype == "bf16" and b16.scale is None and b16.data.dtype == np.uint16
    assert b16.nbytes == 10 * 6 * 2
    np.testing.assert_array_equal(q8.data, reference.quantize_int8(w)[0])
    np.testing.assert_array_equal(b16.data, reference.to_bfloat16(w))
    np.testing.assert_array_equal(q8.dequantize(),
                                  reference.dequantize_int8(*reference.quantize_int8(w)))
    np.testing.assert_array_equal(b16.dequantize(), reference.from_bfloat16(b16.data))
    for a in (q8.data, q8.scale, b16.data):
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 1
    assert "int8" in repr(q8) and reference.QuantizedWeight is QW


def test_quantized_weight_slicing_is_cached(rng):
    x, w = rand(rng, (5, 16)), rand(rng, (12, 16))
    for dtype in ("int8", "bf16"):
        qw = quantized(w, dtype)
        q, k, v = qw[0:4], qw[4:8], qw[8:]
        assert qw[0:4] is q and qw[8:12] is v and qw[:] is qw
        assert q.shape == (4, 16) and v.shape == (4, 16)
        # packed when made: a slice off a panel edge holds its own packed rows from the start
        # (it did after its first product before); on a panel edge it reads its parent's
        # (test_quantized_model_holds_one_copy_of_each_weight)
        np.testing.assert_array_equal(k.data, qw.data[4:8])
        full = ops.linear(x, qw)
        for i, part in enumerate((q, k, v)):
            np.testing.assert_array_equal(ops.linear(x, part), full[:, 4 * i:4 * i + 4])
            np.testing.assert_array_equal(reference.linear(x, part),
                                          reference.linear(x, qw)[:, 4 * i:4 * i + 4])
        packed = k._packed
        ops.linear(x, qw[4:8])
        assert k._packed is packed                                    # not repacked
        assert qw[3:3].shape == (0, 16) and ops.linear(x, qw[3:3]).shape == (5, 0)
        with pytest.raises(TypeError, match="row slices"):
            qw[0]
        with pytest.raises(TypeError, match="row slices"):
            qw[::2]


QUANT_TILES = fastattn.build_info()["quant_tiles"]
PANEL = {"int8": QUANT_TILES["int8_panel"], "bf16": QUANT_TILES["bf16_panel"]}


def check_linear(x, w, qw):
    return (check_int8_linear if qw.dtype == "int8" else check_bf16_linear)(x, w, qw=qw)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
@given(M=st.integers(1, 100), K=st.integers(1, 70), N=st.sampled_from([3, 40]), seed=seeds)
def test_quantized_weight_keeps_only_its_packed_copy_once_used(dtype, M, K, N, seed):
    """After its first product a quantised weight lets go of data; data then reads the same
    values from the packed copy (a new read-only array each time), for any M and K (neither a
    multiple of the panel or the group), and products (few rows: the packed kernel; many:
    the float32 engine on the widened panels), the twin and saving are unchanged."""
    rng = np.random.default_rng(seed)
    w, x = rand(rng, (M, K)), rand(rng, (N, K))
    qw = quantized(w, dtype)
    want = qw.data.copy()
    ref = reference.linear(x, qw)
    check_linear(x, w, qw)
    assert holds_packed_only(qw)                                    # one copy held: packed
    got = qw.data
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype and got.flags.c_contiguous and not got.flags.writeable
    assert qw.data is not got                                       # unpacked, not kept
    assert qw.nbytes == want.nbytes + (4 * M if dtype == "int8" else 0)
    np.testing.assert_array_equal(reference.linear(x, qw), ref)
    np.testing.assert_array_equal(qw.dequantize(), QW.from_stored(dtype, want, qw.scale)
                                  .dequantize())


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
@given(lo=st.integers(0, 2 * 64 + 3), n=st.integers(0, 64 + 5),
       first=st.sampled_from(["parent", "slice"]), seed=seeds)
def test_quantized_slices_read_the_packed_parent(dtype, lo, n, first, seed):
    """A row slice that starts on a panel edge multiplies with its parent's packed copy in
    place (no copy of its own); any other slice packs its own rows. Either way, whichever of
    parent and slice is used first, both agree with the twin and with each other, and data
    reads the slice's rows."""
    rng = np.random.default_rng(seed)
    M, K = 2 * 64 + 9, 21
    w, x = rand(rng, (M, K)), rand(rng, (4, K))
    hi = min(lo + n, M)
    qw = quantized(w, dtype)
    want = qw.data.copy()
    order = [qw, qw[lo:hi]] if first == "parent" else [qw[lo:hi], qw]
    for q in order:
        check_linear(x, w, q)
    sub = qw[lo:hi]
    np.testing.assert_array_equal(ops.linear(x, sub), ops.linear(x, qw)[:, lo:hi])
    np.testing.assert_array_equal(sub.data, want[lo:hi])
    np.testing.assert_array_equal(qw.data, want)
    if lo % PANEL[dtype] == 0 and hi > lo:
        assert np.shares_memory(sub._packed[1], qw._packed[1])
    later = qw[lo:max(lo, hi - 1)]                                  # made after the parent let go
    np.testing.assert_array_equal(later.data, want[lo:max(lo, hi - 1)])
    check_linear(x, w, later)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_a_dropped_weight_frees_its_packed_copy_at_once(dtype, rng):
    """Weight and slices hold no reference cycle once packed: the packed copy goes with the
    last reference, without waiting for a garbage collection."""
    import gc
    import weakref

    x = rand(rng, (3, 16))
    qw = quantized(rand(rng, (3 * 64, 16)), dtype)
    ops.linear(x, qw[0:64])
    ops.linear(x, qw[64:3 * 64])
    gone = weakref.ref(qw._packed[1])
    gc.disable()
    try:
        del qw
        assert gone() is None
    finally:
        gc.enable()


def test_threads_racing_to_pack_and_read_a_fresh_int8_weight(rng):
    """8 Python threads on one fresh int8 weight: some multiply with it or its slices (the
    first of them packs it and lets go of data), the others read data and run the twin at
    the same time. Every thread gets the single-thread answers."""
    M, K = 3 * PANEL["int8"], 40
    w, x = rand(rng, (M, K)), rand(rng, (6, K))
    ref = reference.linear(x, quantized(w, "int8"))
    want_data = quantized(w, "int8").data.copy()
    for _ in range(3):
        qw = quantized(w, "int8")

        def work(i):
            for _ in range(5):
                if i % 2:
                    np.testing.assert_array_equal(qw.data, want_data)
                    np.testing.assert_array_equal(reference.linear(x, qw), ref)
                else:
                    lo = PANEL["int8"] * (i // 2 % 3)
                    np.testing.assert_array_equal(ops.linear(x, qw[lo:M]), ref[:, lo:])
                    np.testing.assert_array_equal(ops.linear(x, qw), ref)
        run_in_threads(work, 8)
        assert holds_packed_only(qw)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_quantized_model_holds_one_copy_of_each_weight(dtype):
    """A quantised encoder-decoder, after generating (a many-row encoder, few-row decode
    steps): every weight holds its packed copy alone, and the cross-attention's q and kv
    parts (slices on panel edges) read their in-projection's copy; saved and loaded, it gives
    the same tokens."""
    import tempfile

    from fastattn import io
    from fastattn import nn as fnn
    C = 128
    m = fnn.Seq2SeqTransformer(1, 1, C, 2, 11, 11, 2 * C, 0.0, max_len=40, seed=0).eval()
    m.quantize(dtype)
    src = np.random.default_rng(0).integers(4, 11, (2, 20))        # 40 encoder rows
    first = m.generate(src, max_new_tokens=5, start_id=1)
    weights = [w for mod in m.modules() for w in vars(mod).values() if isinstance(w, QW)]
    assert weights and any(w._slices for w in weights)
    for w in weights:
        assert holds_packed_only(w), w
        for part in w._slices.values():             # used through its q / kv parts
            assert holds_packed_only(part)
            assert np.shares_memory(part._packed[1], w._packed[1])
    with tempfile.TemporaryDirectory() as d:
        io.save(m, os.path.join(d, "m"))
        back = io.load(os.path.join(d, "m"))
    np.testing.assert_array_equal(back.generate(src, max_new_tokens=5, start_id=1), first)


def test_from_stored_round_trip_and_validation(rng):
    w = rand(rng, (6, 9))
    q8, b16 = quantized(w, "int8"), quantized(w, "bf16")
    s8 = QW.from_stored("int8", np.array(q8.data), np.array(q8.scale))
    sb = QW.from_stored("bf16", np.array(b16.data))
    x = rand(rng, (4, 9))
    np.testing.assert_array_equal(ops.linear(x, s8), ops.linear(x, q8))
    np.testing.assert_array_equal(ops.linear(x, sb), ops.linear(x, b16))
    data, scale = np.array(q8.data), np.array(q8.scale)
    cases = [
        (("int4", data, scale), ValueError, "dtype must be 'int8', 'bf16' or 'bfloat16'"),
        (("int8", data.astype(np.int16), scale), TypeError, "data must be an int8"),
        (("int8", data, scale.astype(np.float64)), TypeError, "scale must be a float32"),
        (("int8", data, None), ValueError, r"needs its scale \(M,\) = \(6,\)"),
        (("int8", data, scale[:5]), ValueError, r"scale must have shape \(6,\)"),
        (("int8", data[0], scale), ValueError, "data must be 2-D"),
        (("int8", data, np.where(np.arange(6) == 2, np.float32(-1), scale)), ValueError,
         r"scale\[2\] = .*finite and >= 0"),
        (("int8", data, np.where(np.arange(6) == 4, np.float32(np.nan), scale)), ValueError,
         r"scale\[4\]"),
        (("int8", np.where(np.arange(9) == 3, np.int8(-128), data), scale), ValueError,
         r"data row 0 holds -128"),
        (("bf16", np.array(b16.data), scale), ValueError, "bf16 weights have no scale"),
        (("bf16", np.array(b16.data).astype(np.int16)), TypeError, "uint16"),
        (("bf16", np.where(np.arange(9) == 1, np.uint16(0x7FC0), b16.data)), ValueError,
         "data row 0 holds a bfloat16 NaN or inf"),
    ]
    for args, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            QW.from_stored(*args)
    big = np.zeros((1, ops.INT8_MAX_K + 1), np.int8)
    with pytest.raises(ValueError, match="int8 limit of 133144"):
        QW.from_stored("int8", big, np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="int8 limit"):
        QW.from_float(big.astype(np.float32), "int8")
    # stored arrays are read into the packed copy when wrapped (the weight keeps nothing
    # else): data reads back read-only, and a later edit of the arrays given changes nothing
    given = data.copy()
    s = QW.from_stored("int8", given, scale)
    given[...] = 0
    np.testing.assert_array_equal(s.data, data)
    assert not s.data.flags.writeable


def test_from_float_bad_input(rng):
    w = rand(rng, (5, 4))
    w_bad = w.copy()
    w_bad[3, 1] = np.inf
    for dtype in ("int8", "bf16"):
        with pytest.raises(ValueError, match="weight row 3 is not finite"):
            QW.from_float(w_bad, dtype)
        with pytest.raises(ValueError, match=r"must be 2-D"):
            QW.from_float(w[0], dtype)
        with pytest.raises(TypeError, match="real numeric"):
            QW.from_float(w.astype(np.complex64), dtype)
    with pytest.raises(ValueError, match="dtype must be 'int8', 'bf16' or 'bfloat16'"):
        QW.from_float(w, "fp8")
    with pytest.raises(ValueError, match="weight row 1 has a value beyond the bfloat16"):
        QW.from_float(np.float32([[1.0], [3.4e38]]), "bf16")


def test_linear_bad_input(rng):
    qw = quantized(rand(rng, (5, 4)), "int8")
    with pytest.raises(ValueError, match=r"x \(3, 6\) has 6 features but weight "
                                         r"QuantizedWeight\(dtype='int8', shape=\(5, 4\)\) "
                                         r"expects 4"):
        ops.linear(rand(rng, (3, 6)), qw)
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        ops.linear(rand(rng, (3, 4)), qw, rand(rng, (4,)))
    with pytest.raises(ValueError, match="activation"):
        ops.linear(rand(rng, (3, 4)), qw, activation="tanh")
    with pytest.raises(TypeError, match="QuantizedWeight; quantised weights are for inference"):
        ops.linear_forward(rand(rng, (3, 4)), qw)
    with pytest.raises(ValueError, match=r"w2 must be \(C, F\)"):
        ops.ffn(rand(rng, (3, 4)), qw, None, qw, None)


# ----------------------------------------------------------------------------------------------
# every SIMD level and int8 path, in child processes


def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA / FASTATTN_INT8_PATH (and small OpenMP
    teams): int8 bit for bit, bf16 to tolerance, at sizes around every kernel's edges."""
    forced = os.environ.get("FASTATTN_INT8_PATH")
    info = fastattn.build_info()
    if forced:
        assert info["int8_path"] == forced, info["int8_path"]
    rng = np.random.default_rng(11)
    x = rand(rng, (1100, 515))
    for K, M in ((1, 1), (7, 33), (67, 129), (515, 200)):
        w, b = rand(rng, (M, K), 1.0 / math.sqrt(K)), rand(rng, (M,))
        q8, b16 = quantized(w, "int8"), quantized(w, "bf16")
        np.testing.assert_array_equal(ops.quantize_int8(x[:40, :K])[0],
                                      reference.quantize_int8(x[:40, :K])[0])
        for N in (1, 2, 5, 8, 9, 16, 31, 32, 33, 64, 130, 1100):
            act = ACTIVATIONS[N % len(ACTIVATIONS)]
            check_int8_linear(x[:N, :K], w, b, act, qw=q8)
            if N in (1, 2, 5, 9, 33, 130):
                check_bf16_linear(x[:N, :K], w, b, act, qw=b16)
    np.testing.assert_array_equal(ops.to_bfloat16(x[:3]), reference.to_bfloat16(x[:3]))


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_ops_quant")

INT8_PATHS = fastattn.build_info()["int8_paths_available"]


def int8_path_checks():
    """Run in a child under each FASTATTN_INT8_PATH: isa_checks, and the activation levels'
    int32 headroom and rule corners (the int32 sums at their limit: the AMX paths sum them in
    two wrapping halves) bit for bit; bf16 products multiply the float32 inputs themselves
    (the AMX paths split them in three bf16 terms)."""
    isa_checks()
    for K, levels in HEADROOM:
        test_int8_activations_use_the_int32_headroom(K, levels)
    for K in (5, 517, 2049):
        test_int8_activation_rule_corners(K)
    test_bf16_products_take_the_float32_inputs_whole(np.random.default_rng(5))


@pytest.mark.parametrize("path", ["generic", "avx2", "avx512bw", "avx512vnni", "amx",
                                  "amx-emulated", "avx512vnni-quads"])
def test_every_int8_path(path):
    if path not in INT8_PATHS:
        pytest.skip(f"int8 path {path} is not available here (available: {INT8_PATHS})")
    run_checks("test_ops_quant", "int8_path_checks", {"FASTATTN_INT8_PATH": path})


def test_amx_path_is_the_default_where_the_tiles_run():
    """amx is the default where the CPU has the int8 and bf16 tiles (and Linux grants them),
    products of fewer than 16 rows on avx512vnni-quads; never amx-emulated unless forced;
    amx-emulated, wherever AVX-512 is, has the AMX layout (32-feature panels, K in quads,
    16-row tiles), and avx512vnni-quads the same packed layout, so that the default's two
    kernels share one packed weight (both give the twin's bits: test_every_int8_path)."""
    info = fastattn.build_info()
    if "FASTATTN_INT8_PATH" not in os.environ:
        assert info["int8_path"] != "amx-emulated"
        if info["amx"]["permitted"] and "amx" in INT8_PATHS:
            assert info["int8_path"] == "amx" and info["amx"]["used"]
        if info["int8_path"] == "amx":
            assert info["int8_path_few_rows"] == "avx512vnni-quads"
        else:
            assert info["int8_path_few_rows"] == info["int8_path"]
    assert info["amx"]["used"] == (info["int8_path"] == "amx")
    if "amx" in INT8_PATHS:
        assert all(info["amx"][key] for key in ("int8", "bf16", "os_enabled"))
    # the tile data is asked of Linux only for the amx path (a grant is process-wide)
    assert info["amx"]["permitted"] or not info["amx"]["used"]
    if "amx-emulated" not in INT8_PATHS:
        pytest.skip("amx-emulated needs the AVX-512 level in use")
    run_checks("test_ops_quant", "amx_layout_checks", {"FASTATTN_INT8_PATH": "amx-emulated"})
    if "avx512vnni-quads" in INT8_PATHS:
        run_checks("test_ops_quant", "amx_layout_checks",
                   {"FASTATTN_INT8_PATH": "avx512vnni-quads"})


def amx_layout_checks():
    info = fastattn.build_info()
    tiles = info["quant_tiles"]
    path = os.environ["FASTATTN_INT8_PATH"]
    assert info["int8_path"] == info["int8_path_few_rows"] == path and not info["amx"]["used"]
    assert (tiles["int8_panel"], tiles["int8_group"]) == (32, 4)
    assert tiles["int8_tile_rows"] == (16 if path == "amx-emulated" else 6)


def test_int8_path_forcing_errors():
    cases = [({"FASTATTN_INT8_PATH": "sse9"}, "expected one of generic, avx2"),
             ({"FASTATTN_INT8_PATH": "avx512vnni", "FASTATTN_CPU_ISA": "generic"},
              "cannot run it"),
             ({"FASTATTN_INT8_PATH": "amx-emulated", "FASTATTN_CPU_ISA": "avx2"},
              "cannot run it")]
    if "amx" not in INT8_PATHS:
        cases.append(({"FASTATTN_INT8_PATH": "amx"}, "cannot run it"))
    for env, pattern in cases:
        proc = run_child("import fastattn", env=env)
        assert proc.returncode != 0 and pattern in proc.stderr, proc.stderr
    info = fastattn.build_info()
    assert info["int8_path"] in info["int8_paths_available"]
    assert set(info["amx"]) >= {"int8", "bf16", "os_enabled", "permitted", "used"}
