"""The position tables of the pretrained families that are computed, not stored (BART's and
mBART's are learned: weights). Each is a float32 (rows, d) table and a rule for the row a
token reads.

```text
Marian     row p = [sin(p w_0) .. sin(p w_{h-1}), cos(p w_0) .. cos(p w_{d-h-1})],
           w_j = 10000 ** (-2 j / d), h = ceil(d / 2) (sin in the first half, cos in the
           second: not interleaved); token t of a sequence reads row t (a decode step's,
           row past + t), whatever the padding
M2M100 /   row n = [sin(n f_0) .. sin(n f_{h-1}), cos(n f_0) .. cos(n f_{h-1}), (0 for
NLLB       odd d)], f_i = exp(-i ln(10000) / (h - 1)), h = d // 2; the pad id's row is zero;
           a token reads pad_id + (its count among the sequence's non-pad tokens, from 1,
           plus past), a pad token the zero row (so left padding moves the positions)
```

Computed in float64 and rounded once to float32 (transformers computes Marian's so, and
M2M100's in float32: those agree with these to float32 rounding).
"""
import math

import numpy as np

__all__ = ["sinusoidal_marian", "sinusoidal_m2m100", "m2m100_rows"]


def sinusoidal_marian(rows, d):
    """Marian's sinusoidal position table (see the module doc).

    Args:
        rows: the number of positions.
        d: the model width.

    Returns:
        (rows, d) float32.
    """
    p = np.arange(rows, dtype=np.float64)[:, None]
    j = np.arange(d)
    angle = p / np.power(10000.0, 2 * (j // 2) / d)
    h = (d + 1) // 2
    out = np.empty((rows, d), np.float64)
    out[:, :h] = np.sin(angle[:, 0::2])
    out[:, h:] = np.cos(angle[:, 1::2])
    return out.astype(np.float32)


def sinusoidal_m2m100(rows, d, pad_id):
    """M2M100's sinusoidal position table, the pad id's row zero (see the module doc).

    Args:
        rows: the number of rows.
        d: the model width.
        pad_id: the padding token id, whose row is zero.

    Returns:
        (rows, d) float32.
    """
    h = d // 2
    if h < 2:
        raise ValueError(f"sinusoidal_m2m100: d = {d} is too small (its frequencies need "
                         "d >= 4)")
    freq = np.exp(np.arange(h, dtype=np.float64) * -(math.log(10000.0) / (h - 1)))
    angle = np.arange(rows, dtype=np.float64)[:, None] * freq[None, :]
    out = np.zeros((rows, d), np.float64)
    out[:, :h] = np.sin(angle)
    out[:, h:2 * h] = np.cos(angle)
    if 0 <= pad_id < rows:
        out[pad_id] = 0.0
    return out.astype(np.float32)


def m2m100_rows(ids, pad_id, past=0):
    """The M2M100 table's row for each token (see the module doc).

    A token's row is pad_id + its 1-based count among the row's non-pad tokens + past; a pad's
    is pad_id.

    Args:
        ids: (B, L) integer token ids.
        pad_id: the padding token id.
        past: the positions already decoded before these (default 0).

    Returns:
        (B, L) int64.
    """
    ids = np.asarray(ids)
    keep = ids != pad_id
    return np.where(keep, np.cumsum(keep, axis=1) + past, 0).astype(np.int64) + pad_id
