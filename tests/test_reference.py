"""Tests of fastattn.reference alone: hand-computed seed cases, a loop oracle, and torch."""

import math

import numpy as np
import pytest

from conftest import (SEED002_MASK, SEED002_SCORES, assert_close, requires_torch, sdpa_masks,
                      to_torch, torch_activation)
from fastattn import reference as F
from tolerances import TOL

NEG_INF = -np.inf
REF = TOL["reference"]
LOOP = TOL["reference_loop"]


# ----------------------------------------------------------------------------------------------
# helpers

def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def naive_attention(q, k, v, allowed, scale):
    """Row-by-row loop oracle with math.exp. allowed: bool (B, H, Lq, Lk), True = visible.

    Returns out (B,H,Lq,Dv), weights (B,H,Lq,Lk), lse (B,H,Lq), all float64.
    """
    B, H, Lq, _ = q.shape
    Lk, Dv = v.shape[2], v.shape[3]
    out = np.zeros((B, H, Lq, Dv))
    weights = np.zeros((B, H, Lq, Lk))
    lse = np.full((B, H, Lq), -np.inf)
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                keys = [j for j in range(Lk) if allowed[b, h, i, j]]
                if not keys:
                    continue
                s = {j: float(np.dot(q[b, h, i].astype(np.float64),
                                     k[b, h, j].astype(np.float64))) * scale for j in keys}
                m = max(s.values())
                z = sum(math.exp(s[j] - m) for j in keys)
                lse[b, h, i] = m + math.log(z)
                for j in keys:
                    weights[b, h, i, j] = math.exp(s[j] - m) / z
                    out[b, h, i] += weights[b, h, i, j] * v[b, h, j].astype(np.float64)
    return out, weights, lse


def causal_allowed(Lq, Lk):
    """Bottom-right aligned causal pattern, written as an explicit loop."""
    allowed = np.zeros((Lq, Lk), dtype=bool)
    for i in range(Lq):
        for j in range(Lk):
            allowed[i, j] = j <= i + (Lk - Lq)
    return allowed


# ----------------------------------------------------------------------------------------------
# positional encoding

def test_positional_encoding_seed000_position0():
    # seed 000, step 5: d_model = 6, position 0 -> sin(0) = 0 on even features, cos(0) = 1 on odd
    pe = F.positional_encoding(1, 6)
    assert_close(pe[0], [0, 1, 0, 1, 0, 1], **TOL["exact"])


@pytest.mark.parametrize("pos", [1, 3, 7])
def test_positional_encoding_by_hand(pos):
    d = 6
    expected = []
    for c in range(d):
        pair = c // 2                                   # features 2i and 2i+1 share an angle
        angle = pos / 10000 ** (2 * pair / d)
        expected.append(math.sin(angle) if c % 2 == 0 else math.cos(angle))
    pe = F.positional_encoding(pos + 1, d)
    assert pe.shape == (pos + 1, d) and pe.dtype == np.float32
    assert_close(pe[pos], expected, **REF)
    # position 1 spelled out: angles 1, 1/10000^(1/3), 1/10000^(2/3)
    if pos == 1:
        a1, a2 = 10000 ** (-1 / 3), 10000 ** (-2 / 3)
        assert_close(pe[1], [math.sin(1), math.cos(1), math.sin(a1), math.cos(a1),
                             math.sin(a2), math.cos(a2)], **REF)


def test_positional_encoding_odd_d_model():
    d = 5
    pe = F.positional_encoding(4, d)
    assert pe.shape == (4, 5)
    for p in range(4):
        for c in range(d):
            angle = p / 10000 ** (2 * (c // 2) / d)
            want = math.sin(angle) if c % 2 == 0 else math.cos(angle)
            assert_close(pe[p, c], want, **TOL["reference_by_hand"])
    # last column (index 4, even) is a sin
    assert_close(pe[:, 4], np.sin(np.arange(4) / 10000 ** (4 / 5)), **REF)


def test_positional_encoding_empty():
    pe = F.positional_encoding(0, 8)
    assert pe.shape == (0, 8) and pe.dtype == np.float32


# ----------------------------------------------------------------------------------------------
# seed 002: the additive -inf causal mask on a 6x6 score table



def test_seed002_mask_table():
    # the mask in seed 002: 0 on/below the diagonal, -inf above
    for i in range(6):
        for j in range(6):
            assert SEED002_MASK[i, j] == (0.0 if j <= i else -np.inf)


def test_seed002_masked_softmax():
    w = F.softmax(SEED002_SCORES + SEED002_MASK)
    assert w.dtype == np.float32
    assert np.all(w[np.triu_indices(6, k=1)] == 0)              # lower triangular
    assert_close(w.sum(axis=-1), np.ones(6), **TOL["reference_row_sums"])         # rows sum to 1
    assert_close(w[0], [1, 0, 0, 0, 0, 0], **TOL["exact"])      # <start> sees only itself
    # row "I": softmax([7.6, 34.0]) by hand
    p_start = 1.0 / (1.0 + math.exp(34.0 - 7.6))
    assert_close(w[1, :2], [p_start, 1.0 - p_start], **TOL["reference_by_hand_rel"])
    # row "am": softmax([15.5, 30.6, 35.9]) by hand
    e = [math.exp(s - 35.9) for s in (15.5, 30.6, 35.9)]
    assert_close(w[2, :3], [x / sum(e) for x in e], **TOL["reference_by_hand_rel"])


def test_seed002_attention_causal_equals_additive_mask():
    # q = scores, k = I, scale = 1 -> q @ k^T * scale reproduces the table; v = I -> out = weights
    q = SEED002_SCORES[None, None]                  # (1, 1, 6, 6)
    k = np.eye(6)[None, None]                       # (1, 1, 6, 6)
    v = np.eye(6)[None, None]                       # (1, 1, 6, 6)
    expected = F.softmax(SEED002_SCORES + SEED002_MASK)

    out_m, w_m = F.attention(q, k, v, mask=SEED002_MASK, scale=1.0, return_weights=True)
    out_c, w_c = F.attention(q, k, v, causal=True, scale=1.0, return_weights=True)
    out_b, w_b = F.attention(q, k, v, mask=np.isinf(SEED002_MASK), scale=1.0,
                             return_weights=True)
    for out, w in ((out_m, w_m), (out_c, w_c), (out_b, w_b)):
        assert_close(w[0, 0], expected, **REF)
        assert_close(out[0, 0], expected, **REF)
        assert np.all(np.triu(w[0, 0], k=1) == 0)
        assert_close(w[0, 0].sum(axis=-1), np.ones(6), **TOL["reference_row_sums"])


# ----------------------------------------------------------------------------------------------
# softmax

def test_softmax_by_hand():
    x = np.array([1.0, 2.0, 3.0])
    e = [math.exp(1 - 3), math.exp(2 - 3), 1.0]
    assert_close(F.softmax(x), [t / sum(e) for t in e], **REF)
    # invariance to a shift, and large values do not overflow
    assert_close(F.softmax(x + 1000.0), [t / sum(e) for t in e], **REF)


def test_softmax_axis():
    x = np.array([[0.0, math.log(3.0)], [0.0, 0.0]])
    assert_close(F.softmax(x, axis=0), [[0.5, 0.75], [0.5, 0.25]], **REF)
    assert_close(F.softmax(x, axis=-1), [[0.25, 0.75], [0.5, 0.5]], **REF)


def test_softmax_masked_and_nan():
    x = np.array([[0.0, NEG_INF, 0.0], [NEG_INF, NEG_INF, NEG_INF], [0.0, np.nan, 1.0]])
    y = F.softmax(x)
    assert_close(y[0], [0.5, 0.0, 0.5], **REF)
    assert_close(y[1], [0.0, 0.0, 0.0], **TOL["exact"])          # all -inf row -> zeros
    assert np.all(np.isnan(y[2]))                                 # NaN propagates


def test_softmax_empty():
    assert F.softmax(np.zeros((0, 5))).shape == (0, 5)
    assert F.softmax(np.zeros((3, 0))).shape == (3, 0)


# ----------------------------------------------------------------------------------------------
# layer norm

def test_layer_norm_by_hand():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    mean, var = 2.5, 1.25                       # population variance: (2.25+0.25+0.25+2.25)/4
    eps = 1e-5
    rstd = 1.0 / math.sqrt(var + eps)
    expected = [(t - mean) * rstd for t in x]   # [-1.3416, -0.4472, 0.4472, 1.3416]
    y = F.layer_norm(x, np.ones(4), np.zeros(4))
    assert_close(y, expected, **REF)
    # weight and bias
    w, b = np.array([1.0, 2.0, 0.5, -1.0]), np.array([0.0, 1.0, -1.0, 3.0])
    y = F.layer_norm(x, w, b)
    assert_close(y, [e * wi + bi for e, wi, bi in zip(expected, w, b)], **REF)
    # cache
    y, cache = F.layer_norm_forward(x[None], np.ones(4), np.zeros(4))
    assert_close(cache["mean"], [mean], **REF)
    assert_close(cache["rstd"], [rstd], **REF)


def test_layer_norm_residual_and_leading_dims(rng):
    x, r = rand(rng, 2, 3, 8), rand(rng, 2, 3, 8)
    w, b = rand(rng, 8), rand(rng, 8)
    y, cache = F.layer_norm_forward(x, w, b, residual=r, eps=1e-6)
    y2 = F.layer_norm(x.astype(np.float64) + r, w, b, eps=1e-6)
    assert y.shape == (2, 3, 8) and y.dtype == np.float32
    assert_close(y, y2, **REF)
    s = x.astype(np.float64) + r
    assert_close(cache["mean"], s.mean(-1).reshape(6), **REF)
    assert_close(cache["rstd"], 1 / np.sqrt(s.var(-1).reshape(6) + 1e-6), **REF)
    assert cache["mean"].shape == (6,) and cache["rstd"].shape == (6,)


def test_layer_norm_empty_and_noncontiguous(rng):
    y, cache = F.layer_norm_forward(np.zeros((0, 4)), np.ones(4), np.zeros(4))
    assert y.shape == (0, 4) and cache["mean"].shape == (0,) and cache["rstd"].shape == (0,)
    x = rand(rng, 8, 6).astype(np.float64).T          # (6, 8) non-contiguous float64
    assert_close(F.layer_norm(x, np.ones(8), np.zeros(8)),
                 F.layer_norm(np.ascontiguousarray(x, dtype=np.float32), np.ones(8), np.zeros(8)),
                 **REF)


# ----------------------------------------------------------------------------------------------
# linear and ffn

def test_linear_by_hand():
    x = np.array([[1.0, -2.0]])                 # (1, 2)
    w = np.array([[1.0, 1.0], [2.0, 0.5], [0.0, -1.0]])   # (3, 2): out 3, in 2
    b = np.array([0.5, 0.0, -1.0])
    # x @ w.T + b = [1-2+0.5, 2-1+0, 0+2-1] = [-0.5, 1.0, 1.0]
    assert_close(F.linear(x, w, b), [[-0.5, 1.0, 1.0]], **REF)
    assert_close(F.linear(x, w), [[-1.0, 1.0, 2.0]], **REF)
    assert_close(F.linear(x, w, b, activation="relu"), [[0.0, 1.0, 1.0]], **REF)
    gelu = lambda t: 0.5 * t * (1 + math.erf(t / math.sqrt(2)))   # noqa: E731
    assert_close(F.linear(x, w, b, activation="gelu"), [[gelu(-0.5), gelu(1.0), gelu(1.0)]], **REF)
    assert_close(F.linear(x, w, b, activation="gelu")[0, 1], 0.8413447460685429,
                 **TOL["reference_by_hand"])


def test_gelu_special_values():
    x = np.array([[0.0, 1.0, -1.0, 10.0, -10.0, np.inf, NEG_INF, np.nan]]).T   # (8, 1)
    y = F.linear(x, np.eye(1), activation="gelu")[:, 0]
    assert y[0] == 0.0
    assert_close(y[1:3], [0.8413447460685429, -0.15865525393145707], **TOL["reference_by_hand"])
    assert y[3] == 10.0
    assert_close(y[4], 0.0, **TOL["gelu_far_tail"])
    assert y[5] == np.inf and y[6] == 0.0 and np.isnan(y[7])


def test_linear_unknown_activation():
    with pytest.raises(ValueError):
        F.linear(np.ones((1, 2)), np.ones((2, 2)), activation="tanh")


def test_linear_leading_dims_and_empty(rng):
    x, w, b = rand(rng, 2, 3, 4), rand(rng, 5, 4), rand(rng, 5)
    y = F.linear(x, w, b)
    assert y.shape == (2, 3, 5) and y.dtype == np.float32
    assert_close(y, np.einsum("bli,oi->blo", x.astype(np.float64), w) + b,
                 **TOL["reference_float64"])
    assert F.linear(np.zeros((0, 4)), w, b).shape == (0, 5)


@pytest.mark.parametrize("activation", ["relu", "gelu", None])
def test_ffn_composition(rng, activation):
    x = rand(rng, 2, 3, 4)
    w1, b1, w2, b2 = rand(rng, 8, 4), rand(rng, 8), rand(rng, 4, 8), rand(rng, 4)
    y = F.ffn(x, w1, b1, w2, b2, activation=activation)
    expected = F.linear(F.linear(x, w1, b1, activation=activation), w2, b2)
    assert y.shape == (2, 3, 4) and y.dtype == np.float32
    assert_close(y, expected, **TOL["reference_ffn"])


def test_ffn_by_hand():
    x = np.array([[1.0, 2.0]])                  # (1, C=2)
    w1 = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])   # (F=3, C=2)
    b1 = np.array([0.0, -3.0, 0.0])
    w2 = np.array([[1.0, 1.0, 1.0], [2.0, 0.0, 5.0]])       # (C=2, F=3)
    b2 = np.array([0.5, -0.5])
    # hidden = relu([1, 2-3, -3]) = [1, 0, 0]; out = [1 + 0.5, 2 - 0.5]
    assert_close(F.ffn(x, w1, b1, w2, b2), [[1.5, 1.5]], **REF)


# ----------------------------------------------------------------------------------------------
# attention: masks, alignment, fully masked rows

def test_attention_by_hand():
    # one query, two keys: scores [0, ln 3] -> weights [1/4, 3/4]
    q = np.array([[[[1.0, 0.0]]]])                         # (1,1,1,2)
    k = np.array([[[[0.0, 0.0], [math.log(3.0), 0.0]]]])   # (1,1,2,2)
    v = np.array([[[[4.0, 0.0, 1.0], [0.0, 8.0, 1.0]]]])   # (1,1,2,3)
    out, w = F.attention(q, k, v, scale=1.0, return_weights=True)
    assert_close(w, [[[[0.25, 0.75]]]], **REF)
    assert_close(out, [[[[1.0, 6.0, 1.0]]]], **REF)
    _, cache = F.attention_forward(q, k, v, scale=1.0)
    assert_close(cache["lse"], [[[math.log(1 + 3)]]], **REF)
    # default scale 1/sqrt(D): D = 2
    _, w = F.attention(q, k, v, return_weights=True)
    p = 3 ** (1 / math.sqrt(2))
    assert_close(w, [[[[1 / (1 + p), p / (1 + p)]]]], **REF)


def test_fully_masked_row_gives_zeros_and_neg_inf_lse(rng):
    q, k, v = rand(rng, 2, 2, 3, 4), rand(rng, 2, 2, 5, 4), rand(rng, 2, 2, 5, 3)
    mask = np.zeros((3, 5), dtype=bool)
    mask[1] = True                                   # query 1 sees no key
    out, w = F.attention(q, k, v, mask=mask, return_weights=True)
    _, cache = F.attention_forward(q, k, v, mask=mask)
    assert not np.isnan(out).any() and not np.isnan(w).any()
    assert np.all(out[:, :, 1] == 0) and np.all(w[:, :, 1] == 0)
    assert np.all(cache["lse"][:, :, 1] == -np.inf)
    assert np.all(np.isfinite(cache["lse"][:, :, [0, 2]]))
    assert_close(w[:, :, [0, 2]].sum(-1), np.ones((2, 2, 2)), **TOL["reference_row_sums"])

    # a whole batch element padded out by key_padding_mask
    kpm = np.zeros((2, 5), dtype=bool)
    kpm[1] = True
    out, cache = F.attention_forward(q, k, v, key_padding_mask=kpm)
    assert np.all(out[1] == 0) and np.all(cache["lse"][1] == -np.inf)
    assert np.all(np.isfinite(cache["lse"][0]))

    # an additive -inf float mask behaves the same
    fmask = np.where(mask, -np.inf, 0.0)
    out2, cache2 = F.attention_forward(q, k, v, mask=fmask)
    assert np.all(out2[:, :, 1] == 0) and np.all(cache2["lse"][:, :, 1] == -np.inf)


@pytest.mark.parametrize("Lq,Lk", [(2, 5), (1, 4), (3, 3), (4, 2)])
def test_causal_bottom_right_alignment(rng, Lq, Lk):
    q, k, v = rand(rng, 1, 1, Lq, 4), rand(rng, 1, 1, Lk, 4), rand(rng, 1, 1, Lk, 4)
    _, w = F.attention(q, k, v, causal=True, return_weights=True)
    visible = w[0, 0] > 0
    # query i sees keys 0 .. i + (Lk - Lq); the last query sees every key
    for i in range(Lq):
        last = i + (Lk - Lq)
        assert list(np.flatnonzero(visible[i])) == list(range(0, max(last + 1, 0)))
    if Lq <= Lk:
        assert visible[-1].all()


def test_causal_pattern_spelled_out(rng):
    # Lq = 2, Lk = 4 (two new queries after two cached keys)
    q, k, v = rand(rng, 1, 1, 2, 3), rand(rng, 1, 1, 4, 3), rand(rng, 1, 1, 4, 3)
    _, w = F.attention(q, k, v, causal=True, return_weights=True)
    assert ((w[0, 0] > 0) == np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)).all()
    # Lq = 3, Lk = 2: the first query sees nothing
    q = rand(rng, 1, 1, 3, 3)
    out, w = F.attention(q, k[:, :, :2], v[:, :, :2], causal=True, return_weights=True)
    assert ((w[0, 0] > 0) == np.array([[0, 0], [1, 0], [1, 1]], dtype=bool)).all()
    assert np.all(out[0, 0, 0] == 0)


@pytest.mark.parametrize("mask_shape", [(3, 5), (2, 1, 3, 5), (1, 4, 3, 5), (2, 4, 3, 5), (5,)])
def test_bool_mask_equals_float_mask(rng, mask_shape):
    q, k, v = rand(rng, 2, 4, 3, 6), rand(rng, 2, 4, 5, 6), rand(rng, 2, 4, 5, 7)
    bmask = rng.random(mask_shape) < 0.3
    fmask = np.where(bmask, -np.inf, 0.0)
    out_b, w_b = F.attention(q, k, v, mask=bmask, return_weights=True)
    out_f, w_f = F.attention(q, k, v, mask=fmask, return_weights=True)
    assert out_b.shape == (2, 4, 3, 7) and w_b.shape == (2, 4, 3, 5)
    assert_close(out_b, out_f, **TOL["exact"])
    assert_close(w_b, w_f, **TOL["exact"])
    # and both agree with the loop oracle
    allowed = ~np.broadcast_to(bmask, (2, 4, 3, 5))
    out_n, w_n, lse_n = naive_attention(q, k, v, allowed, 1 / math.sqrt(6))
    assert_close(out_b, out_n, **LOOP)
    assert_close(w_b, w_n, **REF)
    assert_close(F.attention_forward(q, k, v, mask=bmask)[1]["lse"], lse_n, **LOOP)


def test_key_padding_mask_equals_mask(rng):
    B, H, Lq, Lk = 3, 2, 4, 6
    q, k, v = rand(rng, B, H, Lq, 8), rand(rng, B, H, Lk, 8), rand(rng, B, H, Lk, 8)
    kpm = rng.random((B, Lk)) < 0.4
    kpm[:, 0] = False                                  # keep one key per batch element
    as_mask = kpm[:, None, None, :]                    # (B, 1, 1, Lk)
    out_k, w_k = F.attention(q, k, v, key_padding_mask=kpm, return_weights=True)
    out_m, w_m = F.attention(q, k, v, mask=as_mask, return_weights=True)
    assert_close(out_k, out_m, **TOL["exact"])
    assert_close(w_k, w_m, **TOL["exact"])
    # float key padding mask is added like a float mask
    fkpm = np.where(kpm, -np.inf, 0.0)
    assert_close(F.attention(q, k, v, key_padding_mask=fkpm), out_m, **TOL["exact"])
    # a finite float key padding mask is a bias on that key's score
    bias = rand(rng, B, Lk)
    assert_close(F.attention(q, k, v, key_padding_mask=bias),
                 F.attention(q, k, v, mask=bias[:, None, None, :]), **TOL["exact"])


def test_masks_combine(rng):
    B, H, Lq, Lk = 2, 2, 4, 4
    q, k, v = rand(rng, B, H, Lq, 4), rand(rng, B, H, Lk, 4), rand(rng, B, H, Lk, 4)
    mask = rng.random((Lq, Lk)) < 0.3
    kpm = rng.random((B, Lk)) < 0.3
    allowed = ~mask[None, None] & ~kpm[:, None, None, :] & causal_allowed(Lq, Lk)
    allowed = np.broadcast_to(allowed, (B, H, Lq, Lk))
    out, w = F.attention(q, k, v, mask=mask, key_padding_mask=kpm, causal=True,
                         return_weights=True)
    out_n, w_n, _ = naive_attention(q, k, v, allowed, 0.5)
    assert_close(out, out_n, **LOOP)
    assert_close(w, w_n, **REF)


@pytest.mark.parametrize("B,H,Lq,Lk,D,Dv", [
    (1, 1, 1, 1, 1, 1),
    (2, 3, 5, 7, 4, 6),
    (1, 2, 7, 3, 5, 2),     # Lq > Lk: the first causal rows are fully masked
    (2, 1, 4, 4, 3, 3),
    (0, 2, 3, 4, 5, 6),     # empty batch
    (2, 2, 0, 4, 5, 6),     # no queries
    (1, 2, 3, 0, 5, 6),     # no keys: every row fully masked
])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_vs_loop_oracle(rng, B, H, Lq, Lk, D, Dv, causal):
    q, k, v = rand(rng, B, H, Lq, D), rand(rng, B, H, Lk, D), rand(rng, B, H, Lk, Dv)
    allowed = np.ones((B, H, Lq, Lk), dtype=bool)
    if causal:
        allowed &= causal_allowed(Lq, Lk)
    scale = 0.7
    out, w = F.attention(q, k, v, causal=causal, scale=scale, return_weights=True)
    out2, cache = F.attention_forward(q, k, v, causal=causal, scale=scale)
    out_n, w_n, lse_n = naive_attention(q, k, v, allowed, scale)
    assert_close(out, out_n, **LOOP)
    assert_close(w, w_n, **REF)
    assert_close(out2, out, **TOL["exact"])
    assert_close(cache["lse"], lse_n, **LOOP)


def test_attention_accepts_float64_and_noncontiguous(rng):
    q = rng.standard_normal((2, 5, 3, 4)).transpose(0, 2, 1, 3)   # (2,3,5,4) non-contiguous f64
    k = rng.standard_normal((2, 3, 4, 6))[..., ::2, :4]           # (2,3,2,4) strided
    v = rng.standard_normal((2, 3, 2, 5))
    out, cache = F.attention_forward(q, k, v)
    assert out.dtype == np.float32 and out.shape == (2, 3, 5, 5)
    assert cache["lse"].dtype == np.float32 and cache["lse"].shape == (2, 3, 5)
    allowed = np.ones((2, 3, 5, 2), dtype=bool)
    out_n, _, lse_n = naive_attention(q, k, v, allowed, 0.5)
    assert_close(out, out_n, **REF)
    assert_close(cache["lse"], lse_n, **REF)


def test_attention_nan_propagates(rng):
    q, k, v = rand(rng, 1, 1, 3, 4), rand(rng, 1, 1, 3, 4), rand(rng, 1, 1, 3, 4)
    q[0, 0, 1, 2] = np.nan
    out, cache = F.attention_forward(q, k, v)
    assert np.isnan(out[0, 0, 1]).all() and np.isnan(cache["lse"][0, 0, 1])
    assert not np.isnan(out[0, 0, [0, 2]]).any()


def test_attention_lse_by_hand(rng):
    q, k, v = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 4)
    mask = rng.random((3, 5)) < 0.3
    mask[:, 0] = False
    _, cache = F.attention_forward(q, k, v, mask=mask, scale=0.3)
    s = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)) * 0.3
    s = np.where(mask, -np.inf, s)
    assert_close(cache["lse"], np.log(np.exp(s).sum(-1)), **TOL["reference_float64"])


# ----------------------------------------------------------------------------------------------
# against torch (skipped when torch is not installed)

TORCH_RTOL, TORCH_ATOL = TOL["reference_torch"]["rtol"], TOL["reference_torch"]["atol"]


t = to_torch


@pytest.mark.parametrize("B,H,Lq,Lk,D,Dv", [(2, 3, 5, 7, 8, 8), (1, 2, 6, 6, 16, 4),
                                            (3, 1, 1, 9, 5, 7)])
@pytest.mark.parametrize("masking", ["none", "bool", "float", "padding", "causal"])
def test_attention_vs_torch_sdpa(rng, B, H, Lq, Lk, D, Dv, masking):
    torch = requires_torch()
    q, k, v = rand(rng, B, H, Lq, D), rand(rng, B, H, Lk, D), rand(rng, B, H, Lk, Dv)
    kwargs, tkwargs = sdpa_masks(rng, masking, B, Lq, Lk)
    for scale in (None, 0.25):
        out = F.attention(q, k, v, scale=scale, **kwargs)
        ref = torch.nn.functional.scaled_dot_product_attention(
            t(q), t(k), t(v), scale=scale, **tkwargs).numpy()
        assert_close(out, ref, rtol=TORCH_RTOL, atol=TORCH_ATOL)


def test_attention_lse_vs_torch_logsumexp(rng):
    torch = requires_torch()
    q, k, v = rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 6, 8), rand(rng, 2, 2, 6, 8)
    mask = rng.random((4, 6)) < 0.3
    mask[2] = True                                      # one fully masked row: lse = -inf
    _, cache = F.attention_forward(q, k, v, mask=mask, causal=True)
    s = torch.matmul(t(q), t(k).transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(t(mask), -math.inf)
    s = s.masked_fill(~t(causal_allowed(4, 6)), -math.inf)
    ref = torch.logsumexp(s, dim=-1).numpy()
    assert np.all(cache["lse"][:, :, 2] == -np.inf) and np.all(ref[:, :, 2] == -np.inf)
    assert_close(cache["lse"], ref, rtol=TORCH_RTOL, atol=TORCH_ATOL)


@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((2, 3, 5), 1), ((6,), 0), ((3, 4), 0)])
def test_softmax_vs_torch(rng, shape, axis):
    torch = requires_torch()
    x = rand(rng, *shape, scale=5.0)
    assert_close(F.softmax(x, axis=axis), torch.softmax(t(x), dim=axis).numpy(),
                 rtol=TORCH_RTOL, atol=TORCH_ATOL)


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 32), (1, 7)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_layer_norm_vs_torch(rng, shape, with_residual):
    torch = requires_torch()
    C = shape[-1]
    x, w, b = rand(rng, *shape, scale=3.0) + 1.0, rand(rng, C), rand(rng, C)
    r = rand(rng, *shape) if with_residual else None
    y, cache = F.layer_norm_forward(x, w, b, residual=r)
    s = t(x) + t(r) if with_residual else t(x)
    ref = torch.nn.functional.layer_norm(s, (C,), t(w), t(b), eps=1e-5).numpy()
    assert_close(y, ref, **TOL["reference_torch_sums"])
    _, mean, rstd = torch.ops.aten.native_layer_norm(s, [C], t(w), t(b), 1e-5)
    assert_close(cache["mean"], mean.reshape(-1).numpy(), rtol=TORCH_RTOL, atol=TORCH_ATOL)
    assert_close(cache["rstd"], rstd.reshape(-1).numpy(), rtol=TORCH_RTOL, atol=TORCH_ATOL)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_vs_torch(rng, activation, with_bias):
    torch = requires_torch()
    x, w, b = rand(rng, 2, 5, 12), rand(rng, 7, 12), rand(rng, 7)
    y = F.linear(x, w, b if with_bias else None, activation=activation)
    ref = torch_activation(activation)(
        torch.nn.functional.linear(t(x), t(w), t(b) if with_bias else None))
    assert_close(y, ref.numpy(), **TOL["reference_torch_sums"])


def test_gelu_vs_torch():
    torch = requires_torch()
    x = np.linspace(-12.0, 12.0, 2001)
    y = F.linear(x[:, None], np.eye(1), activation="gelu")[:, 0]
    ref = torch.nn.functional.gelu(t(x)).numpy()        # float64 torch, exact erf form
    assert_close(y, ref.astype(np.float32), **REF)


def test_ffn_vs_torch(rng):
    torch = requires_torch()
    x = rand(rng, 3, 4, 8)
    w1, b1, w2, b2 = rand(rng, 16, 8), rand(rng, 16), rand(rng, 8, 16), rand(rng, 8)
    for act, tact in (("relu", torch.relu), ("gelu", torch.nn.functional.gelu)):
        y = F.ffn(x, w1, b1, w2, b2, activation=act)
        fl = torch.nn.functional.linear
        ref = fl(tact(fl(t(x), t(w1), t(b1))), t(w2), t(b2)).numpy()
        assert_close(y, ref, **TOL["reference_torch_sums"])


@pytest.mark.parametrize("length,d_model", [(50, 16), (7, 6), (10, 1)])
def test_positional_encoding_vs_torch_formula(length, d_model):
    torch = requires_torch()
    # the formula of the PyTorch tutorials, in float64 (even d_model only there)
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0)
                                                                       / d_model))
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)[:, : d_model // 2]
    assert_close(F.positional_encoding(length, d_model), pe.numpy().astype(np.float32),
                 **TOL["reference_float64"])
