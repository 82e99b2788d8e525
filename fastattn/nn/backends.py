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


class FastOps:
    """The kernels, writing into buffers the caller owns (``out``) when it gives one."""

    name = "fast"

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


class ReferenceOps:
    """The NumPy twin, as a prototype would call it: new arrays every time."""

    name = "reference"

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


def backend_ops(name):
    """The op table of backend `name` ("fast" or "reference")."""
    if name == "fast":
        return FastOps
    if name == "reference":
        return ReferenceOps
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")


class Workspace:
    """Activation buffers of one forward pass or decode step, reused by every layer (fast
    backend only: ``get`` returns None on the reference backend, and the ops allocate)."""

    def __init__(self, ops_, decode=False):
        self.fast = ops_ is FastOps
        self.decode = decode          # a decode step: few rows, packed weights worth building
        self.bufs = {}

    def get(self, key, shape):
        if not self.fast:
            return None
        buf = self.bufs.get(key)
        size = math.prod(shape)
        if buf is None or buf.size < size:
            buf = self.bufs[key] = np.empty(size, np.float32)
        return buf[:size].reshape(shape)
