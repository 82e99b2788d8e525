"""The two backends as op tables: one model code path, two sets of ops.

Every module holds ``self._ops``, one of the tables below, chosen in one place
(``backend_ops``). Model code calls only ``self._ops.<op>(...)``; it never asks which backend
it runs on. Each op takes caller-owned ``out`` buffers (the fast table writes into them; the
reference table computes new arrays, as a prototype would, and copies them in when a buffer is
given).

Arrays reaching these ops are already validated by the module boundary: float32, shapes
consistent, attention operands with a contiguous last axis.
"""
import math

import numpy as np

from .. import ops, reference
from ..ops import ACTIVATIONS

BACKENDS = ("fast", "reference")

PACKED_MAX_ROWS = ops.PACKED_MAX_ROWS  # decode steps of up to this many rows use packed weights


class _TrainingOps:
    """The training ops (forwards that keep what the backward needs, and the backwards), over
    a functional module F: fastattn.ops or fastattn.reference, which share names, signatures
    and results. Parameter gradients are accumulated into the arrays given (dw, db), as a
    model accumulates them over backward() calls."""

    F = None

    @classmethod
    def linear_train(cls, x, weight, bias, activation=None):
        """-> (y (N, M), pre (N, M) before the activation, or None)."""
        y, cache = cls.F.linear_forward(x, weight, bias, activation=activation)
        return y, cache["pre"]

    @classmethod
    def linear_backward(cls, dy, x, weight, pre, activation, dw, db):
        """dy (N, M) -> dx (N, K); dw (M, K) += dZ^T x, db (M,) += column sums (if not None)."""
        dx, gw, gb = cls.F.linear_backward(dy, x, weight, pre=pre, activation=activation)
        dw += gw
        if db is not None:
            db += gb
        return dx

    @classmethod
    def ffn_train(cls, x, w1, b1, w2, b2, activation, p, seed):
        """-> (y (N, C), pre (N, F)): linear2(dropout(act(linear1(x))))."""
        y, cache = cls.F.ffn_forward(x, w1, b1, w2, b2, activation=activation, dropout_p=p,
                                     seed=seed)
        return y, cache["pre"]

    @classmethod
    def ffn_backward(cls, dy, x, w1, b1, w2, b2, pre, activation, p, seed, grads):
        """dy (N, C) -> dx (N, C); grads = (dw1, db1, dw2, db2) accumulated (db None: none)."""
        out = cls.F.ffn_backward(dy, x, w1, b1, w2, b2, pre, activation=activation,
                                 dropout_p=p, seed=seed)
        for acc, g in zip(grads, out[1:]):
            if acc is not None:
                acc += g
        return out[0]

    @classmethod
    def add_norm_train(cls, x, residual, weight, bias, eps):
        """-> (LN(x + residual) (N, C), mean (N,), rstd (N,))."""
        y, cache = cls.F.layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
        return y, cache["mean"], cache["rstd"]

    @classmethod
    def add_norm_backward(cls, dy, x, residual, mean, rstd, weight, dw, db):
        """-> the gradient of x (and of residual: the same); dw, db accumulated if not None."""
        dx, gw, gb = cls.F.layer_norm_backward(dy, x, mean, rstd, weight, residual=residual)
        if dw is not None:
            dw += gw
        if db is not None:
            db += gb
        return dx

    @classmethod
    def attention_train(cls, q, k, v, mask, p, seed):
        """-> (out (B, H, Lq, Dv), lse (B, H, Lq)) with dropout p on the weights."""
        out, cache = cls.F.attention_forward(
            q, k, v, mask=mask.bias, key_padding_mask=mask.key_padding(q, k),
            causal=mask.causal, dropout_p=p, seed=seed)
        return out, cache["lse"]

    @classmethod
    def attention_backward(cls, dout, q, k, v, out, lse, mask, p, seed):
        """-> (dq, dk, dv)."""
        return cls.F.attention_backward(
            dout, q, k, v, out, lse, mask=mask.bias, key_padding_mask=mask.key_padding(q, k),
            causal=mask.causal, dropout_p=p, seed=seed)

    @classmethod
    def dropout(cls, x, p, seed):
        return cls.F.dropout(x, p, seed=seed)

    @classmethod
    def dropout_backward(cls, dy, p, seed):
        return cls.F.dropout_backward(dy, p, seed=seed)

    @classmethod
    def embedding_backward(cls, dout, ids, dw):
        """dw (V, C) += the rows of dout (..., C) scattered to ids (...)."""
        dw += cls.F.embedding_backward(dout, ids, dw.shape[0])

    @classmethod
    def cross_entropy(cls, logits, targets, ignore_index, label_smoothing, grad):
        """Mean loss over non-ignored targets -> (float, dlogits (N, V) or None)."""
        if grad:
            loss, dlogits = cls.F.cross_entropy(logits, targets, ignore_index=ignore_index,
                                                label_smoothing=label_smoothing,
                                                return_grad=True)
            return float(loss), dlogits
        return float(cls.F.cross_entropy(logits, targets, ignore_index=ignore_index,
                                         label_smoothing=label_smoothing)), None


class FastOps(_TrainingOps):
    """The kernels, writing into buffers the caller owns (``out``) when it gives one."""

    name = "fast"
    F = ops

    # The backwards accumulate parameter gradients in the kernels (no temporary gradient
    # arrays, no second pass to add them).

    @staticmethod
    def linear_backward(dy, x, weight, pre, activation, dw, db):
        dx = np.empty(x.shape, np.float32)
        ops._linear_backward_into(dx, dw, db, np.ascontiguousarray(dy, np.float32), x, weight,
                                  pre, ACTIVATIONS[activation], True)
        return dx

    @staticmethod
    def ffn_backward(dy, x, w1, b1, w2, b2, pre, activation, p, seed, grads):
        dx = np.empty(x.shape, np.float32)
        ops._ffn_backward_into(dx, *grads, np.ascontiguousarray(dy, np.float32), x, w1, w2, pre,
                               ACTIVATIONS[activation], p, seed, True, dpre=pre)
        return dx

    @staticmethod
    def add_norm_backward(dy, x, residual, mean, rstd, weight, dw, db):
        dx = np.empty(x.shape, np.float32)
        ops._layer_norm_backward_into(dx, dw, db, np.ascontiguousarray(dy, np.float32), x, mean,
                                      rstd, weight, residual, accumulate=True)
        return dx

    @staticmethod
    def embedding_backward(dout, ids, dw):
        C = dw.shape[1]
        ops._embedding_backward_into(dw, np.ascontiguousarray(dout, np.float32).reshape(-1, C),
                                     np.ascontiguousarray(ids, np.int64).reshape(-1), True)

    @staticmethod
    def cross_entropy(logits, targets, ignore_index, label_smoothing, grad):
        """As _TrainingOps.cross_entropy, but the gradient is written over the logits (N, V)
        (float32, C-contiguous, owned by the caller): no second (N, V) array."""
        losses = np.empty(logits.shape[0], np.float32)
        loss = ops._cross_entropy_into(logits if grad else None, losses, logits,
                                       np.ascontiguousarray(targets, dtype=np.int64),
                                       ignore_index=ignore_index,
                                       label_smoothing=label_smoothing)
        return float(loss), (logits if grad else None)

    @staticmethod
    def pack(weight):
        """A copy of `weight` laid out for few-row products (decode steps)."""
        return ops.PackedWeight(weight)

    @staticmethod
    def linear(x, weight, bias, activation=None, out=None, packed=None):
        """act(x (N, K) @ weight (M, K).T + bias) -> (N, M); `packed` (the same weight packed)
        is used for N <= PACKED_MAX_ROWS."""
        if out is None:
            out = np.empty((x.shape[0], weight.shape[0]), np.float32)
        if packed is not None and x.shape[0] <= PACKED_MAX_ROWS:
            return ops._linear_packed_into(out, x, packed, bias, ACTIVATIONS[activation])
        return ops._linear_into(out, x, weight, bias, ACTIVATIONS[activation])

    @staticmethod
    def ffn(x, w1, b1, w2, b2, activation, out=None, packed=None):
        """linear2(act(linear1(x))) (N, C) -> (N, C): the fused kernel, or two packed products
        for decode-sized N when `packed` = (w1 packed, w2 packed)."""
        if out is None:
            out = np.empty(x.shape, np.float32)
        if packed is not None and x.shape[0] <= PACKED_MAX_ROWS:
            hidden = FastOps.linear(x, w1, b1, activation, packed=packed[0])
            return FastOps.linear(hidden, w2, b2, None, out=out, packed=packed[1])
        return ops._ffn_into(out, x, w1, b1, w2, b2, ACTIVATIONS[activation])

    @staticmethod
    def add_norm(x, residual, weight, bias, eps, out=None):
        """LN(x + residual) (N, C) -> out; residual may be None. out may alias x or residual."""
        if out is None:
            out = np.empty(x.shape, np.float32)
        return ops._layer_norm_into(out, x, weight, bias, eps, residual)

    @staticmethod
    def attention(q, k, v, mask, out=None):
        """(B, H, Lq, D) views -> (B, H, Lq, Dv); `mask` a prepared masks.Mask."""
        B, H, Lq, D = q.shape
        if out is None:
            out = np.empty((B, H, Lq, v.shape[3]), np.float32)
        bias = None if mask.bias is None else np.broadcast_to(mask.bias, (B, H, Lq, k.shape[2]))
        return ops._attention_into(out, q, k, v, bias, mask.key_bias, mask.causal,
                                   1.0 / math.sqrt(D) if D else 1.0)

    @staticmethod
    def attention_weights(q, k, v, mask):
        """(out (B, H, Lq, Dv), weights (B, H, Lq, Lk)): the slow path that stores weights."""
        return ops.attention(q, k, v, mask=mask.bias, key_padding_mask=mask.key_padding(q, k),
                             causal=mask.causal, return_weights=True)


class ReferenceOps(_TrainingOps):
    """The NumPy twin, as a prototype would call it: new arrays every time."""

    name = "reference"
    F = reference

    @staticmethod
    def pack(weight):
        return None                                   # a prototype multiplies the weight itself

    @staticmethod
    def linear(x, weight, bias, activation=None, out=None, packed=None):
        return _put(out, reference.linear(x, weight, bias, activation=activation))

    @staticmethod
    def ffn(x, w1, b1, w2, b2, activation, out=None, packed=None):
        return _put(out, reference.ffn(x, w1, b1, w2, b2, activation=activation))

    @staticmethod
    def add_norm(x, residual, weight, bias, eps, out=None):
        return _put(out, reference.layer_norm(x, weight, bias, eps=eps, residual=residual))

    @staticmethod
    def attention(q, k, v, mask, out=None):
        y = reference.attention(q, k, v, mask=mask.bias, key_padding_mask=mask.key_padding(q, k),
                                causal=mask.causal)
        return _put(out, y)

    @staticmethod
    def attention_weights(q, k, v, mask):
        return reference.attention(q, k, v, mask=mask.bias,
                                   key_padding_mask=mask.key_padding(q, k), causal=mask.causal,
                                   return_weights=True)


def _put(out, y):
    if out is None:
        return y
    out[...] = y
    return out


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
    seed, the forward's number and the order of the dropout sites, so every run repeats."""

    def __init__(self, ops_, decode=False, training=False, seed=0, call=0):
        self.training = training
        self.fast = ops_ is FastOps and not training   # buffers reused, stream updated in place
        self.decode = decode          # a decode step: few rows, packed weights worth building
        self.bufs = {}
        self._seed_base = _mix64((_mix64(seed) + call * 0x9E3779B97F4A7C15) & _M64)
        self._sites = 0

    def seed(self):
        """The next dropout site's seed (uint64 as an int)."""
        self._sites += 1
        return _mix64((self._seed_base + self._sites * 0xD1B54A32D192ED03) & _M64)

    def get(self, key, shape):
        if not self.fast:
            return None
        buf = self.bufs.get(key)
        size = math.prod(shape)
        if buf is None or buf.size < size:
            buf = self.bufs[key] = np.empty(size, np.float32)
        return buf[:size].reshape(shape)
