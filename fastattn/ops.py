"""The functional API on the C kernels: validation, mask normalisation, float32, outputs.

Same names, signatures and results as ``fastattn.reference`` (see its module docstring for the
dimension letters and conventions); the shape tables are in csrc/fastattn.h.

Input handling, the same for every op:
- float64 (and other real dtypes) are converted to float32; bool, complex, object and string
  arrays raise TypeError. Non-contiguous inputs are copied, except attention's q, k and v, which
  the kernel reads through their strides when the last axis is contiguous. So are float32 views
  whose data is not 4-byte aligned (np.frombuffer at an odd offset, packed records): the
  kernels load whole floats.
- Wrong ranks or mismatched shapes raise ValueError naming the argument and the shapes seen.
- Empty batches return empty arrays. NaN in the data propagates as NaN (it is not checked).
"""
import math
import numbers

import numpy as np

from . import _kernels, reference
from ._runtime import get_num_threads, tiles

__all__ = [
    "attention", "attention_forward", "softmax", "layer_norm", "layer_norm_forward", "linear",
    "attention_backward",
    "ffn", "positional_encoding",
]

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2}  # = FA_ACT_* in csrc/fastattn.h


# ---- argument checks ---------------------------------------------------------------------------

def _array(x, name, op):
    """x as an aligned float32 ndarray (a view when it already is one), or TypeError for
    non-real data. Aligned: data and strides are whole floats apart, so the C kernels may load
    floats through them (a misaligned view is copied)."""
    a = np.asarray(x)
    if a.dtype == np.bool_ or a.dtype.kind not in "fiu":
        raise TypeError(f"{op}: {name} must be a real numeric array, got dtype {a.dtype}")
    if a.dtype != np.float32:
        return a.astype(np.float32)
    return a if a.flags.aligned else a.copy(order="C")


def _contig(x, name, op):
    """x as an aligned, C-contiguous float32 array of the same shape (0-d stays 0-d)."""
    a = _array(x, name, op)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _ndim(a, n, name, op, letters):
    if a.ndim != n:
        raise ValueError(f"{op}: {name} must be {n}-D {letters}, got shape {a.shape}")


def _vector(x, n, name, op):
    """An optional (n,) parameter as a contiguous float32 array, or None."""
    if x is None:
        return None
    a = _contig(x, name, op)
    if a.shape != (n,):
        raise ValueError(f"{op}: {name} must have shape ({n},), got {a.shape}")
    return a


def _activation(activation, op):
    if not isinstance(activation, (str, type(None))) or activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be None, 'relu' or 'gelu', got {activation!r}")
    return ACTIVATIONS[activation]


def _strided(a):
    """Keep a view the kernel can read through its strides (last axis contiguous, aligned)."""
    if a.flags.aligned and a.strides[-1] == 4 and all(s % 4 == 0 for s in a.strides):
        return a
    return a.copy(order="C")  # fresh memory: ascontiguousarray keeps a misaligned contiguous view


def _mask_bias(mask, name, op, dtype_ok="bool or float"):
    """bool True = blocked -> -inf; float -> itself (added). Integer masks are ambiguous: refused."""
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        return np.where(m, np.float32(-np.inf), np.float32(0.0))
    if m.dtype.kind != "f":
        raise TypeError(f"{op}: {name} must be {dtype_ok}, got dtype {m.dtype}")
    m = m.astype(np.float32, copy=False)
    if not (m.flags.aligned and all(s % 4 == 0 for s in m.strides)):
        m = m.copy(order="C")         # the kernel reads aligned floats, whole-float strides
    return m


# ---- attention ---------------------------------------------------------------------------------

def _check_attention(q, k, v, mask, key_padding_mask, scale, op="attention"):
    q, k, v = (_array(t, n, op) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    _ndim(q, 4, "q", op, "(B, H, Lq, D)")
    _ndim(k, 4, "k", op, "(B, H, Lk, D)")
    _ndim(v, 4, "v", op, "(B, H, Lk, Dv)")
    q, k, v = _strided(q), _strided(k), _strided(v)
    B, H, Lq, D = q.shape
    if k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(f"{op}: k must be (B, H, Lk, D) = ({B}, {H}, Lk, {D}) to match q "
                         f"{q.shape}, got {k.shape}")
    Lk = k.shape[2]
    if v.shape[:3] != (B, H, Lk):
        raise ValueError(f"{op}: v must be (B, H, Lk, Dv) = ({B}, {H}, {Lk}, Dv) to match k "
                         f"{k.shape}, got {v.shape}")
    full = (B, H, Lq, Lk)
    if mask is not None:
        m = _mask_bias(mask, "mask", op)
        try:
            if m.ndim > 4:
                raise ValueError
            mask = np.broadcast_to(m, full)
        except ValueError:
            raise ValueError(f"{op}: mask of shape {m.shape} does not broadcast to "
                             f"(B, H, Lq, Lk) = {full}") from None
    if key_padding_mask is not None:
        kp = _mask_bias(key_padding_mask, "key_padding_mask", op)
        if kp.shape != (B, Lk):
            raise ValueError(f"{op}: key_padding_mask must be (B, Lk) = ({B}, {Lk}), "
                             f"got {kp.shape}")
        key_padding_mask = np.ascontiguousarray(kp).reshape(-1)
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D > 0 else 1.0
    elif not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"{op}: scale must be a real number or None, got {type(scale).__name__}")
    return q, k, v, mask, key_padding_mask, float(scale)


def _attention(q, k, v, mask, key_padding_mask, causal, scale, want_weights, dropout_p, seed):
    p, seed = reference._attention_dropout(dropout_p, seed, "attention")
    q, k, v, bias, key_bias, scale = _check_attention(q, k, v, mask, key_padding_mask, scale)
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
    bottom-right aligned. A query with no allowed key returns zeros. Without return_weights no
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
    p, seed = reference._attention_dropout(dropout_p, seed, op)
    arrays = {}
    for name, x, n, letters in (("dout", dout, 4, "(B, H, Lq, Dv)"), ("q", q, 4, "(B, H, Lq, D)"),
                                ("k", k, 4, "(B, H, Lk, D)"), ("v", v, 4, "(B, H, Lk, Dv)"),
                                ("out", out, 4, "(B, H, Lq, Dv)"), ("lse", lse, 3, "(B, H, Lq)")):
        arrays[name] = _array(x, name, op)
        _ndim(arrays[name], n, name, op, letters)
    q, k, v, bias, key_bias, scale = _check_attention(arrays["q"], arrays["k"], arrays["v"], mask,
                                                      key_padding_mask, scale, op)
    B, H, Lq, D = q.shape
    Lk, Dv = k.shape[2], v.shape[3]
    dout, out = _strided(arrays["dout"]), _strided(arrays["out"])
    for name, a in (("dout", dout), ("out", out)):
        if a.shape != (B, H, Lq, Dv):
            raise ValueError(f"{op}: {name} must be (B, H, Lq, Dv) = ({B}, {H}, {Lq}, {Dv}) to "
                             f"match q {q.shape} and v {v.shape}, got {a.shape}")
    lse = arrays["lse"]
    if lse.shape != (B, H, Lq):
        raise ValueError(f"{op}: lse must be (B, H, Lq) = ({B}, {H}, {Lq}) to match q {q.shape}, "
                         f"got {lse.shape}")
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
    a = _array(x, "x", "softmax")
    if a.ndim == 0:
        raise ValueError("softmax: x must have at least 1 dimension, got a scalar")
    if not isinstance(axis, numbers.Integral) or not -a.ndim <= axis < a.ndim:
        raise ValueError(f"softmax: axis {axis!r} is out of range for x of shape {a.shape}")
    moved = np.ascontiguousarray(np.moveaxis(a, axis, -1))
    y = np.empty_like(moved)
    if moved.size:
        C = moved.shape[-1]
        _kernels.softmax_forward(y.reshape(-1, C), moved.reshape(-1, C), get_num_threads())
    return np.moveaxis(y, -1, axis)


# ---- layer norm --------------------------------------------------------------------------------

def layer_norm_forward(x, weight, bias, *, eps=1e-5, residual=None):
    """LN(x + residual) returning (y, {"mean": (N,), "rstd": (N,)}); see reference."""
    op = "layer_norm"
    x = _contig(x, "x", op)
    if x.ndim == 0:
        raise ValueError(f"{op}: x must have at least 1 dimension (..., C), got a scalar")
    C = x.shape[-1]
    weight = _vector(weight, C, "weight", op)
    bias = _vector(bias, C, "bias", op)
    if residual is not None:
        residual = _contig(residual, "residual", op)
        if residual.shape != x.shape:
            raise ValueError(f"{op}: residual must have the shape of x {x.shape}, "
                             f"got {residual.shape}")
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"{op}: eps must be a real number, got {type(eps).__name__}")
    if not (eps > 0 and math.isfinite(eps)) or np.float32(eps) == 0:
        raise ValueError(f"{op}: eps must be positive and finite in float32, got {eps!r}")
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


# ---- linear and feed-forward -------------------------------------------------------------------

def _rows(x, name, op):
    x = _contig(x, name, op)
    if x.ndim == 0:
        raise ValueError(f"{op}: {name} must have at least 1 dimension (..., features), "
                         "got a scalar")
    return x


def _weight(w, name, op, shape_text):
    w = _contig(w, name, op)
    _ndim(w, 2, name, op, shape_text)
    return w


def linear(x, weight, bias=None, *, activation=None):
    """act(x @ weight.T + bias), GEMM through BLAS with a fused epilogue; see reference.linear."""
    op = "linear"
    x = _rows(x, "x", op)
    weight = _weight(weight, "weight", op, "(out_features, in_features)")
    M, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"{op}: x {x.shape} has {x.shape[-1]} features but weight {weight.shape} "
                         f"expects {K}")
    bias = _vector(bias, M, "bias", op)
    act = _activation(activation, op)
    N = x.size // K if K else int(np.prod(x.shape[:-1]))
    y = np.empty(x.shape[:-1] + (M,), np.float32)
    if N and M and K:
        _kernels.linear_forward(y.reshape(N, M), x.reshape(N, K), weight, bias, act,
                                get_num_threads())
    elif N and M:  # K == 0: an empty sum, only the bias and activation remain
        return reference.linear(x, weight, bias, activation=activation)
    return y


def ffn(x, w1, b1, w2, b2, *, activation="relu"):
    """linear(act(linear(x, w1, b1)), w2, b2) in row blocks; see reference.ffn."""
    op = "ffn"
    x = _rows(x, "x", op)
    C = x.shape[-1]
    w1 = _weight(w1, "w1", op, "(F, C)")
    w2 = _weight(w2, "w2", op, "(C, F)")
    F = w1.shape[0]
    if w1.shape[1] != C:
        raise ValueError(f"{op}: w1 must be (F, C) with C = {C} from x {x.shape}, got {w1.shape}")
    if w2.shape != (C, F):
        raise ValueError(f"{op}: w2 must be (C, F) = ({C}, {F}) from x {x.shape} and w1 "
                         f"{w1.shape}, got {w2.shape}")
    b1 = _vector(b1, F, "b1", op)
    b2 = _vector(b2, C, "b2", op)
    act = _activation(activation, op)
    N = x.size // C if C else int(np.prod(x.shape[:-1]))
    y = np.empty(x.shape, np.float32)
    if N and C and F:
        _kernels.ffn_forward(y.reshape(N, C), x.reshape(N, C), w1, b1, w2, b2, act,
                             get_num_threads())
    elif N and C:  # F == 0: the hidden layer is empty, y = b2
        return reference.ffn(x, w1, b1, w2, b2, activation=activation)
    return y


# ---- positional encoding -----------------------------------------------------------------------

def positional_encoding(length, d_model):
    """(length, d_model) sinusoidal table; computed once per model in NumPy (not a hot path), so
    it is the twin's own code after the argument checks."""
    for name, val in (("length", length), ("d_model", d_model)):
        if not isinstance(val, numbers.Integral) or isinstance(val, bool):
            raise TypeError(f"positional_encoding: {name} must be an int, got "
                            f"{type(val).__name__}")
        if val < 0:
            raise ValueError(f"positional_encoding: {name} must be >= 0, got {val}")
    return reference.positional_encoding(int(length), int(d_model))


# ---- private entry points for fastattn.nn ------------------------------------------------------
# The model layer checks its inputs once at the model boundary and then runs many ops on arrays
# it owns: float32, C-contiguous (attention: last axis contiguous), shapes already consistent.
# These write into caller-owned buffers so a forward pass reuses its activations.

def _linear_into(y, x, weight, bias, act):
    """y (N, M) = act(x (N, K) @ weight (M, K).T + bias); act is an FA_ACT code."""
    _kernels.linear_forward(y, x, weight, bias, act, get_num_threads())
    return y


def _ffn_into(y, x, w1, b1, w2, b2, act):
    """y (N, C) = act(x @ w1.T + b1) @ w2.T + b2."""
    _kernels.ffn_forward(y, x, w1, b1, w2, b2, act, get_num_threads())
    return y


def _layer_norm_into(y, x, weight, bias, eps, residual=None, sum_out=None):
    """y (N, C) = LN(x + residual); sum_out (N, C) receives x + residual. y may alias x,
    residual or sum_out; sum_out may alias residual."""
    _kernels.layer_norm_forward(y, sum_out, None, None, x, residual, weight, bias, eps,
                                get_num_threads())
    return y


def _attention_into(out, q, k, v, bias, key_bias, causal, scale):
    """out (B, H, Lq, Dv) view (any strides, last axis contiguous) = attention(q, k, v);
    bias: float (B, H, Lq, Lk) broadcast view or None; key_bias: float (B*Lk,) or None."""
    _kernels.attention_forward(out, None, None, q, k, v, bias, key_bias, scale, causal,
                               get_num_threads())
    return out


# Up to this many rows (a decode step's beams), a product with a PackedWeight beats BLAS.
PACKED_MAX_ROWS = tiles()["packed_max_rows"]


class PackedWeight:
    """A linear layer's (M, K) weight repacked for decode-sized products (a few rows): the
    kernel streams it once, in order, with vectors along the output features."""

    __slots__ = ("data", "shape")

    def __init__(self, weight):
        w = _contig(weight, "weight", "PackedWeight")
        _ndim(w, 2, "weight", "PackedWeight", "(out_features, in_features)")
        self.shape = w.shape
        self.data = np.empty(_kernels.packed_size(*w.shape), np.float32)
        _kernels.pack_panels(self.data, w, get_num_threads())


def _linear_packed_into(y, x, packed, bias, act):
    """y (N, M) = act(x (N, K) @ weight.T + bias) with the weight as a PackedWeight."""
    _kernels.linear_packed_forward(y, x, packed.data, bias, act, get_num_threads())
    return y
