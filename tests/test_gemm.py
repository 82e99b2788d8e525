"""The float32 GEMM engine (csrc/gemm.c, gemm_body.h) behind every float32 product: against the
twin (float64 sums) on shapes around its tiles and cache blocks, bit for bit against its own
documented summation order, 1 vs 2 threads bit-identical, every SIMD level forced, packed and
as-given weights alike, and the checks of the packed forms' sizes.

The engine's promise (docs/gemm.md): each element of C is one float32 accumulator that takes
k = 0 .. K-1 in order, one fused multiply-add each (AVX2, AVX-512; the generic level a multiply
then an add), so neither the blocking, nor the tile an element falls in, nor the team changes a
bit. An accumulated gradient is that sum added to the old value.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
from conftest import TILES, assert_close, child_isa_tests, child_report, requires_torch, run_child
from fastattn import _kernels, kinds, ops, reference
from strategies import rand, seeds
from tolerances import TOL, dot_atol

PANEL, TILE_ROWS = TILES["packed_panel"], TILES["packed_tile_rows"]
TILE_FEATURES = TILES["packed_tile_features"]


def gemm_info():
    return fastattn.build_info()["gemm"]


def linear_packed(x, w, b=None, act=0, nthreads=None):
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    _kernels.linear_packed_forward(y, x, kinds.pack_panels(w), b, act,
                                   fastattn.get_num_threads() if nthreads is None else nthreads)
    return y


def linear_raw(x, w, b=None, act=0, nthreads=None):
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    _kernels.linear_forward(y, None, x, w, b, act,
                            fastattn.get_num_threads() if nthreads is None else nthreads)
    return y


def order_twin(x, w, fused):
    """x @ w.T in the engine's order, emulated: per element, acc = fma(x_k, w_k, acc) for k in
    order (fused: the product exact in float64, the sum rounded to float64 and then float32,
    which double-rounds with odds of about 2^-29 a step), or acc = acc + fl(x_k w_k)."""
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for k in range(x.shape[1]):
        p = np.outer(x[:, k].astype(np.float64), w[:, k].astype(np.float64))
        if fused:
            acc = (acc.astype(np.float64) + p).astype(np.float32)
        else:
            acc = acc + p.astype(np.float32)
    return acc


def shapes():
    """(N, K, M) around the engine's tiles and blocks at the level in use: 1, odd, a tile's
    rows and a panel's features +- 1, K past one and two K blocks."""
    kb = gemm_info()["k_block"]
    out = [(1, 1, 1), (1, 7, 5), (3, 5, 7), (TILE_ROWS - 1, 33, PANEL - 1),
           (TILE_ROWS, 64, PANEL), (TILE_ROWS + 1, 65, PANEL + 1),
           (2 * TILE_ROWS + 3, 31, TILE_FEATURES + 3), (57, kb + 1, 2 * PANEL + 5),
           (130, 2 * kb + 37, 97), (300, 3, 131)]
    return out


# ---- checks run at every SIMD level (child processes) ------------------------------------------

def isa_checks():
    """At the level in use: the engine against the twin on tile and block edges (as-given and
    packed weights, forward with bias and activation, backward with accumulation, the FFN
    with packed weights), and 1 vs 2 threads bit-identical."""
    rng = np.random.default_rng(3)
    for (N, K, M) in shapes():
        x, w, b = rand(rng, (N, K)), rand(rng, (M, K), 1 / math.sqrt(K)), rand(rng, (M,))
        ref = reference.linear(x, w, b, activation="relu")
        y = linear_packed(x, w, b, 1, nthreads=2)
        assert_close(y, ref, rtol=TOL["linear"]["rtol"], atol=dot_atol(x, w, bias=b),
                     name=f"packed {N}x{K}x{M}")
        np.testing.assert_array_equal(linear_packed(x, w, b, 1, nthreads=1), y)
        # as given: packed per call, the same sums, however few the rows
        np.testing.assert_array_equal(linear_raw(x, w, b, 1, nthreads=2), y)
        np.testing.assert_array_equal(linear_raw(x, w, b, 1, nthreads=1), y)
        # backward: dx = dy w, dW = dy^T x (accumulated: old + the sum), db
        dy = rand(rng, (N, M))
        grads = []
        for nt in (1, 2):
            fastattn.set_num_threads(nt)
            dw0, db0 = np.full((M, K), 0.5, np.float32), np.full(M, -0.25, np.float32)
            dx = np.empty((N, K), np.float32)
            _kernels.linear_backward(dx, dw0, db0, None, dy, None, x, w, 0, True, nt)
            grads.append((dx, dw0, db0))
        for a, c in zip(*grads):
            np.testing.assert_array_equal(a, c)
        dx_ref, dw_ref, db_ref = reference.linear_backward(dy, x, w)
        dx, dw, db = grads[0]
        assert_close(dx, dx_ref, rtol=TOL["linear"]["rtol"], atol=dot_atol(dy, w.T),
                     name=f"dx {N}x{K}x{M}")
        fresh = np.full((M, K), np.nan, np.float32)
        _kernels.linear_backward(None, fresh, None, None, dy, None, x, w, 0, False, 2)
        np.testing.assert_array_equal(dw, np.float32(0.5) + fresh)   # the old value + the sum
        assert_close(fresh, dw_ref, rtol=TOL["linear"]["rtol"], atol=dot_atol(dy.T, x.T),
                     name=f"dW {N}x{K}x{M}")
    # the feed-forward with packed weights equals the one packing them per call
    N, C, F = 77, 45, 2 * PANEL + 3
    x = rand(rng, (N, C))
    w1, b1, w2, b2 = rand(rng, (F, C), 0.2), rand(rng, (F,)), rand(rng, (C, F), 0.1), \
        rand(rng, (C,))
    for nt in (1, 2):
        y1, y2 = np.empty((N, C), np.float32), np.empty((N, C), np.float32)
        _kernels.ffn_forward(y1, None, x, w1, b1, w2, b2, 2, 0.0, 0, nt)
        _kernels.ffn_forward(y2, None, x, w1, b1, w2, b2, 2, 0.0, 0, nt, False, None, None,
                             kinds.pack_panels(w1), kinds.pack_panels(w2))
        np.testing.assert_array_equal(y1, y2)
    fastattn.set_num_threads(2)


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_gemm")


_LEVEL_BITS = """
import hashlib, json, numpy as np, fastattn
from fastattn import kinds
rng = np.random.default_rng(11)
x = rng.standard_normal((37, 1100)).astype(np.float32)
w = rng.standard_normal((101, 1100)).astype(np.float32)
y = kinds.PackedFloat32Weight(w).product(None, 0, 37)(x, np.empty((37, 101), np.float32))
print(json.dumps({"simd": fastattn.build_info()["simd"],
                  "bits": hashlib.sha256(y.tobytes()).hexdigest()}))
"""


def test_avx2_and_avx512_give_the_same_bits():
    """Both levels run one fma chain per element in k order: the same bits, whatever their
    tiles (6 x 16 and 8 x 48) and K blocks."""
    levels = [lv for lv in ("avx2", "avx512") if lv in fastattn.build_info()["simd_available"]]
    if len(levels) < 2:
        pytest.skip(f"needs avx2 and avx512 (available: {levels})")
    reports = [child_report(run_child(_LEVEL_BITS, env={"FASTATTN_CPU_ISA": lv}))
               for lv in levels]
    assert [r["simd"] for r in reports] == levels
    assert reports[0]["bits"] == reports[1]["bits"]


# ---- in this process ------------------------------------------------------------------------

def test_build_info_reports_the_blocking():
    g = gemm_info()
    assert g["l1"] >= 4096 and g["l2"] >= g["l1"] and g["l3"] >= 0
    assert g["k_block"] >= 64 and g["k_block"] % 16 == 0
    assert g["panel"] == PANEL and g["tile_rows"] == TILE_ROWS
    assert g["tile_features"] == TILE_FEATURES and PANEL % TILE_FEATURES == 0


def test_summation_order_is_the_documented_one(rng):
    """Bit for bit against the order emulated in NumPy, K past two K blocks (so a block's
    partial sums go through C and back), tails in every dimension."""
    kb = gemm_info()["k_block"]
    N, K, M = TILE_ROWS + 3, 2 * kb + 11, PANEL + 7
    x, w = rand(rng, (N, K)), rand(rng, (M, K))
    y = linear_packed(x, w)
    fused = fastattn.build_info()["simd"] != "generic"
    want = order_twin(x, w, fused)
    if not fused and not np.array_equal(y, want):  # a native build may contract the generic
        want = order_twin(x, w, True)              # level's multiply-add into an FMA
    np.testing.assert_array_equal(y, want)


def test_results_do_not_depend_on_the_rows_around(rng):
    """Each row's result is the same alone, in a tile, or in a block of many: no batch
    dependence (decode steps and whole passes give the same bits)."""
    kb = gemm_info()["k_block"]
    K, M = kb + 5, 3 * PANEL + 1
    x, w = rand(rng, (301, K)), rand(rng, (M, K))
    wp = kinds.pack_panels(w)
    whole = np.empty((301, M), np.float32)
    _kernels.linear_packed_forward(whole, x, wp, None, 0, 2)
    for lo, hi in [(0, 1), (5, 6), (7, 7 + TILE_ROWS), (100, 163), (300, 301)]:
        part = np.empty((hi - lo, M), np.float32)
        _kernels.linear_packed_forward(part, x[lo:hi], wp, None, 0, 2)
        np.testing.assert_array_equal(part, whole[lo:hi])


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 70), K=st.integers(1, 300), M=st.integers(1, 150), seed=seeds,
       act=st.sampled_from([0, 1, 2, 3, 4]), with_bias=st.booleans(),
       scale=st.sampled_from([1.0, 1e-30, 1e30]))
def test_engine_matches_the_twin(N, K, M, seed, act, with_bias, scale):
    rng = np.random.default_rng(seed)
    x, w = rand(rng, (N, K), scale), rand(rng, (M, K), 1 / math.sqrt(K))
    b = rand(rng, (M,), scale) if with_bias else None
    name = [None, "relu", "gelu", "gelu_tanh", "silu"][act]
    y = linear_packed(x, w, b, act)
    ref = reference.linear(x, w, b, activation=name)
    assert_close(y, ref, rtol=TOL["linear"]["rtol"], atol=dot_atol(x, w, bias=b),
                 name="packed")
    np.testing.assert_array_equal(linear_packed(x, w, b, act, nthreads=1), y)


def test_huge_magnitudes_overflow_as_the_sum_does(rng):
    x = np.full((3, 4), 3e38, np.float32)
    w = np.ones((5, 4), np.float32)
    assert np.isposinf(linear_packed(x, w)).all()
    w[1] = -1
    y = linear_packed(x, w)
    assert np.isposinf(y[:, 0]).all() and np.isneginf(y[:, 1]).all()
    x[0, 2] = np.nan
    assert np.isnan(linear_packed(x, w)[0]).all()


def test_empty_sums_give_the_bias(rng):
    x, w, b = np.zeros((4, 0), np.float32), np.zeros((6, 0), np.float32), rand(rng, (6,))
    np.testing.assert_array_equal(linear_packed(x, w, b), np.broadcast_to(b, (4, 6)))
    np.testing.assert_array_equal(linear_raw(np.zeros((20, 0), np.float32), w, b),
                                  np.broadcast_to(b, (20, 6)))


def test_packed_forms_of_the_wrong_size_are_refused(rng):
    x, w = rand(rng, (3, 10)), rand(rng, (7, 10))
    y = np.empty((3, 7), np.float32)
    short = kinds.pack_panels(w)[:-1]
    with pytest.raises(ValueError, match=r"linear_packed_forward: wp has \d+ floats"):
        _kernels.linear_packed_forward(y, x, short, None, 0, 1)
    w1, w2 = rand(rng, (9, 10)), rand(rng, (10, 9))
    out = np.empty((3, 10), np.float32)
    with pytest.raises(ValueError, match="ffn_forward: panels2 has"):
        _kernels.ffn_forward(out, None, rand(rng, (3, 10)), w1, None, w2, None, 1, 0.0, 0, 1,
                             False, None, None, kinds.pack_panels(w1), kinds.pack_panels(w1))


def test_packed_weight_rows_share_or_repack(rng):
    w = rand(rng, (3 * PANEL + 5, 19))
    kind = kinds.PackedFloat32Weight(w)
    x = rand(rng, (11, 19))
    for lo, hi in [(0, 7), (PANEL, 2 * PANEL + 3), (5, 60), (0, 3 * PANEL + 5)]:
        sub = kind.rows(lo, hi)
        assert np.shares_memory(sub.panels, kind.panels) == (lo % PANEL == 0)
        y = sub.product(None, 0, 11)(x, np.empty((11, hi - lo), np.float32))
        np.testing.assert_array_equal(y, linear_packed(x, w[lo:hi]))


@pytest.mark.parametrize("K,M", [(512, 1536), (512, 2048), (2048, 512), (512, 512)])
def test_transformer_base_shapes_against_torch(rng, K, M):
    torch = requires_torch()
    x, w, b = rand(rng, (96, K)), rand(rng, (M, K), 1 / math.sqrt(K)), rand(rng, (M,))
    lin = torch.nn.Linear(K, M)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
        lin.bias.copy_(torch.from_numpy(b))
        want = lin(torch.from_numpy(x)).numpy()
    y = kinds.PackedFloat32Weight(w).product(b, 0, 96)(x, np.empty((96, M), np.float32))
    assert_close(y, want, rtol=TOL["linear"]["rtol"], atol=dot_atol(x, w, bias=b),
                 name="torch nn.Linear")
    assert_close(ops.linear(x, w, b), want, rtol=TOL["linear"]["rtol"],
                 atol=dot_atol(x, w, bias=b), name="ops.linear")


_PEAK = """
import json, fastattn
from fastattn import _kernels
print(json.dumps({"simd": fastattn.build_info()["simd"],
                  "flops": _kernels.peak(10, 1, "fma")}))
"""


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_the_fma_peak_is_the_levels_own(isa):
    """peak_fma, the roofline the gemm rows are read against, runs at the level in use: ymm on
    AVX2 (24 vfmadd231ps of 8 lanes a step), zmm on AVX-512; the generic level has none."""
    if isa not in fastattn.build_info()["simd_available"]:
        pytest.skip(f"{isa} is not available here")
    r = child_report(run_child(_PEAK, env={"FASTATTN_CPU_ISA": isa}))
    want = {"generic": -1, "avx2": 48 * 8 * 10, "avx512": 48 * 16 * 10}[isa]
    assert (r["simd"], r["flops"]) == (isa, want)


def test_a_case_with_nothing_to_run_gives_an_empty_row():
    """fastattn bench at a level without the case's only implementation (peak_fma on the
    generic level) reports the row as not available instead of failing the run."""
    from fastattn.bench import runner
    from fastattn.bench.base import Case, Unavailable

    def unavailable(_):
        raise Unavailable("not on this level")
    case = Case("nothing_here", "a case with nothing to run", lambda rng: {},
                {"fastattn": unavailable}, flops=1, slow=())
    row = runner._run_time_case(case, 1, 3, 1)
    assert row["fastattn_ms"] is None and "not on this level" in row["fastattn_status"]


def test_the_tile_peaks_run_only_on_the_tiles():
    """peak_amx_bf16 / peak_amx_int8 run the real tiles only (four TDP a step: 4 x 16384 flops,
    4 x 32768 ops), and report -1 where the CPU has no AMX or Linux refuses the tiles (the
    emulated tiles' speed means nothing); an unknown kind is refused by name."""
    amx = fastattn.build_info()["amx"]
    real = amx["int8"] and amx["bf16"] and amx["os_enabled"]
    for kind, flops in (("amx_bf16", 4 * 16384), ("amx_int8", 4 * 32768)):
        got = _kernels.peak(3, 1, kind)
        assert got == (3 * flops if real and got > 0 else -1)
        if not real:
            assert got == -1
    with pytest.raises(ValueError, match="peak: kind must be one of vdpbf16ps, fma"):
        _kernels.peak(1, 1, "tdp")
