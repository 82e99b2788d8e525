"""Conversions of checked arguments to what the C kernels read: aligned float32 arrays (views
when they already are). The checks themselves are fastattn._checks, shared with the NumPy twin."""
import numpy as np

from . import _checks

__all__ = ["f32", "f32c", "array", "contig", "strided"]


def f32(a):
    """A checked real ndarray as an aligned float32 ndarray (a view when it already is one).
    Aligned: data and strides are whole floats apart, so the C kernels may load floats through
    them (a misaligned view is copied)."""
    if a.dtype != np.float32:
        return a.astype(np.float32)
    return a if a.flags.aligned else a.copy(order="C")


def f32c(a):
    """A checked real ndarray (or None) as an aligned, C-contiguous float32 array of the same
    shape (0-d stays 0-d)."""
    if a is None:
        return None
    a = f32(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def array(x, name, op):
    """x as an aligned float32 ndarray (a view when it already is one), or TypeError for
    non-real data."""
    return f32(_checks.real(x, name, op))


def contig(x, name, op):
    """x as an aligned, C-contiguous float32 array of the same shape (0-d stays 0-d)."""
    return f32c(_checks.real(x, name, op))


def strided(a):
    """Keep a view the kernel can read through its strides (last axis contiguous, aligned)."""
    if a.flags.aligned and a.strides[-1] == 4 and all(s % 4 == 0 for s in a.strides):
        return a
    return a.copy(order="C")  # fresh memory: ascontiguousarray keeps a misaligned contiguous view
