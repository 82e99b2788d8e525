"""Attention with finite scores at the edge of float32: |q . k * scale| up to ~3.4e38, reachable
with a head dim of 1 or 2 and values ~1.7e19. The kernels work in base 2 (scores times log2 e),
where such a score passes the float32 range (FLT_MAX / log2 e ~ 2.4e38), and q . k itself can
overflow on the way to a finite score (head dim 2); they must still match the float64 twin:
out, lse, the weights and the gradients, float32 and bf16, on every SIMD level and every bf16
attention path, one query row at a time (decode) and in query blocks, with and without masks.

Also softmax on the same values (its kernel works in natural units; checked so it stays so).
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from conftest import SIMD_LEVELS, assert_close, run_checks, run_isa_checks
from fastattn import ops, reference

BF16_PATHS = ("fma", "avx512bf16", "avx512bf16-decode", "amx", "amx-emulated")
F32_MAX = float(np.finfo(np.float32).max)

# out: a convex combination of v's rows (|v| <= 8 here) whose weights are 0, 1 or an even
# split (the scores differ by ~1e36 or not at all), so float32 rounding of a sum of a few terms
OUT_TOL = dict(rtol=1e-5, atol=1e-5)
# bf16: P rounded to bf16 for P.V (2^-8 relative), and in the rows of ordinary scores a score
# formed in float32 rather than float64 can move P across a rounding boundary: 2^-7 of max|v|,
# the size of test_ops_attention_bf16's bound for scores of size ~1
OUT_ATOL_BF16 = 2.0 ** -7
# lse ~ 3e38: the kernels keep scores past 2^127 (base 2) compressed 8 to 1 (csrc/attention.c),
# so a stored score carries 8 float32 ulps of its value, ~5e-7 relative
LSE_TOL = dict(rtol=2e-6, atol=0.0)
# weights: 0, 1 or 1/n, from exp2 of exactly representable differences
W_TOL = dict(rtol=1e-5, atol=1e-6)
# dq, dk, dv: sums of dS = P (dP - Delta) (P in {0, 1, 1/n}, dout and v ~ 1) times k or q (up to
# ~1e19), which cancel to 0 in a tie: relative to the size of one term (grad_scale); float32
# rounds each to ~1e-7 of that
GRAD_RTOL = 1e-4

BIG = 1.7e19     # BIG * BIG ~ 2.89e38: past FLT_MAX / log2 e with a head dim of 1


def _head(rows, D=1):
    """(1, 1, L, D) float32 from a list of rows (or of scalars, repeated over D)."""
    a = np.array(rows, np.float64).reshape(len(rows), -1)
    if a.shape[1] == 1:
        a = np.repeat(a, D, axis=1)
    return a.astype(np.float32)[None, None]


def cases():
    """(name, q, k, v, kwargs): scores at +-3e38 (base 2 past FLT_MAX), at +-1.5e38 (base 2
    between 2^127 and FLT_MAX), ties, mixes with ordinary scores, head dim 2 whose float32 q . k
    overflows (or cancels inf - inf) though the score is finite, and masks on top."""
    rng = np.random.default_rng(42)
    out = []
    k1 = 3e38 / BIG                                  # q . k = +-3e38 with q = BIG
    for Lq in (1, 40):                                # decode rows, query blocks
        q = _head([BIG] * Lq)
        for name, ks in [("one_neg", [-k1]), ("one_pos", [k1]),
                         ("two_pos", [k1, 2.9e38 / BIG]), ("two_neg", [-k1, -2.9e38 / BIG]),
                         ("tie_pos", [k1, k1]), ("tie_neg", [-k1, -k1]),
                         ("pos_neg", [k1, -k1]), ("pos_zero", [k1, 0.0]),
                         ("neg_zero_small", [-k1, 0.0, 1e-19]),
                         ("mid", [1.5e38 / BIG, 1.4e38 / BIG]),
                         ("mid_neg", [-1.5e38 / BIG, -1.4e38 / BIG]),
                         ("mid_tie", [1.5e38 / BIG, 1.5e38 / BIG, -1.5e38 / BIG])]:
            k = _head(ks)
            v = _head([[i + 1.0, -2.0 * (i + 1)] for i in range(len(ks))])
            out.append((f"{name}_L{Lq}", q, k, v, {}))
        # scores ~1.7e18: ordinary for float32, but an lse past ATT_LSE_MAX, so the backward
        # recomputes each row's max, which must match its pairs' scores to the bit
        out.append((f"large_L{Lq}", _head([-0.10348827] * Lq),
                    _head([-1.6656543e19, 1.5e19, -1.0]),
                    _head([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]), {}))
        # head dim 2: q . k = 4.5e38 overflows float32, the score (times 1/sqrt 2) is 3.18e38;
        # and q . k = inf - inf (NaN in float32) whose score is 0 next to one of 1
        q2 = _head([[1.5e19, 1.5e19]] * Lq)
        k2 = _head([[1.5e19, 1.5e19], [-1.5e19, -1.5e19], [0.0, 0.0]])
        v2 = _head([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        out.append((f"d2_overflow_L{Lq}", q2, k2, v2, {}))
        q3 = _head([[2e19, 2e19]] * Lq)
        k3 = _head([[2e19, -2e19], [1e-19, 1e-19]])
        v3 = _head([[1.0, 2.0], [3.0, 4.0]])
        out.append((f"d2_cancel_L{Lq}", q3, k3, v3, {}))
        # masks: padding hides the largest key; a float mask adds +3e38 to a -3e38 score (0
        # in the twin) and finfo.min to an ordinary one
        k = _head([k1, -k1, 1.0 / BIG])
        v = _head([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        out.append((f"padding_L{Lq}", q, k, v,
                    {"key_padding_mask": np.array([[True, False, False]])}))
        mask = np.zeros((Lq, 3), np.float32)
        mask[:, 1] = 3e38
        mask[:, 2] = -F32_MAX
        out.append((f"float_mask_L{Lq}", q, k, v, {"mask": mask}))
        out.append((f"key_bias_L{Lq}", q, k, v,
                    {"key_padding_mask": np.array([[0.0, 3e38, -F32_MAX]], np.float32)}))
    # random scores in +-[1e38, 3.2e38] among ordinary ones, every mask kind, causal, a few
    # heads, more queries than one block holds
    B, H, L = 2, 2, 37
    mag = rng.uniform(1e19, 1.78e19, (B, H, L, 1)) * rng.choice([-1.0, 1.0], (B, H, L, 1))
    small = rng.standard_normal((B, H, L, 1))
    q = np.where(rng.random((B, H, L, 1)) < 0.7, mag, small).astype(np.float32)
    k = np.where(rng.random((B, H, L, 1)) < 0.7, mag[:, :, ::-1], small).astype(np.float32)
    v = rng.standard_normal((B, H, L, 3)).astype(np.float32)
    out.append(("random", q, k, v, {}))
    out.append(("random_causal", q, k, v, {"causal": True}))
    pad = rng.random((B, L)) < 0.2
    out.append(("random_padding", q, k, v, {"key_padding_mask": pad}))
    out.append(("random_decode", q[:, :, :1], k, v, {"key_padding_mask": pad}))
    return out


def grad_scale(expected, dout, v, other):
    """The size of one term of a gradient's sums: |dout| |v| (dS's two parts) times |k| for dq,
    |q| for dk (scale = 1 / sqrt(D) <= 1 left out), |dout| for dv; at least its largest value."""
    term = float(np.max(np.abs(dout)))
    if other is not None:
        term *= 2.0 * float(np.max(np.abs(v))) * float(np.max(np.abs(other)))
    return max(1.0, term, float(np.max(np.abs(expected))))


def _grads(q, k, v, kw, compute_type):
    """(dq, dk, dv) of the kernels and of the twin, and dout (1, 2, 3 over the output)."""
    out, cache = ops.attention_forward(q, k, v, compute_type=compute_type, **kw)
    ref_out, ref_cache = reference.attention_forward(q, k, v, compute_type=compute_type, **kw)
    dout = (1.0 + np.arange(out.size, dtype=np.float32).reshape(out.shape) % 3)
    fast = ops.attention_backward(dout, q, k, v, out, cache["lse"], compute_type=compute_type,
                                  **kw)
    ref = reference.attention_backward(dout, q, k, v, ref_out, ref_cache["lse"],
                                       compute_type=compute_type, **kw)
    return fast, ref, dout


def extreme_case_checks(name, q, k, v, kw, ct, backward=True):
    """One case through ops and the twin: out, lse, weights and (backward) dq, dk, dv; no NaN
    anywhere the twin has none."""
    tag = f"{name}/{ct}"
    out, cache = ops.attention_forward(q, k, v, compute_type=ct, **kw)
    ref_out, ref_cache = reference.attention_forward(q, k, v, compute_type=ct, **kw)
    tol = OUT_TOL if ct == "float32" else dict(
        # bf16: absolute only, OUT_ATOL_BF16 of the values' size (see there)
        rtol=0.0, atol=OUT_ATOL_BF16 * max(1.0, float(np.max(np.abs(v)))))
    assert_close(out, ref_out, name=f"{tag} out", equal_nan=False, **tol)
    assert_close(cache["lse"], ref_cache["lse"], name=f"{tag} lse", **LSE_TOL)
    _, w = ops.attention(q, k, v, return_weights=True, compute_type=ct, **kw)
    _, ref_w = reference.attention(q, k, v, return_weights=True, compute_type=ct, **kw)
    assert_close(w, ref_w, name=f"{tag} weights", equal_nan=False, **W_TOL)
    if not backward:
        return
    fast, ref, dout = _grads(q, k, v, kw, ct)
    for g, r, gname, other in zip(fast, ref, ("dq", "dk", "dv"), (k, q, None)):
        assert_close(g, r, rtol=GRAD_RTOL, atol=GRAD_RTOL * grad_scale(r, dout, v, other),
                     name=f"{tag} {gname}", equal_nan=False)


def extreme_checks(compute_types=("float32", "bfloat16"), backward=True):
    """Every case of cases() through extreme_case_checks."""
    for name, q, k, v, kw in cases():
        for ct in compute_types:
            extreme_case_checks(name, q, k, v, kw, ct, backward)


def bf16_path_checks():
    """In a child under FASTATTN_ATTENTION_BF16_PATH: the bf16 cases on that path."""
    extreme_checks(compute_types=("bfloat16",))


@pytest.mark.parametrize("compute_type", ["float32", "bfloat16"])
def test_extreme_scores_match_the_twin(compute_type):
    extreme_checks(compute_types=(compute_type,))


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_extreme_scores_every_simd_level(isa):
    run_isa_checks(isa, "test_ops_attention_extremes", "extreme_checks")


@pytest.mark.parametrize("path", BF16_PATHS)
def test_extreme_scores_every_bf16_attention_path(path):
    available = fastattn.build_info()["attention_bf16_paths_available"]
    if path not in available:
        pytest.skip(f"the {path} attention path is not available here ({available})")
    run_checks("test_ops_attention_extremes", "bf16_path_checks",
               {"FASTATTN_ATTENTION_BF16_PATH": path})


# distinct score levels, ~1e37 apart or more, so that the twin's weights are 0, 1 or an even
# split among equal levels, as float32's are (no two levels round to one float32 score)
LEVELS = (3.3e38, 3e38, 2.7e38, 2e38, 1.5e38, 1e38, 1.0, 0.0, -1.0, -1e38, -1.5e38, -2e38,
          -2.7e38, -3e38, -3.3e38)


@given(Lq=st.sampled_from([1, 3, 40]), data=st.data(),
       compute_type=st.sampled_from(["float32", "bfloat16"]), causal=st.booleans())
def test_extreme_score_levels_match_the_twin(Lq, data, compute_type, causal):
    """Any mix of the levels over the keys (ties included), per query a sign of q, optionally
    causal and with padding: out, lse and gradients as the twin's."""
    Lk = data.draw(st.integers(Lq if causal else 1, 40), label="Lk")
    levels = np.array(data.draw(st.lists(st.sampled_from(LEVELS), min_size=Lk, max_size=Lk),
                                label="levels"))
    signs = np.array(data.draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=Lq,
                                        max_size=Lq), label="signs"))
    pad = np.array(data.draw(st.lists(st.booleans(), min_size=Lk, max_size=Lk), label="pad"))
    q = (signs * BIG).astype(np.float32).reshape(1, 1, Lq, 1)
    k = (levels / BIG).astype(np.float32).reshape(1, 1, Lk, 1)
    v = np.stack([np.arange(Lk), -np.arange(Lk) / 2], axis=1).astype(np.float32)[None, None]
    extreme_case_checks("levels", q, k, v, {"causal": causal, "key_padding_mask": pad[None]},
                        compute_type)


@pytest.mark.parametrize("row", [[3e38, 3e38], [-3e38], [-3e38, -2.9e38], [3e38, -3e38],
                                 [3e38, 2.9e38], [-F32_MAX, -F32_MAX, 0.0], [2.5e38] * 40,
                                 [-2.5e38] * 3 + [-2.4e38]])
def test_softmax_extreme_values_match_the_twin(row):
    x = np.array([row], np.float32)
    assert_close(ops.softmax(x), reference.softmax(x), name="softmax", equal_nan=False,
                 **W_TOL)


# One extreme score alone in a block of ordinary ones, at query lanes across every vector of a
# query block (64 queries at most, plus a tail block) and keys across the register tiles of two
# key blocks: the tiled pass notices it whichever lane and tile it sits in. (q_p, k_m) pairs:
# float32 q . k overflowing to +inf, to -inf, products inf - inf (NaN), and base-2 scores past
# 2^127 that float32 still holds (+ and -).
LONE_KINDS = {"pos_inf": ((1.5e19, 1.5e19), (1.5e19, 1.5e19)),
              "neg_inf": ((1.5e19, 1.5e19), (-1.5e19, -1.5e19)),
              "nan": ((2e19, 2e19), (2e19, -2e19)),
              "wide_pos": ((1e19, 1e19), (1e19, 1e19)),
              "wide_neg": ((1e19, 1e19), (-1e19, -1e19))}
LONE_LANES = (0, 5, 15, 16, 31, 33, 47, 50, 63, 64, 69)


def lone_extreme_checks():
    """Each kind of LONE_KINDS at each query lane of LONE_LANES (a key for each in another
    register tile), float32 and bf16, against the twin."""
    rng = np.random.default_rng(7)
    Lq, Lk = 70, 197
    base_q = rng.standard_normal((1, 1, Lq, 2)).astype(np.float32)
    base_k = rng.standard_normal((1, 1, Lk, 2)).astype(np.float32)
    v = rng.standard_normal((1, 1, Lk, 3)).astype(np.float32)
    for kind, (qp, km) in LONE_KINDS.items():
        for p in LONE_LANES:
            m = (p * 37 + 11) % Lk
            q, k = base_q.copy(), base_k.copy()
            q[0, 0, p], k[0, 0, m] = qp, km
            for ct in ("float32", "bfloat16"):
                extreme_case_checks(f"lone_{kind}_q{p}_k{m}", q, k, v, {}, ct, backward=False)


def test_lone_extreme_score_in_any_lane():
    lone_extreme_checks()


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_lone_extreme_score_in_any_lane_every_simd_level(isa):
    run_isa_checks(isa, "test_ops_attention_extremes", "lone_extreme_checks")
