"""The bfloat16 compute type: linear with a QuantizedWeight of dtype "bfloat16" against its twin.

Both operands of every product are rounded to bf16 (reference.round_bfloat16, vcvtneps2bf16's
rule), each product is exact in float32 and the sums run in one defined order
(reference.linear's docstring), so ops and reference agree bit for bit for activation None
and relu, on every path (the FMA tiles at each SIMD level, the vdpbf16ps tiles), any row
count and any thread count; gelu differs by its kernel's accuracy only. The AMX tiles (the
default on an AMX CPU) sum in TDPBF16PS's order instead, and match the twin computed in that
order bit for bit. The one documented departure: products or partial sums below 2^-126 in
magnitude (not exact in float32; the vdpbf16ps path flushes them to zero), at most 2^-126 per
step.
"""
import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import _kernels, ops, reference
from fastattn._runtime import BF16_PATHS
from conftest import assert_close, run_checks, run_child
from strategies import features, rand, seeds
from tolerances import TOL

QW = ops.QuantizedWeight
ACTIVATIONS = [None, "relu", "gelu", "silu"]
PATHS = fastattn.build_info()["bf16_paths_available"]


def twin(x, qw, b=None, activation=None):
    """The twin in the order of the path in use for x's rows: the AMX paths sum per block of 16
    pairs (reference._linear_bfloat16's order="amx"), every other path as reference.linear."""
    rows = int(np.prod(np.shape(x)[:-1]))
    if BF16_PATHS[_kernels.bfloat16_path_rows(rows)].startswith("amx"):
        return reference._linear_bfloat16(x, qw, b, activation, order="amx")
    return reference.linear(x, qw, b, activation=activation)


def check(x, w, b=None, activation=None, qw=None):
    qw = QW.from_float(w, "bfloat16") if qw is None else qw
    got = ops.linear(x, qw, b, activation=activation)
    want = twin(x, qw, b, activation)
    if activation in ("gelu", "silu"):
        assert_close(got, want, **TOL["quantized_gelu"], name=f"bfloat16 linear with {activation}")
    else:
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    return got


@given(N=st.integers(1, 40), K=features(1, 600), M=features(1, 300),
       activation=st.sampled_from(ACTIVATIONS), with_bias=st.booleans(), seed=seeds)
def test_linear_matches_twin(N, K, M, activation, with_bias, seed):
    rng = np.random.default_rng(seed)
    x, w = rand(rng, (N, K)), rand(rng, (M, K), 1.0 / math.sqrt(K))
    check(x, w, rand(rng, (M,)) if with_bias else None, activation)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_many_rows_and_long_k_with_the_epilogue(activation):
    """Sizes past every blocking of the many-row paths: rows beyond one chunk of the tiles'
    A (256) and not a multiple of 32, K over three chunks (the tiles' bias and activation are
    done once, on the last), features past a pass of 128 columns and not a multiple of 32;
    with and without a bias."""
    rng = np.random.default_rng(5)
    x, w = rand(rng, (300, 1100)), rand(rng, (290, 1100), 1.0 / math.sqrt(1100))
    check(x, w, rand(rng, (290,)), activation)
    check(x, w, None, activation)


def edge_checks():
    """Rows around every tile height and the row-block split, odd K, M around the panel."""
    rng = np.random.default_rng(3)
    panel = fastattn.build_info()["quant_tiles"]["bfloat16_panel"]
    x = rand(rng, (300, 515))
    for K, M in ((1, 1), (2, 3), (7, panel - 1), (67, panel + 1), (514, 2 * panel), (515, 200)):
        w, b = rand(rng, (M, K), 1.0 / math.sqrt(K)), rand(rng, (M,))
        qw = QW.from_float(w, "bfloat16")
        for N in (1, 2, 5, 6, 7, 11, 12, 13, 31, 33, 95, 97, 193, 300):
            check(x[:N, :K], w, b, ACTIVATIONS[N % len(ACTIVATIONS)], qw=qw)


def test_rows_tiles_and_tails():
    edge_checks()


def test_threads_bit_identical(restore_threads):
    rng = np.random.default_rng(4)
    x, w = rand(rng, (257, 131)), rand(rng, (190, 131), 0.1)
    qw = QW.from_float(w, "bfloat16")
    outs = []
    for n in (1, 2):
        fastattn.set_num_threads(n)
        outs.append(ops.linear(x, qw).view(np.uint32))
        outs.append(ops.linear(x[:3], qw).view(np.uint32))      # few rows: panels split
    assert np.array_equal(outs[0], outs[2]) and np.array_equal(outs[1], outs[3])


def test_operand_rounding_rule():
    """round_bfloat16 by hand, and the kernels' rounding of x through an identity weight
    (y = one exact product: the rounded input itself)."""
    f = np.float32
    cases = {1.0: 1.0, 1 + 2**-8: 1.0, 1 + 3 * 2**-8: 1 + 2**-6, 1 + 2**-8 + 2**-20: 1 + 2**-7,
             -(1 + 2**-8): -1.0, 2.0**-126: 2.0**-126, 2.0**-127: 0.0, -(2.0**-140): -0.0,
             3.4e38: np.inf, np.inf: np.inf, -np.inf: -np.inf}
    x = np.array(list(cases), f)
    want = np.array(list(cases.values()), f)
    got = ops.round_bfloat16(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got.view(np.uint32), reference.round_bfloat16(x).view(np.uint32))
    nan = ops.round_bfloat16(np.array([np.nan, -np.nan], f))
    assert np.isnan(nan).all() and np.signbit(nan).tolist() == [False, True]
    K = 9
    finite = np.array([1 + 2**-8, 1 + 3 * 2**-8, 2.0**-127, -(2.0**-140), 5e-39, -7.0, 0.0,
                       1e30, 3.3e38], f)
    y = ops.linear(finite[None, :], QW.from_float(np.eye(K, dtype=f), "bfloat16"))
    r = reference.round_bfloat16(finite)
    assert np.array_equal(np.abs(y[0]), np.abs(r))       # (0 + -0 = +0: signs of zeros aside)


def test_weights_hold_the_operand_values():
    """A bfloat16 weight stores what its products multiply by: subnormal bits become zeros
    (vcvtneps2bf16's rule); a bf16 weight keeps them."""
    w = np.array([[1e-39, -1e-39, 1.5, 2.0**-126]], np.float32)
    assert np.array_equal(QW.from_float(w, "bfloat16").dequantize().view(np.uint32),
                          reference.round_bfloat16(w).view(np.uint32))
    assert QW.from_float(w, "bf16").dequantize()[0, 0] != 0
    stored = QW.from_stored("bfloat16", np.array([[0x0001, 0x8040, 0x3F80]], np.uint16))
    assert stored.data.tolist() == [[0x0000, 0x8000, 0x3F80]]


def test_non_finite_inputs(rng):
    """NaN meets every product of its row (NaN out); inf gives inf (or NaN against a zero
    weight or an opposite inf), as IEEE arithmetic and the twin do."""
    K, M = 20, 70
    x = rand(rng, (6, K))
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    x[3, 0] = -np.inf
    x[4, 19] = 3.4e38                      # rounds to inf
    w = rand(rng, (M, K), 0.2)
    w[7, 5] = 0.0
    qw = QW.from_float(w, "bfloat16")
    got = ops.linear(x, qw)
    want = twin(x, qw)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1]).all() and np.isnan(got[2, 7])
    assert np.array_equal(got[np.isfinite(want)], want[np.isfinite(want)])
    assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)])
    assert np.isfinite(got[[0, 5]]).all()


def test_tiny_products_stay_within_the_stated_bound(rng):
    """Products below 2^-126 are not exact in float32: the paths may differ there from the
    twin (vdpbf16ps flushes them and partial sums that small to zero; an FMA rounds once with
    the sum), by at most 2^-126 per step."""
    K, M = 64, 64
    x = rand(rng, (8, K)) * np.float32(2.0**-64)
    w = rand(rng, (M, K)) * np.float32(2.0**-64)
    qw = QW.from_float(w, "bfloat16")
    got, want = ops.linear(x, qw), twin(x, qw)
    assert np.abs(got - want).max() <= K * 2.0**-126


def test_empty_and_zero_in_features():
    qw = QW.from_float(np.zeros((5, 0), np.float32), "bfloat16")
    b = np.arange(5, dtype=np.float32)
    assert np.array_equal(ops.linear(np.zeros((3, 0), np.float32), qw, b), np.tile(b, (3, 1)))
    qw = QW.from_float(np.ones((5, 4), np.float32), "bfloat16")
    assert ops.linear(np.zeros((0, 4), np.float32), qw).shape == (0, 5)


def test_ffn_and_slices(rng):
    x = rand(rng, (40, 32))
    w1, w2 = rand(rng, (128, 32), 0.2), rand(rng, (32, 128), 0.1)
    q1, q2 = QW.from_float(w1, "bfloat16"), QW.from_float(w2, "bfloat16")
    h = twin(x, q1, None, "relu")
    np.testing.assert_array_equal(ops.ffn(x, q1, None, q2, None, activation="relu"),
                                  twin(h, q2))
    for lo, hi in ((0, 64), (64, 128), (3, 70)):        # a panel edge reads the parent's copy
        q1._kernel_arrays()
        check(x, None, qw=q1[lo:hi])


def test_ffn_hidden_as_bf16_bits_gives_the_two_products_bits(rng):
    """The FFN of two bfloat16 weights holds its hidden as bf16 bits (the second product
    rounds it to them anyway): the same bits as two linear calls through a float32 hidden, for
    a decode step's rows (float32 hidden), many rows, K past the tiles' one chunk (C = 515:
    float32 hidden on the tiles), slices of a weight on a panel edge, an empty hidden or sum."""
    for N, C, F, act in ((1, 8, 16, "relu"), (2, 33, 70, "gelu"), (3, 16, 40, "relu"),
                         (97, 64, 130, "relu"), (300, 515, 131, "gelu"), (40, 512, 96, "relu"),
                         (3, 0, 4, "relu"), (3, 4, 0, "relu")):
        x = rand(rng, (N, C))
        q1 = QW.from_float(rand(rng, (F, C), 0.2), "bfloat16")
        q2 = QW.from_float(rand(rng, (C, F), 0.1), "bfloat16")
        b1, b2 = rand(rng, (F,)), rand(rng, (C,))
        two = ops.linear(ops.linear(x, q1, b1, activation=act), q2, b2)
        got = ops.ffn(x, q1, b1, q2, b2, activation=act)
        np.testing.assert_array_equal(got.view(np.uint32), two.view(np.uint32))
    x = rand(rng, (50, 32))
    q1 = QW.from_float(rand(rng, (192, 32), 0.2), "bfloat16")
    q2 = QW.from_float(rand(rng, (32, 70), 0.1), "bfloat16")
    sub = q1[64:134]                                    # a slice reading its parent's panels
    np.testing.assert_array_equal(ops.ffn(x, sub, None, q2, None),
                                  ops.linear(ops.linear(x, sub, None, activation="relu"), q2))
    with pytest.raises(ValueError, match="ffn_bfloat16_forward: w1p"):
        from fastattn import _kernels
        _kernels.ffn_bfloat16_forward(np.empty((2, 32), np.float32), x[:2],
                                      q2._kernel_arrays()[1], None, q1._kernel_arrays()[1], None,
                                      70, 1, 1)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="dtype must be 'int8', 'bf16' or 'bfloat16'"):
        QW.from_float(np.ones((2, 2), np.float32), "bfloat")
    qw = QW.from_float(np.ones((3, 4), np.float32), "bfloat16")
    with pytest.raises(ValueError, match="linear"):
        ops.linear(np.ones((2, 5), np.float32), qw)
    with pytest.raises(ValueError, match="beyond the bfloat16 range"):
        QW.from_float(np.full((1, 2), 3.4e38, np.float32), "bfloat16")


# ----------------------------------------------------------------------------------------------
# every path, forced in a child


def path_checks():
    """Run in a child under FASTATTN_CPU_ISA and FASTATTN_BF16_PATH: every check above."""
    forced = os.environ.get("FASTATTN_BF16_PATH")
    info = fastattn.build_info()
    if forced:
        assert info["bf16_path"] == forced, info["bf16_path"]
    edge_checks()
    test_operand_rounding_rule()
    test_non_finite_inputs(np.random.default_rng(1))
    test_tiny_products_stay_within_the_stated_bound(np.random.default_rng(2))
    test_ffn_and_slices(np.random.default_rng(3))
    test_ffn_hidden_as_bf16_bits_gives_the_two_products_bits(np.random.default_rng(4))
    rng = np.random.default_rng(9)
    x, w = rand(rng, (130, 77)), rand(rng, (65, 77), 0.1)
    qw = QW.from_float(w, "bfloat16")
    fastattn.set_num_threads(1)
    one = ops.linear(x, qw)
    # one thread takes its rows in the tallest chunks (the tiles: 512 rows), K past a chunk
    tall, wt = rand(rng, (1100, 515)), rand(rng, (70, 515), 0.05)
    check(tall, wt, rand(rng, (70,)), "relu")
    fastattn.set_num_threads(2)
    assert np.array_equal(one, ops.linear(x, qw))


@pytest.mark.parametrize("isa, path", [("generic", "fma"), ("avx2", "fma"), ("avx512", "fma"),
                                       ("avx512", "avx512bf16"), ("avx512", "amx-emulated"),
                                       ("avx512", "amx")])
def test_every_path(isa, path):
    available = fastattn.build_info()["simd_available"]
    if isa not in available:
        pytest.skip(f"{isa} is not available on this CPU/build (available: {available})")
    if path == "avx512bf16" and not fastattn.build_info()["bf16_dot_products"]["avx512_bf16"]:
        pytest.skip("this CPU has no AVX512_BF16")
    amx = fastattn.build_info()["amx"]
    if path == "amx" and not (amx["bf16"] and amx["os_enabled"] and
                              fastattn.build_info()["bf16_dot_products"]["avx512_bf16"]):
        pytest.skip("this CPU (or its OS) has no AMX-BF16 tiles (with AVX512_BF16)")
    report = run_checks("test_ops_bfloat16", "path_checks",
                        {"FASTATTN_CPU_ISA": isa, "FASTATTN_BF16_PATH": path})
    assert report["simd"] == isa


def test_default_path_and_forcing_errors():
    """Unforced: amx where the CPU has AMX-BF16 and Linux grants the tiles (decode-sized
    products of one or two rows on a vector path), else the faster of fma and avx512bf16 (timed
    once at import: both give the same bits); an unknown or unavailable path is refused at
    import."""
    info = fastattn.build_info()
    assert info["bf16_path"] in PATHS
    if "FASTATTN_BF16_PATH" not in os.environ:
        amx = info["amx"]
        # the tiles run from the AVX-512 level (a level forced lower keeps them out)
        # (and only with AVX512_BF16 too, whose conversion rounds the tiles' inputs: every
        # CPU with AMX-BF16 has it)
        want_amx = (bool(amx["bf16"] and amx["os_enabled"]) and info["simd"] == "avx512" and
                    info["bf16_dot_products"]["avx512_bf16"])
        assert (info["bf16_path"] == "amx") == want_amx
        assert info["bf16_path_few_rows"] in ("fma", "avx512bf16")
    assert ("avx512bf16" in PATHS) == (info["simd"] == "avx512" and
                                       info["bf16_dot_products"]["avx512_bf16"])
    cases = [({"FASTATTN_BF16_PATH": "sse9"}, "expected one of fma, avx512bf16"),
             ({"FASTATTN_BF16_PATH": "amx-emulated", "FASTATTN_CPU_ISA": "avx2"},
              "cannot run it"),
             ({"FASTATTN_BF16_PATH": "avx512bf16", "FASTATTN_CPU_ISA": "avx2"},
              "cannot run it")]
    for env, pattern in cases:
        proc = run_child("import fastattn", env=env, timeout=120)
        assert proc.returncode != 0 and pattern in proc.stderr, proc.stderr
