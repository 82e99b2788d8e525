"""The argument checks of the functional API, shared by both twins.

``fastattn.ops`` and ``fastattn.reference`` call the same function here at the top of each
public op, with the same operation name, so they accept the same arguments and refuse the same
ones with the same exception and message: a prototype that runs on the reference runs on the
kernels. The checks look at dtypes, ranks, shapes and options, never at values inside the data
arrays (NaN and inf are data); they return the arrays as NumPy arrays of their own dtype, and
each twin converts them (ops to aligned float32, the reference to float64).

Conventions of the messages: ``"<op>: <argument> ..."``; TypeError for a wrong kind of value
(dtype, type), ValueError for a wrong rank, shape or range.
"""
import math
import numbers

import numpy as np

# = FA_ACT_* in csrc/fastattn.h; "gelu" is the exact (erf) GELU, "gelu_tanh" its tanh
# approximation (torch's GELU(approximate="tanh")), "silu" x sigmoid(x) (torch's SiLU, the
# "swish" of Marian models)
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
_ACT_CHOICES = ", ".join(map(repr, list(ACTIVATIONS)[:-1])) + f" or {list(ACTIVATIONS)[-1]!r}"
REDUCTIONS = ("mean", "sum", "none")
_INT64 = np.iinfo(np.int64)


def _quantized(w):
    """True for an ops.QuantizedWeight (recognised by a class flag: no import of ops here)."""
    return getattr(type(w), "_fastattn_quantized", False)


# ---- arrays ------------------------------------------------------------------------------------

def real(x, name, op):
    """x as an ndarray of its own dtype, or TypeError unless it holds real numbers (float or
    integer; bool, complex, object and string arrays are refused)."""
    a = np.asarray(x)
    if a.dtype == np.bool_ or a.dtype.kind not in "fiu":
        raise TypeError(f"{op}: {name} must be a real numeric array, got dtype {a.dtype}")
    return a


def ndim(a, n, name, op, letters):
    if a.ndim != n:
        raise ValueError(f"{op}: {name} must be {n}-D {letters}, got shape {a.shape}")


def rows(x, name, op, letters="(..., features)"):
    """A real array with at least one axis (its last one is the features)."""
    a = real(x, name, op)
    if a.ndim == 0:
        shape = f" {letters}" if letters else ""
        raise ValueError(f"{op}: {name} must have at least 1 dimension{shape}, got a scalar")
    return a


def vector(x, n, name, op):
    """An optional (n,) real parameter, or None."""
    if x is None:
        return None
    a = real(x, name, op)
    if a.shape != (n,):
        raise ValueError(f"{op}: {name} must have shape ({n},), got {a.shape}")
    return a


def same_shape(a, name, like, like_name, op):
    if a.shape != like.shape:
        raise ValueError(f"{op}: {name} must have the shape of {like_name} {like.shape}, "
                         f"got {a.shape}")


def real_number(value, name, op):
    """A finite real hyper-parameter as a Python float (TypeError / ValueError otherwise)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{op}: {name} must be finite, got {value!r}")
    return value


def activation(act, op):
    """The activation's name, checked: None, "relu", "gelu", "gelu_tanh" or "silu"."""
    if not isinstance(act, (str, type(None))) or act not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be {_ACT_CHOICES}, got {act!r}")
    return act


# ---- masks -------------------------------------------------------------------------------------

def mask_array(mask, name, op, dtype_ok="bool or float"):
    """A mask as an ndarray: bool (True = not allowed) or real floating point (added to the
    scores). Integer masks are ambiguous (0/1 blocked? allowed? added?) and refused, as are
    complex, object and string ones."""
    m = np.asarray(mask)
    if m.dtype != np.bool_ and m.dtype.kind != "f":
        raise TypeError(f"{op}: {name} must be {dtype_ok}, got dtype {m.dtype}")
    return m


# ---- attention ---------------------------------------------------------------------------------

COMPUTE_TYPES = ("float32", "bfloat16")


def compute_type(value, op, dropout_p=0.0):
    """compute_type checked -> True for "bfloat16", False for "float32" (any dropout_p: bf16
    training rounds the dropped weights too)."""
    if not isinstance(value, str) or value not in COMPUTE_TYPES:
        raise ValueError(f"{op}: compute_type must be one of {', '.join(map(repr, COMPUTE_TYPES))}, "
                         f"got {value!r}")
    return value == "bfloat16"


def attention_dropout(dropout_p, seed, op):
    """(p, seed) checked: p a real number in [0, 1); seed an int in [0, 2**64) when p > 0
    (ignored, and returned as None, when p == 0). TypeError / ValueError naming the argument."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"{op}: dropout_p must be a real number, got {type(dropout_p).__name__}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:  # also refuses NaN
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p!r} (a dropout of 1 "
                         "would zero every weight: leave the layer out instead)")
    if p == 0:
        return p, None  # no dropout: the seed is ignored
    if seed is None:
        raise ValueError(f"{op}: seed is required when dropout_p > 0 (an int in [0, 2**64)), "
                         "got None")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{op}: seed must be an int in [0, 2**64) or None, got "
                        f"{type(seed).__name__}")
    if not 0 <= int(seed) < 2 ** 64:
        raise ValueError(f"{op}: seed must be in [0, 2**64), got {seed}")
    return p, int(seed)


def attention(q, k, v, mask, key_padding_mask, scale, op="attention"):
    """attention's operands checked -> (q, k, v, mask, key_padding_mask, scale): arrays of
    their own dtype (masks bool or float; mask broadcastable to (B, H, Lq, Lk), not yet
    broadcast; key_padding_mask (B, Lk)), scale a float (default 1 / sqrt(D), 1 if D = 0)."""
    q, k, v = (real(t, n, op) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    ndim(q, 4, "q", op, "(B, H, Lq, D)")
    ndim(k, 4, "k", op, "(B, H, Lk, D)")
    ndim(v, 4, "v", op, "(B, H, Lk, Dv)")
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
        mask = mask_array(mask, "mask", op)
        try:
            if mask.ndim > 4:
                raise ValueError
            if np.broadcast_shapes(mask.shape, full) != full:
                raise ValueError
        except ValueError:
            raise ValueError(f"{op}: mask of shape {mask.shape} does not broadcast to "
                             f"(B, H, Lq, Lk) = {full}") from None
    if key_padding_mask is not None:
        key_padding_mask = mask_array(key_padding_mask, "key_padding_mask", op)
        if key_padding_mask.shape != (B, Lk):
            raise ValueError(f"{op}: key_padding_mask must be (B, Lk) = ({B}, {Lk}), "
                             f"got {key_padding_mask.shape}")
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D > 0 else 1.0
    elif not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"{op}: scale must be a real number or None, got {type(scale).__name__}")
    return q, k, v, mask, key_padding_mask, float(scale)


def attention_backward(dout, q, k, v, out, lse, mask, key_padding_mask, scale, dropout_p, seed,
                       op="attention_backward"):
    """attention_backward's arguments checked -> (dout, q, k, v, out, lse, mask,
    key_padding_mask, scale, p, seed), as attention() and attention_dropout() return them."""
    p, seed = attention_dropout(dropout_p, seed, op)
    arrays = {}
    for name, x, n, letters in (("dout", dout, 4, "(B, H, Lq, Dv)"), ("q", q, 4, "(B, H, Lq, D)"),
                                ("k", k, 4, "(B, H, Lk, D)"), ("v", v, 4, "(B, H, Lk, Dv)"),
                                ("out", out, 4, "(B, H, Lq, Dv)"), ("lse", lse, 3, "(B, H, Lq)")):
        arrays[name] = real(x, name, op)
        ndim(arrays[name], n, name, op, letters)
    q, k, v, mask, key_padding_mask, scale = attention(arrays["q"], arrays["k"], arrays["v"],
                                                       mask, key_padding_mask, scale, op)
    B, H, Lq, _ = q.shape
    Dv = v.shape[3]
    for name in ("dout", "out"):
        a = arrays[name]
        if a.shape != (B, H, Lq, Dv):
            raise ValueError(f"{op}: {name} must be (B, H, Lq, Dv) = ({B}, {H}, {Lq}, {Dv}) to "
                             f"match q {q.shape} and v {v.shape}, got {a.shape}")
    if arrays["lse"].shape != (B, H, Lq):
        raise ValueError(f"{op}: lse must be (B, H, Lq) = ({B}, {H}, {Lq}) to match q {q.shape}, "
                         f"got {arrays['lse'].shape}")
    return (arrays["dout"], q, k, v, arrays["out"], arrays["lse"], mask, key_padding_mask, scale,
            p, seed)


# ---- softmax, layer norm -----------------------------------------------------------------------

def softmax(x, axis, op="softmax"):
    a = rows(x, "x", op, letters="")
    if not isinstance(axis, numbers.Integral) or not -a.ndim <= axis < a.ndim:
        raise ValueError(f"{op}: axis {axis!r} is out of range for x of shape {a.shape}")
    return a, int(axis)


def layer_norm(x, weight, bias, eps, residual, op="layer_norm"):
    """-> (x, weight, bias, residual, eps): x (..., C); weight, bias (C,) or None; residual
    x's shape or None; eps a real number > 0 that stays > 0 in float32."""
    x = rows(x, "x", op, "(..., C)")
    C = x.shape[-1]
    weight = vector(weight, C, "weight", op)
    bias = vector(bias, C, "bias", op)
    if residual is not None:
        residual = real(residual, "residual", op)
        if residual.shape != x.shape:
            raise ValueError(f"{op}: residual must have the shape of x {x.shape}, "
                             f"got {residual.shape}")
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"{op}: eps must be a real number, got {type(eps).__name__}")
    if not (eps > 0 and math.isfinite(eps)) or np.float32(eps) == 0:
        raise ValueError(f"{op}: eps must be positive and finite in float32, got {eps!r}")
    return x, weight, bias, residual, float(eps)


def layer_norm_backward(dy, x, mean, rstd, weight, residual, op="layer_norm_backward"):
    """-> (dy, x, mean, rstd, weight, residual): x and dy (..., C), mean and rstd (N,), weight
    (C,) or None, residual x's shape or None."""
    x = rows(x, "x", op, "(..., C)")
    dy = real(dy, "dy", op)
    same_shape(dy, "dy", x, "x", op)
    C = x.shape[-1]
    N = math.prod(x.shape[:-1])
    mean = vector(mean, N, "mean", op)
    rstd = vector(rstd, N, "rstd", op)
    if mean is None or rstd is None:
        raise TypeError(f"{op}: mean and rstd are required (layer_norm_forward's cache)")
    weight = vector(weight, C, "weight", op)
    if residual is not None:
        residual = real(residual, "residual", op)
        same_shape(residual, "residual", x, "x", op)
    return dy, x, mean, rstd, weight, residual


# ---- linear and feed-forward -------------------------------------------------------------------

def weight(w, name, op, shape_text, quantized_ok=False):
    """A 2-D real weight; a QuantizedWeight passes where quantized_ok (inference), and is a
    TypeError elsewhere (training)."""
    if _quantized(w):
        if quantized_ok:
            return w
        raise TypeError(f"{op}: {name} is a QuantizedWeight; quantised weights are for "
                        "inference (linear, ffn), not training")
    w = real(w, name, op)
    ndim(w, 2, name, op, shape_text)
    return w


def linear(x, w, bias, act, op="linear", quantized_ok=False):
    """-> (x, weight, bias, activation): x (..., K), weight (M, K) (or a QuantizedWeight where
    quantized_ok), bias (M,) or None."""
    x = rows(x, "x", op)
    w = weight(w, "weight", op, "(out_features, in_features)", quantized_ok)
    M, K = w.shape
    if x.shape[-1] != K:
        shown = repr(w) if _quantized(w) else w.shape
        raise ValueError(f"{op}: x {x.shape} has {x.shape[-1]} features but weight {shown} "
                         f"expects {K}")
    bias = vector(bias, M, "bias", op)
    return x, w, bias, activation(act, op)


def pre_activation(pre, N, M, name, op):
    """The saved pre-activation: (N, M), or (..., M) with N rows in all."""
    a = real(pre, name, op)
    if a.ndim == 0 or a.shape[-1] != M or a.size != N * M:
        raise ValueError(f"{op}: {name} must be ({N}, {M}) (the forward's cache), got {a.shape}")
    return a


def linear_backward(dy, x, w, pre, act, op="linear_backward"):
    """-> (dy, x, weight, pre, activation); pre is required (and checked) with an activation,
    ignored (returned as None) without one."""
    x = rows(x, "x", op)
    w = weight(w, "weight", op, "(out_features, in_features)")
    M, K = w.shape
    if x.shape[-1] != K:
        raise ValueError(f"{op}: x {x.shape} has {x.shape[-1]} features but weight {w.shape} "
                         f"expects {K}")
    dy = real(dy, "dy", op)
    if dy.shape != x.shape[:-1] + (M,):
        raise ValueError(f"{op}: dy must be {x.shape[:-1] + (M,)} (x's rows, weight's "
                         f"{M} outputs), got {dy.shape}")
    act = activation(act, op)
    N = math.prod(x.shape[:-1])
    if act is not None and pre is None:
        raise ValueError(f"{op}: pre (linear_forward's cache['pre']) is required with "
                         f"activation={act!r}")
    pre = pre_activation(pre, N, M, "pre", op) if act is not None else None
    return dy, x, w, pre, act


def ffn(x, w1, b1, w2, b2, act, op="ffn", quantized_ok=False):
    """-> (x, w1, b1, w2, b2, activation): x (..., C), w1 (F, C), w2 (C, F) (either may be a
    QuantizedWeight where quantized_ok), b1 (F,) and b2 (C,) or None."""
    x = rows(x, "x", op)
    C = x.shape[-1]
    w1 = weight(w1, "w1", op, "(F, C)", quantized_ok)
    w2 = weight(w2, "w2", op, "(C, F)", quantized_ok)
    F = w1.shape[0]
    if w1.shape[1] != C:
        raise ValueError(f"{op}: w1 must be (F, C) with C = {C} from x {x.shape}, got "
                         f"{tuple(w1.shape)}")
    if tuple(w2.shape) != (C, F):
        raise ValueError(f"{op}: w2 must be (C, F) = ({C}, {F}) from x {x.shape} and w1 "
                         f"{tuple(w1.shape)}, got {tuple(w2.shape)}")
    b1 = vector(b1, F, "b1", op)
    b2 = vector(b2, C, "b2", op)
    return x, w1, b1, w2, b2, activation(act, op)


def ffn_training(x, w1, b1, w2, b2, act, dropout_p, seed, op):
    """ffn_forward's checks: ffn's (no QuantizedWeight), then the dropout's."""
    checked = ffn(x, w1, b1, w2, b2, act, op)
    dropout_args(dropout_p, seed, op)
    return checked


def ffn_backward(dy, x, w1, b1, w2, b2, pre, act, dropout_p, seed, op="ffn_backward"):
    """-> (dy, x, w1, b1, w2, b2, pre, activation)."""
    x, w1, b1, w2, b2, act = ffn_training(x, w1, b1, w2, b2, act, dropout_p, seed, op)
    dy = real(dy, "dy", op)
    same_shape(dy, "dy", x, "x", op)
    pre = pre_activation(pre, math.prod(x.shape[:-1]), w1.shape[0], "pre", op)
    return dy, x, w1, b1, w2, b2, pre, act


# ---- dropout, embedding, positional encoding ---------------------------------------------------

def dropout_args(p, seed, op):
    """The dropout rules: p a real number in [0, 1); seed an int in [0, 2**64), required when
    p > 0 (None allowed for p = 0)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{op}: p must be a real number, got {type(p).__name__}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{op}: p must be in [0, 1), got {p!r}")
    if seed is None:
        if p > 0:
            raise ValueError(f"{op}: seed is required when p > 0 (an int in [0, 2**64))")
        return
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{op}: seed must be an int, got {type(seed).__name__}")
    if not 0 <= int(seed) < 2 ** 64:
        raise ValueError(f"{op}: seed must be in [0, 2**64), got {seed}")


def dropout(x, p, seed, op, name):
    """dropout's and dropout_backward's arguments: x (..., C) real, then p and seed."""
    a = rows(x, name, op, "(..., C)")
    dropout_args(p, seed, op)
    return a


def ids_array(ids, op):
    a = np.asarray(ids)
    if a.dtype == np.bool_ or a.dtype.kind not in "iu":
        raise TypeError(f"{op}: ids must be an integer array, got dtype {a.dtype}")
    return a


def embedding_backward(dout, ids, num_embeddings, op="embedding_backward"):
    """-> (dout, ids as int64, V): ids in [0, V), dout of ids' shape plus a feature axis."""
    if isinstance(num_embeddings, bool) or not isinstance(num_embeddings, numbers.Integral):
        raise TypeError(f"{op}: num_embeddings must be an int, got "
                        f"{type(num_embeddings).__name__}")
    V = int(num_embeddings)
    if V < 0:
        raise ValueError(f"{op}: num_embeddings must be >= 0, got {V}")
    ids = ids_array(ids, op)
    if ids.dtype.kind == "u" and ids.size and int(ids.max()) > _INT64.max:
        raise ValueError(f"{op}: ids must be in [0, num_embeddings) = [0, {V}), found "
                         f"{int(ids.max())}")
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    dout = real(dout, "dout", op)
    if dout.ndim != ids.ndim + 1 or dout.shape[:-1] != ids.shape:
        raise ValueError(f"{op}: dout must be ids' shape {ids.shape} plus a feature axis "
                         f"(..., C), got {dout.shape}")
    flat = ids.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= V):
        bad = flat[(flat < 0) | (flat >= V)][0]
        raise ValueError(f"{op}: ids must be in [0, num_embeddings) = [0, {V}), found {bad}")
    return dout, ids, V


def positional_encoding(length, d_model, op="positional_encoding"):
    for name, val in (("length", length), ("d_model", d_model)):
        if not isinstance(val, numbers.Integral) or isinstance(val, bool):
            raise TypeError(f"{op}: {name} must be an int, got {type(val).__name__}")
        if val < 0:
            raise ValueError(f"{op}: {name} must be >= 0, got {val}")
    return int(length), int(d_model)


# ---- loss --------------------------------------------------------------------------------------

def loss_options(ignore_index, label_smoothing, reduction, op):
    """-> (ignore_index, label_smoothing) as int and float."""
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if not _INT64.min <= ignore_index <= _INT64.max:
        raise ValueError(f"{op}: ignore_index must fit in int64, got {ignore_index}")
    eps = real_number(label_smoothing, "label_smoothing", op)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return int(ignore_index), eps


def targets(t, shape, V, ignore_index, op):
    """targets as a flat int64 array, checked: integer dtype, shape `shape`, each in [0, V) or
    equal to ignore_index. Returns (t, count of rows not ignored)."""
    t = np.asarray(t)
    if t.dtype == np.bool_ or t.dtype.kind not in "iu":
        raise TypeError(f"{op}: targets must be an integer array of class indices, got dtype "
                        f"{t.dtype}")
    if t.shape != shape:
        raise ValueError(f"{op}: targets must have the shape of the logits without their last "
                         f"axis, {shape}, got {t.shape}")
    if t.dtype.kind == "u" and t.size and int(t.max()) > _INT64.max:
        raise ValueError(f"{op}: target {int(t.max())} is out of range for V = {V} classes")
    t = np.ascontiguousarray(t, dtype=np.int64).reshape(-1)
    keep = t != ignore_index
    bad = keep & ((t < 0) | (t >= V))
    if bad.any():
        raise ValueError(f"{op}: target {int(t[bad][0])} is out of range for V = {V} classes "
                         f"(valid: 0 .. {V - 1}, or ignore_index = {ignore_index})")
    return t, int(np.count_nonzero(keep))


def cross_entropy(logits, t, ignore_index, label_smoothing, reduction, op="cross_entropy"):
    """-> (logits, targets (N,) int64, count of rows not ignored, ignore_index, label_smoothing)."""
    ignore_index, eps = loss_options(ignore_index, label_smoothing, reduction, op)
    x = rows(logits, "logits", op, "(..., V)")
    t, count = targets(t, x.shape[:-1], x.shape[-1], ignore_index, op)
    return x, t, count, ignore_index, eps


# ---- optimiser ---------------------------------------------------------------------------------

def as_list(x, name, op):
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, (list, tuple)):
        return list(x)
    raise TypeError(f"{op}: {name} must be a float32 array or a list of them, got "
                    f"{type(x).__name__}")


def inplace_array(a, name, op, writable=True):
    """An array updated (or, not writable, read) where it lies: float32, C-contiguous,
    aligned; nothing is converted or copied. Returned flat."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{op}: {name} must be a NumPy array, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise TypeError(f"{op}: {name} must be float32, got dtype {a.dtype}")
    if not (a.flags.c_contiguous and a.flags.aligned):
        raise ValueError(f"{op}: {name} must be C-contiguous and aligned (it is used in place), "
                         f"got strides {a.strides} for shape {a.shape}")
    if writable and not a.flags.writeable:
        raise ValueError(f"{op}: {name} is read-only; it is updated in place")
    return a.reshape(-1)


def adam(params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay, op):
    """-> (tensors, step, lr, beta1, beta2, eps, weight_decay); tensors: one [p, g, m, v] list of
    flat in-place views per parameter."""
    lists = [as_list(x, n, op) for x, n in ((params, "params"), (grads, "grads"),
                                            (exp_avg, "exp_avg"), (exp_avg_sq, "exp_avg_sq"))]
    if len({len(x) for x in lists}) != 1:
        raise ValueError(f"{op}: params, grads, exp_avg and exp_avg_sq must be as many, got "
                         f"{', '.join(str(len(x)) for x in lists)}")
    if not isinstance(step, numbers.Integral) or isinstance(step, bool):
        raise TypeError(f"{op}: step must be an int (1-based), got {type(step).__name__}")
    if step < 1:
        raise ValueError(f"{op}: step must be >= 1 (1-based: the first update is step 1), "
                         f"got {step}")
    lr = real_number(lr, "lr", op)
    eps = real_number(eps, "eps", op)
    weight_decay = real_number(weight_decay, "weight_decay", op)
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{op}: betas must be a pair (beta1, beta2), got {betas!r}")
    b1, b2 = (real_number(b, f"betas[{i}]", op) for i, b in enumerate(betas))
    for name, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        if v < 0:
            raise ValueError(f"{op}: {name} must be >= 0, got {v!r}")
    for i, b in enumerate((b1, b2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{op}: betas[{i}] must be in [0, 1), got {b!r}")
    tensors = []
    for i, (p, g, m, v) in enumerate(zip(*lists)):
        flat = [inplace_array(a, f"{n}[{i}]", op, writable=n != "grads")
                for a, n in ((p, "params"), (g, "grads"), (m, "exp_avg"), (v, "exp_avg_sq"))]
        if not p.shape == g.shape == m.shape == v.shape:
            raise ValueError(f"{op}: params[{i}], grads[{i}], exp_avg[{i}] and exp_avg_sq[{i}] "
                             f"must have the same shape, got {p.shape}, {g.shape}, {m.shape}, "
                             f"{v.shape}")
        named = (("params", p), ("grads", g), ("exp_avg", m), ("exp_avg_sq", v))
        for j, (na, a) in enumerate(named):
            for nb, b in named[j + 1:]:
                if a.size and np.may_share_memory(a, b):
                    raise ValueError(f"{op}: {na}[{i}] and {nb}[{i}] share memory")
        tensors.append(flat)
    return tensors, int(step), lr, b1, b2, eps, weight_decay


def grad_list(grads, op):
    """grad_norm's grads: one real array or a list of them -> list of ndarrays."""
    return [real(g, f"grads[{i}]", op) for i, g in enumerate(as_list(grads, "grads", op))]


def clip_grads(grads, max_norm, op="clip_grads"):
    """-> (flat in-place views of grads, max_norm as a float)."""
    if not isinstance(max_norm, numbers.Real) or isinstance(max_norm, bool):
        raise TypeError(f"{op}: max_norm must be a real number, got {type(max_norm).__name__}")
    max_norm = float(max_norm)
    if not max_norm >= 0:
        raise ValueError(f"{op}: max_norm must be >= 0 (inf: never clip), got {max_norm!r}")
    flat = [inplace_array(g, f"grads[{i}]", op) for i, g in enumerate(as_list(grads, "grads", op))]
    return flat, max_norm


# ---- quantised weights -------------------------------------------------------------------------

def int8_array(q, name, op):
    a = np.asarray(q)
    if a.dtype != np.int8:
        raise TypeError(f"{op}: {name} must be an int8 array, got dtype {a.dtype}")
    return a


def float32_exact(a, name, op):
    """A float32 array as given (never converted: a conversion would change stored values)."""
    a = np.asarray(a)
    if a.dtype != np.float32:
        raise TypeError(f"{op}: {name} must be a float32 array, got dtype {a.dtype}")
    return a


def dequantize_int8(q, scale, op="dequantize_int8"):
    q = int8_array(q, "q", op)
    if q.ndim == 0:
        raise ValueError(f"{op}: q must have at least 1 dimension (..., K), got a scalar")
    scale = float32_exact(scale, "scale", op)
    if scale.shape != q.shape[:-1]:
        raise ValueError(f"{op}: scale must have shape {q.shape[:-1]} (q's rows), got "
                         f"{scale.shape}")
    return q, scale


def bfloat16_bits(bits, op="from_bfloat16"):
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError(f"{op}: bits must be uint16 (bfloat16 bit patterns), got "
                        f"dtype {b.dtype}")
    return b
