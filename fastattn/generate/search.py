"""The search loops, over any decoder with two methods:

    decoder.step(tokens)            tokens (R,) int64, one per live row -> logits (R, V)
    decoder.reorder(rows, sources)  continue with rows `rows` (new row i = old row rows[i]);
                                    `sources`: the kept sources when whole sources were
                                    dropped, else None

Rows are grouped by source: row r belongs to source r // k (k = beam slots per source, 1 for
greedy and sampling). Nothing here knows what a layer is: fastattn's models give a decoder
through their decode step (see fastattn.generate.generate), and any other model (a torch one,
in the benchmarks) can be searched with the same rules by giving these two methods.
"""
import numbers

import numpy as np

from .sampling import check_logits, log_softmax

MAX_BEAM_SIZE = 256      # beam slots per source, at most (and at most the target vocabulary)


def pad_rows(rows, pad_id):
    """Pad B token lists into one array.

    Args:
        rows: a list of B token lists.
        pad_id: the token that fills each row after its end.

    Returns:
        (B, T) int64, T the longest row's length.
    """
    T = max(map(len, rows)) if rows else 1
    out = np.full((len(rows), T), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def check_beam(k, V):
    """A beam of k slots over a target vocabulary of V tokens: 1 <= k <= min(MAX_BEAM_SIZE, V)
    (a beam wider than the vocabulary cannot hold k distinct hypotheses at the first step,
    and each slot is a row of decoder state: the bound keeps the work and memory bounded)."""
    most = min(MAX_BEAM_SIZE, V)
    if k > most:
        raise ValueError(f"generate: beam_size must be an int >= 1 and <= {most} (the target "
                         f"vocabulary's {V} tokens, at most {MAX_BEAM_SIZE}), got {k}")


def check_slots(k, where):
    """k beam slots per source: an int in [1, MAX_BEAM_SIZE], else ValueError (each slot is
    a row of decoder state; the vocabulary bound is checked at the first step)."""
    if not isinstance(k, numbers.Integral) or isinstance(k, bool) or not \
            1 <= k <= MAX_BEAM_SIZE:
        raise ValueError(f"{where}: k must be an int >= 1 and <= {MAX_BEAM_SIZE} (beam slots "
                         f"per source), got {k!r}")
    return int(k)


def single(decoder, B, pick, *, max_new_tokens, start_id, end_id=None, pad_id=0):
    """Greedy or sampling (`pick`: logits (R, V) -> ids (R,)): one row per source; a row that
    produces end_id is finished and dropped from the work. -> (B, T) int64."""
    seqs = [[start_id] for _ in range(B)]
    live = np.arange(B)                                   # source of each decoder row
    tokens = np.full(B, start_id, dtype=np.int64)
    for t in range(max_new_tokens):
        nxt = pick(check_logits(decoder.step(tokens), t))
        for r, src in enumerate(live):
            seqs[src].append(int(nxt[r]))
        alive = np.ones(len(live), bool) if end_id is None else nxt != end_id
        if not alive.all():
            if not alive.any():
                break
            keep = np.flatnonzero(alive)
            decoder.reorder(keep, keep)
            live, nxt = live[keep], nxt[keep]
        tokens = nxt.astype(np.int64)
    return pad_rows(seqs, pad_id)


def _top_k(flat, k):
    """Indices of the k largest entries of each row, best first; ties -> the lower index
    (what a stable sort of -flat gives, without sorting all of it)."""
    n, width = flat.shape
    if k >= width:
        return np.argsort(-flat, axis=1, kind="stable")
    kth = np.partition(flat, width - k, axis=1)[:, width - k][:, None]   # k-th largest
    out = np.empty((n, k), dtype=np.int64)
    for i in range(n):
        idx = np.flatnonzero(flat[i] >= kth[i])                         # >= k candidates
        order = np.argsort(-flat[i, idx], kind="stable")[:k]            # idx is ascending
        out[i] = idx[order]
    return out


def beam(decoder, B, k, *, max_new_tokens, start_id, end_id=None, pad_id=0,
         length_penalty=1.0):
    """Beam search with k slots per source (rules: fastattn.generate's docstring) ->
    (B, T) int64."""
    check_slots(k, "beam")
    live_src = np.arange(B)                               # sources still decoding
    hyps = [[[start_id] for _ in range(k)] for _ in range(B)]    # per source, per slot
    score = np.full((B, k), -np.inf)
    score[:, 0] = 0.0                                     # one live hypothesis to begin with
    finished = [[] for _ in range(B)]                     # (normalised score, tokens)
    tokens = np.full(B * k, start_id, dtype=np.int64)
    for t in range(max_new_tokens):
        n = len(live_src)
        logp = log_softmax(check_logits(decoder.step(tokens), t)).reshape(n, k, -1)
        V = logp.shape[2]
        if t == 0:
            check_beam(k, V)                                 # the vocabulary, now known
        flat = (score[live_src][:, :, None] + logp).reshape(n, k * V)
        best = _top_k(flat, k)                                          # (n, k)
        parent, tok = best // V, best % V
        new_score = np.take_along_axis(flat, best, axis=1)
        rows, keep_src = [], []
        for i, src in enumerate(live_src):
            old, new = hyps[src], []
            for slot in range(k):
                s, p, w = new_score[i, slot], parent[i, slot], int(tok[i, slot])
                seq = old[p] + [w]
                if s > -np.inf and end_id is not None and w == end_id:   # finished
                    finished[src].append((s / (len(seq) - 1) ** length_penalty, seq))
                    new_score[i, slot] = -np.inf                 # its slot stays empty
                new.append(seq)
            hyps[src] = new
            score[src] = new_score[i]
            if np.isfinite(score[src]).any():
                keep_src.append(i)
                rows.extend(i * k + parent[i])
        if not keep_src:
            break
        keep_src = np.asarray(keep_src)
        decoder.reorder(np.asarray(rows), None if len(keep_src) == n else keep_src)
        live_src = live_src[keep_src]
        tokens = tok[keep_src].reshape(-1).astype(np.int64)
    out = []
    for src in range(B):
        cands = list(finished[src])                        # then the live ones, scored alike
        cands += [(score[src, slot] / (len(hyps[src][slot]) - 1) ** length_penalty,
                   hyps[src][slot]) for slot in range(k) if np.isfinite(score[src, slot])]
        best = max(range(len(cands)), key=lambda i: (cands[i][0], -i))   # ties: first found
        out.append(cands[best][1])
    return pad_rows(out, pad_id)
