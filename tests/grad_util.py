"""Helpers for the backward tests: central finite differences of the float64 twins.

The twins compute in float64 and round their results to float32 at the end (reference._f32).
``float64_twins()`` lifts that rounding for the duration of a with-block, so that finite
differences of a twin's forward can check the same twin's backward to ~1e-7 (the first oracle
of the style guide: the reference against finite differences, on tiny shapes).
"""
import contextlib

import numpy as np

from fastattn import reference


@contextlib.contextmanager
def float64_twins():
    """Within the block, the twins return float64 (their own precision) instead of float32."""
    saved = reference._f32
    reference._f32 = lambda a: np.asarray(a, dtype=np.float64)
    try:
        yield
    finally:
        reference._f32 = saved


def numeric_grad(loss, x, h=1e-6):
    """d loss / d x by central differences; x is a float64 array perturbed in place (restored)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + h
        up = loss()
        flat[i] = keep - h
        down = loss()
        flat[i] = keep
        gflat[i] = (up - down) / (2 * h)
    return g
