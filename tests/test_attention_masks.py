"""What a mask means, in both twins and on every attention path (the tiled forward, the
one-row-at-a-time forward of decode steps, return_weights, dropout, the backward), on every SIMD
level (child processes):

- Only a bool True or a -inf hides a key. Any finite mask value is added to the score, however
  large, as torch does: torch.finfo(float32).min (Hugging Face's masked value) gives a key a
  weight of 0 next to an unmasked key, and a row masked that way throughout averages its values
  (the kernels used to read it as -inf and return zeros).
- A hidden key takes no part in the output or the gradients: NaN or inf in its k or v rows
  stays out, in both twins alike.

torch's math backend is the outside oracle (its default CPU backend, flash attention, gets the
backward of a row masked throughout by finfo.min wrong: it forms P from a float32 lse that
cannot hold log(Lk) next to -3.4e38).
"""
import math

import numpy as np
import pytest

import fastattn
from conftest import TILES, assert_close, child_isa_tests, requires_torch, to_torch
from fastattn import _fast, ops, reference
from tolerances import TOL, scaled

F32_MIN = float(np.finfo(np.float32).min)
MASKS, MEAN_ROW = TOL["attention_masks"], TOL["attention_mean_row"]
BQ, BK = TILES["attention_block_q"], TILES["attention_block_k"]
R = TILES["attention_rows_max_q"]

# (B, H, Lq, Lk, D, Dv): one row at a time (a decode step, a few beams), tiled with partial
# blocks, more than one key block
SHAPES = {
    "one_query": (2, 2, 1, BK + 3, 8, 5),
    "rows": (2, 3, R, 33, 16, 9),
    "tiled": (2, 2, BQ + 5, 2 * BQ + 7, 8, 6),
    "key_blocks": (1, 2, 9 if R < 9 else R + 3, BK + 40, 4, 3),
}


def qkv(rng, B, H, Lq, Lk, D, Dv):
    return (rng.standard_normal((B, H, Lq, D)).astype(np.float32),
            rng.standard_normal((B, H, Lk, D)).astype(np.float32),
            rng.standard_normal((B, H, Lk, Dv)).astype(np.float32))


def finite_masks(rng, kind, B, Lq, Lk):
    """(attention kwargs, the same as one additive float32 (B, 1, Lq, Lk) mask for torch).
    Rows masked throughout by finfo.min, rows mixing finfo.min, 0, finite values and -inf; no
    row hides every key (torch gives NaN there). Some keys are masked twice by finfo.min (torch's
    float32 sum is -inf there, ours a finite score far below a key masked once: weight 0 either
    way), never every key of a row."""
    kw = {}
    full = np.zeros((B, 1, Lq, Lk), np.float32)
    if kind in ("mask", "both"):
        m = (rng.standard_normal((Lq, Lk)) * 2).astype(np.float32)     # finite values: added
        m[rng.random((Lq, Lk)) < 0.3] = F32_MIN
        m[0] = F32_MIN                                                 # a row masked throughout
        if Lq > 1:
            m[1] = F32_MIN
            m[1, ::3] = -np.inf                                        # finfo.min and -inf mixed
        if Lq > 2:
            m[2, 1:] = -np.inf                                         # one key left: weight 1
        if Lq > 3:
            m[-1, -1] = 0.0
        kw["mask"] = m
        full += m
    if kind in ("padding", "both"):
        kp = np.zeros((B, Lk), np.float32)
        kp[0] = F32_MIN                                                # a source padded entirely
        if B > 1:
            kp[1, Lk // 2:] = F32_MIN
        if kind == "both":
            kp[0] = np.where(np.asarray(kw["mask"][0]) == F32_MIN, 0.0, F32_MIN)
            kp[:, -1] = 0.0
        kw["key_padding_mask"] = kp
        with np.errstate(over="ignore"):                               # twice: -inf for torch
            full += kp[:, None, None, :]
    return kw, full


def torch_attention(q, k, v, full, dout):
    """torch's math backend: out and the gradients of (out * dout).sum()."""
    torch = requires_torch()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (to_torch(x).requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                               attn_mask=to_torch(full))
    out.backward(to_torch(dout))
    weights = torch.softmax(qt.detach() @ kt.detach().transpose(-1, -2) / math.sqrt(q.shape[-1])
                            + to_torch(full), dim=-1)
    return out.detach().numpy(), weights.numpy(), (qt.grad.numpy(), kt.grad.numpy(),
                                                   vt.grad.numpy())


def check_twins(q, k, v, kw, rng):
    """ops against reference: out, lse, weights, the backward (each with and without dropout).
    Returns the kernel's (out, weights, grads) without dropout."""
    result = None
    for drop in ({}, {"dropout_p": 0.25, "seed": 99}):
        kwd = dict(kw, **drop)
        out, cache = ops.attention_forward(q, k, v, **kwd)
        rout, rcache = reference.attention_forward(q, k, v, **kwd)
        assert_close(out, rout, **scaled(MASKS["out"], rout, 1.0), name="out")
        assert_close(cache["lse"], rcache["lse"], **TOL["attention_lse"], name="lse")
        _, w = ops.attention(q, k, v, return_weights=True, **kwd)
        _, rw = reference.attention(q, k, v, return_weights=True, **kwd)
        assert_close(w, rw, **TOL["attention_weights"], name="weights")
        dout = rng.standard_normal(out.shape).astype(np.float32)
        grads = ops.attention_backward(dout, q, k, v, out, cache["lse"], **kwd)
        rgrads = reference.attention_backward(dout, q, k, v, out, cache["lse"], **kwd)
        for name, g, rg in zip(("dq", "dk", "dv"), grads, rgrads):
            assert_close(g, rg, **scaled(MASKS["grad"], rg, 1.0), name=name)
        if not drop:
            result = out, w, grads
    return result


@pytest.mark.parametrize("kind", ["mask", "padding", "both"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_finite_masks_are_added_in_both_twins(rng, shape, kind):
    B, H, Lq, Lk, D, Dv = SHAPES[shape]
    q, k, v = qkv(rng, B, H, Lq, Lk, D, Dv)
    kw, _ = finite_masks(rng, kind, B, Lq, Lk)
    out, w, _ = check_twins(q, k, v, kw, rng)
    mean_v = v.mean(axis=2)                                          # (B, H, Dv)
    if kind == "mask":                       # row 0 masked throughout by finfo.min: mean of v
        assert_close(out[:, :, 0], mean_v, **MEAN_ROW, name="finfo.min row")
    if kind == "padding":                    # source 0 padded throughout by finfo.min
        assert_close(out[0], np.broadcast_to(mean_v[0, :, None], out[0].shape), **MEAN_ROW,
                     name="finfo.min padding")
    assert np.isfinite(w).all()
    sums = w.sum(-1)
    assert_close(sums, np.ones_like(sums), **TOL["attention_masks_row_sums"], name="row sums",
                 dtype=None)


@pytest.mark.parametrize("kind", ["mask", "padding", "both"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_finite_masks_match_torch(rng, shape, kind):
    requires_torch()
    B, H, Lq, Lk, D, Dv = SHAPES[shape]
    q, k, v = qkv(rng, B, H, Lq, Lk, D, Dv)
    kw, full = finite_masks(rng, kind, B, Lq, Lk)
    dout = rng.standard_normal((B, H, Lq, Dv)).astype(np.float32)
    tout, tw, tgrads = torch_attention(q, k, v, full, dout)
    out, cache = ops.attention_forward(q, k, v, **kw)
    assert_close(out, tout, **scaled(MASKS["out_torch"], tout, 1.0), name="out vs torch")
    _, w = ops.attention(q, k, v, return_weights=True, **kw)
    assert_close(w, tw, **TOL["attention_weights"], name="weights vs torch")
    grads = ops.attention_backward(dout, q, k, v, out, cache["lse"], **kw)
    for name, g, tg in zip(("dq", "dk", "dv"), grads, tgrads):
        assert_close(g, tg, **scaled(MASKS["grad_torch"], tg, 1.0), name=f"{name} vs torch")
    # the twin too (its backward recomputes P from the scores, as torch's math does)
    for name, g, tg in zip(("dq", "dk", "dv"), reference.attention_backward(
            dout, q, k, v, out, cache["lse"], **kw), tgrads):
        assert_close(g, tg, **scaled(MASKS["grad_torch"], tg, 1.0),
                     name=f"reference {name} vs torch")


def test_huge_finite_values_keep_their_order(rng):
    """Masks near the float32 limit on both sides: each row's weight goes to its largest total
    (a key masked twice by finfo.min is far below one masked once), never NaN or zeros."""
    B, H, Lq, Lk, D, Dv = 1, 1, 6, 5, 4, 3
    q, k, v = qkv(rng, B, H, Lq, Lk, D, Dv)
    m = np.full((Lq, Lk), F32_MIN, np.float32)
    m[0, 2] = F32_MIN / 2                        # one key at half the minimum wins the row
    m[1, 3] = np.float32(3e38)                   # a huge positive bias wins its row
    m[2] = [F32_MIN, -3e38, -2.5e38, F32_MIN, F32_MIN]
    kp = np.zeros((1, Lk), np.float32)
    kp[0, 0] = F32_MIN                           # key 0 masked twice in the rows above
    out, w, _ = check_twins(q, k, v, {"mask": m, "key_padding_mask": kp}, rng)
    won = np.array([w[0, 0, 0, 2], w[0, 0, 1, 3], w[0, 0, 2, 2]])
    assert_close(won, np.ones(3), **TOL["attention_masks_winner"], name="winning keys",
                 dtype=None)
    alike = TOL["attention_masks_masked_alike"]
    assert_close(w[0, 0, 3:, 0], np.zeros(3), **alike, name="key 0 masked twice", dtype=None,
                 equal_nan=False)
    assert_close(w[0, 0, 3:, 1:], np.full((3, 4), 0.25), **alike, name="keys masked once",
                 dtype=None, equal_nan=False)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("how", ["causal", "bool_mask", "inf_mask", "bool_padding", "inf_padding",
                                 "combined"])
@pytest.mark.parametrize("where", ["k", "v", "kv"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_hidden_keys_keep_nan_and_inf_out(rng, shape, how, where, value):
    B, H, Lq, Lk, D, Dv = SHAPES[shape]
    if how == "causal":
        Lk = max(Lk, Lq + 1)
    q, k, v = qkv(rng, B, H, Lq, Lk, D, Dv)
    kw, hidden_keys = {}, [Lk - 1] if how == "causal" else [Lk // 2, Lk - 1]
    if how in ("bool_mask", "inf_mask", "combined"):
        m = np.zeros((Lq, Lk), bool)
        m[:, hidden_keys[0]] = True
        kw["mask"] = m if how != "inf_mask" else np.where(m, -np.inf, 0).astype(np.float32)
    if how in ("bool_padding", "inf_padding", "combined"):
        kp = np.zeros((B, Lk), bool)
        kp[:, hidden_keys[-1]] = True
        kw["key_padding_mask"] = kp if how != "inf_padding" else \
            np.where(kp, -np.inf, 0).astype(np.float32)
    if how == "bool_mask":
        kw["mask"][:, hidden_keys[-1]] = True
    if how == "inf_mask":
        kw["mask"][:, hidden_keys[-1]] = -np.inf
    if how in ("bool_padding", "inf_padding"):
        kw["key_padding_mask"][:, hidden_keys[0]] = True if how == "bool_padding" else -np.inf
    if how in ("causal", "combined"):
        kw["causal"] = True                      # the last key: seen by the last query only
    for j in hidden_keys:
        if "k" in where:
            k[:, :, j, ::2] = value
        if "v" in where:
            v[:, :, j, 1::2] = value
    out, w, grads = check_twins(q, k, v, kw, rng)
    sees_bad = Lq - 1 if how == "causal" else Lq       # queries before this one see no bad key
    assert np.isfinite(out[:, :, :sees_bad]).all()
    assert np.isfinite(w[:, :, :sees_bad]).all()
    if how != "causal":
        for g in grads:
            assert np.isfinite(g).all()


def test_decode_attention_entry_reads_finite_key_bias_as_added(rng):
    """The decode step's kernel entry (_fast.attention_fn: a key bias, one row at a time):
    finfo.min padding averages the values; -inf padding with NaN values stays out."""
    B, H, Lk, D = 3, 2, 20, 8
    q, k, v = qkv(rng, B, H, 1, Lk, D, D)
    kb = np.zeros((B, Lk), np.float32)
    kb[0] = F32_MIN                                   # a source padded entirely, finfo.min
    kb[1, 5:] = F32_MIN
    kb[2, 7:] = -np.inf
    v[2, :, 9] = np.nan                               # hidden by -inf: stays out
    out = np.empty((B, H, 1, D), np.float32)
    _fast.attention_fn(1.0 / math.sqrt(D))(q, k, v, kb.reshape(-1), out)
    want = reference.attention(q, k, v, key_padding_mask=kb)
    assert np.isfinite(out).all()
    assert_close(out, want, **MEAN_ROW, name="decode step")
    assert_close(out[0], v[0].mean(axis=-2, keepdims=True), **MEAN_ROW,
                 name="finfo.min padding = mean of v")


def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA (and small OpenMP teams)."""
    rng = np.random.default_rng(3)
    tiles = fastattn.build_info()["tiles"]
    bq, bk, r = tiles["attention_block_q"], tiles["attention_block_k"], \
        tiles["attention_rows_max_q"]
    for B, H, Lq, Lk, D, Dv in ((2, 2, 1, bk + 3, 8, 5), (2, 3, r, 33, 16, 9),
                                (2, 2, bq + 5, 2 * bq + 7, 8, 6), (1, 2, r + 3, bk + 40, 4, 3)):
        for kind in ("mask", "padding", "both"):
            q, k, v = qkv(rng, B, H, Lq, Lk, D, Dv)
            check_twins(q, k, v, finite_masks(rng, kind, B, Lq, Lk)[0], rng)
        q, k, v = qkv(rng, B, H, Lq, Lk + Lq, D, Dv)
        kp = np.zeros((B, Lk + Lq), bool)
        kp[:, 1] = True
        k[:, :, 1], v[:, :, -1] = np.nan, np.inf      # hidden by padding, and causally from
        out, _, grads = check_twins(q, k, v, {"key_padding_mask": kp, "causal": True}, rng)
        assert np.isfinite(out[:, :, :-1]).all()      # all but the last query


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_attention_masks")
