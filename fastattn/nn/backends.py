"""The two backends as op tables: one model code path, two sets of ops.

Every module holds ``self._ops``, one of the two tables below (FastOps, ReferenceOps), chosen
in one place (``backend_ops``). Model code calls only ``self._ops.<op>(...)``; it never asks
which backend it runs on. Each op takes caller-owned ``out`` buffers (the fast table writes into
them; the reference table computes new arrays, as a prototype would, and copies them in when a
buffer is given).

The linear and feed-forward products are not in the tables: they are the weight *kinds'*
(fastattn.kinds; TwinWeight below for the reference backend), which the table hands out
(``weight_kind``, ``decode_kind``: on the fast backend fastattn.kinds chooses, so a new kind
does not touch the model layer) and the module owning the parameter keeps. Precision is a
setting that installs kinds (float32, or bf16 training's copies), not a table of its own; the
attention's own products take it as a flag (``bf16``).

Arrays reaching these ops are already validated by the module boundary: float32, shapes
consistent, attention operands with a contiguous last axis.
"""
import math

import numpy as np

from .. import _fast, kinds, ops, reference
from ..ops import ACTIVATIONS

BACKENDS = ("fast", "reference")
_PRECISION_NAMES = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}


def precision_name(value, what="precision"):
    """"fp32" or "bf16" for a training precision given as fp32/float32 or bf16/bfloat16;
    ValueError naming the accepted values otherwise."""
    if isinstance(value, str) and value in _PRECISION_NAMES:
        return _PRECISION_NAMES[value]
    raise ValueError(f"{what} must be 'fp32' or 'bf16' (or 'float32', 'bfloat16'), got {value!r}")


class TwinWeight(kinds.WeightKind):
    """The reference backend's kind: the weight as the twin takes it (a float32 array or a
    QuantizedWeight) and, in training, the compute type of its products ("bfloat16" for bf16
    training: the twin rounds the operands itself). Its products are the twin's (new arrays,
    copied into the buffers given), with the signatures of fastattn.kinds'."""

    __slots__ = ("data", "shape", "compute_type")
    kind = "twin"

    def __init__(self, data, compute_type="float32"):
        self.data, self.shape, self.compute_type = data, data.shape, compute_type

    def rows(self, lo, hi):
        return TwinWeight(self.data[lo:hi], self.compute_type)

    def product(self, bias, act, rows=0):
        w, name = self.data, _ACT_NAMES[act]
        return lambda x, y: _put(y, reference.linear(x, w, bias, activation=name))

    def ffn_product(self, b1, w2, b2, act, rows=0):
        w1, w2, name = self.data, w2.data, _ACT_NAMES[act]
        if isinstance(w1, kinds.QuantizedWeight) or isinstance(w2, kinds.QuantizedWeight):
            return lambda x, y: _put(y, reference.linear(
                reference.linear(x, w1, b1, activation=name), w2, b2))
        return lambda x, y: _put(y, reference.ffn(x, w1, b1, w2, b2, activation=name))

    def train_forward(self, x, bias, act, y, pre):
        out, cache = reference.linear_forward(x, self.data, bias, activation=_ACT_NAMES[act],
                                              compute_type=self.compute_type)
        if pre is not None:
            pre[...] = cache["pre"]
        return _put(y, out)

    def train_backward(self, dy, x, pre, act, dw, db, dx):
        g, gw, gb = reference.linear_backward(dy, x, self.data, pre=pre,
                                              activation=_ACT_NAMES[act],
                                              compute_type=self.compute_type)
        dw += gw
        if db is not None:
            db += gb
        return _put(dx, g)

    def ffn_train(self, x, b1, w2, b2, act, dropout_p, seed, y, pre):
        out, cache = reference.ffn_forward(x, self.data, b1, w2.data, b2,
                                           activation=_ACT_NAMES[act], dropout_p=dropout_p,
                                           seed=seed, compute_type=self.compute_type)
        pre[...] = cache["pre"]
        return _put(y, out)

    def ffn_backward(self, dy, x, b1, w2, b2, pre, act, dropout_p, seed, grads, dx, h):
        out = reference.ffn_backward(dy, x, self.data, b1, w2.data, b2, pre,
                                     activation=_ACT_NAMES[act], dropout_p=dropout_p, seed=seed,
                                     compute_type=self.compute_type)
        for acc, g in zip(grads, out[1:]):
            if acc is not None:
                acc += g
        return _put(dx, out[0])


_ACT_NAMES = {code: name for name, code in ACTIVATIONS.items()}


class _TrainingOps:
    """The training ops (forwards that keep what the backward needs, and the backwards), over
    a functional module F: fastattn.ops or fastattn.reference, which share names, signatures
    and results. Every result goes into a buffer the caller gives (``Buffers``: reused from
    step to step on the fast backend; new arrays on the reference one), and parameter
    gradients are accumulated into the arrays given (dw, db), as a model accumulates them over
    backward() calls. This generic version computes new arrays with F and copies them in (the
    twin, as a prototype computes); FastOps writes in place with the kernels. ``bf16`` flags bf16
    training's attention products (the linear ones are the weight kinds')."""

    F = None

    # Attention's projected q, k, v: what a training forward writes them into, what its record
    # keeps of them, and the float32 heads its backward reads back (bf16 training keeps them
    # as bf16 bits: the backward's products read them rounded anyway).
    @staticmethod
    def head_buffer(bufs, key, shape, bf16=False):
        """The (N, n*C) array a projection writes its heads into."""
        return bufs.get(key, shape)

    @staticmethod
    def keep_heads(y, bufs, key, bf16=False):
        """What the record keeps of y (N, n*C), a head_buffer, after the attention read it."""
        return y

    @staticmethod
    def kept_heads(kept, slot):
        """keep_heads' result -> float32 (N, n*C) for the backward (valid until this thread
        asks for `slot` again)."""
        return kept

    @classmethod
    def add_norm_train(cls, x, residual, weight, bias, eps, y, s, mean, rstd):
        """y = LN(x + residual) (N, C); s (N, C) keeps x + residual (may be x or residual
        themselves: written over them), mean and rstd (N,) the statistics. Without a residual
        s is x itself (pass s=x). Returns y."""
        out, cache = cls.F.layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
        if residual is not None:
            np.add(x, residual, out=s)
        mean[...] = cache["mean"]
        rstd[...] = cache["rstd"]
        return _put(y, out)

    @classmethod
    def add_norm_backward(cls, dy, s, mean, rstd, weight, dw, db, dx):
        """-> dx (N, C), the gradient of LN's input s = x + residual (so of x and residual
        alike); dw, db accumulated if not None."""
        g, gw, gb = cls.F.layer_norm_backward(dy, s, mean, rstd, weight)
        if dw is not None:
            dw += gw
        if db is not None:
            db += gb
        return _put(dx, g)

    @classmethod
    def attention_train(cls, q, k, v, mask, p, seed, out, lse, bf16=False):
        """out (B, H, Lq, Dv) view, lse (B, H, Lq): attention with dropout p on the weights;
        bf16: bf16 training's products."""
        o, cache = cls.F.attention_forward(
            q, k, v, mask=mask.bias, key_padding_mask=mask.key_padding(q, k),
            causal=mask.causal, dropout_p=p, seed=seed, compute_type=_compute(bf16))
        lse[...] = cache["lse"]
        return _put(out, o)

    @classmethod
    def attention_backward(cls, dout, q, k, v, out, lse, mask, p, seed, dq, dk, dv, bf16=False):
        """(dq, dk, dv) into the views given."""
        grads = cls.F.attention_backward(
            dout, q, k, v, out, lse, mask=mask.bias, key_padding_mask=mask.key_padding(q, k),
            causal=mask.causal, dropout_p=p, seed=seed, compute_type=_compute(bf16))
        for buf, g in zip((dq, dk, dv), grads):
            buf[...] = g
        return dq, dk, dv

    @classmethod
    def dropout(cls, x, p, seed, out):
        """out = dropout(x) (out may be x: in place); its backward is the same call."""
        return _put(out, cls.F.dropout(x, p, seed=seed))

    @classmethod
    def dropout_backward(cls, dy, p, seed, out):
        """out = dropout's backward of dy (out may be dy)."""
        return _put(out, cls.F.dropout_backward(dy, p, seed=seed))

    @classmethod
    def embedding_backward(cls, dout, ids, dw):
        """dw (V, C) += the rows of dout (N, C) scattered to ids (N,) int64."""
        dw += cls.F.embedding_backward(dout, ids, dw.shape[0])

    @classmethod
    def cross_entropy(cls, logits, targets, ignore_index, label_smoothing, grad, losses):
        """Mean loss over non-ignored targets -> (float, dlogits (N, V) or None); the
        gradient is written over the logits (N, V) (the caller's own buffer). losses (N,):
        scratch for the per-row losses."""
        if grad:
            loss, dlogits = cls.F.cross_entropy(logits, targets, ignore_index=ignore_index,
                                                label_smoothing=label_smoothing,
                                                return_grad=True)
            logits[...] = dlogits
            return float(loss), logits
        return float(cls.F.cross_entropy(logits, targets, ignore_index=ignore_index,
                                         label_smoothing=label_smoothing)), None


class FastOps(_TrainingOps):
    """The kernels, writing into buffers the caller owns (``out``) when it gives one."""

    name = "fast"
    F = ops
    reuses_buffers = True        # inference passes reuse a workspace, the stream in place

    # -- weight kinds: chosen by fastattn.kinds (a new kind does not touch the model layer) ----
    weight_kind = staticmethod(kinds.weight_kind)
    decode_kind = staticmethod(kinds.decode_kind)

    # Training: every result written by the kernels into the caller's buffers, parameter
    # gradients accumulated in the kernels (no temporary arrays, no second pass to add them).

    @staticmethod
    def add_norm_train(x, residual, weight, bias, eps, y, s, mean, rstd):
        return _fast.layer_norm_into(y, x, weight, bias, eps, residual,
                                    s if residual is not None else None, mean, rstd)

    @staticmethod
    def add_norm_backward(dy, s, mean, rstd, weight, dw, db, dx):
        _fast.layer_norm_backward_into(dx, dw, db, dy, s, mean, rstd, weight, None,
                                      accumulate=True)
        return dx

    @staticmethod
    def attention_train(q, k, v, mask, p, seed, out, lse, bf16=False):
        bias, scale = _attention_bias(q, k, mask)
        return _fast.attention_into(out, q, k, v, bias, mask.key_bias, mask.causal, scale,
                                   lse.reshape(-1), p, seed, bf16=bf16)

    @staticmethod
    def attention_backward(dout, q, k, v, out, lse, mask, p, seed, dq, dk, dv, bf16=False):
        """bf16: q, k, v hold bf16 values (kept_heads' widened bits); dout is rounded here."""
        bias, scale = _attention_bias(q, k, mask)
        if bf16:
            dout = kinds.rounded(dout, "dy")
        _fast.attention_backward_into(dq, dk, dv, dout, out, lse.reshape(-1), q, k, v, bias,
                                     mask.key_bias, mask.causal, scale, p, seed, bf16=bf16)
        return dq, dk, dv

    @staticmethod
    def head_buffer(bufs, key, shape, bf16=False):
        """bf16: a per-thread scratch array (only the bits are kept: keep_heads)."""
        return kinds.scratch(shape, "heads." + key) if bf16 else bufs.get(key, shape)

    @staticmethod
    def keep_heads(y, bufs, key, bf16=False):
        """bf16: y rounded to bf16 as the attention's products round it, kept as bits (half of
        float32's memory)."""
        if not bf16:
            return y
        return _fast.round_bf16_bits(y, bufs.get("bf16." + key, y.shape, np.uint16))

    @staticmethod
    def kept_heads(kept, slot):
        if kept.dtype != np.uint16:
            return kept
        return _fast.widen_bf16(kept, kinds.scratch(kept.shape, slot))

    @staticmethod
    def dropout(x, p, seed, out):
        return _fast.dropout_into(out, x, p, seed)

    dropout_backward = dropout              # the same mask and scale, applied to the gradient

    @staticmethod
    def embedding_backward(dout, ids, dw):
        _fast.embedding_backward_into(dw, dout, ids, True)

    @staticmethod
    def cross_entropy(logits, targets, ignore_index, label_smoothing, grad, losses):
        loss = _fast.cross_entropy_into(logits if grad else None, losses, logits, targets,
                                       ignore_index=ignore_index,
                                       label_smoothing=label_smoothing)
        return float(loss), (logits if grad else None)

    # -- inference ------------------------------------------------------------------------------
    @staticmethod
    def attention_fn(head_dim, bf16=False):
        """``attention`` with no mask but a key padding bias, for heads of head_dim, chosen
        now (a decode step's): f(q, k, v, key_bias, out) -> out. bf16: bf16 products (the
        bfloat16 compute type, inference only)."""
        return _fast.attention_fn(_scale(head_dim), bf16=bf16)

    @staticmethod
    def add_norm(x, residual, weight, bias, eps, out=None):
        """LN(x + residual) (N, C) -> out; residual may be None. out may alias x or residual."""
        if out is None:
            out = np.empty(x.shape, np.float32)
        return _fast.layer_norm_into(out, x, weight, bias, eps, residual)

    @staticmethod
    def attention(q, k, v, mask, out=None, bf16=False):
        """(B, H, Lq, D) views -> (B, H, Lq, Dv); `mask` a prepared masks.Mask; bf16: bf16
        products (inference only)."""
        if out is None:
            out = np.empty(q.shape[:3] + v.shape[3:], np.float32)
        bias, scale = _attention_bias(q, k, mask)
        return _fast.attention_into(out, q, k, v, bias, mask.key_bias, mask.causal, scale,
                                    bf16=bf16)

    @staticmethod
    def attention_weights(q, k, v, mask, bf16=False):
        """(out (B, H, Lq, Dv), weights (B, H, Lq, Lk)): the slow path that stores weights."""
        return ops.attention(q, k, v, mask=mask.bias, key_padding_mask=mask.key_padding(q, k),
                             causal=mask.causal, return_weights=True,
                             compute_type=_compute(bf16))


class ReferenceOps(_TrainingOps):
    """The NumPy twin, as a prototype would call it: new arrays every time."""

    name = "reference"
    F = reference
    reuses_buffers = False

    @staticmethod
    def weight_kind(weight, precision=None):
        """The weight as the twin takes it, with its products' compute type."""
        return TwinWeight(weight, _compute(precision == "bf16"))

    @staticmethod
    def decode_kind(weight):
        return TwinWeight(weight)                 # a prototype multiplies the weight itself

    @staticmethod
    def attention_fn(head_dim, bf16=False):
        def attend(q, k, v, key_bias, out):
            kpm = None if key_bias is None else key_bias.reshape(q.shape[0], k.shape[2])
            return _put(out, reference.attention(q, k, v, key_padding_mask=kpm,
                                                 compute_type=_compute(bf16)))
        return attend

    @staticmethod
    def add_norm(x, residual, weight, bias, eps, out=None):
        return _put(out, reference.layer_norm(x, weight, bias, eps=eps, residual=residual))

    @staticmethod
    def attention(q, k, v, mask, out=None, bf16=False):
        y = reference.attention(q, k, v, mask=mask.bias, key_padding_mask=mask.key_padding(q, k),
                                causal=mask.causal, compute_type=_compute(bf16))
        return _put(out, y)

    @staticmethod
    def attention_weights(q, k, v, mask, bf16=False):
        return reference.attention(q, k, v, mask=mask.bias,
                                   key_padding_mask=mask.key_padding(q, k), causal=mask.causal,
                                   return_weights=True, compute_type=_compute(bf16))


def _compute(bf16):
    """The attention op's compute_type for the model layer's bf16 flag."""
    return "bfloat16" if bf16 else "float32"


def _put(out, y):
    if out is None:
        return y
    out[...] = y
    return out


def _scale(D):
    """The attention's scale for heads of D features."""
    return 1.0 / math.sqrt(D) if D else 1.0


def _attention_bias(q, k, mask):
    """The kernel's view of mask.bias (broadcast to (B, H, Lq, Lk), no copy) and the scale."""
    B, H, Lq, D = q.shape
    bias = None if mask.bias is None else np.broadcast_to(mask.bias, (B, H, Lq, k.shape[2]))
    return bias, _scale(D)


_M64 = (1 << 64) - 1


def _mix64(z):
    """SplitMix64's finaliser on a Python int (64-bit wrapping)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def backend_ops(name):
    """The op table of backend `name` ("fast" or "reference")."""
    if name == "fast":
        return FastOps
    if name == "reference":
        return ReferenceOps
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")


class Workspace:
    """Activation buffers of one forward pass or decode step, reused by every layer (fast
    backend in inference only: ``get`` returns None otherwise, and the ops allocate; a
    training forward keeps each layer's activations for its backward).

    In a training forward, ``seed()`` hands out the dropout seeds: a pure function of the base
    seed, the forward's number and the order of the dropout sites, so every run repeats.

    ``weights``: None in every ordinary pass; a dict in a recording pass (an inference pass
    made by ``attention_weights``), where each MultiheadAttention stores its attention weights
    (B, H, Lq, Lk) under itself as the key. Passes that share the dict record into one place."""

    def __init__(self, ops_, training=False, seed=0, call=0, weights=None):
        self.training = training
        self.weights = weights
        self.ops = ops_
        self.fast = ops_.reuses_buffers and not training  # buffers reused, stream in place
        self.bufs = {}
        self._views = {}              # (key, shape) -> the view get() hands out (decode steps
                                      # ask for the same ones every step)
        self._seed_base = _mix64((_mix64(seed) + call * 0x9E3779B97F4A7C15) & _M64)
        self._sites = 0

    def seed(self):
        """The next dropout site's seed (uint64 as an int)."""
        self._sites += 1
        return _mix64((self._seed_base + self._sites * 0xD1B54A32D192ED03) & _M64)

    def get(self, key, shape):
        if not self.fast:
            return None
        view = self._views.get((key, shape))
        if view is not None:
            return view
        buf = self.bufs.get(key)
        size = math.prod(shape)
        if buf is None or buf.size < size:
            buf = self.bufs[key] = np.empty(size, np.float32)
            self._views = {k: v for k, v in self._views.items() if k[0] != key}   # old buffer
        view = self._views[(key, shape)] = buf[:size].reshape(shape)
        return view


class Buffers:
    """Named arrays a module's training steps reuse: each key is one grow-only flat buffer,
    handed out reshaped, so once a step of the largest shape has run, later steps allocate no
    arrays. On the reference backend (``reuse=False``) every ``get`` is a new array, as a
    prototype allocates.

    A key must not be asked for again while its previous array is still needed: a module's
    forward buffers are safe because a module runs once per forward (and its backward reads
    them before the next forward); the backward's scratch is shared by the blocks of a pass
    under fixed roles, and ``other`` alternates the gradient handed from block to block."""

    __slots__ = ("reuse", "_arrays")

    def __init__(self, reuse):
        self.reuse = reuse
        self._arrays = {}

    def get(self, key, shape, dtype=np.float32):
        size = math.prod(shape)
        if not self.reuse:
            return np.empty(shape, dtype)
        buf = self._arrays.get(key)
        if buf is None or buf.size < size or buf.dtype != dtype:
            buf = self._arrays[key] = np.empty(size, dtype)
        return buf[:size].reshape(shape)

    def other(self, busy, shape):
        """One of two alternating gradient buffers of `shape`, never the one under `busy`."""
        a = self.get("grad.a", shape)
        return self.get("grad.b", shape) if np.may_share_memory(a, busy) else a

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self._arrays.values())
