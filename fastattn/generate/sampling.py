"""Choosing the next token from a step's logits: greedy, sampling, and beam scores.

NaN logits: a step whose logits hold a NaN or +inf, or a row with no finite logit, raises
ValueError (greedy, sampling and beam search alike), naming the step and the rows: such logits
come from NaN or inf in the weights or the inputs, and no token chosen from them would mean
anything. (-inf logits are fine: those tokens are never chosen.)
"""
import numpy as np


def check_logits(logits, t):
    """logits (R, V) float; ValueError for a row holding NaN or +inf, or no finite logit."""
    # one pass: a row's max is NaN if it holds one, +inf if it holds one, -inf if nothing in it
    # is finite (and a row of no logits has none)
    if logits.shape[1] == 0:
        bad = np.ones(logits.shape[0], bool)
    else:
        bad = ~np.isfinite(logits.max(axis=1))
    if bad.any():
        rows = np.flatnonzero(bad)
        raise ValueError(f"generate: the model produced NaN or infinite logits at step {t} (rows "
                         f"{rows[:8].tolist()}{' ...' if rows.size > 8 else ''}); the weights "
                         "or the inputs hold NaN or inf")
    return logits


def greedy(logits):
    """The most likely token of each row (ties: the lowest id)."""
    return np.argmax(logits, axis=1)


def log_softmax(logits):
    """float64 log-probabilities of (R, V) logits (checked by check_logits first)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def sample(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """One draw per row from softmax(logits / temperature) restricted to top_k, then top_p.

    - temperature scales the max-subtracted logits, (l - max) / temperature, so any positive
      temperature, however small, tends to greedy and never overflows into NaN;
    - top_k keeps the k largest logits (ties at the k-th value all kept);
    - top_p keeps the smallest set of most likely tokens whose probability reaches top_p;
    - the draw u in [0, 1) picks the first kept token whose cumulative probability passes
      u x (the kept total), and only a kept token can be picked, whatever the rounding.
    """
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)                                 # <= 0, max is 0
    with np.errstate(over="ignore"):
        z /= temperature                                              # tiny: -inf but the max
    if top_k is not None and top_k < z.shape[1]:
        kth = np.partition(z, -top_k, axis=1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z)                                                     # max entry is 1
    p /= p.sum(axis=1, keepdims=True)
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, axis=1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=1)
        keep_sorted = np.cumsum(sorted_p, axis=1) - sorted_p < top_p    # reach top_p, no more
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=1)
        p = np.where(keep, p, 0.0)
    cum = np.cumsum(p, axis=1)
    u = rng.random(p.shape[0])[:, None] * cum[:, -1:]                 # in [0, kept total)
    ids = (cum <= u).sum(axis=1)               # first token whose cumsum passes u: its p > 0
    last_kept = p.shape[1] - 1 - np.argmax(p[:, ::-1] > 0, axis=1)
    return np.minimum(ids, last_kept)          # u rounded up to the total: the last kept token
