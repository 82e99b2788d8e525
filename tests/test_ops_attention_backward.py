"""Attention training: fastattn.ops.attention_backward (the flash-style C kernel) and dropout on
the attention weights, against the float64 NumPy twin, finite differences of the twin, and torch
autograd.

The kernel's backward is compared with the twin's on the same inputs (dout, q, k, v and the
kernel's own out and lse), so that a mismatch points at the backward, not at the forward.
Tolerances: each gradient sums products of recomputed probabilities (relative error about
eps * |score|, the scores being rounded before they are exponentiated) with float32 data, so the
absolute tolerance is a fraction of the largest |gradient| of the tensor and grows with the
largest |score| past the calibrated range, as in test_ops_attention.py.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TILES, assert_close, requires_torch, sdpa_masks
from fastattn import _kernels, ops, reference
from grad_util import numeric_grad
from strategies import AttentionProblem, attention_problems, build_attention, rand
from tolerances import TOL, attention_grad_atol, attention_grad_magnitudes, max_score, scaled

# dq, dk, dv against the twin and against torch (tolerances.attention_grad_atol)
GRAD, GRAD_TORCH = TOL["attention_grad"], TOL["attention_grad_torch"]
FD = TOL["finite_difference"]

KB = TILES["attention_block_q"]            # keys per backward block (along the lanes)
BR = TILES["attention_backward_block_q"]   # query rows per backward block
R = TILES["attention_rows_max_q"]          # the forward's one-row-at-a-time limit


# ----------------------------------------------------------------------------------------------
# helpers


def compare(grads, expect, dout, q, k, v, out, tol=GRAD, **kwargs):
    """dq, dk, dv each within tol["atol"] x eps32 x (sqrt(terms) + smax) x max(its magnitudes)."""
    terms = max(q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2], 1)
    smax = max_score(q, k, kwargs.get("scale"), finite_only=True)
    mags = attention_grad_magnitudes(dout, q, k, v, out, **kwargs)
    for a, e, m, name in zip(grads, expect, mags, ("dq", "dk", "dv")):
        assert_close(a, e, rtol=tol["rtol"], name=name,
                     atol=attention_grad_atol(m, terms, smax, tol["atol"]))


def check_backward(q, k, v, dout=None, *, seed_dout=0, **kwargs):
    """ops vs twin: the backward on the kernel's own out and lse. Returns (out, lse, grads)."""
    if dout is None:
        dout = rand(np.random.default_rng(seed_dout), q.shape[:3] + (v.shape[-1],))
    out, cache = ops.attention_forward(q, k, v, **kwargs)
    grads = ops.attention_backward(dout, q, k, v, out, cache["lse"], **kwargs)
    expect = reference.attention_backward(dout, q, k, v, out, cache["lse"], **kwargs)
    for g, shape in zip(grads, (q.shape, k.shape, v.shape)):
        assert g.shape == shape and g.dtype == np.float32 and g.flags.c_contiguous
    compare(grads, expect, dout, q, k, v, out, **kwargs)
    return out, cache["lse"], grads


@pytest.fixture
def qkv(rng):
    def make(B, H, Lq, Lk, D, Dv=None, magnitude=1.0):
        Dv = D if Dv is None else Dv
        return (rand(rng, (B, H, Lq, D), magnitude), rand(rng, (B, H, Lk, D), magnitude),
                rand(rng, (B, H, Lk, Dv), magnitude))
    return make


# ----------------------------------------------------------------------------------------------
# ops vs the twin: property tests and tile edges


MORE_EXAMPLES = settings(max_examples=3 * settings.default.max_examples)


@MORE_EXAMPLES
@given(p=attention_problems(max_len=200))
def test_backward_matches_reference(p):
    check_backward(p.q, p.k, p.v, seed_dout=p.seed, **p.kwargs())


@given(p=attention_problems(max_len=130, magnitudes=(1.0,)),
       dropout_p=st.sampled_from([0.1, 0.5, 0.9]), seed=st.integers(0, 2**64 - 1))
def test_backward_with_dropout_matches_reference(p, dropout_p, seed):
    kwargs = dict(p.kwargs(), dropout_p=dropout_p, seed=seed)
    out, _, _ = check_backward(p.q, p.k, p.v, seed_dout=p.seed, **kwargs)
    ref_out, _ = reference.attention_forward(p.q, p.k, p.v, **kwargs)
    vmax = max(1.0, float(np.abs(p.v).max()))
    assert_close(out, ref_out, rtol=TOL["attention"]["rtol"],
                 atol=TOL["attention"]["atol"] * vmax / (1 - dropout_p), name="out")


# Lengths straddling the backward's key block (KB keys, along the lanes) and query block (BR
# rows), with causal offsets both ways, and the forward's one-row limit (its dropout path).
EDGE_LENGTHS = [(1, 1), (1, KB + 1), (R, KB - 1), (KB - 1, KB), (KB, KB), (KB + 1, KB + 1),
                (BR - 1, BR + 1), (BR, BR), (BR + 1, BR - 1), (2 * BR + 1, KB + 1),
                (KB + 1, 2 * BR + 3), (3 * KB - 1, 2 * BR + 1)]


@pytest.mark.parametrize("Lq,Lk", EDGE_LENGTHS)
@pytest.mark.parametrize("mask_kind", ["none", "bool_broadcast", "additive", "key_padding"])
def test_tile_edges(Lq, Lk, mask_kind):
    for causal in (False, True):
        p = build_attention(AttentionProblem(
            B=1, H=2, Lq=Lq, Lk=Lk, D=19, Dv=KB + 3, mask_kind=mask_kind, with_padding=False,
            causal=causal, fully_masked=False, magnitude=1.0, seed=Lq * 1000 + Lk))
        check_backward(p.q, p.k, p.v, seed_dout=1, **p.kwargs())
        check_backward(p.q, p.k, p.v, seed_dout=2, dropout_p=0.25, seed=Lq + Lk, **p.kwargs())


@pytest.mark.parametrize("D,Dv", [(1, 1), (3, 5), (7, 64), (64, 7), (80, 80), (64, 16),
                                  (128, 64), (2 * KB + 1, 33)])
def test_head_dims(qkv, D, Dv):
    q, k, v = qkv(2, 2, 77, 93, D, Dv)
    check_backward(q, k, v)
    check_backward(q, k, v, causal=True)


def test_multiblock_masks_combined(qkv, rng):
    B, H, L = 2, 3, 2 * BR + KB + 5
    q, k, v = qkv(B, H, L, L, 64, 48)
    mask = np.where(rng.random((B, 1, L, L)) < 0.2, -np.inf, rng.standard_normal((B, 1, L, L)))
    kpm = rng.random((B, L)) < 0.1
    check_backward(q, k, v, mask=mask, key_padding_mask=kpm, causal=True)
    check_backward(q, k, v, mask=mask.astype(np.float32) < -1, key_padding_mask=kpm,
                   dropout_p=0.1, seed=99)


# ----------------------------------------------------------------------------------------------
# rows that see no key, causal alignment, special values


@pytest.mark.parametrize("Lq,Lk", [(40, 17), (129, 2), (5, 1), (BR + KB, KB)])
def test_causal_more_queries_than_keys(qkv, Lq, Lk):
    # bottom-right alignment: the first Lq - Lk queries see no key -> zero dq, nothing to dk/dv
    q, k, v = qkv(2, 2, Lq, Lk, 32, 7)
    _, lse, (dq, dk, dv) = check_backward(q, k, v, causal=True)
    blind = Lq - Lk
    assert np.all(lse[:, :, :blind] == -np.inf)
    assert np.all(dq[:, :, :blind] == 0)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    # the blind rows contribute nothing: dropping them leaves dk and dv unchanged
    dout = rand(np.random.default_rng(0), (2, 2, Lq, 7))
    out, cache = ops.attention_forward(q, k, v, causal=True)
    dq, dk, dv = ops.attention_backward(dout, q, k, v, out, cache["lse"], causal=True)
    _, _, ref_dv = reference.attention_backward(dout[:, :, blind:], q[:, :, blind:], k, v,
                                                out[:, :, blind:], cache["lse"][:, :, blind:],
                                                causal=True)
    assert_close(dv, ref_dv, **scaled(TOL["attention_grad_plain"], ref_dv), name="dv")


@pytest.mark.parametrize("Lq,Lk", [(17, 50), (70, 70), (BR + 1, 3 * KB + 2)])
def test_causal_fewer_queries_than_keys(qkv, Lq, Lk):
    # torch's is_causal is top-left aligned, so only the twin can check Lq != Lk
    q, k, v = qkv(2, 3, Lq, Lk, 24, 40)
    check_backward(q, k, v, causal=True)


def test_fully_masked_rows_get_zero_gradients(qkv, rng):
    # torch gives NaN for such rows; ours (and the twin's) are zeros
    B, H, Lq, Lk = 2, 3, BR + 9, KB + 7
    q, k, v = qkv(B, H, Lq, Lk, 16, 20)
    mask = rng.random((B, H, Lq, Lk)) < 0.2
    mask[0, 1, 4] = True                                 # one (batch, head, query) row
    mask[:, :, Lq - 1] = True                            # the last query of every head
    kpm = np.zeros((B, Lk), bool)
    kpm[1, :] = True                                     # batch element 1: all padding
    for m in (mask, np.where(mask, -np.inf, 0.0)):
        for extra in ({}, {"dropout_p": 0.3, "seed": 5}, {"causal": True}):
            _, lse, (dq, dk, dv) = check_backward(q, k, v, mask=m, key_padding_mask=kpm,
                                                  **extra)
            assert lse[0, 1, 4] == -np.inf and np.all(lse[:, :, Lq - 1] == -np.inf)
            assert np.all(dq[0, 1, 4] == 0) and np.all(dq[:, :, Lq - 1] == 0)
            assert np.all(dq[1] == 0) and np.all(dk[1] == 0) and np.all(dv[1] == 0)
            assert not any(np.isnan(g).any() for g in (dq, dk, dv))


def test_no_keys_visible_at_all(qkv):
    q, k, v = qkv(1, 2, 9, 11, 8)
    _, _, grads = check_backward(q, k, v, mask=np.ones((9, 11), bool))
    assert all(np.all(g == 0) for g in grads)


@pytest.mark.parametrize("magnitude", [1e2, 1e4])
def test_large_magnitudes(qkv, magnitude):
    q, k, v = qkv(2, 2, 70, 90, 32, 16, magnitude=magnitude)
    scale = 4.0 / (magnitude ** 2 * math.sqrt(32))       # scores stay within about +-20
    check_backward(q, k, v, scale=scale)
    check_backward(q, k, v, scale=scale, causal=True, dropout_p=0.2, seed=1)
    dout = rand(np.random.default_rng(1), (2, 2, 70, 16), 1e3)
    check_backward(q, k, v, dout, scale=scale)


def test_nan_in_a_query_row_stays_where_the_twin_puts_it(qkv):
    # NaN in q row 5 of head 1: its lse and out are NaN; its probabilities count as zero (its
    # lse is not a number), so dv stays finite, but its dS is NaN through Delta = dout . out:
    # NaN in its dq row and in every dk row of that head; the other head is untouched
    q, k, v = qkv(1, 2, 20, 37, 16)
    q[0, 1, 5, 3] = np.nan
    _, lse, (dq, dk, dv) = check_backward(q, k, v)
    assert np.isnan(lse[0, 1, 5]) and np.isnan(dq[0, 1, 5]).all() and np.isnan(dk[0, 1]).all()
    assert np.isfinite(dv).all() and np.isfinite(dq[0, 1, :5]).all()
    assert np.isfinite(dq[0, 0]).all() and np.isfinite(dk[0, 0]).all()


def test_nan_in_a_query_row_causal(qkv):
    # with causal, the keys hidden from the NaN row may or may not receive its NaN in dk
    # (blocks of keys that row never reaches are skipped); everything else is specified
    q, k, v = qkv(1, 2, 20, 37, 16)
    q[0, 1, 5, 3] = np.nan
    dout = rand(np.random.default_rng(0), (1, 2, 20, 16))
    out, cache = ops.attention_forward(q, k, v, causal=True)
    dq, dk, dv = ops.attention_backward(dout, q, k, v, out, cache["lse"], causal=True)
    assert np.isnan(dq[0, 1, 5]).all() and np.isnan(dk[0, 1, :5 + 17 + 1]).all()
    assert np.isfinite(dv).all() and np.isfinite(np.delete(dq[0, 1], 5, axis=0)).all()
    assert np.isfinite(dq[0, 0]).all() and np.isfinite(dk[0, 0]).all()
    _, want_dk, want_dv = reference.attention_backward(dout, q, k, v, out, cache["lse"],
                                                       causal=True)
    ok = ~np.isnan(dk) & ~np.isnan(want_dk)  # numbers in both
    assert_close(dk[ok], want_dk[ok], **TOL["attention_grad_plain"], name="dk")
    assert_close(dv, want_dv, **TOL["attention_grad_plain"], name="dv")


# ----------------------------------------------------------------------------------------------
# layouts, dtypes, degenerate sizes


def test_strided_views_equal_contiguous(rng):
    B, H, Lq, Lk, D, Dv = 2, 3, 37, 45, 16, 24
    q = rand(rng, (B, Lq, H, D)).transpose(0, 2, 1, 3)             # (B, H, L, D) head views
    k = rand(rng, (B, Lk, H, D)).transpose(0, 2, 1, 3)
    v = rand(rng, (B, Lk, H, Dv)).transpose(0, 2, 1, 3)
    dout = rand(rng, (B, Lq, H, Dv)).transpose(0, 2, 1, 3)
    assert not (q.flags.c_contiguous or dout.flags.c_contiguous)
    for kwargs in ({}, {"causal": True, "dropout_p": 0.2, "seed": 3}):
        out, cache = ops.attention_forward(q, k, v, **kwargs)
        out_view = np.ascontiguousarray(out.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        grads = ops.attention_backward(dout, q, k, v, out_view, cache["lse"], **kwargs)
        contig = [np.ascontiguousarray(a) for a in (dout, q, k, v)]
        want = ops.attention_backward(contig[0], *contig[1:], out, cache["lse"], **kwargs)
        for g, w in zip(grads, want):
            np.testing.assert_array_equal(g, w)
        # a last-axis-strided view (every other feature) is copied, with the same result
        q2 = np.repeat(np.ascontiguousarray(q), 2, axis=-1)[..., ::2]
        grads2 = ops.attention_backward(dout, q2, k, v, out, cache["lse"], **kwargs)
        for g, w in zip(grads2, want):
            np.testing.assert_array_equal(g, w)


def test_float64_inputs_return_float32(qkv):
    q, k, v = qkv(2, 2, 9, 11, 8)
    dout = rand(np.random.default_rng(0), (2, 2, 9, 8))
    out, cache = ops.attention_forward(q, k, v, causal=True)
    g32 = ops.attention_backward(dout, q, k, v, out, cache["lse"], causal=True)
    g64 = ops.attention_backward(*(a.astype(np.float64) for a in (dout, q, k, v, out,
                                                                   cache["lse"])), causal=True)
    for a, b in zip(g32, g64):
        assert b.dtype == np.float32
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("B,H,Lq,Lk,D,Dv", [(0, 2, 3, 4, 5, 6), (2, 2, 0, 4, 5, 6),
                                            (2, 2, 3, 0, 5, 6), (2, 2, 3, 4, 0, 6),
                                            (2, 2, 3, 4, 5, 0)])
def test_degenerate_sizes(qkv, B, H, Lq, Lk, D, Dv):
    q, k, v = qkv(B, H, Lq, Lk, D, Dv)
    for kwargs in ({}, {"causal": True}, {"dropout_p": 0.5, "seed": 1}):
        _, _, grads = check_backward(q, k, v, **kwargs)
        assert not any(np.isnan(g).any() for g in grads)


@pytest.mark.parametrize("B,H,Lq,Lk,D,Dv", [(0, 2, 3, 4, 5, 6), (2, 2, 0, 4, 5, 6),
                                            (2, 2, 3, 0, 5, 6), (2, 2, 3, 4, 0, 6),
                                            (2, 2, 3, 4, 5, 0)])
def test_binding_writes_exactly_the_elements_that_exist(rng, B, H, Lq, Lk, D, Dv):
    # the kernel itself on empty sizes (ops hands those to the twin): NULL pointers for arrays
    # without elements, every existing element written
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv))
    dout = rand(rng, (B, H, Lq, Dv))
    out, _, lse = reference._attention64(q, k, v, None, None, True, 0.5)
    out, lse = out.astype(np.float32), lse.astype(np.float32)
    grads = [np.full(s, np.nan, np.float32) for s in (q.shape, k.shape, v.shape)]
    _kernels.attention_backward(*grads, dout, out, lse.reshape(-1), q, k, v, None, None, 0.5,
                                True, 0.0, 0, 2)
    want = reference.attention_backward(dout, q, k, v, out, lse, causal=True, scale=0.5)
    for g, w, name in zip(grads, want, ("dq", "dk", "dv")):
        assert_close(g, w, **TOL["attention_grad_empty_sizes"], name=name)


# ----------------------------------------------------------------------------------------------
# against torch autograd (scaled_dot_product_attention, inputs requiring grad)


def torch_grads(q, k, v, dout, dtype, **tkwargs):
    torch = requires_torch()
    ts = [torch.tensor(np.asarray(a), dtype=dtype, requires_grad=True) for a in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*ts, **tkwargs)
    grads = torch.autograd.grad(out, ts, torch.tensor(np.asarray(dout), dtype=dtype))
    return [g.numpy() for g in grads]


@pytest.mark.parametrize("B,H,Lq,Lk,D,Dv", [(2, 3, 65, 65, 80, 80), (1, 2, 1, 200, 64, 64),
                                            (2, 2, 33, 129, 7, 32), (3, 1, 17, 17, 1, 3),
                                            (1, 1, 1, 1, 5, 9), (2, 2, BR + 3, KB + 1, 64, 16)])
@pytest.mark.parametrize("masking", ["none", "bool", "float", "padding", "causal"])
@pytest.mark.parametrize("torch_dtype", ["float64", "float32"])
def test_backward_vs_torch_autograd(rng, B, H, Lq, Lk, D, Dv, masking, torch_dtype):
    torch = requires_torch()
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv))
    dout = rand(rng, (B, H, Lq, Dv))
    kwargs, tkwargs = sdpa_masks(rng, masking, B, Lq, Lk)
    mask = tkwargs.get("attn_mask")
    if torch_dtype == "float64" and mask is not None and mask.is_floating_point():
        tkwargs["attn_mask"] = mask.double()
    for scale in (None, 0.25):
        out, cache = ops.attention_forward(q, k, v, scale=scale, **kwargs)
        grads = ops.attention_backward(dout, q, k, v, out, cache["lse"], scale=scale, **kwargs)
        want = torch_grads(q, k, v, dout, getattr(torch, torch_dtype), scale=scale, **tkwargs)
        compare(grads, want, dout, q, k, v, out, tol=GRAD_TORCH, scale=scale, **kwargs)


def test_backward_vs_torch_large_values(rng):
    q, k, v = (rand(rng, (2, 2, 50, 32), 30.0), rand(rng, (2, 2, 60, 32), 30.0),
               rand(rng, (2, 2, 60, 32), 1e3))
    dout = rand(rng, (2, 2, 50, 32), 1e2)
    scale = 0.01                                          # scores up to about +-30
    out, cache = ops.attention_forward(q, k, v, scale=scale)
    grads = ops.attention_backward(dout, q, k, v, out, cache["lse"], scale=scale)
    want = torch_grads(q, k, v, dout, requires_torch().float64, scale=scale)
    compare(grads, want, dout, q, k, v, out, tol=GRAD_TORCH, scale=scale)


# ----------------------------------------------------------------------------------------------
# the twin against finite differences (float64)


@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"dropout_p": 0.4, "seed": 7},
                                    {"mask": "float", "key_padding_mask": "bool"}])
def test_twin_matches_finite_differences(rng, kwargs):
    B, H, Lq, Lk, D, Dv = 1, 2, 4, 5, 3, 2
    q = rng.standard_normal((B, H, Lq, D))
    k = rng.standard_normal((B, H, Lk, D))
    v = rng.standard_normal((B, H, Lk, Dv))
    dout = rng.standard_normal((B, H, Lq, Dv))
    kwargs = dict(kwargs)
    if kwargs.get("mask") == "float":
        kwargs["mask"] = np.where(rng.random((Lq, Lk)) < 0.3, -np.inf,
                                  rng.standard_normal((Lq, Lk)))
        kwargs["mask"][:, 0] = 0.0
        kwargs["key_padding_mask"] = np.array([[False, False, True, False, False]])
    p, seed = kwargs.pop("dropout_p", 0.0), kwargs.pop("seed", None)

    def loss():  # float64 all the way: the twin's private forward
        out, _, _ = reference._attention64(q, k, v, kwargs.get("mask"),
                                           kwargs.get("key_padding_mask"),
                                           kwargs.get("causal", False), None, p, seed)
        return float(np.sum(out * dout))

    out, _, lse = reference._attention64(q, k, v, kwargs.get("mask"),
                                         kwargs.get("key_padding_mask"),
                                         kwargs.get("causal", False), None, p, seed)
    grads = reference.attention_backward(dout, q, k, v, out, lse, dropout_p=p, seed=seed,
                                         **kwargs)
    for g, x, name in zip(grads, (q, k, v), ("dq", "dk", "dv")):
        assert_close(g, numeric_grad(loss, x), **FD, name=name, dtype=None)


# ----------------------------------------------------------------------------------------------
# dropout on the attention weights


def keep_mask(seed, p, B, H, Lq, Lk):
    """The weights attention's dropout keeps, from the twin's dropout_keep."""
    return reference.dropout_keep(seed, np.arange(B * H * Lq), np.arange(Lk), p).reshape(
        B, H, Lq, Lk)


@pytest.mark.parametrize("Lq,Lk", [(1, 50), (R, 2 * KB + 3), (R + 1, 40), (BR + 3, 3 * KB + 1),
                                   (200, 200)])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_forward_drops_the_twins_elements(qkv, Lq, Lk, causal):
    # both paths of the forward (one row at a time, query blocks) drop exactly the weights the
    # twin drops, and scale the kept ones by 1 / (1 - p)
    B, H, p, seed = 2, 3, 0.3, 2**63 + 12345
    q, k, v = qkv(B, H, Lq, Lk, 32, 24)
    out, w = ops.attention(q, k, v, causal=causal, return_weights=True, dropout_p=p, seed=seed)
    ref_out, ref_w = reference.attention(q, k, v, causal=causal, return_weights=True,
                                         dropout_p=p, seed=seed)
    _, w0 = reference.attention(q, k, v, causal=causal, return_weights=True)
    keep = keep_mask(seed, p, B, H, Lq, Lk)
    np.testing.assert_array_equal(w == 0, ref_w == 0)
    np.testing.assert_array_equal(w == 0, ~keep | (w0 == 0))
    assert_close(w, ref_w, **TOL["attention_weights"], name="weights")
    assert_close(w[keep], w0[keep] / (1 - p), **TOL["attention_weights"], name="kept weights")
    assert_close(out, ref_out, rtol=TOL["attention_dropout_out"]["rtol"],
                 atol=TOL["attention_dropout_out"]["atol"] * float(np.abs(v).max()), name="out")
    out_f, cache = ops.attention_forward(q, k, v, causal=causal, dropout_p=p, seed=seed)
    np.testing.assert_array_equal(out_f, out)
    _, cache0 = ops.attention_forward(q, k, v, causal=causal)
    np.testing.assert_array_equal(cache["lse"], cache0["lse"])   # lse: before dropout


def test_dropout_zero_is_bit_identical_to_no_dropout(qkv, rng):
    q, k, v = qkv(2, 3, BR + 5, KB + 9, 32, 24)
    mask = rng.random((BR + 5, KB + 9)) < 0.2
    for kwargs in ({}, {"causal": True}, {"mask": mask}):
        base = ops.attention_forward(q, k, v, **kwargs)
        base_w = ops.attention(q, k, v, return_weights=True, **kwargs)
        dout = rand(rng, base[0].shape)
        base_g = ops.attention_backward(dout, q, k, v, base[0], base[1]["lse"], **kwargs)
        for seed in (None, 3):   # ignored at p = 0
            got = ops.attention_forward(q, k, v, dropout_p=0.0, seed=seed, **kwargs)
            np.testing.assert_array_equal(got[0], base[0])
            np.testing.assert_array_equal(got[1]["lse"], base[1]["lse"])
            got_w = ops.attention(q, k, v, return_weights=True, dropout_p=0, seed=seed, **kwargs)
            np.testing.assert_array_equal(got_w[1], base_w[1])
            got_g = ops.attention_backward(dout, q, k, v, base[0], base[1]["lse"], dropout_p=0.0,
                                           seed=seed, **kwargs)
            for a, b in zip(got_g, base_g):
                np.testing.assert_array_equal(a, b)


def test_dropout_is_unbiased_over_seeds(qkv):
    # E[dropped output] = undropped output: the mean over many seeds approaches it
    q, k, v = qkv(1, 2, 24, 40, 16, 8)
    want = ops.attention(q, k, v, causal=True)
    n, p = 400, 0.5
    mean = sum(ops.attention(q, k, v, causal=True, dropout_p=p, seed=s) for s in range(n)) / n
    # each output averages ~40 dropped terms; the mean of n draws has sd ~ |v| / sqrt(n)
    err = np.abs(mean - want).max()
    assert err < 6 * float(np.abs(v).max()) / math.sqrt(n), err
    assert not np.array_equal(ops.attention(q, k, v, dropout_p=p, seed=1),
                              ops.attention(q, k, v, dropout_p=p, seed=2))


def test_dropout_rate(qkv):
    q, k, v = qkv(2, 4, 100, 300, 8)
    for p in (0.1, 0.5, 0.9):
        _, w = ops.attention(q, k, v, return_weights=True, dropout_p=p, seed=11)
        assert abs(float((w == 0).mean()) - p) < TOL["dropout_fraction"]


def test_dropout_backward_is_the_gradient_of_the_dropped_forward(qkv):
    # the twin's gradient with dropout equals the gradient of a forward whose weights are masked
    # by the same bits (checked against finite differences above); here: torch autograd on the
    # twin's keep mask applied by hand
    torch = requires_torch()
    B, H, Lq, Lk, D, Dv, p, seed = 2, 2, 30, 45, 16, 12, 0.35, 77
    q, k, v = qkv(B, H, Lq, Lk, D, Dv)
    dout = rand(np.random.default_rng(4), (B, H, Lq, Dv))
    keep = torch.tensor(keep_mask(seed, p, B, H, Lq, Lk), dtype=torch.float64) / (1 - p)
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v)]
    scores = ts[0] @ ts[1].transpose(-1, -2) / math.sqrt(D)
    scores = scores.masked_fill(~torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq), -math.inf)
    out_t = (torch.softmax(scores, -1) * keep) @ ts[2]
    want = torch.autograd.grad(out_t, ts, torch.tensor(dout, dtype=torch.float64))
    out, cache = ops.attention_forward(q, k, v, causal=True, dropout_p=p, seed=seed)
    assert_close(out, out_t.detach().numpy(), **TOL["attention_dropout_torch"], name="out")
    grads = ops.attention_backward(dout, q, k, v, out, cache["lse"], causal=True, dropout_p=p,
                                   seed=seed)
    compare(grads, [w.numpy() for w in want], dout, q, k, v, out, tol=GRAD_TORCH, causal=True,
            dropout_p=p, seed=seed)


# ----------------------------------------------------------------------------------------------
# argument checks (ops and the twin refuse the same dropout arguments)


Q, K, V = (np.zeros(s, np.float32) for s in ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6)))
OUT, LSE = np.zeros((2, 3, 5, 6), np.float32), np.zeros((2, 3, 5), np.float32)


@pytest.mark.parametrize("kwargs,exc,pattern", [
    ({"dropout_p": 0.1}, ValueError, r"\bseed\b.*required"),
    ({"dropout_p": 0.1, "seed": -1}, ValueError, r"\bseed\b.*\[0, 2\*\*64\)"),
    ({"dropout_p": 0.1, "seed": 2**64}, ValueError, r"\bseed\b"),
    ({"dropout_p": 0.1, "seed": 1.5}, TypeError, r"\bseed\b.*float"),
    ({"dropout_p": 0.1, "seed": True}, TypeError, r"\bseed\b.*bool"),
    ({"dropout_p": 1.0, "seed": 1}, ValueError, r"\bdropout_p\b.*\[0, 1\)"),
    ({"dropout_p": -0.1, "seed": 1}, ValueError, r"\bdropout_p\b"),
    ({"dropout_p": float("nan"), "seed": 1}, ValueError, r"\bdropout_p\b"),
    ({"dropout_p": "0.1", "seed": 1}, TypeError, r"\bdropout_p\b.*str"),
    ({"dropout_p": True, "seed": 1}, TypeError, r"\bdropout_p\b.*bool"),
])
@pytest.mark.parametrize("twin", [ops, reference], ids=["ops", "reference"])
def test_dropout_arguments_refused(twin, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        twin.attention(Q, K, V, **kwargs)
    with pytest.raises(exc, match=pattern):
        twin.attention_forward(Q, K, V, **kwargs)
    with pytest.raises(exc, match=r"attention_backward.*" + pattern):
        twin.attention_backward(OUT, Q, K, V, OUT, LSE, **kwargs)


def test_dropout_seed_accepts_numpy_integers_and_the_full_range():
    for seed in (np.uint64(2**64 - 1), np.int32(5), 0, 2**64 - 1):
        ops.attention(Q, K, V, dropout_p=0.5, seed=seed)
        reference.attention(Q, K, V, dropout_p=0.5, seed=seed)


@pytest.mark.parametrize("name,args,pattern", [
    ("dout", (np.zeros((2, 3, 5, 5), np.float32), Q, K, V, OUT, LSE),
     r"\bdout\b.*\(2, 3, 5, 6\).*\(2, 3, 5, 5\)"),
    ("dout", (np.zeros((3, 5, 6), np.float32), Q, K, V, OUT, LSE), r"\bdout\b.*4-D.*\(3, 5, 6\)"),
    ("out", (OUT, Q, K, V, np.zeros((2, 3, 4, 6), np.float32), LSE),
     r"\bout\b.*\(2, 3, 5, 6\).*\(2, 3, 4, 6\)"),
    ("lse", (OUT, Q, K, V, OUT, np.zeros((2, 3, 7), np.float32)),
     r"\blse\b.*\(2, 3, 5\).*\(2, 3, 7\)"),
    ("lse", (OUT, Q, K, V, OUT, np.zeros((2, 3, 5, 1), np.float32)), r"\blse\b.*3-D"),
    ("k", (OUT, Q, np.zeros((2, 3, 7, 5), np.float32), V, OUT, LSE), r"\bk\b.*\(2, 3, 7, 5\)"),
    ("v", (OUT, Q, K, np.zeros((2, 3, 6, 6), np.float32), OUT, LSE), r"\bv\b.*\(2, 3, 6, 6\)"),
])
def test_backward_shapes_refused(name, args, pattern):
    with pytest.raises(ValueError, match=r"attention_backward: " + pattern):
        ops.attention_backward(*args)


@pytest.mark.parametrize("name", ["dout", "q", "k", "v", "out", "lse"])
def test_backward_dtypes_refused(name):
    args = dict(dout=OUT, q=Q, k=K, v=V, out=OUT, lse=LSE)
    args[name] = args[name].astype(bool)
    with pytest.raises(TypeError, match=rf"attention_backward: {name}\b.*bool"):
        ops.attention_backward(*args.values())


def test_backward_mask_checks_name_the_op():
    with pytest.raises(ValueError, match=r"attention_backward: mask.*\(2, 3, 5, 7\)"):
        ops.attention_backward(OUT, Q, K, V, OUT, LSE, mask=np.zeros((4, 7), bool))
    with pytest.raises(ValueError, match=r"attention_backward: key_padding_mask.*\(2, 7\)"):
        ops.attention_backward(OUT, Q, K, V, OUT, LSE, key_padding_mask=np.zeros((2, 6), bool))


def test_twins_share_names_and_signatures():
    import inspect
    for name in ("attention", "attention_forward", "attention_backward"):
        assert inspect.signature(getattr(ops, name)) == inspect.signature(
            getattr(reference, name)), name
    assert "attention_backward" in ops.__all__ and "attention_backward" in reference.__all__


# ----------------------------------------------------------------------------------------------
# memory: no (Lq, Lk) matrix


def test_backward_memory_stays_far_below_one_score_matrix(qkv):
    # B1 H1 L4096: one (L, L) float32 matrix is 64 MiB; forward + backward allocate their
    # outputs (out, lse, dq, dk, dv: about 4 MiB) and small per-thread blocks
    from fastattn.bench.timing import peak_memory_growth
    q, k, v = qkv(1, 1, 4096, 4096, 64)
    dout = rand(np.random.default_rng(0), q.shape)

    def train_step():
        out, cache = ops.attention_forward(q, k, v, causal=True)
        return ops.attention_backward(dout, q, k, v, out, cache["lse"], causal=True)

    train_step()
    _, mib, _, method = peak_memory_growth(train_step)
    if method != "VmHWM":
        pytest.skip(f"peak RSS not resettable here ({method})")
    assert mib < 24, f"forward + backward grew the peak RSS by {mib:.1f} MiB"
