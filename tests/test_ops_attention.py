"""fastattn.ops.attention / attention_forward (the fused C kernel) against the NumPy twin.

Tolerances: the kernel works in float32, the reference in float64. The output is a convex
combination of the rows of v, so its absolute error scales with max|v|; each weight carries a
relative error of about eps * |score| (the scores are rounded, then exponentiated), so the
tolerance also grows with the largest |score| of the problem.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings

from conftest import (SEED002_MASK, SEED002_SCORES, TILES, assert_close, requires_torch,
                      sdpa_masks, to_torch)
from fastattn import ops, reference
from strategies import AttentionProblem, attention_problems, build_attention, rand
from tolerances import TOL, attention_tols

# ----------------------------------------------------------------------------------------------
# helpers


def check_attention(q, k, v, *, weights=False, **kwargs):
    """ops vs reference: attention_forward's out and lse, and optionally attention's weights.
    Returns the kernel's (out, lse)."""
    t_out, t_w, t_lse = attention_tols(q, k, v, kwargs.get("scale"))
    out, cache = ops.attention_forward(q, k, v, **kwargs)
    ref_out, ref_cache = reference.attention_forward(q, k, v, **kwargs)
    assert_close(out, ref_out, name="out", **t_out)
    assert_close(cache["lse"], ref_cache["lse"], name="lse", **t_lse)
    if weights:
        out_w, w = ops.attention(q, k, v, return_weights=True, **kwargs)
        _, ref_w = reference.attention(q, k, v, return_weights=True, **kwargs)
        assert_close(out_w, ref_out, name="out (return_weights)", **t_out)
        assert_close(w, ref_w, name="weights", **t_w)
    else:
        assert_close(ops.attention(q, k, v, **kwargs), ref_out, name="out (attention)", **t_out)
    return out, cache["lse"]


@pytest.fixture
def qkv(rng):
    def make(B, H, Lq, Lk, D, Dv=None):
        Dv = D if Dv is None else Dv
        return (rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv)))
    return make


# ----------------------------------------------------------------------------------------------
# property tests over the shared problem generator


# The attention kernel is the most intricate: a few times the profile's example budget (each
# example takes milliseconds).
MORE_EXAMPLES = settings(max_examples=4 * settings.default.max_examples)


@MORE_EXAMPLES
@given(p=attention_problems())
def test_attention_forward_matches_reference(p):
    check_attention(p.q, p.k, p.v, **p.kwargs())


@MORE_EXAMPLES
@given(p=attention_problems(max_len=160))
def test_attention_weights_match_reference(p):
    check_attention(p.q, p.k, p.v, weights=True, **p.kwargs())


# Lengths straddling this level's query block (BQ), key block (BK) and one-row-at-a-time limit
# (R), with and without causal alignment offsets: a deterministic sweep of the tile edges.
BQ, BK, R = (TILES[key] for key in ("attention_block_q", "attention_block_k",
                                    "attention_rows_max_q"))
EDGE_LENGTHS = [(1, BK), (1, BK + 1), (R, BQ + 1), (R + 1, BQ - 1), (BQ - 1, BQ + 1), (BQ, BQ),
                (BQ + 1, BQ), (2 * BQ, 2 * BQ + 1), (2 * BQ + 1, 2 * BQ), (BK - 1, BK),
                (BK, BK), (BK + 1, BK), (BQ, 2 * BK + 1), (BK + BQ + 1, 2 * BK - 1),
                (2 * BK - 2, BK - 1), (BK + 2 * BQ + 1, BK + 3 * BQ + 1)]


@pytest.mark.parametrize("Lq,Lk", EDGE_LENGTHS)
@pytest.mark.parametrize("mask_kind", ["none", "bool_broadcast", "additive", "key_padding"])
def test_tile_edges(Lq, Lk, mask_kind):
    for causal in (False, True):
        p = build_attention(AttentionProblem(
            B=1, H=2, Lq=Lq, Lk=Lk, D=32, Dv=17, mask_kind=mask_kind, with_padding=False,
            causal=causal, fully_masked=False, magnitude=1.0, seed=Lq * 1000 + Lk))
        check_attention(p.q, p.k, p.v, weights=Lq * Lk < 20000, **p.kwargs())


# ----------------------------------------------------------------------------------------------
# explicit cases


def test_decode_single_query(qkv):
    # L = 1 decode step against a 200-key cache: causal lets the one query see every key
    q, k, v = qkv(2, 3, 1, 200, 64)
    out, lse = check_attention(q, k, v, causal=True, weights=True)
    out_nc, _ = ops.attention_forward(q, k, v)
    assert_close(out, out_nc, **TOL["attention_causal_one_row"],
                 name="causal == non-causal for Lq=1")
    assert np.isfinite(lse).all()


@pytest.mark.parametrize("Lq,Lk", [(40, 17), (129, 2), (5, 1), (BK + 1, BK)])
def test_causal_more_queries_than_keys(qkv, Lq, Lk):
    # bottom-right alignment: query i sees keys j <= i - (Lq - Lk); the first Lq - Lk see nothing
    q, k, v = qkv(2, 2, Lq, Lk, 32, 7)
    out, lse = check_attention(q, k, v, causal=True, weights=True)
    blind = Lq - Lk
    assert np.all(out[:, :, :blind] == 0), "rows with no visible key must be zeros"
    assert np.all(lse[:, :, :blind] == -np.inf), "rows with no visible key must have lse -inf"
    assert np.isfinite(out).all() and np.isfinite(lse[:, :, blind:]).all()
    _, w = ops.attention(q, k, v, causal=True, return_weights=True)
    assert np.all(w[:, :, :blind] == 0)
    assert_close(w[:, :, blind:].sum(-1), np.ones((2, 2, Lk)), **TOL["row_sums"],
                 name="row sums")


def test_key_padding_fully_masks_a_batch_element(qkv):
    q, k, v = qkv(3, 2, 33, 70, 16, 20)
    kpm = np.zeros((3, 70), dtype=bool)
    kpm[0, 50:] = True
    kpm[1] = True                                      # batch element 1: every key is padding
    kpm[2, ::3] = True
    out, lse = check_attention(q, k, v, key_padding_mask=kpm, weights=True)
    assert np.all(out[1] == 0) and np.all(lse[1] == -np.inf)
    assert np.isfinite(out).all() and np.isfinite(lse[[0, 2]]).all()
    _, w = ops.attention(q, k, v, key_padding_mask=kpm, return_weights=True)
    assert np.all(w[1] == 0) and np.all(w[0, :, :, 50:] == 0) and np.all(w[2, :, :, ::3] == 0)
    # combined with causal (Lq < Lk: every row could see keys, but batch 1 still sees none)
    out_c, lse_c = check_attention(q, k, v, key_padding_mask=kpm, causal=True)
    assert np.all(out_c[1] == 0) and np.all(lse_c[1] == -np.inf)


def test_fully_masked_rows_by_mask(qkv):
    q, k, v = qkv(2, 3, 19, 23, 8)
    mask = np.zeros((2, 3, 19, 23), dtype=bool)
    mask[0, 1, 4] = True                               # one (batch, head, query) row
    mask[:, :, 17] = True                              # a query row in every head
    for m in (mask, np.where(mask, -np.inf, 0.0)):     # bool and additive forms
        out, lse = check_attention(q, k, v, mask=m, weights=True)
        assert np.all(out[0, 1, 4] == 0) and lse[0, 1, 4] == -np.inf
        assert np.all(out[:, :, 17] == 0) and np.all(lse[:, :, 17] == -np.inf)
        assert not np.isnan(out).any()


def test_nan_in_query_row_propagates_to_that_row_only(qkv):
    # Documented behaviour: NaN in one query row makes that row's output (and lse) NaN; the
    # kernel does not check for NaN, and other rows are unaffected.
    q, k, v = qkv(1, 2, 20, 37, 16)
    q[0, 1, 5, 3] = np.nan
    out, lse = check_attention(q, k, v, causal=True)      # NaN positions must match the twin
    assert np.isnan(out[0, 1, 5]).all() and np.isnan(lse[0, 1, 5])
    others = np.ones(out.shape[:3], dtype=bool)
    others[0, 1, 5] = False
    assert not np.isnan(out[others]).any() and not np.isnan(lse[others]).any()


@pytest.mark.parametrize("causal", [False, True])
def test_nan_in_key_propagates_to_queries_that_see_it(qkv, causal):
    # a NaN score poisons every query whose softmax includes that key; causal-blocked queries
    # never see it and stay finite
    q, k, v = qkv(1, 2, 40, 40, 16, 8)
    k[0, 0, 20, 3] = np.nan
    out, lse = check_attention(q, k, v, causal=causal)
    seen = slice(20, None) if causal else slice(None)
    assert np.isnan(out[0, 0, seen]).all() and np.isnan(lse[0, 0, seen]).all()
    if causal:
        assert np.isfinite(out[0, 0, :20]).all() and np.isfinite(lse[0, 0, :20]).all()
    assert np.isfinite(out[0, 1]).all()


def test_noncontiguous_inputs_match_contiguous(rng):
    B, H, Lq, Lk, D, Dv = 2, 3, 37, 45, 16, 24
    # (B, L, H, D) layouts viewed as (B, H, L, D): strided heads, contiguous last axis
    q_t = rand(rng, (B, Lq, H, D)).transpose(0, 2, 1, 3)
    k_t = rand(rng, (B, Lk, H, D)).transpose(0, 2, 1, 3)
    v_t = rand(rng, (B, Lk, H, Dv)).transpose(0, 2, 1, 3)
    assert not q_t.flags.c_contiguous
    mask = rng.random((Lk, Lq)).T < 0.3                      # transposed (Lq, Lk) bool mask
    mask[:, 0] = False
    kpm = (rng.random((Lk, B)) < 0.2).T                      # transposed (B, Lk)
    for kwargs in ({}, {"causal": True}, {"mask": mask, "key_padding_mask": kpm}):
        out_t, lse_t = check_attention(q_t, k_t, v_t, **kwargs)
        out_c, cache_c = ops.attention_forward(np.ascontiguousarray(q_t),
                                               np.ascontiguousarray(k_t),
                                               np.ascontiguousarray(v_t), **kwargs)
        assert out_t.flags.c_contiguous
        np.testing.assert_array_equal(out_t, out_c)
        np.testing.assert_array_equal(lse_t, cache_c["lse"])

    # a last-axis-strided view (every other feature) and a sliced key range
    q_big = rand(rng, (B, H, Lq, 2 * D))
    k_big = rand(rng, (B, H, 2 * Lk, D))
    v = rand(rng, (B, H, Lk, Dv))
    q_s, k_s = q_big[..., ::2], k_big[:, :, ::2]
    out_s, lse_s = check_attention(q_s, k_s, v, causal=True)
    out_c, cache_c = ops.attention_forward(np.ascontiguousarray(q_s), np.ascontiguousarray(k_s),
                                           v, causal=True)
    np.testing.assert_array_equal(out_s, out_c)
    np.testing.assert_array_equal(lse_s, cache_c["lse"])


def test_broadcast_masks_equal_full_masks(qkv, rng):
    B, H, Lq, Lk = 2, 3, 17, 33
    q, k, v = qkv(B, H, Lq, Lk, 7, 5)
    for shape in [(Lq, Lk), (B, 1, Lq, Lk), (1, H, 1, Lk), (Lk,)]:
        m = rng.random(shape) < 0.4
        full = np.broadcast_to(m, (B, H, Lq, Lk)).copy()
        out_b, lse_b = check_attention(q, k, v, mask=m)
        out_f, cache_f = ops.attention_forward(q, k, v, mask=full)
        np.testing.assert_array_equal(out_b, out_f)
        np.testing.assert_array_equal(lse_b, cache_f["lse"])
        # bool True = blocked is exactly an additive -inf
        out_a, _ = ops.attention_forward(q, k, v, mask=np.where(m, -np.inf, 0.0))
        np.testing.assert_array_equal(out_b, out_a)


def test_float64_input_returns_float32(qkv):
    q, k, v = qkv(2, 2, 9, 11, 8)
    out64, cache64 = ops.attention_forward(q.astype(np.float64), k.astype(np.float64),
                                           v.astype(np.float64), causal=True)
    assert out64.dtype == np.float32 and cache64["lse"].dtype == np.float32
    out32, cache32 = ops.attention_forward(q, k, v, causal=True)
    np.testing.assert_array_equal(out64, out32)
    np.testing.assert_array_equal(cache64["lse"], cache32["lse"])
    out, w = ops.attention(q.astype(np.float64), k, v.astype(np.float16), return_weights=True)
    assert out.dtype == np.float32 and w.dtype == np.float32


def test_empty_batch(qkv):
    q, k, v = qkv(0, 3, 5, 7, 4, 6)
    out, cache = ops.attention_forward(q, k, v, causal=True)
    assert out.shape == (0, 3, 5, 6) and out.dtype == np.float32
    assert cache["lse"].shape == (0, 3, 5) and cache["lse"].dtype == np.float32
    out, w = ops.attention(q, k, v, return_weights=True)
    assert out.shape == (0, 3, 5, 6) and w.shape == (0, 3, 5, 7)


@pytest.mark.parametrize("causal", [False, True])
def test_no_keys_returns_zeros(qkv, causal):
    q, k, v = qkv(2, 3, 5, 0, 4, 6)
    out, cache = ops.attention_forward(q, k, v, causal=causal)
    assert out.shape == (2, 3, 5, 6) and out.dtype == np.float32
    assert np.all(out == 0)
    assert cache["lse"].shape == (2, 3, 5) and np.all(cache["lse"] == -np.inf)
    out, w = ops.attention(q, k, v, causal=causal, return_weights=True)
    assert np.all(out == 0) and w.shape == (2, 3, 5, 0)


def test_no_queries(qkv):
    q, k, v = qkv(2, 3, 0, 5, 4, 6)
    out, cache = ops.attention_forward(q, k, v, causal=True)
    assert out.shape == (2, 3, 0, 6) and cache["lse"].shape == (2, 3, 0)


def test_large_multiblock_problem(qkv, rng):
    # several query blocks and key blocks per (batch, head), spread over the thread team
    B, H, L, D, Dv = 2, 4, BK + BQ + 1, 80, 64
    q, k, v = qkv(B, H, L, L, D, Dv)
    mask = rng.random((L, L)) < 0.2
    kpm = rng.random((B, L)) < 0.1
    check_attention(q, k, v, mask=mask, key_padding_mask=kpm, causal=True)
    check_attention(q, k, v, causal=True, weights=True)


# ----------------------------------------------------------------------------------------------
# seed 002: the additive -inf causal mask on a 6x6 score table



@pytest.mark.parametrize("how", ["additive", "bool", "causal"])
def test_seed002_causal_mask_gives_lower_triangular_weights(how):
    # q = scores, k = I, scale = 1: q k^T * scale is the table itself; v = I: out = weights
    q = SEED002_SCORES[None, None]
    k = v = np.eye(6)[None, None]
    kwargs = {"additive": {"mask": SEED002_MASK}, "bool": {"mask": np.isinf(SEED002_MASK)},
              "causal": {"causal": True}}[how]
    out, w = ops.attention(q, k, v, scale=1.0, return_weights=True, **kwargs)
    _, w_ref = reference.attention(q, k, v, scale=1.0, return_weights=True, **kwargs)
    w = w[0, 0]
    assert np.all(w[np.triu_indices(6, k=1)] == 0), "weights above the diagonal must be 0"
    assert_close(w.sum(-1), np.ones(6), **TOL["row_sums"], name="row sums")
    t_out, t_w, _ = attention_tols(q, k, v, 1.0)
    assert_close(w, w_ref[0, 0], name="weights", **t_w)
    assert_close(out[0, 0], w_ref[0, 0], name="out = weights (v = I)", **t_out)
    assert w[0, 0] == 1.0                                    # <start> sees only itself
    p_start = 1.0 / (1.0 + math.exp(34.0 - 7.6))             # row "I": softmax([7.6, 34.0])
    assert_close(w[1, :2], [p_start, 1.0 - p_start], **TOL["attention_seed002_by_hand"],
                 name="row I", dtype=None)


# ----------------------------------------------------------------------------------------------
# against torch.nn.functional.scaled_dot_product_attention (skipped without torch)


@pytest.mark.parametrize("B,H,Lq,Lk,D,Dv", [(2, 3, 65, 65, 80, 80), (1, 2, 1, 200, 64, 64),
                                            (2, 2, 33, 129, 7, 32), (3, 1, 17, 17, 1, 3)])
@pytest.mark.parametrize("masking", ["none", "bool", "float", "padding", "causal"])
def test_attention_vs_torch_sdpa(rng, B, H, Lq, Lk, D, Dv, masking):
    torch = requires_torch()
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv))
    kwargs, tkwargs = sdpa_masks(rng, masking, B, Lq, Lk)
    for scale in (None, 0.25):
        out = ops.attention(q, k, v, scale=scale, **kwargs)
        ref = torch.nn.functional.scaled_dot_product_attention(
            to_torch(q), to_torch(k), to_torch(v), scale=scale, **tkwargs).numpy()
        assert_close(out, ref, name=f"out vs torch (scale={scale})", **TOL["torch"])
