"""attention(..., compute_type="bfloat16") against the NumPy twin, on every code path.

The twin rounds q, k, v and P exactly as the kernels do (reference.bfloat16_round) and sums in
float64; the kernels sum in float32, in an order of their own (per path). The bound, per
output element (i, e), with u = 2^-24, M the largest |score| of the problem (masks added), W
the twin's weights P / l and |v^| the rounded values:

  scores: |ds| <= (D + 4) u M (D exact products summed in float32, the scale, the masks), so
          P, l and the weights carry a relative error delta = 2 (D + 4) u M + 16 u (exp2's
          own error included);
  P^:     the two P may round to neighbouring bf16 (a "flip", when P lies within delta of a
          rounding midpoint): |dP^| <= (2^-7 + delta) P;
  out:    Lk products summed in float32 (and the online softmax's rescales):
          |dout| <= (2^-7 + 2 delta + (Lk + 16) u) (W |v^|) + (delta + (Lk + 16) u) |out|.

The 2^-7 term only ever shows where a flip happens; test_p_is_rounded checks on a problem
whose P sit far from midpoints that the kernel is far closer to the twin than to the same
twin without the rounding of P (and test_inputs_are_rounded that the kernel rounds q, k, v:
pre-rounded inputs give the same bits).
"""
import math
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings

import fastattn
from conftest import TESTS, assert_close, requires_torch, run_child
from fastattn import _fast, ops, reference
from strategies import AttentionProblem, attention_problems, build_attention, rand
from tolerances import TOL

U = 2.0 ** -24
BF16 = dict(compute_type="bfloat16")
BF16_TOL = TOL["attention_bf16"]
AVAILABLE = fastattn.build_info()["simd_available"]
BF16_PATHS = fastattn.build_info()["attention_bf16_paths_available"]


def bf16_tolerance(q, k, v, mask=None, key_padding_mask=None, causal=False, scale=None):
    """(out atol array, weights rtol) of the bound in the module docstring."""
    B, H, Lq, D = np.shape(q)
    Lk = np.shape(k)[2]
    qh, kh, vh = (reference.bfloat16_round(t).astype(np.float64) for t in (q, k, v))
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    with np.errstate(invalid="ignore", over="ignore"):
        M = np.abs(qh) @ np.swapaxes(np.abs(kh), -1, -2) * abs(sc)            # (B,H,Lq,Lk)
        for m in (mask, None if key_padding_mask is None
                  else np.asarray(key_padding_mask)[:, None, None, :]):
            if m is not None and np.asarray(m).dtype != np.bool_:
                M = M + np.where(np.isfinite(m), np.abs(np.asarray(m, np.float64)), 0.0)
    finite = M[np.isfinite(M)]
    Mmax = max(1.0, float(finite.max(initial=0.0)))
    delta = 2 * (D + 4) * U * Mmax + 16 * U
    _, w = reference.attention(q, k, v, mask=mask, key_padding_mask=key_padding_mask,
                               causal=causal, scale=scale, return_weights=True, **BF16)
    w = np.nan_to_num(w.astype(np.float64))
    A = w @ np.where(np.isfinite(vh), np.abs(vh), 0.0)                          # (B,H,Lq,Dv)
    out = np.nan_to_num(reference.attention(q, k, v, mask=mask,
                                            key_padding_mask=key_padding_mask, causal=causal,
                                            scale=scale, **BF16).astype(np.float64))
    atol = (2.0 ** -7 + 2 * delta + (Lk + 16) * U) * A + (delta + (Lk + 16) * U) * np.abs(out)
    return atol + 1e-30, 2 * delta + (Lk + 16) * U


def check_bf16(q, k, v, *, weights=True, **kwargs):
    """ops vs reference in bf16: out (and weights) within the bound. Returns the kernel's out."""
    atol, w_rtol = bf16_tolerance(q, k, v, **kwargs)
    ref = reference.attention(q, k, v, return_weights=weights, **kwargs, **BF16)
    got = ops.attention(q, k, v, return_weights=weights, **kwargs, **BF16)
    if not weights:
        ref, got = (ref, None), (got, None)
    assert_close(got[0], ref[0], rtol=BF16_TOL["out_rtol"], atol=atol, name="out (bf16)")
    if weights:
        assert_close(got[1], ref[1], rtol=w_rtol, atol=BF16_TOL["weights_atol"],
                     name="weights (bf16)")
    return got[0]


# ----------------------------------------------------------------------------------------------
# the API


def test_compute_type_checked():
    q = np.zeros((1, 1, 2, 4), np.float32)
    for F in (ops, reference):
        with pytest.raises(ValueError, match="compute_type must be one of 'float32', 'bfloat16'"):
            F.attention(q, q, q, compute_type="bf16")
        with pytest.raises(ValueError, match="compute_type must be one of"):
            F.attention(q, q, q, compute_type=None)
        F.attention(q, q, q, compute_type="float32")


def test_float32_is_the_default(rng):
    q, k, v = (rand(rng, (2, 2, 9, 16)) for _ in range(3))
    assert np.array_equal(ops.attention(q, k, v), ops.attention(q, k, v, compute_type="float32"))


def test_bfloat16_round_matches_the_instruction_rules():
    # nearest even; subnormals to +-0; NaN quiet; past 3.3895e38 + half an ulp: inf
    x = np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20, 1e-40, -1e-40,
                  3.3961e38, 3.3963e38, -3.4e38, np.inf, np.nan, 2.0 ** -126, -0.0], np.float32)
    want = np.array([1.0, 1.0 + 2 ** -6, 1.0 + 2 ** -7, 0.0, -0.0, 3.3895314e38, np.inf,
                     -np.inf, np.inf, np.nan, 2.0 ** -126, -0.0], np.float32)
    got = reference.bfloat16_round(x)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    bits = reference.bfloat16_round(np.float32(np.frombuffer(
        np.uint32(0x7f800001).tobytes(), np.float32)[0])).view(np.uint32)
    assert bits == 0x7fc00000                     # a signalling NaN comes back quiet, not inf


# ----------------------------------------------------------------------------------------------
# against the twin


@settings(max_examples=2 * settings.default.max_examples)
@given(p=attention_problems(max_len=200))
def test_bf16_matches_reference(p):
    check_bf16(p.q, p.k, p.v, **p.kwargs())


def test_inputs_are_rounded(rng):
    # rounding is idempotent: pre-rounded inputs give the same bits, on both passes
    for Lq in (1, 3, 100):
        q, k, v = rand(rng, (2, 2, Lq, 33)), rand(rng, (2, 2, 150, 33)), rand(rng, (2, 2, 150, 9))
        got = ops.attention(q, k, v, causal=True, **BF16)
        pre = ops.attention(*(reference.bfloat16_round(t) for t in (q, k, v)), causal=True,
                            **BF16)
        assert np.array_equal(got, pre)
        assert not np.array_equal(got, ops.attention(q, k, v, causal=True))


def test_p_is_rounded(rng):
    # the kernel follows the twin's rounding of P: much closer to it than to the twin with P
    # left float32 (same scores, same sums)
    q, k, v = rand(rng, (2, 4, 96, 16)), rand(rng, (2, 4, 200, 16)), rand(rng, (2, 4, 200, 16))
    got = ops.attention(q, k, v, **BF16).astype(np.float64)
    twin = reference.attention(q, k, v, **BF16).astype(np.float64)
    qh, kh, vh = (reference.bfloat16_round(t).astype(np.float64) for t in (q, k, v))
    unrounded = reference.attention(qh, kh, vh).astype(np.float64)
    # (medians: the rows where a flip happened sit between the two)
    assert np.median(np.abs(got - twin)) < 0.02 * np.median(np.abs(got - unrounded))


def test_equal_scores_average_the_rounded_values(rng):
    # q = 0: every P is exactly 1, out = mean of v^ (float32 sums only)
    k, v = rand(rng, (1, 2, 77, 8)), rand(rng, (1, 2, 77, 21))
    out = ops.attention(np.zeros((1, 2, 5, 8), np.float32), k, v, **BF16)
    want = reference.bfloat16_round(v).astype(np.float64).mean(axis=2, keepdims=True)
    assert_close(out, np.broadcast_to(want, out.shape), rtol=100 * U, atol=100 * U)


@pytest.mark.parametrize("Lq,Lk,D,Dv", [(1, 1, 1, 1), (1, 300, 7, 3), (3, 65, 63, 65),
                                        (17, 5, 2, 130), (200, 193, 64, 64), (70, 250, 33, 17)])
@pytest.mark.parametrize("causal", [False, True])
def test_odd_shapes(rng, Lq, Lk, D, Dv, causal):
    q, k, v = rand(rng, (2, 2, Lq, D)), rand(rng, (2, 2, Lk, D)), rand(rng, (2, 2, Lk, Dv))
    check_bf16(q, k, v, causal=causal)


@pytest.mark.parametrize("Lq", [1, 4, 100])
def test_fully_masked_rows_and_nan(rng, Lq):
    # a row with no key gives zeros; NaN in q (or a visible v) propagates; NaN, inf or a value
    # that rounds to inf in a hidden key's rows stays out, as in float32
    B, H, Lk, D = 2, 2, 40, 16
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, D))
    kpm = np.zeros((B, Lk), bool)
    kpm[0] = True                                    # batch 0 sees nothing
    kpm[1, 3:6] = True
    k[1, :, 3], v[1, :, 4], v[1, :, 5] = np.nan, np.inf, 3.3963e38   # hidden keys' rows
    q[1, 0, 0, 2] = np.nan                                           # one query row
    out = check_bf16(q, k, v, key_padding_mask=kpm)
    assert (out[0] == 0).all()
    assert np.isnan(out[1, 0, 0]).all() and np.isfinite(out[1, 1]).all()
    v[1, 1, 7, 0] = np.nan                                           # a visible key
    out = check_bf16(q, k, v, key_padding_mask=kpm)
    assert np.isnan(out[1, 1, :, 0]).all()


def test_huge_magnitudes(rng):
    # values near the float32 limit: inf after rounding, as vcvtneps2bf16 gives
    q, k, v = rand(rng, (1, 2, 6, 8)), rand(rng, (1, 2, 30, 8)), rand(rng, (1, 2, 30, 8))
    v[0, 0, 2, 1] = 3.3963e38                        # rounds to inf: that feature goes inf
    v[0, 1, :, :] *= 1e37                            # large finite values stay finite
    out = check_bf16(q, k, v)
    assert np.isinf(out[0, 0, :, 1]).all() and np.isfinite(out[0, 1]).all()
    ref32 = ops.attention(q, k, v)
    assert np.isfinite(ref32[0, 0, :, 1]).all()      # float32 itself keeps 3.3963e38 finite


def test_masks_of_every_kind():
    kinds = ("none", "bool_full", "bool_broadcast", "additive", "key_padding",
             "key_padding_float")
    for i, kind in enumerate(kinds):
        for Lq, Lk in ((1, 70), (5, 33), (80, 130)):
            p = build_attention(AttentionProblem(2, 2, Lq, Lk, 24, 12, kind, kind != "none",
                                                 i % 2 == 0, kind != "none", 1.0, 100 + i))
            check_bf16(p.q, p.k, p.v, **p.kwargs())


# ----------------------------------------------------------------------------------------------
# threads, the decode step, the fast-path entries


def test_threads_give_the_same_bits(rng, restore_threads):
    q, k, v = rand(rng, (2, 3, 130, 40)), rand(rng, (2, 3, 200, 40)), rand(rng, (2, 3, 200, 24))
    outs = []
    for n in (1, 2):
        fastattn.set_num_threads(n)
        outs.append([ops.attention(q[:, :, :Lq], k, v, causal=True, return_weights=True, **BF16)
                     for Lq in (1, 130)])
    for (o1, w1), (o2, w2) in zip(*outs):
        assert np.array_equal(o1, o2) and np.array_equal(w1, w2)


def test_decode_steps_match_the_full_forward(rng):
    # the one-row pass (decode step over a KV cache) against the last rows of the tiled one
    B, H, L, D = 2, 4, 150, 64
    q, k, v = rand(rng, (B, H, L, D)), rand(rng, (B, H, L, D)), rand(rng, (B, H, L, D))
    full = ops.attention(q, k, v, causal=True, **BF16)
    atol, _ = bf16_tolerance(q, k, v, causal=True)
    for t in (0, 1, 64, L - 1):
        step = ops.attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], **BF16)
        assert_close(step, full[:, :, t:t + 1], rtol=BF16_TOL["out_rtol"],
                     atol=TOL["attention_bf16_two_paths"] * atol[:, :, t:t + 1], name=f"step {t}")


def test_fast_path_entries(rng):
    # the model layer's entries: attention_into (any strides) and attention_fn (decode step)
    B, H, Lq, Lk, D = 2, 3, 5, 60, 32
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, D))
    kpm = np.zeros((B, Lk), bool)
    kpm[1, -7:] = True
    key_bias = np.where(kpm, np.float32(-np.inf), np.float32(0)).reshape(-1)
    want = ops.attention(q, k, v, key_padding_mask=kpm, **BF16)
    buf = np.zeros((B, Lq, H, D), np.float32)                 # (B, L, H, D) head-major views
    out = _fast.attention_into(buf.transpose(0, 2, 1, 3), q, k, v, None, key_bias, False,
                               1.0 / math.sqrt(D), bf16=True)
    assert np.array_equal(out, want)
    attend = _fast.attention_fn(1.0 / math.sqrt(D), bf16=True)
    step = attend(q[:, :, :1], k, v, key_bias, np.empty((B, H, 1, D), np.float32))
    # against the op on the same one query (on AVX2 the 5 queries above take the tiled pass,
    # whose sums run in another order than the one-row pass's)
    assert np.array_equal(step, ops.attention(q[:, :, :1], k, v, key_padding_mask=kpm, **BF16))
    assert not np.array_equal(step, _fast.attention_fn(1.0 / math.sqrt(D))(
        q[:, :, :1], k, v, key_bias, np.empty((B, H, 1, D), np.float32)))


# ----------------------------------------------------------------------------------------------
# every path, forced in a fresh interpreter

CHILD = textwrap.dedent(r"""
    import sys
    import numpy as np
    import fastattn
    from fastattn import ops
    isa, path, out_file, tests_dir = sys.argv[1:5]
    sys.path.insert(0, tests_dir)
    from strategies import AttentionProblem, build_attention
    info = fastattn.build_info()
    assert info["simd"] == isa and info["attention_bf16_path"] == path, info
    res = {}
    kinds = ("none", "bool_full", "additive", "key_padding")
    shapes = [(1, 1, 7, 3), (3, 200, 64, 64), (100, 130, 33, 17), (65, 65, 16, 9),
              (1, 500, 64, 64), (129, 250, 80, 80)]
    for n in (1, 2):
        fastattn.set_num_threads(n)
        for s, (Lq, Lk, D, Dv) in enumerate(shapes):
            for c, kind in enumerate(kinds):
                p = build_attention(AttentionProblem(2, 2, Lq, Lk, D, Dv, kind, False,
                                                     (s + c) % 2 == 0, False, 1.0, 10 * s + c))
                o, w = ops.attention(p.q, p.k, p.v, return_weights=True,
                                     compute_type="bfloat16", **p.kwargs())
                res[f"{n}_{s}_{c}_out"], res[f"{n}_{s}_{c}_w"] = o, w
    # one call of several query blocks per head (the fma path rounds k and v once for all of
    # them) against one call per block (each rounding its own): a query's lane never meets
    # another's, so the bits must be the same
    bq = {"generic": 8, "avx2": 16, "avx512": 64}[isa]      # queries per block (fa_tiles.h)
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 3, L, d)).astype(np.float32)
               for L, d in ((128, 40), (150, 40), (150, 24)))
    pad = rng.random((2, 150)) < 0.2
    res["blocks_whole"] = np.concatenate(ops.attention(
        q, k, v, key_padding_mask=pad, return_weights=True, compute_type="bfloat16"), axis=-1)
    res["blocks_apart"] = np.concatenate([np.concatenate(ops.attention(
        q[:, :, i:i + bq], k, v, key_padding_mask=pad, return_weights=True,
        compute_type="bfloat16"), axis=-1) for i in range(0, 128, bq)], axis=2)
    np.savez(out_file, **res)
""")


def _paths():
    for isa in ("generic", "avx2", "avx512"):
        for path in ("fma", "avx512bf16", "avx512bf16-decode", "amx", "amx-emulated"):
            if path != "fma" and isa != "avx512":
                continue
            yield isa, path


@pytest.mark.parametrize("isa,path", list(_paths()))
def test_each_path_matches_reference(tmp_path, isa, path):
    if isa not in AVAILABLE or (isa == "avx512" and path not in BF16_PATHS):
        pytest.skip(f"{isa}/{path} is not available on this CPU/build")
    res = _child_results(tmp_path, isa, path)
    kinds = ("none", "bool_full", "additive", "key_padding")
    shapes = [(1, 1, 7, 3), (3, 200, 64, 64), (100, 130, 33, 17), (65, 65, 16, 9),
              (1, 500, 64, 64), (129, 250, 80, 80)]
    for s, (Lq, Lk, D, Dv) in enumerate(shapes):
        for c, kind in enumerate(kinds):
            p = build_attention(AttentionProblem(2, 2, Lq, Lk, D, Dv, kind, False,
                                                 (s + c) % 2 == 0, False, 1.0, 10 * s + c))
            atol, w_rtol = bf16_tolerance(p.q, p.k, p.v, **p.kwargs())
            ref_o, ref_w = reference.attention(p.q, p.k, p.v, return_weights=True,
                                               **p.kwargs(), **BF16)
            name = f"{isa}/{path} {p!r}"
            assert_close(res[f"1_{s}_{c}_out"], ref_o, rtol=BF16_TOL["out_rtol"], atol=atol,
                         name=name)
            assert_close(res[f"1_{s}_{c}_w"], ref_w, rtol=w_rtol, atol=BF16_TOL["weights_atol"],
                         name=name)
            assert np.array_equal(res[f"1_{s}_{c}_out"], res[f"2_{s}_{c}_out"]), name
            assert np.array_equal(res[f"1_{s}_{c}_w"], res[f"2_{s}_{c}_w"]), name
    assert np.array_equal(res["blocks_whole"], res["blocks_apart"]), f"{isa}/{path} blocks"


_CHILD_RESULTS = {}


def _child_results(tmp_path, isa, path):
    """CHILD's results under a forced SIMD level and path, run once per module for each pair
    (the amx pair is compared with the twin and with its emulation by two tests; the emulated
    tiles' run is the slowest here)."""
    key = (isa, path)
    if key not in _CHILD_RESULTS:
        out_file = tmp_path / f"{isa}-{path}.npz"
        proc = run_child(CHILD, isa, path, out_file, TESTS, timeout=300,
                         env={"FASTATTN_CPU_ISA": isa, "FASTATTN_ATTENTION_BF16_PATH": path})
        assert proc.returncode == 0, proc.stderr[-3000:]
        with np.load(out_file) as f:
            _CHILD_RESULTS[key] = {name: f[name] for name in f.files}
    return _CHILD_RESULTS[key]


def test_amx_tiles_match_their_emulation(tmp_path):
    """The amx path and its C emulation (which CI runs on any AVX-512 CPU) give the same bits."""
    if "amx" not in BF16_PATHS:
        pytest.skip("no AMX tiles granted here")
    real, emulated = (_child_results(tmp_path, "avx512", p) for p in ("amx", "amx-emulated"))
    assert sorted(real) == sorted(emulated)
    for name in real:
        assert np.array_equal(real[name], emulated[name], equal_nan=True), name


def test_forcing_an_unknown_path_fails():
    proc = run_child("import fastattn", env={"FASTATTN_ATTENTION_BF16_PATH": "tiles"},
                     timeout=120)
    assert proc.returncode != 0 and "FASTATTN_ATTENTION_BF16_PATH='tiles'" in proc.stderr


def test_forcing_a_path_the_cpu_lacks_fails():
    """amx on a CPU or SIMD level without the tiles is refused by name, with what is there."""
    proc = run_child("import fastattn", timeout=120,
                     env={"FASTATTN_CPU_ISA": "avx2", "FASTATTN_ATTENTION_BF16_PATH": "amx"})
    if "avx2" not in AVAILABLE:
        pytest.skip("no avx2 level here")
    assert proc.returncode != 0
    assert "FASTATTN_ATTENTION_BF16_PATH=amx" in proc.stderr and "available: fma" in proc.stderr


# ----------------------------------------------------------------------------------------------
# the error of bf16 next to torch's


@pytest.mark.parametrize("L,D", [(128, 64), (1, 64), (300, 80)])
def test_error_next_to_torch_bf16(rng, L, D):
    # relative error (Frobenius, against float64) of our bf16 attention and of torch's
    # scaled_dot_product_attention on bf16 tensors, same inputs: ours keeps P's sum, the
    # output and the accumulator in float32 (torch's output is bf16 too), so it is no worse
    torch = requires_torch()
    B, H, Lk = 4, 8, max(L, 128)
    q, k, v = rand(rng, (B, H, L, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, D))
    exact = reference.attention(q.astype(np.float64), k, v).astype(np.float64)

    def rel(x):
        return float(np.linalg.norm(np.asarray(x, np.float64) - exact) / np.linalg.norm(exact))

    ours = rel(ops.attention(q, k, v, **BF16))
    with torch.inference_mode():
        tq, tk, tv = (torch.from_numpy(t).to(torch.bfloat16) for t in (q, k, v))
        theirs = rel(torch.nn.functional.scaled_dot_product_attention(tq, tk, tv).float())
    fp32 = rel(ops.attention(q, k, v))
    msg = f"relative error: fastattn bf16 {ours:.2e}, torch bf16 {theirs:.2e}, fp32 {fp32:.2e}"
    assert fp32 < ours < 1.1 * theirs, msg
    assert ours < 2.0 ** -7, msg
