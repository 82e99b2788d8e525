"""The fast path fastattn.nn runs: kernel calls on trusted arguments, into caller-owned buffers.

The model layer checks its inputs once at the model boundary and then runs many ops on arrays
it owns: float32, C-contiguous (attention: last axis contiguous), shapes already consistent.
These functions write into caller-owned buffers so a forward pass reuses its activations, and
take activation codes (fastattn._checks.ACTIVATIONS) rather than names. The public, validating
API is fastattn.ops; nothing here checks its arguments (the C kernels trust them too).

The linear and feed-forward products are made by the weight's kind (fastattn.kinds), which
calls the product functions here; this module imports nothing above the binding.
"""
import numpy as np

from . import _checks, _kernels
from ._runtime import get_num_threads


def linear_into(y, x, weight, bias, act, pre=None, bf16=False, packed=None):
    """y (N, M) = act(x (N, K) @ weight (M, K).T + bias); act is an FA_ACT code. pre (N, M), if
    given, receives x @ weight.T + bias (training, with an activation). bf16: x and weight hold
    bf16 values (bf16 training's rounded operands); packed: _kernels.bf16_weight_pack(weight,
    1) of these very values, or None."""
    _kernels.linear_forward(y, pre, x, weight, bias, act, get_num_threads(), bool(bf16), packed)
    return y


def round_bf16(x, out=None):
    """x rounded to bf16 as float32 values (reference.round_bfloat16's rule), C-contiguous:
    into out when given (out may be x), else a new array. x: float32, any layout."""
    src = np.ascontiguousarray(x)
    if out is None:
        out = np.empty(src.shape, np.float32)
    _kernels.round_bfloat16(out.reshape(-1), src.reshape(-1), get_num_threads())
    return out


def bf16_weight_pack(w, trans):
    """w (M, K), bf16 values held in float32s (C-contiguous): its form packed for the bf16
    tiles' products (trans 1: the forwards' w.T; 0: the input gradients' w), to pass as
    `packed` below with these very values; None where the tiles are not the bf16 path."""
    return _kernels.bf16_weight_pack(w, trans)


def round_bf16_bits(x, out):
    """x (C-contiguous float32) rounded to bf16 as round_bf16 rounds it, into the bits `out`
    (uint16, x's shape, C-contiguous) -> out."""
    if not out.flags.c_contiguous:
        raise ValueError(f"round_bf16_bits: out must be C-contiguous, got strides {out.strides}")
    _kernels.round_bfloat16_bits(out.reshape(-1), x.reshape(-1), get_num_threads())
    return out


def widen_bf16(bits, out):
    """The float32 values of bf16 bits (C-contiguous) into `out` (their shape, C-contiguous)
    -> out."""
    if not out.flags.c_contiguous:
        raise ValueError(f"widen_bf16: out must be C-contiguous, got strides {out.strides}")
    _kernels.widen_bfloat16(out.reshape(-1), bits.reshape(-1), get_num_threads())
    return out


def linear_backward_into(dx, dweight, dbias, dy, x, weight, pre, act, accumulate, dz=None,
                         bf16=False, packed=None):
    """Gradients of y = act(x @ weight.T + b) into caller-owned buffers: dx (N, K) (None: not
    wanted, a first layer) is overwritten; dweight (M, K) and dbias (M,) (either may be None)
    are overwritten, or added to when accumulate is True (parameter gradients summed across
    calls, as torch's .grad). pre (N, M): the forward's, with an activation (act != 0). dz (N,
    M): scratch for dy * act'(pre), allocated when None; it may be pre or dy themselves, which
    are then overwritten. bf16: dz (dy without an activation) rounded to bf16 before the
    products and sums; x and weight must come rounded (bf16 training); packed:
    _kernels.bf16_weight_pack(weight, 0) of these very values, or None."""
    if (act or bf16) and dz is None:
        dz = np.empty(dy.shape, np.float32)
    _kernels.linear_backward(dx, dweight, dbias, dz if act or bf16 else None, dy,
                             pre if act else None, x, weight, act, bool(accumulate),
                             get_num_threads(), bool(bf16), packed)


def ffn_into(y, x, w1, b1, w2, b2, act, panels1=None, panels2=None):
    """y (N, C) = act(x @ w1.T + b1) @ w2.T + b2; panels1, panels2: w1's and w2's packed
    panels (kinds.pack_panels of these very values), or None: packed by the call."""
    _kernels.ffn_forward(y, None, x, w1, b1, w2, b2, act, 0.0, 0, get_num_threads(), False,
                         None, None, panels1, panels2)
    return y


def ffn_forward_into(y, pre, x, w1, b1, w2, b2, act, dropout_p=0.0, seed=0, bf16=False,
                     packed=(None, None)):
    """y (N, C) = drop(act(x @ w1.T + b1)) @ w2.T + b2, pre (N, F) = x @ w1.T + b1 (training;
    pre may be None). dropout_p in [0, 1), seed an int in [0, 2**64) (checked by the caller).
    bf16: the hidden rounded to bf16 before the second product; x, w1, w2 must come rounded;
    packed: w1's and w2's _kernels.bf16_weight_pack(w, 1) (either may be None)."""
    _kernels.ffn_forward(y, pre, x, w1, b1, w2, b2, act, float(dropout_p), int(seed or 0),
                         get_num_threads(), bool(bf16), *packed)
    return y


def ffn_backward_into(dx, dw1, db1, dw2, db2, dy, x, w1, w2, pre, act, dropout_p, seed,
                       accumulate, h=None, dpre=None, bf16=False, packed=(None, None)):
    """Gradients of the FFN into caller-owned buffers: dx (N, C) overwritten (None: not
    wanted); dw1 (F, C), db1 (F,), dw2 (C, F), db2 (C,) (each may be None) overwritten, or
    added to when accumulate is True. pre (N, F): the forward's. h, dpre (N, F): scratch,
    allocated when None; dpre may be pre itself (then overwritten: pre is not needed after).
    bf16: h and dpre rounded to bf16 before the products that read them; dy, x, w1, w2 must
    come rounded; packed: w1's and w2's _kernels.bf16_weight_pack(w, 0) (either may be None)."""
    N, F = pre.shape
    if h is None:
        h = np.empty((N, F), np.float32)
    if dpre is None:
        dpre = np.empty((N, F), np.float32)
    _kernels.ffn_backward(dx, dw1, db1, dw2, db2, h, dpre, dy, pre, x, w1, w2, act,
                          float(dropout_p), int(seed or 0), bool(accumulate), get_num_threads(),
                          bool(bf16), *packed)


def layer_norm_backward_into(dx, dweight, dbias, dy, x, mean, rstd, weight, residual=None,
                              accumulate=False):
    """Gradients of LN(x + residual) into caller-owned buffers: dx (N, C) (None: not wanted)
    overwritten; dweight, dbias (C,) (either may be None) overwritten, or added to when
    accumulate is True."""
    _kernels.layer_norm_backward(dx, dweight, dbias, dy, mean, rstd, x, residual, weight,
                                 bool(accumulate), get_num_threads())


def dropout_into(y, x, p, seed):
    """y (N, C) = x * keep / (1 - p); y may be x itself (in place). p, seed checked by the
    caller; the backward is the same call on the gradient."""
    _kernels.dropout_forward(y, x, float(p), int(seed or 0), get_num_threads())
    return y


def embedding_backward_into(dweight, dout, ids, accumulate):
    """dweight (V, C) (+)= the scatter-add of dout (N, C) by ids (N,) int64 in [0, V) (checked by
    the caller): overwritten, or added to when accumulate is True."""
    _kernels.embedding_backward(dweight, dout, ids, bool(accumulate), get_num_threads())
    return dweight


def layer_norm_into(y, x, weight, bias, eps, residual=None, sum_out=None, mean=None,
                     rstd=None):
    """y (N, C) = LN(x + residual); sum_out (N, C) receives x + residual, mean and rstd (N,)
    the row statistics (training). y may alias x, residual or sum_out; sum_out may alias x or
    residual."""
    _kernels.layer_norm_forward(y, sum_out, mean, rstd, x, residual, weight, bias, eps,
                                get_num_threads())
    return y


def attention_into(out, q, k, v, bias, key_bias, causal, scale, lse=None, dropout_p=0.0,
                   seed=0, bf16=False):
    """out (B, H, Lq, Dv) view (any strides, last axis contiguous) = attention(q, k, v);
    bias: float (B, H, Lq, Lk) broadcast view or None; key_bias: float (B*Lk,) or None.
    Training: lse (B*H*Lq,) receives the log-sum-exp, and dropout_p / seed (checked by the
    caller) drop attention weights. bf16=True: ops.attention's compute_type="bfloat16" (with
    dropout, P' = P keep is rounded); its backward is attention_backward_into(bf16=True)."""
    _kernels.attention_forward(out, lse, None, q, k, v, bias, key_bias, scale, causal,
                               get_num_threads(), float(dropout_p), int(seed or 0), bool(bf16))
    return out


def attention_fn(scale, bf16=False):
    """attention_into without masks other than key_bias, the scale chosen now (a decode
    step's attention): f(q, k, v, key_bias, out) -> out, the same kernel call. bf16=True: bf16
    compute (ops.attention's compute_type="bfloat16"), for inference."""
    kernel = _kernels.attention_forward
    bf16 = bool(bf16)

    def attend(q, k, v, key_bias, out):
        kernel(out, None, None, q, k, v, None, key_bias, scale, False, get_num_threads(), 0.0, 0,
               bf16)
        return out
    return attend


def attention_backward_into(dq, dk, dv, dout, out, lse, q, k, v, bias, key_bias, causal,
                             scale, dropout_p=0.0, seed=0, bf16=False):
    """(dq, dk, dv) of attention_into's training call into caller-owned views (any strides,
    last axis contiguous): dq (B, H, Lq, D), dk (B, H, Lk, D), dv (B, H, Lk, Dv); dout and out
    (B, H, Lq, Dv) views; lse (B*H*Lq,); masks, scale, dropout as in the forward. bf16: P' and
    dS rounded to bf16 before their products; q, k, v and dout must come rounded."""
    _kernels.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, bias, key_bias, scale,
                                causal, float(dropout_p), int(seed or 0), get_num_threads(),
                                bool(bf16))


def linear_packed_into(y, x, panels, bias, act):
    """y (N, M) = act(x (N, K) @ weight.T + bias) with the weight's panels
    (kinds.pack_panels(weight))."""
    _kernels.linear_packed_forward(y, x, panels, bias, act, get_num_threads())
    return y


def reduce_losses(losses, count, reduction):
    """The per-row losses (N,) reduced in float64, in NumPy's fixed (pairwise) order: the same
    for any thread count. A mean over no counted rows is 0."""
    if reduction == "none":
        return losses
    total = float(np.sum(losses, dtype=np.float64))
    if reduction == "sum":
        return total
    return total / count if count else 0.0


def ce_grad_scale(count, reduction):
    return 1.0 / count if reduction == "mean" and count else 1.0


def cross_entropy_into(dlogits, losses, logits, targets, *, ignore_index=-100,
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
                                   ce_grad_scale(count, reduction), get_num_threads())
    return reduce_losses(losses, count, reduction)
