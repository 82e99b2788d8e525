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

from . import _checks, _kernels, reference
from ._checks import ACTIVATIONS
from ._runtime import get_num_threads, quant_tiles, tiles

__all__ = [
    "attention", "attention_forward", "softmax", "layer_norm", "layer_norm_forward", "linear",
    "attention_backward",
    "ffn", "positional_encoding",
]


# ---- conversions (after the checks in _checks) --------------------------------------------------

def _f32(a):
    """A checked real ndarray as an aligned float32 ndarray (a view when it already is one).
    Aligned: data and strides are whole floats apart, so the C kernels may load floats through
    them (a misaligned view is copied)."""
    if a.dtype != np.float32:
        return a.astype(np.float32)
    return a if a.flags.aligned else a.copy(order="C")


def _f32c(a):
    """A checked real ndarray (or None) as an aligned, C-contiguous float32 array of the same
    shape (0-d stays 0-d)."""
    if a is None:
        return None
    a = _f32(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _array(x, name, op):
    """x as an aligned float32 ndarray (a view when it already is one), or TypeError for
    non-real data."""
    return _f32(_checks.real(x, name, op))


def _contig(x, name, op):
    """x as an aligned, C-contiguous float32 array of the same shape (0-d stays 0-d)."""
    return _f32c(_checks.real(x, name, op))


def _strided(a):
    """Keep a view the kernel can read through its strides (last axis contiguous, aligned)."""
    if a.flags.aligned and a.strides[-1] == 4 and all(s % 4 == 0 for s in a.strides):
        return a
    return a.copy(order="C")  # fresh memory: ascontiguousarray keeps a misaligned contiguous view


def _mask_bias(mask, name, op, dtype_ok="bool or float"):
    """bool True = blocked -> -inf; float -> itself (added). Integer masks are ambiguous: refused."""
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
    q, k, v = _strided(_f32(q)), _strided(_f32(k)), _strided(_f32(v))
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = np.broadcast_to(_bias(mask), (B, H, Lq, Lk))
    if key_padding_mask is not None:
        key_padding_mask = np.ascontiguousarray(_bias(key_padding_mask)).reshape(-1)
    return q, k, v, mask, key_padding_mask


def _attention(q, k, v, mask, key_padding_mask, causal, scale, want_weights, dropout_p, seed):
    p, seed = _checks.attention_dropout(dropout_p, seed, "attention")
    q, k, v, mask, key_padding_mask, scale = _checks.attention(q, k, v, mask, key_padding_mask,
                                                               scale)
    q, k, v, bias, key_bias = _attention_operands(q, k, v, mask, key_padding_mask, "attention")
    B, H, Lq, D = q.shape
    Lk, Dv = k.shape[2], v.shape[3]
    if min(B, H, Lq, Dv) == 0 or min(Lk, D) == 0:
        # Nothing to tile (an empty batch, or no keys / zero-width heads): the twin is exact.
        kb = None if key_bias is None else key_bias.reshape(B, Lk)
        out, weights, lse = reference._attention64(q, k, v, bias, kb, bool(causal), scale, p,
                                                   seed)
        return (out.astype(np.float32), lse.astype(np.float32),
                weights.astype(np.float32) if want_weights else None)
    out = np.empty((B, H, Lq, Dv), np.float32)
    lse = np.empty(B * H * Lq, np.float32)
    weights = np.empty(B * H * Lq * Lk, np.float32) if want_weights else None
    _kernels.attention_forward(out, lse, weights, q, k, v, bias, key_bias, scale, bool(causal),
                               get_num_threads(), p, seed or 0)
    return out, lse.reshape(B, H, Lq), (weights.reshape(B, H, Lq, Lk) if want_weights else None)


def attention_forward(q, k, v, *, mask=None, key_padding_mask=None, causal=False, scale=None,
                      dropout_p=0.0, seed=None):
    """Fused attention returning (out, {"lse": (B, H, Lq)}); see reference.attention_forward."""
    out, lse, _ = _attention(q, k, v, mask, key_padding_mask, causal, scale, False, dropout_p,
                             seed)
    return out, {"lse": lse}


def attention(q, k, v, *, mask=None, key_padding_mask=None, causal=False, scale=None,
              return_weights=False, dropout_p=0.0, seed=None):
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
    """
    out, _, weights = _attention(q, k, v, mask, key_padding_mask, causal, scale, return_weights,
                                 dropout_p, seed)
    return (out, weights) if return_weights else out


def attention_backward(dout, q, k, v, out, lse, *, mask=None, key_padding_mask=None,
                       causal=False, scale=None, dropout_p=0.0, seed=None):
    """(dq, dk, dv) of attention from the forward's out and lse, flash style (the probabilities
    are recomputed block by block; no (Lq, Lk) matrix is stored); see
    reference.attention_backward.

    dout and out (B, H, Lq, Dv), lse (B, H, Lq) (attention_forward's cache["lse"]); q, k, v
    and every option exactly as given to the forward (the same seed regenerates its dropout).
    dout, out, q, k and v are read through their strides when their last axis is contiguous.
    -> dq (B, H, Lq, D), dk (B, H, Lk, D), dv (B, H, Lk, Dv), float32, C-contiguous.
    NaN propagates as in the twin, except that with causal a NaN query row may leave the keys
    it cannot see untouched (the twin spreads its NaN to every key of the head).
    """
    op = "attention_backward"
    dout, q, k, v, out, lse, mask, key_padding_mask, scale, p, seed = _checks.attention_backward(
        dout, q, k, v, out, lse, mask, key_padding_mask, scale, dropout_p, seed, op)
    q, k, v, bias, key_bias = _attention_operands(q, k, v, mask, key_padding_mask, op)
    dout, out, lse = _strided(_f32(dout)), _strided(_f32(out)), _f32(lse)
    B, H, Lq, D = q.shape
    Lk, Dv = k.shape[2], v.shape[3]
    if min(B, H, Lq, Lk, D, Dv) == 0:
        # Nothing to tile (an empty batch, no queries or keys, zero-width heads): the twin.
        kb = None if key_bias is None else key_bias.reshape(B, Lk)
        return reference.attention_backward(dout, q, k, v, out, lse, mask=bias,
                                            key_padding_mask=kb, causal=bool(causal),
                                            scale=scale, dropout_p=p, seed=seed)
    dq = np.empty((B, H, Lq, D), np.float32)
    dk = np.empty((B, H, Lk, D), np.float32)
    dv = np.empty((B, H, Lk, Dv), np.float32)
    _kernels.attention_backward(dq, dk, dv, dout, out, np.ascontiguousarray(lse).reshape(-1),
                                q, k, v, bias, key_bias, scale, bool(causal), p, seed or 0,
                                get_num_threads())
    return dq, dk, dv


# ---- softmax -----------------------------------------------------------------------------------

def softmax(x, axis=-1):
    """Max-subtracted softmax along `axis`; a row of all -inf gives zeros. See reference.softmax."""
    a, axis = _checks.softmax(x, axis)
    a = _f32(a)
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
    x, weight, bias, residual = map(_f32c, (x, weight, bias, residual))
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
    dy, x, mean, rstd, weight, residual = map(_f32c, checked)
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
    x, weight, bias = map(_f32c, (x, weight, bias))
    M, K = weight.shape
    return x, weight, bias, ACTIVATIONS[activation], math.prod(x.shape[:-1]), M, K


def linear(x, weight, bias=None, *, activation=None):
    """act(x @ weight.T + bias), GEMM through BLAS with a fused epilogue; see reference.linear.
    weight may be a QuantizedWeight (int8 or bf16): the quantised kernels, any number of rows."""
    if isinstance(weight, QuantizedWeight):
        return _linear_quantized(x, weight, bias, activation, "linear")
    x, weight, bias, act, N, M, K = _check_linear(x, weight, bias, activation)
    y = np.empty(x.shape[:-1] + (M,), np.float32)
    if N and M and K:
        _kernels.linear_forward(y.reshape(N, M), None, x.reshape(N, K), weight, bias, act,
                                get_num_threads())
    elif N and M:  # K == 0: an empty sum, only the bias and activation remain
        return reference.linear(x, weight, bias, activation=activation)
    return y


def linear_forward(x, weight, bias=None, *, activation=None):
    """linear() returning (y, {"pre": (N, M) or None}): the pre-activation is kept (written by
    the GEMM's epilogue) when there is an activation. See reference.linear_forward."""
    x, weight, bias, act, N, M, K = _check_linear(x, weight, bias, activation)
    if not (N and M and K):  # nothing to multiply: the twin is exact
        return reference.linear_forward(x, weight, bias, activation=activation)
    y = np.empty(x.shape[:-1] + (M,), np.float32)
    pre = None if act == 0 else np.empty((N, M), np.float32)
    _kernels.linear_forward(y.reshape(N, M), pre, x.reshape(N, K), weight, bias, act,
                            get_num_threads())
    return y, {"pre": pre}


def linear_backward(dy, x, weight, *, pre=None, activation=None):
    """Gradients (dx, dweight, dbias) of act(x @ weight.T + bias); pre is the forward's
    cache["pre"] (needed with an activation). See reference.linear_backward."""
    dy, x, weight, pre, activation = _checks.linear_backward(dy, x, weight, pre, activation)
    dy, x, weight, pre = map(_f32c, (dy, x, weight, pre))
    act = ACTIVATIONS[activation]
    M, K = weight.shape
    N = math.prod(x.shape[:-1])
    pre = None if pre is None else pre.reshape(N, M)
    dx = np.empty(x.shape, np.float32)
    dweight = np.empty((M, K), np.float32)
    dbias = np.empty(M, np.float32)
    dz = np.empty((N, M), np.float32) if act and N and M else None
    _kernels.linear_backward(dx.reshape(N, K), dweight, dbias, dz, dy.reshape(N, M), pre,
                             x.reshape(N, K), weight, act, False, get_num_threads())
    return dx, dweight, dbias


def ffn(x, w1, b1, w2, b2, *, activation="relu"):
    """linear(act(linear(x, w1, b1)), w2, b2) in row blocks; see reference.ffn. w1 and w2 may
    be QuantizedWeights: then two products (the activation fused in the first one's
    epilogue) with a float32 hidden in between."""
    if isinstance(w1, QuantizedWeight) or isinstance(w2, QuantizedWeight):
        return _ffn_quantized(x, w1, b1, w2, b2, activation)
    x, w1, b1, w2, b2, act = _check_ffn(x, w1, b1, w2, b2, activation, "ffn")
    C, F = x.shape[-1], w1.shape[0]
    N = x.size // C if C else int(np.prod(x.shape[:-1]))
    y = np.empty(x.shape, np.float32)
    if N and C and F:
        _kernels.ffn_forward(y.reshape(N, C), None, x.reshape(N, C), w1, b1, w2, b2, act, 0.0,
                             0, get_num_threads())
    elif N and C:  # F == 0: the hidden layer is empty, y = b2
        return reference.ffn(x, w1, b1, w2, b2, activation=activation)
    return y


def _check_ffn(x, w1, b1, w2, b2, activation, op, quantized_ok=False):
    """ffn's arguments checked and converted (float weights to float32; QuantizedWeights,
    allowed where quantized_ok, as they are) -> (x, w1, b1, w2, b2, act code)."""
    x, w1, b1, w2, b2, activation = _checks.ffn(x, w1, b1, w2, b2, activation, op, quantized_ok)
    w1, w2 = (w if isinstance(w, QuantizedWeight) else _f32c(w) for w in (w1, w2))
    x, b1, b2 = map(_f32c, (x, b1, b2))
    return x, w1, b1, w2, b2, ACTIVATIONS[activation]


def ffn_forward(x, w1, b1, w2, b2, *, activation="relu", dropout_p=0.0, seed=None):
    """The FFN in training, linear2(dropout(act(linear1(x)))), returning (y, {"pre": (N, F)});
    dropout_p = 0 runs the inference kernel's path (only pre is written in addition). See
    reference.ffn_forward."""
    op = "ffn_forward"
    x, w1, b1, w2, b2, activation = _checks.ffn_training(x, w1, b1, w2, b2, activation,
                                                         dropout_p, seed, op)
    x, w1, b1, w2, b2 = map(_f32c, (x, w1, b1, w2, b2))
    act = ACTIVATIONS[activation]
    C, F = x.shape[-1], w1.shape[0]
    N = math.prod(x.shape[:-1])
    if not (N and C and F):  # an empty batch, model or hidden layer: the twin is exact
        return reference.ffn_forward(x, w1, b1, w2, b2, activation=activation,
                                     dropout_p=dropout_p, seed=seed)
    y = np.empty(x.shape, np.float32)
    pre = np.empty((N, F), np.float32)
    _kernels.ffn_forward(y.reshape(N, C), pre, x.reshape(N, C), w1, b1, w2, b2, act,
                         float(dropout_p), int(seed or 0), get_num_threads())
    return y, {"pre": pre}


def ffn_backward(dy, x, w1, b1, w2, b2, pre, *, activation="relu", dropout_p=0.0, seed=None):
    """Gradients (dx, dw1, db1, dw2, db2) of the FFN from its cache["pre"]; the activation and
    the dropout mask are recomputed. db1 / db2 are None when b1 / b2 are. See
    reference.ffn_backward."""
    op = "ffn_backward"
    dy, x, w1, b1, w2, b2, pre, activation = _checks.ffn_backward(
        dy, x, w1, b1, w2, b2, pre, activation, dropout_p, seed, op)
    dy, x, w1, b1, w2, b2, pre = map(_f32c, (dy, x, w1, b1, w2, b2, pre))
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
                          get_num_threads())
    return dx, dw1, db1, dw2, db2


__all__ += ["layer_norm_backward", "linear_forward", "linear_backward", "ffn_forward",
            "ffn_backward", "dropout", "dropout_backward", "embedding_backward"]


# ---- dropout -----------------------------------------------------------------------------------

def _dropout(x, p, seed, op, name):
    a = _f32c(_checks.dropout(x, p, seed, op, name))
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
    dout = _f32c(dout)
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


# ---- private entry points for fastattn.nn ------------------------------------------------------
# The model layer checks its inputs once at the model boundary and then runs many ops on arrays
# it owns: float32, C-contiguous (attention: last axis contiguous), shapes already consistent.
# These write into caller-owned buffers so a forward pass reuses its activations.

def _linear_into(y, x, weight, bias, act, pre=None):
    """y (N, M) = act(x (N, K) @ weight (M, K).T + bias); act is an FA_ACT code. pre (N, M), if
    given, receives x @ weight.T + bias (training, with an activation)."""
    _kernels.linear_forward(y, pre, x, weight, bias, act, get_num_threads())
    return y


def _linear_backward_into(dx, dweight, dbias, dy, x, weight, pre, act, accumulate, dz=None):
    """Gradients of y = act(x @ weight.T + b) into caller-owned buffers: dx (N, K) (None: not
    wanted, a first layer) is overwritten; dweight (M, K) and dbias (M,) (either may be None)
    are overwritten, or added to when accumulate is True (parameter gradients summed across
    calls, as torch's .grad). pre (N, M): the forward's, with an activation (act != 0). dz (N,
    M): scratch for dy * act'(pre), allocated when None; it may be pre or dy themselves, which
    are then overwritten."""
    if act and dz is None:
        dz = np.empty(dy.shape, np.float32)
    _kernels.linear_backward(dx, dweight, dbias, dz if act else None, dy, pre if act else None,
                             x, weight, act, bool(accumulate), get_num_threads())


def _ffn_into(y, x, w1, b1, w2, b2, act):
    """y (N, C) = act(x @ w1.T + b1) @ w2.T + b2."""
    _kernels.ffn_forward(y, None, x, w1, b1, w2, b2, act, 0.0, 0, get_num_threads())
    return y


def _ffn_forward_into(y, pre, x, w1, b1, w2, b2, act, dropout_p=0.0, seed=0):
    """y (N, C) = drop(act(x @ w1.T + b1)) @ w2.T + b2, pre (N, F) = x @ w1.T + b1 (training;
    pre may be None). dropout_p in [0, 1), seed an int in [0, 2**64) (checked by the caller)."""
    _kernels.ffn_forward(y, pre, x, w1, b1, w2, b2, act, float(dropout_p), int(seed or 0),
                         get_num_threads())
    return y


def _ffn_backward_into(dx, dw1, db1, dw2, db2, dy, x, w1, w2, pre, act, dropout_p, seed,
                       accumulate, h=None, dpre=None):
    """Gradients of the FFN into caller-owned buffers: dx (N, C) overwritten (None: not
    wanted); dw1 (F, C), db1 (F,), dw2 (C, F), db2 (C,) (each may be None) overwritten, or
    added to when accumulate is True. pre (N, F): the forward's. h, dpre (N, F): scratch,
    allocated when None; dpre may be pre itself (then overwritten: pre is not needed after)."""
    N, F = pre.shape
    if h is None:
        h = np.empty((N, F), np.float32)
    if dpre is None:
        dpre = np.empty((N, F), np.float32)
    _kernels.ffn_backward(dx, dw1, db1, dw2, db2, h, dpre, dy, pre, x, w1, w2, act,
                          float(dropout_p), int(seed or 0), bool(accumulate), get_num_threads())


def _layer_norm_backward_into(dx, dweight, dbias, dy, x, mean, rstd, weight, residual=None,
                              accumulate=False):
    """Gradients of LN(x + residual) into caller-owned buffers: dx (N, C) (None: not wanted)
    overwritten; dweight, dbias (C,) (either may be None) overwritten, or added to when
    accumulate is True."""
    _kernels.layer_norm_backward(dx, dweight, dbias, dy, mean, rstd, x, residual, weight,
                                 bool(accumulate), get_num_threads())


def _dropout_into(y, x, p, seed):
    """y (N, C) = x * keep / (1 - p); y may be x itself (in place). p, seed checked by the
    caller; the backward is the same call on the gradient."""
    _kernels.dropout_forward(y, x, float(p), int(seed or 0), get_num_threads())
    return y


def _embedding_backward_into(dweight, dout, ids, accumulate):
    """dweight (V, C) (+)= the scatter-add of dout (N, C) by ids (N,) int64 in [0, V) (checked by
    the caller): overwritten, or added to when accumulate is True."""
    _kernels.embedding_backward(dweight, dout, ids, bool(accumulate), get_num_threads())
    return dweight


def _layer_norm_into(y, x, weight, bias, eps, residual=None, sum_out=None, mean=None,
                     rstd=None):
    """y (N, C) = LN(x + residual); sum_out (N, C) receives x + residual, mean and rstd (N,)
    the row statistics (training). y may alias x, residual or sum_out; sum_out may alias x or
    residual."""
    _kernels.layer_norm_forward(y, sum_out, mean, rstd, x, residual, weight, bias, eps,
                                get_num_threads())
    return y


def _attention_into(out, q, k, v, bias, key_bias, causal, scale, lse=None, dropout_p=0.0,
                    seed=0):
    """out (B, H, Lq, Dv) view (any strides, last axis contiguous) = attention(q, k, v);
    bias: float (B, H, Lq, Lk) broadcast view or None; key_bias: float (B*Lk,) or None.
    Training: lse (B*H*Lq,) receives the log-sum-exp, and dropout_p / seed (checked by the
    caller) drop attention weights."""
    _kernels.attention_forward(out, lse, None, q, k, v, bias, key_bias, scale, causal,
                               get_num_threads(), float(dropout_p), int(seed or 0))
    return out


def _attention_fn(scale):
    """_attention_into without masks other than key_bias, the scale chosen now (a decode
    step's attention): f(q, k, v, key_bias, out) -> out, the same kernel call."""
    kernel = _kernels.attention_forward

    def attend(q, k, v, key_bias, out):
        kernel(out, None, None, q, k, v, None, key_bias, scale, False, get_num_threads(), 0.0, 0)
        return out
    return attend


def _attention_backward_into(dq, dk, dv, dout, out, lse, q, k, v, bias, key_bias, causal,
                             scale, dropout_p=0.0, seed=0):
    """(dq, dk, dv) of _attention_into's training call into caller-owned views (any strides,
    last axis contiguous): dq (B, H, Lq, D), dk (B, H, Lk, D), dv (B, H, Lk, Dv); dout and out
    (B, H, Lq, Dv) views; lse (B*H*Lq,); masks, scale, dropout as in the forward."""
    _kernels.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, bias, key_bias, scale,
                                causal, float(dropout_p), int(seed or 0), get_num_threads())


# Up to this many rows (a decode step's beams), a product with a PackedWeight beats BLAS.
PACKED_MAX_ROWS = tiles()["packed_max_rows"]


class PackedWeight:
    """A linear layer's (M, K) weight repacked for decode-sized products (a few rows): the
    kernel streams it once, in order, with vectors along the output features."""

    __slots__ = ("data", "shape")

    def __init__(self, weight):
        w = _contig(weight, "weight", "PackedWeight")
        _checks.ndim(w, 2, "weight", "PackedWeight", "(out_features, in_features)")
        self.shape = w.shape
        self.data = np.empty(_kernels.packed_size(*w.shape), np.float32)
        _kernels.pack_panels(self.data, w, get_num_threads())


def _linear_packed_into(y, x, packed, bias, act):
    """y (N, M) = act(x (N, K) @ weight.T + bias) with the weight as a PackedWeight."""
    _kernels.linear_packed_forward(y, x, packed.data, bias, act, get_num_threads())
    return y


# ---- loss --------------------------------------------------------------------------------------

__all__ += ["cross_entropy"]

REDUCTIONS = _checks.REDUCTIONS


def _reduce_losses(losses, count, reduction):
    """The per-row losses (N,) reduced in float64, in NumPy's fixed (pairwise) order: the same
    for any thread count. A mean over no counted rows is 0."""
    if reduction == "none":
        return losses
    total = float(np.sum(losses, dtype=np.float64))
    if reduction == "sum":
        return total
    return total / count if count else 0.0


def _ce_grad_scale(count, reduction):
    return 1.0 / count if reduction == "mean" and count else 1.0


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
    x = _f32c(x)
    V = x.shape[-1]
    N = t.size
    losses = np.empty(N, np.float32)
    dlogits = np.empty(x.shape, np.float32) if return_grad else None
    _kernels.cross_entropy_forward(losses, None if dlogits is None else dlogits.reshape(N, V),
                                   x.reshape(N, V), t, ignore_index, eps,
                                   _ce_grad_scale(count, reduction), get_num_threads())
    loss = _reduce_losses(losses, count, reduction)
    if reduction == "none":
        loss = loss.reshape(x.shape[:-1])
    return (loss, dlogits) if return_grad else loss


def _cross_entropy_into(dlogits, losses, logits, targets, *, ignore_index=-100,
                        label_smoothing=0.0, reduction="mean"):
    """For fastattn.nn: cross_entropy on caller-owned buffers. logits (N, V) float32
    C-contiguous, targets (N,) int64 C-contiguous, losses (N,) float32 out, dlogits (N, V)
    float32 out or None; dlogits MAY BE logits itself (the gradient is then written over the
    logits, row by row, so no second (N, V) buffer exists). The targets are still checked
    (the kernel indexes with them). Returns the reduced loss (a float), or losses for "none";
    dlogits holds the gradient of that loss ("none": of the sum)."""
    op = "cross_entropy"
    ignore_index, eps = _checks.loss_options(ignore_index, label_smoothing, reduction, op)
    N, V = logits.shape
    t, count = _checks.targets(targets, (N,), V, ignore_index, op)
    _kernels.cross_entropy_forward(losses, dlogits, logits, t, ignore_index, eps,
                                   _ce_grad_scale(count, reduction), get_num_threads())
    return _reduce_losses(losses, count, reduction)


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
    flat = [_f32c(g).reshape(-1) for g in _checks.grad_list(grads, op)]
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


# ---- quantised weights: int8 (per-row scales) and bfloat16 -------------------------------------
# The rules are reference.quantize_int8's and reference._linear_quantized's (and fastattn.h's):
# ops and reference agree bit for bit on quantize_int8, dequantize_int8, to_bfloat16 and
# from_bfloat16, and on linear with an int8 weight when the activation is None or relu (gelu,
# gelu_tanh: to their kernels' accuracy, ~1e-6 relative); with a bf16 weight, linear agrees with the
# twin as the fp32 linear does (float32 sums).

__all__ += ["quantize_int8", "dequantize_int8", "to_bfloat16", "from_bfloat16",
            "QuantizedWeight", "INT8_MAX_K"]

INT8_MAX_K = _kernels.int8_max_k()    # = reference.INT8_MAX_K: K * 127 * 127 fits an int32
# bf16 products of up to this many rows stream a packed copy; more rows widen the weight to
# float32 and run the fp32 GEMM
BF16_PACKED_MAX_ROWS = quant_tiles()["bf16_packed_max_rows"]
QUANT_DTYPES = ("int8", "bf16")


def quantize_int8(x):
    """Symmetric per-row int8 quantisation of the last axis: (q int8 (..., K), scale float32
    (...,)), with x ~= q * scale[..., None]; see reference.quantize_int8 for the exact rule
    (bit for bit the same here). A row with NaN or inf raises ValueError naming it."""
    op = "quantize_int8"
    x = _f32c(_checks.rows(x, "x", op, "(..., K)"))
    lead, K = x.shape[:-1], x.shape[-1]
    N = math.prod(lead)
    q = np.empty((N, K), np.int8)
    scale = np.empty(N, np.float32)
    bad = _kernels.quantize_int8(q, scale, x.reshape(N, K), get_num_threads())
    if bad >= 0:
        raise ValueError(f"{op}: x row {reference._row_name(bad, lead)} is not finite (NaN or "
                         "inf); int8 quantisation needs finite values")
    return q.reshape(x.shape), scale.reshape(lead)


_int8_array = _checks.int8_array
_float32_exact = _checks.float32_exact


def dequantize_int8(q, scale):
    """q * scale[..., None] as float32: q (..., K) int8, scale (...,) float32 -> (..., K)."""
    return reference.dequantize_int8(q, scale)


def to_bfloat16(x):
    """bfloat16 bits (uint16, same shape) of x (converted to float32 first): round to nearest
    even; NaN stays a quiet NaN. See reference.to_bfloat16 (bit for bit the same)."""
    x = _contig(x, "x", "to_bfloat16")
    bits = np.empty(x.shape, np.uint16)
    _kernels.to_bfloat16(bits.reshape(-1), x.reshape(-1), get_num_threads())
    return bits


def from_bfloat16(bits):
    """float32 values of bfloat16 bits (a uint16 array), exact."""
    return reference.from_bfloat16(bits)


def _dtype_name(dtype, op):
    if not isinstance(dtype, str) or dtype not in QUANT_DTYPES:
        raise ValueError(f"{op}: dtype must be 'int8' or 'bf16', got {dtype!r}")
    return dtype


def _readonly(a):
    """a as a C-contiguous, aligned, read-only array: a view when it already is one (so a
    loaded weight is not copied; its owner must not change it afterwards), else a copy."""
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = a.copy(order="C")
    v = a.view()
    v.flags.writeable = False
    return v


def _first_bad_row(bad_rows):
    rows = np.flatnonzero(bad_rows)
    return int(rows[0]) if rows.size else -1


class QuantizedWeight:
    """A linear layer's (M, K) weight stored in int8 (with per-row float32 scales) or bf16, for
    inference: ``linear(x, qw, bias, activation=...)`` and ``ffn`` accept it in place of a
    float32 weight, in ops (the kernels) and reference (the same math in NumPy) alike.

    - ``QuantizedWeight.from_float(w, "int8" | "bf16")`` quantises (see
      reference.quantize_int8 and reference.to_bfloat16); a weight with NaN or inf raises
      ValueError naming the row, as does a bf16 value that rounds to inf.
    - ``QuantizedWeight.from_stored(dtype, data, scale=None)`` wraps stored arrays (int8 data
      (M, K) + scale (M,) float32; bf16 data (M, K) uint16), validated, never requantised.
      Arrays that are already C-contiguous are used without a copy: do not change them after.
    - ``.dtype`` ("int8" | "bf16"), ``.shape`` (M, K), ``.data``, ``.scale`` ((M,) float32, or
      None for bf16), ``.nbytes`` (data + scale), ``.dequantize()`` -> float32 (M, K).
      ``data`` and ``scale`` are read-only.
    - ``w[lo:hi]`` is the QuantizedWeight of rows lo:hi (a view of scale; of data, or of the
      packed copy, see below), cached per (lo, hi): slicing an in-projection into q, k, v on
      every call costs a dict lookup.

    The products (reference.linear gives the exact rule): int8 quantises each row of x on the
    fly, symmetric as the weights but to int16 with as many levels as the int32 sums allow
    (32767 up to K = 516, 8256 at K = 2048), sums exactly in int32 and computes
    ``y = act(float32(acc) * (sx[n] * scale[m]) + bias[m])`` in float32 (bit for bit the
    twin's for activation None and relu; a row of x with NaN or inf gives a NaN row); bf16
    widens the weight to float32 and sums in float32.

    The kernels read a packed copy (a layout private to C, for the int8 path in use, see
    build_info()["int8_path"]) built on first use and never saved. The weight then lets go of
    ``data`` and keeps only the packed copy (M rounded up to the panel, K to the int8 group:
    no larger when M is a multiple of the panel, as in every Transformer-base weight), so a
    quantised model holds one byte per int8 weight and two per bf16 weight, not twice that;
    ``data`` still reads as before, unpacked into a new read-only array on each access (the
    reference backend, io.save and state_dict pay that copy, the kernels never do). A row
    slice starting on a panel edge (``build_info()["quant_tiles"]["int8_panel"]`` or
    ``["bf16_panel"]``, e.g. an in-projection's q / kv parts at d_model = 512) reads its
    parent's packed copy in place. Two threads using a new weight at
    once may both build the packed copy (one is kept); neither sees a partial one.
    """

    __slots__ = ("dtype", "_data", "scale", "shape", "_packed", "_slices", "_parent", "_lo")
    _fastattn_quantized = True       # how reference.linear recognises one (without importing ops)

    def __init__(self, dtype, data, scale, parent=None, lo=0, hi=0):
        """Private: use from_float or from_stored (which validate). A row slice has its
        parent and rows lo:hi (data: its rows, or None once the parent has let go of its
        own)."""
        self.dtype = dtype
        self.scale = None if scale is None else _readonly(scale)
        self._data = None if data is None else _readonly(data)
        self.shape = (hi - lo, parent.shape[1]) if data is None else \
            tuple(int(s) for s in self._data.shape)
        self._packed = None
        self._slices = {}
        self._parent = parent
        self._lo = lo

    @property
    def data(self):
        """The stored values: int8 (M, K) or bf16 bits (M, K) uint16, read-only. Once the
        packed copy is built, unpacked from it on each access (see above)."""
        data = self._data
        if data is not None:
            return data
        packed, parent = self._packed, self._parent     # threads may pack meanwhile
        if packed is None and parent is not None:      # a slice made after its parent packed
            return _readonly(parent.data[self._lo:self._lo + self.shape[0]])
        # read again: if another thread packed between the two reads above, packed was None
        # and parent already cleared; _packed is set before _data and _parent are cleared
        return _unpack(self._packed, self.shape)

    @classmethod
    def from_float(cls, w, dtype):
        op = "QuantizedWeight.from_float"
        dtype = _dtype_name(dtype, op)
        w = _f32c(_checks.weight(w, "w", op, "(out_features, in_features)"))
        M, K = w.shape
        if dtype == "int8":
            _check_int8_k(K, op)
            q = np.empty((M, K), np.int8)
            scale = np.empty(M, np.float32)
            bad = _kernels.quantize_int8(q, scale, w, get_num_threads())
            if bad >= 0:
                raise ValueError(f"{op}: weight row {bad} is not finite (NaN or inf)")
            return cls("int8", q, scale)
        finite = np.isfinite(w).all(axis=1) if K else np.ones(M, bool)
        if not finite.all():
            raise ValueError(f"{op}: weight row {_first_bad_row(~finite)} is not finite "
                             "(NaN or inf)")
        bits = to_bfloat16(w)
        row = _first_bad_row(_bf16_nonfinite_rows(bits))
        if row >= 0:
            raise ValueError(f"{op}: weight row {row} has a value beyond the bfloat16 range "
                             "(it rounds to inf)")
        return cls("bf16", bits, None)

    @classmethod
    def from_stored(cls, dtype, data, scale=None):
        op = "QuantizedWeight.from_stored"
        dtype = _dtype_name(dtype, op)
        if dtype == "int8":
            data = _int8_array(data, "data", op)
            _checks.ndim(data, 2, "data", op, "(out_features, in_features)")
            M, K = data.shape
            _check_int8_k(K, op)
            if scale is None:
                raise ValueError(f"{op}: int8 data needs its scale (M,) = ({M},) float32")
            scale = _float32_exact(scale, "scale", op)
            if scale.shape != (M,):
                raise ValueError(f"{op}: scale must have shape ({M},) (one per row of data "
                                 f"{data.shape}), got {scale.shape}")
            ok = np.isfinite(scale) & (scale >= 0)
            if not ok.all():
                row = _first_bad_row(~ok)
                raise ValueError(f"{op}: scale[{row}] = {scale[row]!r}; scales must be finite "
                                 "and >= 0")
            low = (data == -128).any(axis=1) if K else np.zeros(M, bool)
            if low.any():
                raise ValueError(f"{op}: data row {_first_bad_row(low)} holds -128; int8 "
                                 "weights are symmetric, in [-127, 127]")
            return cls("int8", data, scale)
        if scale is not None:
            raise ValueError(f"{op}: bf16 weights have no scale (got one)")
        data = np.asarray(data)
        if data.dtype != np.uint16:
            raise TypeError(f"{op}: bf16 data must be uint16 (bfloat16 bit patterns), got "
                            f"dtype {data.dtype}")
        _checks.ndim(data, 2, "data", op, "(out_features, in_features)")
        row = _first_bad_row(_bf16_nonfinite_rows(data))
        if row >= 0:
            raise ValueError(f"{op}: data row {row} holds a bfloat16 NaN or inf")
        return cls("bf16", data, None)

    @property
    def nbytes(self):
        """Bytes of the stored values and scales (what io.save writes)."""
        M, K = self.shape
        return M * K * (1 if self.dtype == "int8" else 2) + \
            (0 if self.scale is None else self.scale.nbytes)

    def dequantize(self):
        """The float32 (M, K) weight the kernels compute with."""
        if self.dtype == "int8":
            return reference.dequantize_int8(self.data, self.scale)
        return reference.from_bfloat16(self.data)

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"QuantizedWeight: only row slices w[lo:hi] are supported, got "
                            f"{key!r}")
        lo, hi, _ = key.indices(self.shape[0])
        hi = max(lo, hi)
        if (lo, hi) == (0, self.shape[0]):
            return self
        sub = self._slices.get((lo, hi))
        if sub is None:
            data = self._data
            sub = QuantizedWeight(self.dtype, None if data is None else data[lo:hi],
                                  None if self.scale is None else self.scale[lo:hi],
                                  parent=self, lo=lo, hi=hi)
            self._slices[(lo, hi)] = sub
        return sub

    def __repr__(self):
        return f"QuantizedWeight(dtype={self.dtype!r}, shape={self.shape})"

    def _kernel_arrays(self):
        """The packed copy for the kernels, built on the first product (once per int8 path;
        see the class doc): (path, wp, panel, group), group 1 for bf16 (the int8 layout with
        K in groups of 1), wp a view of the parent's for a slice on a panel edge."""
        path = _kernels.int8_path()
        packed = self._packed
        if packed is None or packed[0] != path:
            M, K = self.shape
            int8 = self.dtype == "int8"
            tiles = _kernels.quant_tiles()
            panel, group = (tiles[0], tiles[1]) if int8 else (tiles[5], 1)
            size = (_kernels.int8_packed_size if int8 else _kernels.bf16_packed_size)(M, K)
            parent, lo = self._parent, self._lo
            if parent is not None and lo % panel == 0 and M > 0:
                # rows lo.. of the parent's panels, in place (a panel past hi, if any, is
                # computed and dropped by the kernel like a padded one)
                start = lo * (-(-K // group) * group)
                wp = parent._kernel_arrays()[1][start:start + size]
            else:
                data = self.data
                wp = np.empty(size, data.dtype)
                (_kernels.int8_pack if int8 else _kernels.bf16_pack)(wp, data, get_num_threads())
            packed = (path, wp, panel, group)
            self._packed = packed
            self._parent = None             # the packed copy is all a slice needs now
            self._data = None               # data now unpacks from the packed copy
        return packed


def _unpack(packed, shape):
    """The (M, K) weight of a packed copy (path, wp, panel, group), read-only:
    wp[p][kg][f][j] = w[p panel + f][kg group + j], zero padded (fa_int8_pack; fa_bf16_pack's
    layout is the same with group 1)."""
    M, K = shape
    wp, panel, group = packed[1:]
    P, Kg = -(-M // panel), -(-K // group)
    q = wp[:P * Kg * panel * group].reshape(P, Kg, panel, group).transpose(0, 2, 1, 3)
    return _readonly(np.ascontiguousarray(q.reshape(P * panel, Kg * group)[:M, :K]))


def _check_int8_k(K, op):
    if K > INT8_MAX_K:
        raise ValueError(f"{op}: in_features K = {K} is above the int8 limit of {INT8_MAX_K} "
                         "(K * 127 * 127 must fit the int32 sums)")


def _bf16_nonfinite_rows(bits):
    """(M,) bool: rows of bf16 bits (M, K) holding an inf or NaN (exponent all ones)."""
    if bits.shape[1] == 0:
        return np.zeros(bits.shape[0], bool)
    return ((bits & 0x7F80) == 0x7F80).any(axis=1)


def _linear_quantized_into(y, x, qweight, bias, act):
    """y (N, M) = act(x (N, K) @ weight.T + bias) with a QuantizedWeight (int8 or bf16): the
    model backends' entry (arguments trusted: float32, C-contiguous, shapes consistent; act an
    FA_ACT code). The kernel takes any N: few rows (decode steps) stream the packed weight once,
    split by panels; many rows run the blocked GEMM."""
    N, K = x.shape
    if N == 0 or y.shape[1] == 0:
        return y
    if K == 0:          # an empty sum: only the bias and activation remain
        y[...] = reference.linear(x, qweight, bias, activation=_ACT_NAMES[act])
        return y
    return _quantized_product(qweight, bias, act)(x, y)


def _quantized_product(qweight, bias, act):
    """The kernel call of _linear_quantized_into for x of at least one row and a weight with
    elements, its packed copy looked up now: f(x, y) -> y."""
    wp = qweight._kernel_arrays()[1]
    if qweight.dtype == "int8":
        scale, kernel = qweight.scale, _kernels.linear_int8_forward

        def product(x, y):
            kernel(y, x, wp, scale, bias, act, get_num_threads())
            return y
        return product
    kernel = _kernels.linear_bf16_forward

    def product(x, y):
        kernel(y, x, wp, bias, act, get_num_threads())
        return y
    return product


_ACT_NAMES = {code: name for name, code in ACTIVATIONS.items()}


def _layouts():
    """What the quantized weights' packed copies are laid out for (the int8 path): a product
    chosen by _linear_fn holds its packed copy, and is chosen again when this changes."""
    return _kernels.int8_path()


def _linear_fn(weight, bias, act, packed=None, rows=0):
    """The product y (rows, M) = act(x @ weight.T + bias) that the fast backend runs for x of
    `rows` rows (arguments trusted as for the _into functions), chosen now: f(x, y) -> y, for
    a decode step, which makes the same products every step. For rows > 0 and a weight with
    elements, f calls the kernel that _linear_quantized_into / _linear_packed_into (when
    `packed` is given and rows <= PACKED_MAX_ROWS) / _linear_into would call, with the same
    arguments, and nothing else."""
    M, K = weight.shape
    if isinstance(weight, QuantizedWeight):
        if rows <= 0 or M == 0 or K == 0:
            return lambda x, y: _linear_quantized_into(y, x, weight, bias, act)
        return _quantized_product(weight, bias, act)
    if packed is None or rows > PACKED_MAX_ROWS:
        return lambda x, y: _linear_into(y, x, weight, bias, act)
    wp, kernel = packed.data, _kernels.linear_packed_forward

    def product(x, y):
        kernel(y, x, wp, bias, act, get_num_threads())
        return y
    return product


def _linear_any_into(y, x, weight, bias, act):
    """_linear_into or _linear_quantized_into, by the weight's type."""
    if isinstance(weight, QuantizedWeight):
        return _linear_quantized_into(y, x, weight, bias, act)
    return _linear_into(y, x, weight, bias, act)


def _linear_quantized(x, weight, bias, activation, op):
    x, weight, bias, activation = _checks.linear(x, weight, bias, activation, op,
                                                 quantized_ok=True)
    x, bias = _f32c(x), _f32c(bias)
    act = ACTIVATIONS[activation]
    M, K = weight.shape
    N = math.prod(x.shape[:-1])
    y = np.empty(x.shape[:-1] + (M,), np.float32)
    _linear_quantized_into(y.reshape(N, M), x.reshape(N, K), weight, bias, act)
    return y


def _ffn_quantized(x, w1, b1, w2, b2, activation):
    x, w1, b1, w2, b2, act = _check_ffn(x, w1, b1, w2, b2, activation, "ffn",
                                        quantized_ok=True)
    C = x.shape[-1]
    N = math.prod(x.shape[:-1])
    y = np.empty(x.shape, np.float32)
    _ffn_quantized_into(y.reshape(N, C), x.reshape(N, C), w1, b1, w2, b2, act)
    return y


def _ffn_quantized_into(y, x, w1, b1, w2, b2, act, hidden=None):
    """y (N, C) = act(x @ w1.T + b1) @ w2.T + b2 with w1 (F, C) and / or w2 (C, F) quantised
    (either may be a float32 array): the model backends' entry, arguments trusted like
    _linear_quantized_into's. Two products, the activation in the first one's epilogue;
    hidden (N, F) float32 is scratch, allocated when None. Two calls rather than one fused
    region per row block: keeping a block's hidden rows in cache between the products does
    not make them faster, and the two calls reuse each product's own work split."""
    if hidden is None:
        hidden = np.empty((x.shape[0], w1.shape[0]), np.float32)
    _linear_any_into(hidden, x, w1, b1, act)
    _linear_any_into(y, hidden, w2, b2, 0)
    return y
