"""Token-budget batching of encoded pairs: batches of similar lengths, a fixed padded size.

A pair's cost in a batch is the batch's longest sequence: a batch of B pairs whose longest
source has Ls ids and longest target Lt ids is padded to (B, Ls) and (B, Lt), and is cut so
that ``B * max(Ls, Lt) <= batch_tokens``. A pair longer than batch_tokens alone is a batch of
its own (it is never dropped).

One epoch's batches (``epoch_batches``), all from ``numpy.random.default_rng((seed, epoch))``:

1. the pairs are shuffled (a permutation of their indices);
2. the shuffled order is cut into windows of ``window`` pairs (default: about 100 batches'
   worth); within each window the pairs are sorted by length (the longer side first, then the
   other; ties keep the shuffled order) and cut greedily into batches under the budget, so
   pairs of similar lengths share a batch and little of it is padding;
3. the batch order of the whole epoch is shuffled, so lengths do not grow along a window.

Every pair is in exactly one batch per epoch. The result is a pure function of (lengths,
batch_tokens, seed, epoch, window): a position (epoch, index of the batch within the epoch)
says where a run is, and a resumed run recomputes the epoch and continues from that index.

``padding_fraction`` is padded positions / all positions of a batch, sources and targets
together; ``collate`` builds the padded (B, Ls) and (B, Lt) int64 arrays.
"""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["epoch_batches", "padding_fraction", "collate", "default_window", "check_budget"]

WINDOW_BATCHES = 100        # a shuffling window holds about this many batches' pairs


def check_budget(batch_tokens, where="batch_tokens"):
    """Check a token budget.

    Args:
        batch_tokens: the value to check.
        where: how the error names it (default "batch_tokens").

    Returns:
        batch_tokens, an int >= 1.

    Raises:
        ValueError: not an int >= 1.
    """
    if not isinstance(batch_tokens, numbers.Integral) or isinstance(batch_tokens, bool) \
            or batch_tokens < 1:
        raise ValueError(f"{where} must be an int >= 1 (ids per padded batch), got "
                         f"{batch_tokens!r}")
    return int(batch_tokens)


def _lengths(src_lens, tgt_lens):
    s = np.asarray(src_lens, dtype=np.int64).reshape(-1)
    t = np.asarray(tgt_lens, dtype=np.int64).reshape(-1)
    if s.shape != t.shape:
        raise ValueError(f"src_lens and tgt_lens must have one entry per pair, got {s.size} "
                         f"and {t.size}")
    if s.size and (s.min() < 0 or t.min() < 0):
        raise ValueError("lengths must be >= 0")
    return s, t


def default_window(src_lens, tgt_lens, batch_tokens):
    """Pairs per shuffling window: WINDOW_BATCHES batches of pairs of the mean length.

    Args:
        src_lens: each pair's source length.
        tgt_lens: each pair's target length.
        batch_tokens: the padded budget per batch.

    Returns:
        The window, an int >= 1.
    """
    s, t = _lengths(src_lens, tgt_lens)
    mean = float(np.maximum(s, t).mean()) if s.size else 1.0
    return max(1, int(WINDOW_BATCHES * batch_tokens / max(mean, 1.0)))


def _cut(order, longest, batch_tokens):
    """Cut `order` (pair indices, in order) into consecutive batches with
    len(batch) * max(longest of its pairs) <= batch_tokens (a pair over budget alone)."""
    batches, start, top = [], 0, 0
    for i, n in enumerate(longest[order]):
        n = max(int(n), 1)
        if i > start and (i - start + 1) * max(top, n) > batch_tokens:
            batches.append(order[start:i])
            start, top = i, 0
        top = max(top, n)
    if start < len(order):
        batches.append(order[start:])
    return batches


def epoch_batches(src_lens, tgt_lens, batch_tokens, *, seed=0, epoch=0, window=None,
                  sort=True, shuffle=True):
    """The batches of one epoch (see the module docstring).

    Args:
        src_lens: each pair's source length, in ids.
        tgt_lens: each pair's target length, in ids.
        batch_tokens: the padded budget: B * max(Ls, Lt) <= batch_tokens.
        seed: the run's seed (default 0).
        epoch: the epoch, 0-based (default 0).
        window: pairs per sorting window; None (the default) for `default_window`.
        sort: sort within windows (default True; False cuts the shuffled order as it is,
            the unsorted baseline).
        shuffle: shuffle the pairs and the batches (default True; False keeps the given
            order, what evaluation uses, with one window over all pairs).

    Returns:
        A list of int64 index arrays into the pairs.
    """
    s, t = _lengths(src_lens, tgt_lens)
    batch_tokens = check_budget(batch_tokens)
    n = s.size
    if n == 0:
        return []
    longest = np.maximum(s, t)
    rng = np.random.default_rng((int(seed), int(epoch))) if shuffle else None
    order = rng.permutation(n) if shuffle else np.arange(n)
    if window is None:
        window = default_window(s, t, batch_tokens)
    window = check_budget(window, "window")
    batches = []
    for w in range(0, n, window):
        part = order[w:w + window]
        if sort:
            # lexsort: the last key is the primary one; stable, so ties keep the shuffle
            part = part[np.lexsort((np.minimum(s, t)[part], longest[part]))]
        batches.extend(_cut(part, longest, batch_tokens))
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return [np.asarray(b, dtype=np.int64) for b in batches]


def padding_fraction(batch, src_lens, tgt_lens):
    """Padded positions / all positions of a batch, sources and targets together.

    Args:
        batch: the batch's pair indices (ints).
        src_lens: each pair's source length.
        tgt_lens: each pair's target length.

    Returns:
        A float in [0, 1).
    """
    s, t = _lengths(src_lens, tgt_lens)
    b = np.asarray(batch, dtype=np.int64)
    if b.size == 0:
        return 0.0
    total = b.size * (int(s[b].max()) + int(t[b].max()))
    real = int(s[b].sum() + t[b].sum())
    return 0.0 if total == 0 else 1.0 - real / total


def collate(seqs, batch, pad_id):
    """The padded array of some sequences.

    Args:
        seqs: the encoded sequences (lists of ids).
        batch: the indices of the sequences to take, B of them.
        pad_id: the id that pads each row on the right.

    Returns:
        (B, L) int64, L the longest of them.
    """
    rows = [seqs[i] for i in batch]
    L = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), L), pad_id, dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r
    return out
