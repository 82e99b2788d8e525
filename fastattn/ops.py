"""The functional API on the C kernels: validation, mask normalisation, float32, outputs.

Same names, signatures and results as ``fastattn.reference`` (see its module docstring for the
dimension letters and conventions); the shape tables are in csrc/fastattn.h.

Input handling, the same for every op:
- The arguments are checked by fastattn._checks, the same functions the reference calls: both
  twins accept and refuse the same arguments, with the same errors.
- float64 (and other real dtypes) are converted to float32; bool, complex, object and string
  arrays raise TypeError. Non-contiguous inputs are copied, except attention's q, k and v, which
  the kernel reads through their strides when the last axis is contiguous. So are float32 views
  whose data is not 4-byte aligned (np.frombuffer at an odd offset, packed records): the
  kernels load whole floats.
- Wrong ranks or mismatched shapes raise ValueError naming the argument and the shapes seen.
- Empty batches return empty arrays. NaN in the data propagates as NaN (it is not checked).
"""
import math

import numpy as np

from . import _checks, _convert, _fast, _kernels, kinds, reference
from ._checks import ACTIVATIONS
from ._runtime import get_num_threads
from .quant import (INT8_MAX_K, QuantizedWeight, dequantize_int8, from_bfloat16,  # noqa: F401
                    quantize_int8, round_bfloat16, to_bfloat16)

__all__ = [
    "attention", "attention_forward", "softmax", "layer_norm", "layer_norm_forward", "linear",
    "attention_backward",
    "ffn", "positional_encoding",
]
# quantised weights (fastattn.quant): the twin API names, here as in fastattn.reference
__all__ += ["quantize_int8", "dequantize_int8", "to_bfloat16", "from_bfloat16",
            "round_bfloat16", "QuantizedWeight", "INT8_MAX_K"]


# ---- masks (after the checks in _checks) --------------------------------------------------------

def _mask_bias(mask, name, op, dtype_ok="bool or float"):
    """bool True = blocked -> -inf; float -> itself (added). Integer masks are ambiguous:
    refused."""
    return _bias(_checks.mask_array(mask, name, op, dtype_ok))


def _bias(m):
    """A checked mask (bool or float ndarray) as the kernels' float32 bias: True -> -inf, False
    -> 0, floats as they are (aligned, whole-float strides)."""
    if m.dtype == np.bool_:
        return np.where(m, np.float32(-np.inf), np.float32(0.0))
    m = m.astype(np.float32, copy=False)
    if not (m.flags.aligned and all(s % 4 == 0 for s in m.strides)):
        m = m.copy(order="C")         # the kernel reads aligned floats, whole-float strides
    return m


# ---- attention ---------------------------------------------------------------------------------

def _attention_operands(q, k, v, mask, key_padding_mask, op):
    """Checked attention operands in the kernel's form: q, k, v float32 with a contiguous last
    axis; mask -> a float32 bias broadcast to (B, H, Lq, Lk) (a view); key_padding_mask -> a
    float32 (B * Lk,) bias."""
    q, k, v = (_convert.strided(_convert.f32(a)) for a in (q, k, v))
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = np.broadcast_to(_bias(mask), (B, H, Lq, Lk))
    if key_padding_mask is not None:
        key_padding_mask = np.ascontiguousarray(_bias(key_padding_mask)).reshape(-1)
    return q, k, v, mask, key_padding_mask


def _attention(q, k, v, mask, key_padding_mask, causal, scale, want_weights, dropout_p, seed,
               compute_type="float32"):
    p, seed = _checks.attention_dropout(dropout_p, seed, "attention")
    bf16 = _checks.compute_type(compute_type, "attention", p)
    q, k, v, mask, key_padding_mask, scale = _checks.attention(q, k, v, mask, key_padding_mask,
                                                               scale)
    q, k, v, bias, key_bias = _attention_operands(q, k, v, mask, key_padding_mask, "attention")
    B, H, Lq, D = q.shape
    Lk, Dv = k.shape[2], v.shape[3]
    if min(B, H, Lq, Dv) == 0 or min(Lk, D) == 0:
        # Nothing to tile (an empty batch, or no keys / zero-width heads): the twin is exact.
        kb = None if key_bias is None else key_bias.reshape(B, Lk)
        if bf16:
            out, weights, lse = reference._attention64_bf16(q, k, v, bias, kb, bool(causal),
                                                            scale, p, seed)
        else:
            out, weights, lse = reference._attention64(q, k, v, bias, kb, bool(causal), scale,
                                                       p, seed)
        return (out.astype(np.float32), lse.astype(np.float32),
                weights.astype(np.float32) if want_weights else None)
    out = np.empty((B, H, Lq, Dv), np.float32)
    lse = np.empty(B * H * Lq, np.float32)
    weights = np.empty(B * H * Lq * Lk, np.float32) if want_weights else None
    _kernels.attention_forward(out, lse, weights, q, k, v, bias, key_bias, scale, bool(causal),
                               get_num_threads(), p, seed or 0, bf16)
    return out, lse.reshape(B, H, Lq), (weights.reshape(B, H, Lq, Lk) if want_weights else None)


def attention_forward(q, k, v, *, mask=None, key_padding_mask=None, causal=False, scale=None,
                      dropout_p=0.0, seed=None, compute_type="float32"):
    """Fused attention returning (out, {"lse": (B, H, Lq)}); see reference.attention_forward.
    compute_type="bfloat16": as attention's, with dropout's P keep rounded (bf16 training)."""
    out, lse, _ = _attention(q, k, v, mask, key_padding_mask, causal, scale, False, dropout_p,
                             seed, compute_type)
    return out, {"lse": lse}


def attention(q, k, v, *, mask=None, key_padding_mask=None, causal=False, scale=None,
              return_weights=False, dropout_p=0.0, seed=None, compute_type="float32"):
    """softmax(q k^T * scale + masks) v, fused and tiled; see reference.attention.

    q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv) -> (B, H, Lq, Dv) float32 [, weights
    (B, H, Lq, Lk) when return_weights]. mask: bool (True = not allowed) or float (added),
    broadcastable to (B, H, Lq, Lk); key_padding_mask (B, Lk), True = padding; causal is
    bottom-right aligned. Only True or -inf hides a key (its k and v rows, NaN included, take no
    part); any finite mask value is added to the score, however large (finfo(float32).min gives
    a weight of 0 next to an unmasked key; a row masked that way throughout averages its
    values), as in torch. A query with no allowed key returns zeros. Without return_weights no
    (Lq, Lk) matrix is ever stored. dropout_p in [0, 1) drops attention weights (kept ones
    scaled by 1 / (1 - p)) as reference.dropout_keep decides from seed, bit for bit; the
    returned weights are the dropped ones.

    compute_type="bfloat16": q, k, v rounded to bf16 (nearest
    even, as vcvtneps2bf16), q.k products exact and summed in float32, then times scale; the
    softmax in float32; P = exp(s - max) rounded to bf16 for the product with the rounded v,
    divided by the float32 sum of the unrounded P; returned weights float32 (P / sum). The
    AVX512_BF16 path uses vdpbf16ps, the others round, widen and FMA: the same products, float32
    sums whose order may differ (see reference.attention and docs/bf16_attention.md).
    """
    out, _, weights = _attention(q, k, v, mask, key_padding_mask, causal, scale, return_weights,
                                 dropout_p, seed, compute_type)
    return (out, weights) if return_weights else out


def attention_backward(dout, q, k, v, out, lse, *, mask=None, key_padding_mask=None,
                       causal=False, scale=None, dropout_p=0.0, seed=None,
                       compute_type="float32"):
    """(dq, dk, dv) of attention from the forward's out and lse, flash style (the probabilities
    are recomputed block by block; no (Lq, Lk) matrix is stored); see
    reference.attention_backward.

    dout and out (B, H, Lq, Dv), lse (B, H, Lq) (attention_forward's cache["lse"]); q, k, v
    and every option exactly as given to the forward (the same seed regenerates its dropout).
    dout, out, q, k and v are read through their strides when their last axis is contiguous.
    -> dq (B, H, Lq, D), dk (B, H, Lk, D), dv (B, H, Lk, Dv), float32, C-contiguous.
    NaN propagates as in the twin, except that with causal a NaN query row may leave the keys
    it cannot see untouched (the twin spreads its NaN to every key of the head).
    compute_type="bfloat16": bf16 training's backward (see reference.attention_backward).
    """
    op = "attention_backward"
    dout, q, k, v, out, lse, mask, key_padding_mask, scale, p, seed = _checks.attention_backward(
        dout, q, k, v, out, lse, mask, key_padding_mask, scale, dropout_p, seed, op)
    bf16 = _checks.compute_type(compute_type, op, p)
    q, k, v, bias, key_bias = _attention_operands(q, k, v, mask, key_padding_mask, op)
    dout, out = (_convert.strided(_convert.f32(a)) for a in (dout, out))
    if bf16:
        dout, q, k, v = (_fast.round_bf16(t) for t in (dout, q, k, v))
    lse = _convert.f32(lse)
    B, H, Lq, D = q.shape
    Lk, Dv = k.shape[2], v.shape[3]
    if min(B, H, Lq, Lk, D, Dv) == 0:
        # Nothing to tile (an empty batch, no queries or keys, zero-width heads): the twin.
        kb = None if key_bias is None else key_bias.reshape(B, Lk)
        return reference.attention_backward(dout, q, k, v, out, lse, mask=bias,
                                            key_padding_mask=kb, causal=bool(causal),
                                            scale=scale, dropout_p=p, seed=seed,
                                            compute_type=compute_type)
    dq = np.empty((B, H, Lq, D), np.float32)
    dk = np.empty((B, H, Lk, D), np.float32)
    dv = np.empty((B, H, Lk, Dv), np.float32)
    _kernels.attention_backward(dq, dk, dv, dout, out, np.ascontiguousarray(lse).reshape(-1),
                                q, k, v, bias, key_bias, scale, bool(causal), p, seed or 0,
                                get_num_threads(), bf16)
    return dq, dk, dv


# ---- softmax -----------------------------------------------------------------------------------

def softmax(x, axis=-1):
    """Max-subtracted softmax along `axis`; a row of all -inf gives zeros. See reference.softmax."""
    a, axis = _checks.softmax(x, axis)
    a = _convert.f32(a)
    moved = np.ascontiguousarray(np.moveaxis(a, axis, -1))
    y = np.empty_like(moved)
    if moved.size:
        C = moved.shape[-1]
        _kernels.softmax_forward(y.reshape(-1, C), moved.reshape(-1, C), get_num_threads())
    return np.moveaxis(y, -1, axis)


# ---- layer norm --------------------------------------------------------------------------------

def layer_norm_forward(x, weight, bias, *, eps=1e-5, residual=None):
    """LN(x + residual) returning (y, {"mean": (N,), "rstd": (N,)}); see reference."""
    x, weight, bias, residual, eps = _checks.layer_norm(x, weight, bias, eps, residual)
    x, weight, bias, residual = map(_convert.f32c, (x, weight, bias, residual))
    C = x.shape[-1]
    N = x.size // C if C else 0
    y = np.empty(x.shape, np.float32)
    mean = np.empty(N, np.float32)
    rstd = np.empty(N, np.float32)
    if N and C:
        _kernels.layer_norm_forward(y.reshape(N, C), None, mean, rstd, x.reshape(N, C),
                                    None if residual is None else residual.reshape(N, C),
                                    weight, bias, float(eps), get_num_threads())
    elif N:  # C == 0: nothing to normalise; the twin defines the degenerate statistics
        return reference.layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
    return y, {"mean": mean, "rstd": rstd}


def layer_norm(x, weight, bias, *, eps=1e-5, residual=None):
    """LN(x + residual) over the last axis, residual add fused; see reference.layer_norm."""
    return layer_norm_forward(x, weight, bias, eps=eps, residual=residual)[0]


def layer_norm_backward(dy, x, mean, rstd, weight, *, residual=None):
    """Gradients (dx, dweight, dbias) of LN(x + residual) * weight + bias from the forward's
    mean and rstd; dx is the gradient of x and of residual alike. See
    reference.layer_norm_backward."""
    checked = _checks.layer_norm_backward(dy, x, mean, rstd, weight, residual)
    dy, x, mean, rstd, weight, residual = map(_convert.f32c, checked)
    C = x.shape[-1]
    N = math.prod(x.shape[:-1])
    dx = np.empty(x.shape, np.float32)
    dweight = None if weight is None else np.empty(C, np.float32)
    dbias = np.empty(C, np.float32)
    _kernels.layer_norm_backward(dx.reshape(N, C), dweight, dbias, dy.reshape(N, C), mean, rstd,
                                 x.reshape(N, C),
                                 None if residual is None else residual.reshape(N, C), weight,
                                 False, get_num_threads())
    return dx, dweight, dbias


# ---- linear and feed-forward -------------------------------------------------------------------

def _check_linear(x, weight, bias, activation):
    """linear's arguments checked and converted -> (x, weight, bias, act code, N, M, K)."""
    x, weight, bias, activation = _checks.linear(x, weight, bias, activation)
    x, weight, bias = map(_convert.f32c, (x, weight, bias))
    M, K = weight.shape
    return x, weight, bias, ACTIVATIONS[activation], math.prod(x.shape[:-1]), M, K


def linear(x, weight, bias=None, *, activation=None):
    """act(x @ weight.T + bias), the GEMM engine with a fused epilogue; see reference.linear.
    weight may be a QuantizedWeight (int8 or bf16): the quantised kernels, any number of rows.
    The product is the weight kind's (fastattn.kinds)."""
    quantized = isinstance(weight, QuantizedWeight)
    x, weight, bias, activation = _checks.linear(x, weight, bias, activation, "linear",
                                                 quantized_ok=True)
    x, bias = _convert.f32c(x), _convert.f32c(bias)
    if not quantized:
        weight = _convert.f32c(weight)
    M, K = weight.shape
    N = math.prod(x.shape[:-1])
    y = np.empty(x.shape[:-1] + (M,), np.float32)
    if not quantized and not (N and M and K):
        if N and M:  # K == 0: an empty sum, only the bias and activation remain
            return reference.linear(x, weight, bias, activation=activation)
        return y
    kinds.of(weight).product(bias, ACTIVATIONS[activation])(x.reshape(N, K), y.reshape(N, M))
    return y


def linear_forward(x, weight, bias=None, *, activation=None, compute_type="float32"):
    """linear() returning (y, {"pre": (N, M) or None}): the pre-activation is kept (written by
    the GEMM's epilogue) when there is an activation. compute_type="bfloat16": x and weight
    rounded to bf16 first (bf16 training). See reference.linear_forward."""
    x, weight, bias, act, N, M, K = _check_linear(x, weight, bias, activation)
    bf16 = _checks.compute_type(compute_type, "linear_forward")
    if bf16:
        x, weight = _fast.round_bf16(x), _fast.round_bf16(weight)
    if not (N and M and K):  # nothing to multiply: the twin is exact
        return reference.linear_forward(x, weight, bias, activation=activation)
    y = np.empty(x.shape[:-1] + (M,), np.float32)
    pre = None if act == 0 else np.empty((N, M), np.float32)
    _kernels.linear_forward(y.reshape(N, M), pre, x.reshape(N, K), weight, bias, act,
                            get_num_threads(), bf16)
    return y, {"pre": pre}


def linear_backward(dy, x, weight, *, pre=None, activation=None, compute_type="float32"):
    """Gradients (dx, dweight, dbias) of act(x @ weight.T + bias); pre is the forward's
    cache["pre"] (needed with an activation). compute_type="bfloat16": bf16 training's
    backward (see reference.linear_backward). See reference.linear_backward."""
    dy, x, weight, pre, activation = _checks.linear_backward(dy, x, weight, pre, activation)
    bf16 = _checks.compute_type(compute_type, "linear_backward")
    dy, x, weight, pre = map(_convert.f32c, (dy, x, weight, pre))
    if bf16:
        x, weight = _fast.round_bf16(x), _fast.round_bf16(weight)
    act = ACTIVATIONS[activation]
    M, K = weight.shape
    N = math.prod(x.shape[:-1])
    pre = None if pre is None else pre.reshape(N, M)
    dx = np.empty(x.shape, np.float32)
    dweight = np.empty((M, K), np.float32)
    dbias = np.empty(M, np.float32)
    dz = np.empty((N, M), np.float32) if (act or bf16) and N and M else None
    _kernels.linear_backward(dx.reshape(N, K), dweight, dbias, dz, dy.reshape(N, M), pre,
                             x.reshape(N, K), weight, act, False, get_num_threads(), bf16)
    return dx, dweight, dbias


def ffn(x, w1, b1, w2, b2, *, activation="relu"):
    """linear(act(linear(x, w1, b1)), w2, b2) in row blocks; see reference.ffn. w1 and w2 may
    be QuantizedWeights: then two products (the activation fused in the first one's
    epilogue) with a float32 hidden in between. The products are the weight kinds'
    (fastattn.kinds.ffn_product)."""
    quantized = isinstance(w1, QuantizedWeight) or isinstance(w2, QuantizedWeight)
    x, w1, b1, w2, b2, act = _check_ffn(x, w1, b1, w2, b2, activation, "ffn",
                                        quantized_ok=quantized)
    C, F = x.shape[-1], w1.shape[0]
    N = x.size // C if C else int(np.prod(x.shape[:-1]))
    y = np.empty(x.shape, np.float32)
    if not quantized and not (N and C and F):
        if N and C:  # F == 0: the hidden layer is empty, y = b2
            return reference.ffn(x, w1, b1, w2, b2, activation=activation)
        return y
    kinds.ffn_product(w1, b1, w2, b2, act)(x.reshape(N, C), y.reshape(N, C))
    return y


def _check_ffn(x, w1, b1, w2, b2, activation, op, quantized_ok=False):
    """ffn's arguments checked and converted (float weights to float32; QuantizedWeights,
    allowed where quantized_ok, as they are) -> (x, w1, b1, w2, b2, act code)."""
    x, w1, b1, w2, b2, activation = _checks.ffn(x, w1, b1, w2, b2, activation, op, quantized_ok)
    w1, w2 = (w if isinstance(w, QuantizedWeight) else _convert.f32c(w) for w in (w1, w2))
    x, b1, b2 = map(_convert.f32c, (x, b1, b2))
    return x, w1, b1, w2, b2, ACTIVATIONS[activation]


def ffn_forward(x, w1, b1, w2, b2, *, activation="relu", dropout_p=0.0, seed=None,
                compute_type="float32"):
    """The FFN in training, linear2(dropout(act(linear1(x)))), returning (y, {"pre": (N, F)});
    dropout_p = 0 runs the inference kernel's path (only pre is written in addition).
    compute_type="bfloat16": bf16 training's forward. See reference.ffn_forward."""
    op = "ffn_forward"
    x, w1, b1, w2, b2, activation = _checks.ffn_training(x, w1, b1, w2, b2, activation,
                                                         dropout_p, seed, op)
    bf16 = _checks.compute_type(compute_type, op)
    x, w1, b1, w2, b2 = map(_convert.f32c, (x, w1, b1, w2, b2))
    if bf16:
        x, w1, w2 = (_fast.round_bf16(t) for t in (x, w1, w2))
    act = ACTIVATIONS[activation]
    C, F = x.shape[-1], w1.shape[0]
    N = math.prod(x.shape[:-1])
    if not (N and C and F):  # an empty batch, model or hidden layer: the twin is exact
        return reference.ffn_forward(x, w1, b1, w2, b2, activation=activation,
                                     dropout_p=dropout_p, seed=seed)
    y = np.empty(x.shape, np.float32)
    pre = np.empty((N, F), np.float32)
    _kernels.ffn_forward(y.reshape(N, C), pre, x.reshape(N, C), w1, b1, w2, b2, act,
                         float(dropout_p), int(seed or 0), get_num_threads(), bf16)
    return y, {"pre": pre}


def ffn_backward(dy, x, w1, b1, w2, b2, pre, *, activation="relu", dropout_p=0.0, seed=None,
                 compute_type="float32"):
    """Gradients (dx, dw1, db1, dw2, db2) of the FFN from its cache["pre"]; the activation and
    the dropout mask are recomputed. db1 / db2 are None when b1 / b2 are.
    compute_type="bfloat16": bf16 training's backward. See reference.ffn_backward."""
    op = "ffn_backward"
    dy, x, w1, b1, w2, b2, pre, activation = _checks.ffn_backward(
        dy, x, w1, b1, w2, b2, pre, activation, dropout_p, seed, op)
    bf16 = _checks.compute_type(compute_type, op)
    dy, x, w1, b1, w2, b2, pre = map(_convert.f32c, (dy, x, w1, b1, w2, b2, pre))
    if bf16:
        dy, x, w1, w2 = (_fast.round_bf16(t) for t in (dy, x, w1, w2))
    act = ACTIVATIONS[activation]
    C, F = x.shape[-1], w1.shape[0]
    N = math.prod(x.shape[:-1])
    pre = pre.reshape(N, F)
    dx = np.empty(x.shape, np.float32)
    dw1, dw2 = np.empty((F, C), np.float32), np.empty((C, F), np.float32)
    db1 = None if b1 is None else np.empty(F, np.float32)
    db2 = None if b2 is None else np.empty(C, np.float32)
    h = np.empty((N, F), np.float32)
    dpre = np.empty((N, F), np.float32)
    _kernels.ffn_backward(dx.reshape(N, C), dw1, db1, dw2, db2, h, dpre, dy.reshape(N, C), pre,
                          x.reshape(N, C), w1, w2, act, float(dropout_p), int(seed or 0), False,
                          get_num_threads(), bf16)
    return dx, dw1, db1, dw2, db2


__all__ += ["layer_norm_backward", "linear_forward", "linear_backward", "ffn_forward",
            "ffn_backward", "dropout", "dropout_backward", "embedding_backward"]


# ---- dropout -----------------------------------------------------------------------------------

def _dropout(x, p, seed, op, name):
    a = _convert.f32c(_checks.dropout(x, p, seed, op, name))
    y = np.empty(a.shape, np.float32)
    C = a.shape[-1]
    N = math.prod(a.shape[:-1])
    if N and C:
        _kernels.dropout_forward(y.reshape(N, C), a.reshape(N, C), float(p), int(seed or 0),
                                 get_num_threads())
    return y


def dropout(x, p, *, seed=None):
    """x * keep / (1 - p) over the last axis, the mask a pure function of (seed, row, column)
    computed in the kernel (never stored); p = 0 returns a copy. See reference.dropout."""
    return _dropout(x, p, seed, "dropout", "x")


def dropout_backward(dy, p, *, seed=None):
    """dy * keep / (1 - p) with the forward's mask regenerated from seed. See
    reference.dropout_backward."""
    return _dropout(dy, p, seed, "dropout_backward", "dy")


# ---- embedding ---------------------------------------------------------------------------------

def embedding_backward(dout, ids, num_embeddings):
    """Deterministic scatter-add of the rows of dout (..., C) into the rows of their ids (...):
    dweight (num_embeddings, C). See reference.embedding_backward."""
    dout, ids, V = _checks.embedding_backward(dout, ids, num_embeddings)
    dout = _convert.f32c(dout)
    flat = ids.reshape(-1)
    C = dout.shape[-1]
    dweight = np.empty((V, C), np.float32)
    _kernels.embedding_backward(dweight, dout.reshape(flat.size, C), flat, False,
                                get_num_threads())
    return dweight


# ---- positional encoding -----------------------------------------------------------------------

def positional_encoding(length, d_model):
    """(length, d_model) sinusoidal table; computed once per model in NumPy (not a hot path), so
    it is the twin's own code after the argument checks."""
    return reference.positional_encoding(length, d_model)


# ---- loss --------------------------------------------------------------------------------------

__all__ += ["cross_entropy"]

REDUCTIONS = _checks.REDUCTIONS


def cross_entropy(logits, targets, *, ignore_index=-100, label_smoothing=0.0, reduction="mean",
                  return_grad=False):
    """Cross-entropy of log-softmax(logits) against integer targets, fused (one read pass per
    row, and one write pass for the gradient); torch.nn.functional.cross_entropy's semantics
    with the classes on the LAST axis. See reference.cross_entropy.

    logits (..., V), targets (...) int -> loss (a float; "none": (...) float32 losses)
    [, dlogits (..., V) float32 with return_grad: the gradient of the reduced loss ("none":
    of their sum)]. Rows whose target is ignore_index count for nothing; a mean over no
    counted row is 0 (torch gives NaN). A target outside [0, V) raises ValueError.
    """
    op = "cross_entropy"
    x, t, count, ignore_index, eps = _checks.cross_entropy(logits, targets, ignore_index,
                                                           label_smoothing, reduction, op)
    x = _convert.f32c(x)
    V = x.shape[-1]
    N = t.size
    losses = np.empty(N, np.float32)
    dlogits = np.empty(x.shape, np.float32) if return_grad else None
    _kernels.cross_entropy_forward(losses, None if dlogits is None else dlogits.reshape(N, V),
                                   x.reshape(N, V), t, ignore_index, eps,
                                   _fast.ce_grad_scale(count, reduction),
                                   get_num_threads())
    loss = _fast.reduce_losses(losses, count, reduction)
    if reduction == "none":
        loss = loss.reshape(x.shape[:-1])
    return (loss, dlogits) if return_grad else loss


# ---- optimiser ---------------------------------------------------------------------------------

__all__ += ["adamw_step", "adam_step", "grad_norm", "clip_grads"]


def _adam(op, decoupled, params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps,
          weight_decay):
    tensors, step, lr, b1, b2, eps, wd = _checks.adam(params, grads, exp_avg, exp_avg_sq, step,
                                                      lr, betas, eps, weight_decay, op)
    p, g, m, v = (list(t) for t in zip(*tensors)) if tensors else ([], [], [], [])
    _kernels.adam_step(p, m, v, g, step, lr, b1, b2, eps, wd, decoupled, get_num_threads())


def adamw_step(params, grads, exp_avg, exp_avg_sq, *, step, lr, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=0.01):
    """One AdamW update (torch.optim.AdamW: decoupled weight decay), in place: one pass over
    each tensor, every tensor of the lists in one parallel region; see reference.adamw_step.
    Every array float32, C-contiguous, matching shapes (nothing is converted or copied);
    params, exp_avg and exp_avg_sq writable. step is 1-based."""
    _adam("adamw_step", True, params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps,
          weight_decay)


def adam_step(params, grads, exp_avg, exp_avg_sq, *, step, lr, betas=(0.9, 0.999), eps=1e-8,
              weight_decay=0.0):
    """One Adam update (torch.optim.Adam: L2 weight decay added to the gradient), in place;
    see reference.adam_step and adamw_step."""
    _adam("adam_step", False, params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps,
          weight_decay)


def grad_norm(grads):
    """Global L2 norm of a list of arrays (or one array), as a float: sums of squares in float64
    over fixed blocks of each array, added in block order, array after array, so the same bits
    for any thread count. Other dtypes and layouts are converted (a copy); see
    reference.grad_norm."""
    op = "grad_norm"
    flat = [_convert.f32c(g).reshape(-1) for g in _checks.grad_list(grads, op)]
    return math.sqrt(_kernels.sum_squares(flat, get_num_threads()))


def clip_grads(grads, max_norm):
    """Scale the gradients in place by max_norm / (total + 1e-6) when their global L2 norm
    `total` exceeds max_norm (torch.nn.utils.clip_grad_norm_); returns total (before clipping).
    grads: float32 C-contiguous writable arrays. A NaN total scales every gradient by NaN, an
    infinite one by 0, as torch does. See reference.clip_grads."""
    flat, max_norm = _checks.clip_grads(grads, max_norm)
    total = math.sqrt(_kernels.sum_squares(flat, get_num_threads()))
    if not total <= max_norm:                 # also NaN, as torch
        _kernels.scale_inplace(flat, max_norm / (total + 1e-6), get_num_threads())
    return total
