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
    """Fused attention that also returns the log-sum-exp the backward needs.

    The same results as `fastattn.reference.attention_forward`. compute_type="bfloat16": as
    `attention`'s, with dropout's P keep rounded (bf16 training).

    Args:
        q: (B, H, Lq, D) queries.
        k: (B, H, Lk, D) keys.
        v: (B, H, Lk, Dv) values.
        mask: broadcastable to (B,H,Lq,Lk); bool (True = not allowed) or float (added; -inf = not
            allowed, any finite value is added, however large), to (B, H, Lq, Lk): (Lq, Lk), (B, 1,
            Lq, Lk).
        key_padding_mask: (B, Lk) bool (True = padding) or float (as mask).
        causal: bool; query i sees key j iff j <= i + (Lk - Lq).
        scale: float; default 1 / sqrt(D) (1 if D = 0).
        dropout_p: float in [0,1); dropout on the attention weights (see attention).
        seed: int in [0,2^64); the dropout's seed; required when dropout_p > 0.
        compute_type: str; "float32" or "bfloat16" (see attention; with dropout the dropped weights
            P keep are rounded).

    Returns:
        out: (B, H, Lq, Dv) float32; zeros for a query with no allowed key.
        `cache["lse"]`: (B, H, Lq) float32; logsumexp of the scaled, masked scores per query row
            (before dropout); -inf for a fully masked row, clamped to the float32 range otherwise.
    """
    out, lse, _ = _attention(q, k, v, mask, key_padding_mask, causal, scale, False, dropout_p,
                             seed, compute_type)
    return out, {"lse": lse}


def attention(q, k, v, *, mask=None, key_padding_mask=None, causal=False, scale=None,
              return_weights=False, dropout_p=0.0, seed=None, compute_type="float32"):
    """Scaled dot-product attention: dropout(softmax((q @ k^T) * scale + masks)) @ v, fused.

    Tiled flash-style: without return_weights no (Lq, Lk) matrix is ever stored. The same
    results as `fastattn.reference.attention`. Only True or -inf hides a key (its k and v rows,
    NaN included, take no part); any finite mask value is added to the score, however large
    (finfo(float32).min gives a weight of 0 next to an unmasked key; a row masked that way
    throughout averages its values), as in torch. A query with no allowed key returns zeros.

    compute_type="bfloat16": q, k, v rounded to bf16 (nearest even, as vcvtneps2bf16), q.k
    products exact and summed in float32, then times scale; the softmax in float32;
    P = exp(s - max) rounded to bf16 for the product with the rounded v, divided by the float32
    sum of the unrounded P; returned weights float32 (P / sum). The AVX512_BF16 path uses
    vdpbf16ps, the others round, widen and FMA: the same products, float32 sums whose order may
    differ (see docs/bf16_attention.md).

    Args:
        q: (B, H, Lq, D) queries.
        k: (B, H, Lk, D) keys.
        v: (B, H, Lk, Dv) values.
        mask: broadcastable to (B,H,Lq,Lk); bool (True = not allowed) or float (added; -inf = not
            allowed, any finite value is added, however large), to (B, H, Lq, Lk): (Lq, Lk), (B, 1,
            Lq, Lk).
        key_padding_mask: (B, Lk) bool (True = padding) or float (as mask).
        causal: bool; query i sees key j iff j <= i + (Lk - Lq).
        scale: float; default 1 / sqrt(D) (1 if D = 0).
        return_weights: bool; also return the attention weights.
        dropout_p: float in [0,1); dropout on the attention weights, as torch's MultiheadAttention
            applies it: each weight is kept or zeroed, kept ones are scaled by 1 / (1 - p).
        seed: int in [0,2^64); the dropout's seed; required when dropout_p > 0 (ignored at 0).
            Weight (b, h, i, j) is kept iff dropout_keep(seed, (b*H + h)*Lq + i, j, dropout_p).
        compute_type: str; "float32" (default) or "bfloat16": bf16 products (dropout applied as
            in float32; the backward is attention_backward's), below.

    Returns:
        out: (B, H, Lq, Dv) float32; zeros for a query with no allowed key.
        weights: (B, H, Lq, Lk) float32, only with return_weights=True: the weights after
            dropout (as torch returns them); without dropout, rows sum to 1, or are all zeros for a
            fully masked row.
    """
    out, _, weights = _attention(q, k, v, mask, key_padding_mask, causal, scale, return_weights,
                                 dropout_p, seed, compute_type)
    return (out, weights) if return_weights else out


def attention_backward(dout, q, k, v, out, lse, *, mask=None, key_padding_mask=None,
                       causal=False, scale=None, dropout_p=0.0, seed=None,
                       compute_type="float32"):
    """Gradients (dq, dk, dv) of attention from the forward's out and lse, flash style.

    The probabilities are recomputed block by block; no (Lq, Lk) matrix is stored. dout, out,
    q, k and v are read through their strides when their last axis is contiguous. NaN
    propagates as in the twin (`fastattn.reference.attention_backward`), except that with
    causal a NaN query row may leave the keys it cannot see untouched (the twin spreads its NaN
    to every key of the head). compute_type="bfloat16": bf16 training's backward.

    Args:
        dout: (B, H, Lq, Dv) gradient of the loss with respect to out.
        q: (B, H, Lq, D) the forward's queries.
        k: (B, H, Lk, D) the forward's keys.
        v: (B, H, Lk, Dv) the forward's values.
        out: (B, H, Lq, Dv) the forward's output (dropout included).
        lse: (B, H, Lq) the forward's cache["lse"].
        mask: as given to the forward.
        key_padding_mask: as given to the forward.
        causal: as given to the forward.
        scale: as given to the forward.
        dropout_p: as given to the forward.
        seed: as given to the forward (the same seed regenerates the same dropped weights).
        compute_type: as given to the forward: "float32" (the default) or "bfloat16" (below).

    Returns:
        dq: (B, H, Lq, D) float32.
        dk: (B, H, Lk, D) float32.
        dv: (B, H, Lk, Dv) float32.
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
    """Max-subtracted softmax along `axis`; a row of all -inf gives zeros.

    The same results as `fastattn.reference.softmax`.

    Args:
        x: (..., L, ...) scores; -inf entries get weight 0.
        axis: int; axis to normalise, default the last.

    Returns:
        y: the shape of x, float32; sums to 1 along axis, or all zeros where every entry
            along axis is -inf (torch gives NaN).
    """
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
    """Layer norm that also returns the statistics the backward needs.

    The same results as `fastattn.reference.layer_norm_forward`.

    Args:
        x: (..., C) input; every leading dim is a row (N rows in all).
        weight: (C,) gain, or None (= 1).
        bias: (C,) shift, or None (= 0).
        eps: float; added to the variance.
        residual: (..., C) optional, added to x before normalising.

    Returns:
        y: (..., C) float32; (s - mean) * rstd * weight + bias, s = x + residual summed in
            float32 (a row where it overflows gives NaN).
        `cache["mean"]`: (N,) float32; mean of s per row.
        `cache["rstd"]`: (N,) float32; 1 / sqrt(var + eps), biased (population) var.
    """
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
    """Layer norm of (x + residual) over the last axis, the residual add fused.

    The same results as `fastattn.reference.layer_norm`.

    Args:
        x: (..., C) input; every leading dim is a row.
        weight: (C,) gain, or None (= 1).
        bias: (C,) shift, or None (= 0).
        eps: float; added to the variance.
        residual: (..., C) optional, added to x before normalising.

    Returns:
        y: (..., C) float32; (s - mean) / sqrt(var + eps) * weight + bias.
    """
    return layer_norm_forward(x, weight, bias, eps=eps, residual=residual)[0]


def layer_norm_backward(dy, x, mean, rstd, weight, *, residual=None):
    """Gradients of LN(x + residual) * weight + bias, from the forward's mean and rstd.

    dx is the gradient of x and of residual alike. The same results as
    `fastattn.reference.layer_norm_backward`.

    Args:
        dy: (..., C) gradient of y.
        x: (..., C) the forward's input (N rows in all).
        mean: (N,) cache["mean"] of layer_norm_forward.
        rstd: (N,) cache["rstd"] of layer_norm_forward.
        weight: (C,) gain, or None (= 1).
        residual: (..., C) the forward's residual, or None; s = x + residual is recomputed (in
            float32, as the forward), not saved.

    Returns:
        dx: (..., C) float32; gradient of x, and also of residual (the residual add passes the
            same gradient to both).
        dweight: (C,) float32, or None when weight is None.
        dbias: (C,) float32; column sums of dy (bias or not).
    """
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
    """act(x @ weight.T + bias): the GEMM engine with a fused epilogue.

    weight may be a `QuantizedWeight` (int8 or bf16): the quantised kernels, any number of rows.
    The product is the weight kind's (`fastattn.kinds`). The same results as
    `fastattn.reference.linear`.

    Args:
        x: (..., C_in) input; every leading dim is a row.
        weight: (C_out, C_in) torch layout; or a QuantizedWeight (int8, bf16).
        bias: (C_out,) optional.
        activation: str or None; None, "relu", "gelu" (exact erf form), "gelu_tanh" (its tanh
            approximation) or "silu".

    Returns:
        y: (..., C_out) float32.
    """
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
    """linear() that also keeps the pre-activation for linear_backward.

    The pre-activation is written by the GEMM's epilogue when there is an activation. The same
    results as `fastattn.reference.linear_forward`.

    Args:
        x: (..., C_in) input; every leading dim is a row (N rows in all).
        weight: (C_out, C_in) torch layout.
        bias: (C_out,) optional.
        activation: str or None; None, "relu", "gelu" (exact erf form), "gelu_tanh" (its tanh
            approximation) or "silu".
        compute_type: "float32" (the default) or "bfloat16" (below).

    Returns:
        y: (..., C_out) float32; act(pre).
        `cache["pre"]`: (N, C_out) float32; x @ weight.T + bias, or None when activation is None
            (then pre = y).
    """
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
    """Gradients (dx, dweight, dbias) of act(x @ weight.T + bias).

    The same results as `fastattn.reference.linear_backward`.

    Args:
        dy: (..., C_out) gradient of y.
        x: (..., C_in) the forward's input (N rows in all).
        weight: (C_out, C_in) torch layout.
        pre: (N, C_out) cache["pre"] of linear_forward; needed (and only read) when activation is
            not None.
        activation: str or None; the forward's.
        compute_type: "float32" (the default) or "bfloat16" (below).

    Returns:
        dx: (..., C_in) float32; dz @ weight.
        dweight: (C_out, C_in) float32; dz^T @ x.
        dbias: (C_out,) float32; column sums of dz (whether or not the forward had a bias).
    """
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
    """The feed-forward block linear(act(linear(x, w1, b1)), w2, b2), in row blocks.

    w1 and w2 may be QuantizedWeights: then two products (the activation fused in the first
    one's epilogue) with a float32 hidden in between. The products are the weight kinds'
    (`fastattn.kinds.ffn_product`). The same results as `fastattn.reference.ffn`.

    Args:
        x: (..., C) input; every leading dim is a row.
        w1: (F, C) first layer weight.
        b1: (F,) first layer bias (may be None).
        w2: (C, F) second layer weight.
        b2: (C,) second layer bias (may be None).
        activation: str or None; "relu" (default), "gelu", "gelu_tanh", "silu" or None.

    Returns:
        y: (..., C) float32.
    """
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
    """The feed-forward block in training, keeping the pre-activation for ffn_backward.

    linear2(dropout(act(linear1(x)))), torch's order. dropout_p = 0 runs the inference kernel's
    path (only pre is written in addition). The same results as
    `fastattn.reference.ffn_forward`.

    Args:
        x: (..., C) input; every leading dim is a row (N rows in all).
        w1: (F, C) first layer's weight.
        b1: (F,) first layer's bias, or None.
        w2: (C, F) second layer's weight.
        b2: (C,) second layer's bias, or None.
        activation: str or None; "relu" (default), "gelu", "gelu_tanh", "silu" or None.
        dropout_p: float; in [0, 1): hidden element (n, f) is kept iff
            `dropout_keep(seed, [n], [f], dropout_p)`, then scaled by 1 / (1 - dropout_p);
            0 = no dropout.
        seed: int; 0 <= seed < 2^64; required when dropout_p > 0.
        compute_type: "float32" (the default) or "bfloat16" (below).

    Returns:
        y: (..., C) float32.
        `cache["pre"]`: (N, F) float32; x @ w1.T + b1. The backward recomputes the activation and
            the dropout mask from it and the seed (N * F * 4 bytes per layer).
    """
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
    """Gradients of the feed-forward block from its cache["pre"].

    The activation and the dropout mask are recomputed, not stored. The same results as
    `fastattn.reference.ffn_backward`.

    Args:
        dy: (..., C) gradient of y.
        x: (..., C) the forward's input (N rows in all).
        w1: (F, C) first layer's weight.
        b1: (F,) first layer's bias, or None.
        w2: (C, F) second layer's weight.
        b2: (C,) second layer's bias, or None.
        pre: (N, F) cache["pre"] of ffn_forward.
        activation: the forward's.
        dropout_p: the forward's (the mask is regenerated, not stored).
        seed: the forward's.
        compute_type: "float32" (the default) or "bfloat16" (below).

    Returns:
        dx: (..., C) float32.
        `dw1, db1`: (F, C), (F,) float32; db1 None when b1 is None.
        `dw2, db2`: (C, F), (C,) float32; db2 None when b2 is None.
    """
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
    """Dropout over the last axis: x * keep / (1 - p).

    The mask is a pure function of (seed, row, column) computed in the kernel (never stored); p
    = 0 returns a copy. The same results as `fastattn.reference.dropout`.

    Args:
        x: (..., C) every leading dim is a row: row n of the flattened (N, C), column c.
        p: float; drop probability in [0, 1); 0 returns a copy.
        seed: int; 0 <= seed < 2^64; required when p > 0.

    Returns:
        y: (..., C) float32; keep = dropout_keep(seed, rows, cols, p).
    """
    return _dropout(x, p, seed, "dropout", "x")


def dropout_backward(dy, p, *, seed=None):
    """Gradient of dropout: dy * keep / (1 - p), the forward's mask regenerated from seed.

    Args:
        dy: (..., C) gradient of y.
        p: the forward's drop probability.
        seed: the forward's seed.

    Returns:
        dx: (..., C) float32.
    """
    return _dropout(dy, p, seed, "dropout_backward", "dy")


# ---- embedding ---------------------------------------------------------------------------------

def embedding_backward(dout, ids, num_embeddings):
    """Gradient of an embedding lookup: rows of dout scatter-added into the rows of their ids.

    The same results as `fastattn.reference.embedding_backward`.

    Args:
        dout: (..., C) gradient of the looked-up rows; leading dims = ids'.
        ids: (...) int64, each in [0, num_embeddings).
        num_embeddings: int; V, rows of the embedding table.

    Returns:
        dweight: (V, C) float32; dweight[v] = sum of dout[i] over ids[i] = v, 0 for ids that do
            not occur.
    """
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
    """The sinusoidal positional encoding table of "Attention Is All You Need".

    Computed once per model in NumPy (not a hot path), so it is the twin's own code after the
    argument checks.

    Args:
        length: int; number of positions p = 0 .. length-1.
        d_model: int; number of features (odd allowed: last column is sin).

    Returns:
        pe: (length, C) float32, C = d_model; `pe[p, 2i] = sin(p / 10000^(2i / d_model))` and
            `pe[p, 2i+1] = cos(p / 10000^(2i / d_model))`.
    """
    return reference.positional_encoding(length, d_model)


# ---- loss --------------------------------------------------------------------------------------

__all__ += ["cross_entropy"]

REDUCTIONS = _checks.REDUCTIONS


def cross_entropy(logits, targets, *, ignore_index=-100, label_smoothing=0.0, reduction="mean",
                  return_grad=False):
    """Cross-entropy of log-softmax(logits) against integer targets, fused.

    One read pass per row, and one write pass for the gradient;
    torch.nn.functional.cross_entropy's semantics with the classes on the LAST axis. Rows whose
    target is ignore_index count for nothing; a mean over no counted row is 0 (torch gives NaN).
    The same results as `fastattn.reference.cross_entropy`.

    Args:
        logits: (..., V) unnormalised scores; every leading dim is a row (N rows in all).
        targets: (...) int class index per row, in [0, V), or ignore_index.
        ignore_index: int; rows with this target count for nothing: loss 0, gradient 0, not in the
            mean's count.
        label_smoothing: float in [0,1]; eps: the target distribution is (1 - eps) one-hot + eps /
            V uniform.
        reduction: str; "mean" (over the rows not ignored), "sum" or "none".
        return_grad: bool; also return d loss / d logits.

    Returns:
        loss: float (...) float32; "mean" / "sum"; a mean over no counted row is 0 (torch gives
            NaN) "none": one loss per row (0 where ignored).
        dlogits: (..., V) float32, only with return_grad: the gradient of the returned loss
            ("none": of the sum of the losses).
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
    """One AdamW update (torch.optim.AdamW: decoupled weight decay), in place.

    One pass over each tensor, every tensor of the lists in one parallel region. Every array
    float32, C-contiguous, matching shapes (nothing is converted or copied); params, exp_avg and
    exp_avg_sq writable. The update is `fastattn.reference.adamw_step`'s.

    Args:
        params: list of arrays; float32, updated in place (or one array).
        grads: same shapes float32 gradients.
        exp_avg: same shapes float32 first moments m, updated (zeros at first).
        exp_avg_sq: same shapes float32 second moments v, updated (zeros at first).
        step: int >= 1; this update's number (1-based), for the bias corrections.
        lr: float; the learning rate.
        betas: (beta1, beta2), the moments' decay rates, as torch (default (0.9, 0.999)).
        eps: float; added to the denominator, as torch (default 1e-8).
        weight_decay: float; decoupled (p *= 1 - lr * weight_decay; default 0.01).
    """
    _adam("adamw_step", True, params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps,
          weight_decay)


def adam_step(params, grads, exp_avg, exp_avg_sq, *, step, lr, betas=(0.9, 0.999), eps=1e-8,
              weight_decay=0.0):
    """One Adam update (torch.optim.Adam: L2 weight decay added to the gradient), in place.

    As `adamw_step`; the update is `fastattn.reference.adam_step`'s.

    Args:
        params: list of arrays; float32, updated in place (or one array).
        grads: same shapes float32 gradients.
        exp_avg: same shapes float32 first moments m, updated (zeros at first).
        exp_avg_sq: same shapes float32 second moments v, updated (zeros at first).
        step: int >= 1; this update's number (1-based), for the bias corrections.
        lr: float; the learning rate.
        betas: (beta1, beta2), the moments' decay rates, as torch (default (0.9, 0.999)).
        eps: float; added to the denominator, as torch (default 1e-8).
        weight_decay: float; the L2 term's factor (default 0).
    """
    _adam("adam_step", False, params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps,
          weight_decay)


def grad_norm(grads):
    """Global L2 norm of a list of arrays (or one array).

    Sums of squares in float64 over fixed blocks of each array, added in block order, array
    after array, so the same bits for any thread count. Other dtypes and layouts are converted
    (a copy).

    Args:
        grads: a list of arrays, or one array.

    Returns:
        The norm, as a float.
    """
    op = "grad_norm"
    flat = [_convert.f32c(g).reshape(-1) for g in _checks.grad_list(grads, op)]
    return math.sqrt(_kernels.sum_squares(flat, get_num_threads()))


def clip_grads(grads, max_norm):
    """Clip gradients by their global norm, in place, as torch.nn.utils.clip_grad_norm_.

    Scales the gradients by max_norm / (total + 1e-6) when their global L2 norm `total` exceeds
    max_norm. The arrays must be float32, C-contiguous and writable. A NaN total scales every
    gradient by NaN, an infinite one by 0, as torch does.

    Args:
        grads: a list of float32 arrays, or one array; updated in place.
        max_norm: float; the largest norm kept.

    Returns:
        total, the norm before clipping (a float).
    """
    flat, max_norm = _checks.clip_grads(grads, max_norm)
    total = math.sqrt(_kernels.sum_squares(flat, get_num_threads()))
    if not total <= max_norm:                 # also NaN, as torch
        _kernels.scale_inplace(flat, max_norm / (total + 1e-6), get_num_threads())
    return total
