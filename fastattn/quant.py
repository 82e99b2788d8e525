"""Quantised linear weights for inference: int8 with per-row scales, bf16 weights (float32
compute), and the bfloat16 compute type (both operands of each product rounded to bf16).

The rules are reference.quantize_int8's and reference._linear_quantized's (and fastattn.h's):
these functions and their twins in fastattn.reference agree bit for bit on quantize_int8,
dequantize_int8, to_bfloat16 and from_bfloat16, and on linear with an int8 weight when the
activation is None or relu (gelu, gelu_tanh: to their kernels' accuracy, ~1e-6 relative); with
a bf16 weight, linear agrees with the twin as the float32 linear does (float32 sums); with a
bfloat16 weight, bit for bit (the sums' order is defined: reference.linear).
``fastattn.ops`` exports the public names (the twin API); QuantizedWeight and its products
are in fastattn.kinds (one class per stored type).
"""
import math

import numpy as np

from . import _checks, _convert, _kernels, reference
from ._runtime import get_num_threads
from .kinds import INT8_MAX_K, QuantizedWeight  # noqa: F401  (the twin API's names)

__all__ = ["quantize_int8", "dequantize_int8", "to_bfloat16", "from_bfloat16", "round_bfloat16",
           "QuantizedWeight", "INT8_MAX_K"]


def quantize_int8(x):
    """Symmetric per-row int8 quantisation of the last axis.

    x ~= q * scale[..., None]; bit for bit `fastattn.reference.quantize_int8`'s rule.

    Args:
        x: (..., K) converted to float32 first; must be finite.

    Returns:
        q: (..., K) int8 clip(rint(x * (127 / amax)), -127, 127).
        scale: (...,) float32 amax / 127, amax = max |x| over the row.
    """
    op = "quantize_int8"
    x = _convert.f32c(_checks.rows(x, "x", op, "(..., K)"))
    lead, K = x.shape[:-1], x.shape[-1]
    N = math.prod(lead)
    q = np.empty((N, K), np.int8)
    scale = np.empty(N, np.float32)
    bad = _kernels.quantize_int8(q, scale, x.reshape(N, K), get_num_threads())
    if bad >= 0:
        raise ValueError(f"{op}: x row {reference._row_name(bad, lead)} is not finite (NaN or "
                         "inf); int8 quantisation needs finite values")
    return q.reshape(x.shape), scale.reshape(lead)


def dequantize_int8(q, scale):
    """The float32 values of int8 rows with their per-row scales: q * scale[..., None].

    Args:
        q: (..., K) int8.
        scale: (...,) float32, one scale per row.

    Returns:
        (..., K) float32.
    """
    return reference.dequantize_int8(q, scale)


def to_bfloat16(x):
    """The bfloat16 bits of x: round to nearest even; NaN stays a quiet NaN.

    Bit for bit `fastattn.reference.to_bfloat16`.

    Args:
        x: an array of real numbers, converted to float32 first.

    Returns:
        uint16 array of the shape of x.
    """
    x = _convert.contig(x, "x", "to_bfloat16")
    bits = np.empty(x.shape, np.uint16)
    _kernels.to_bfloat16(bits.reshape(-1), x.reshape(-1), get_num_threads())
    return bits


def round_bfloat16(x):
    """The bfloat16 compute type's operand rounding, as vcvtneps2bf16 (subnormals to zero).

    Bit for bit `fastattn.reference.round_bfloat16`.

    Args:
        x: an array of real numbers, converted to float32 first.

    Returns:
        float32 array of the shape of x, each value a bfloat16.
    """
    return reference.round_bfloat16(x)


def from_bfloat16(bits):
    """The float32 values of bfloat16 bits, exactly.

    Args:
        bits: uint16 array of bfloat16 bits.

    Returns:
        float32 array of the same shape.
    """
    return reference.from_bfloat16(bits)
