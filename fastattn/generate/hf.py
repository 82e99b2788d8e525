"""Greedy and beam search by the rules transformers' ``generate`` applies to the pretrained
encoder-decoder families (Marian, M2M100 / NLLB, BART / mBART), over any decoder with
``step`` / ``reorder`` (see fastattn.generate.search). fastattn.pretrained's Translator drives
them; the results are token lists, without the decoder start token and padding.

Lengths count the decoder start token, as transformers' ``max_length`` does: a sequence holds
at most ``max_length`` tokens, so at most max_length - 1 are generated.

Each step's scores go through ``Rules.apply`` (transformers' logits processors for these
models): the banned ids (the pad id) get -inf; at the first generated position a forced BOS
token (NLLB's and M2M100's target language) is the only one allowed, with score 0; at the
last position (length max_length - 1) a forced EOS token likewise. Greedy applies them to the
logits, beam search to the log-probabilities (so a forced token adds 0 to a beam's score).

Greedy: the best processed logit (ties: the lowest id); a row that produces eos_id is done.

Beam search (``num_beams`` = k): each step the live beams' log-probabilities are added to their
scores and the 2k best continuations over all beams and tokens are taken (best first; ties: the
lower flat index beam * V + token). A continuation among the first k that ends in eos_id (or
reaches max_length) is a finished hypothesis, scored ``sum of log-probs / generated length **
length_penalty`` (the generated length counts the eos token; not the start token); a source
keeps the k best finished hypotheses. The k best continuations that did not finish are the
next live beams. A source stops:

- ``early_stopping=True``: once it holds k finished hypotheses;
- ``False`` (the default): once it holds k and its best live beam, divided by its current
  `generated length ** length_penalty`, is not above the worst of them;
- ``"never"``: as False, but with length_penalty > 0 the best live beam is divided by the
  longest possible generated length (max_length - 1);

or at max_length. The result is its best finished hypothesis.

How a step is computed (the choices are those of the rules above): greedy reads each row's
logits once (greedy_pick); beam search takes a row's log-probabilities as logit - its
log-sum-exp, the log-sum-exp from fastattn's fused cross-entropy kernel in float32 arithmetic
(transformers' log_softmax is float32 too), the sums with the beam scores in float64, and
finds the 2k best without building the (n, k V) table of them (beam_candidates).
"""
import numpy as np

from .sampling import check_logits
from .search import check_slots

__all__ = ["Rules", "greedy", "greedy_pick", "beam", "beam_candidates", "EARLY_STOPPING"]

EARLY_STOPPING = (True, False, "never")
_FLOOR = -1.0e9          # transformers' "very large negative" beam score


class Rules:
    """What transformers' logits processors do to these models' scores (see the module doc).

    Banned ids, a forced first token, a forced last token, and the longest sequence.

    Args:
        max_length: the longest sequence, the decoder start token counted.
        eos_id: the end-of-sequence token id.
        banned: ids that get -inf at every step (the pad id); default none.
        forced_bos_id: the token forced at the first generated position, or None (the
            default).
        forced_eos_id: the token forced at the last position (length max_length - 1), or None
            (the default).
    """

    def __init__(self, max_length, eos_id, banned=(), forced_bos_id=None, forced_eos_id=None):
        self.max_length, self.eos_id = int(max_length), eos_id
        self.banned = np.asarray(sorted(set(banned)), dtype=np.int64)
        self.forced_bos_id, self.forced_eos_id = forced_bos_id, forced_eos_id

    def forced(self, length):
        """The token forced after `length` tokens, or None.

        Args:
            length: the tokens so far, the start token included.

        Returns:
            The forced token id, or None.
        """
        forced = None
        if length == 1 and self.forced_bos_id is not None:
            forced = self.forced_bos_id
        if length == self.max_length - 1 and self.forced_eos_id is not None:
            forced = self.forced_eos_id
        return forced

    def apply(self, scores, length):
        """Apply the rules, in place, to the scores of the token after `length` tokens.

        Args:
            scores: (R, V) float scores (logits or log-probabilities).
            length: the tokens so far, the start token included.

        Returns:
            scores, changed in place.
        """
        if self.banned.size:
            scores[:, self.banned] = -np.inf
        forced = self.forced(length)
        if forced is not None:
            scores[:] = -np.inf
            scores[:, forced] = 0.0
        return scores


def _strip(seq):
    """A sequence without its start token."""
    return [int(x) for x in seq[1:]]


def _banned(ids, banned):
    """Which of `ids` (any shape) are banned (a handful of ids: compared one by one, which
    is cheaper than np.isin's sort at this size)."""
    if banned.size > 8:
        return np.isin(ids, banned)
    hit = np.zeros(np.shape(ids), bool)
    for b in banned:
        hit |= ids == b
    return hit


def greedy_pick(logits, rules, length):
    """The greedy choice after `length` tokens: each row's best logit after `Rules.apply`.

    Ties go to the lowest id.

    One pass over the logits (they are not written): the argmax of the raw row (NaN and +inf
    are maxima to argmax, so its value says what check_logits' row maximum says); a row whose
    best is a banned id is searched again without the banned ids; a forced token is every
    row's choice.

    Args:
        logits: (R, V) float logits (not written).
        rules: the `Rules`.
        length: the tokens so far, the start token included.

    Returns:
        (R,) int64 token ids.

    Raises:
        ValueError: a row holding NaN or +inf, or no finite logit (as check_logits).
    """
    logits = np.asarray(logits)
    if logits.dtype != np.float32:
        logits = logits.astype(np.float32)
    R = logits.shape[0]
    if logits.shape[1] == 0:
        check_logits(logits, length - 1)                  # raises: no logit at all
    best = np.argmax(logits, axis=1)
    check_logits(logits[np.arange(R), best][:, None], length - 1)
    forced = rules.forced(length)
    if forced is not None:
        return np.full(R, forced, dtype=np.int64)
    if rules.banned.size:
        rows = np.flatnonzero(_banned(best, rules.banned))
        if rows.size:
            sub = logits[rows]                            # a copy (fancy indexing)
            sub[:, rules.banned] = -np.inf
            best[rows] = np.argmax(sub, axis=1)
    return best.astype(np.int64, copy=False)


def greedy(decoder, B, rules, *, start_id):
    """Greedy decoding of B sources.

    Args:
        decoder: a decoder with `step` / `reorder` (see fastattn.generate.search), one row
            per source.
        B: the number of sources.
        rules: the `Rules`.
        start_id: the decoder start token.

    Returns:
        B token lists (the start token left out).
    """
    seqs = [[start_id] for _ in range(B)]
    live = np.arange(B)
    tokens = np.full(B, start_id, dtype=np.int64)
    for length in range(1, rules.max_length):
        nxt = greedy_pick(decoder.step(tokens), rules, length)
        for r, src in enumerate(live):
            seqs[src].append(int(nxt[r]))
        alive = np.ones(len(live), bool) if rules.eos_id is None else nxt != rules.eos_id
        if not alive.all():
            if not alive.any():
                break
            keep = np.flatnonzero(alive)
            decoder.reorder(keep, keep)
            live, nxt = live[keep], nxt[keep]
        tokens = nxt.astype(np.int64)
    return [_strip(s) for s in seqs]


def _best(flat, n):
    """Indices of the n largest entries of each row of flat, best first (ties: lower
    index)."""
    width = flat.shape[1]
    n = min(n, width)
    if n < width:
        part = np.argpartition(-flat, n - 1, axis=1)[:, :n]
        kth = np.take_along_axis(flat, part, axis=1).min(axis=1, keepdims=True)
    out = np.empty((flat.shape[0], n), dtype=np.int64)
    for i in range(flat.shape[0]):
        idx = np.arange(width) if n == width else np.flatnonzero(flat[i] >= kth[i])
        out[i] = idx[np.argsort(-flat[i, idx], kind="stable")[:n]]
    return out


_GROUP = 32             # tokens per group of beam_candidates' maxima (at most)


def _log_normalizer(logits, best=None):
    """logits (R, V) float32, checked -> float64 (R,) log-sum-exp of each row: its maximum
    plus fastattn's fused cross-entropy against it (= lse - max: one read pass per row, on
    fastattn's threads; float32 arithmetic, about 1e-6 absolute on lse - max <= log V).
    best: (R,) ids of each row's largest logit, when known."""
    from .. import ops
    if best is None:
        best = np.argmax(logits, axis=1)
    top = logits[np.arange(logits.shape[0]), best].astype(np.float64)
    return top + ops.cross_entropy(logits, best, reduction="none").astype(np.float64)


def _group_layout(V, n):
    """(W, nb): tokens per group and full groups, enough groups (>= 4n) for the n best.
    Group g < nb holds tokens g, g + nb, ..., g + (W - 1) nb (strided, so that its maximum
    is an elementwise max over W contiguous slices); group nb, when V > W nb, the tail."""
    W = max(1, min(_GROUP, V // (4 * n)))
    return W, V // W


def _group_tokens(groups, W, nb, V):
    """The tokens of `groups` (C,) -> (C, W) int64, -1 where the tail group has fewer."""
    j = np.arange(W)
    tok = groups[:, None] + nb * j
    tail = groups == nb
    if tail.any():
        t = nb * W + j
        tok[tail] = np.where(t < V, t, -1)
    return tok


def _full_candidates(z, lse, run_score, rules, length, n2):
    """The 2k best continuations of every source from the whole (n, k V) score table
    (the rules applied to the log-probabilities): forced tokens, rows with fewer than 2k
    finite choices, tiny vocabularies."""
    n, k = run_score.shape
    V = z.shape[1]
    logp = rules.apply(z.astype(np.float64) - lse[:, None], length).reshape(n, k, V)
    flat = (run_score[:, :, None] + logp).reshape(n, k * V)
    top = _best(flat, n2)
    return top, np.take_along_axis(flat, top, axis=1)


def _forced_candidates(forced, run_score, V, n2):
    """The 2k best when `forced` is the only allowed token (log-probability 0, every other
    -inf): the k beams' forced continuations, then -inf entries of the lowest flat indices,
    as the full table ranks them."""
    n, k = run_score.shape
    beams = np.arange(k)
    flat = np.concatenate([beams * V + forced,
                           np.setdiff1d(np.arange(n2 + k), beams * V + forced)[:n2]])
    score = np.concatenate([run_score, np.full((n, n2), -np.inf)], axis=1)     # (n, k + n2)
    order = np.lexsort((np.broadcast_to(flat, score.shape), -score), axis=1)[:, :n2]
    return flat[order].astype(np.int64), np.take_along_axis(score, order, axis=1)


def beam_candidates(logits, run_score, rules, length, k):
    """One beam step's choice: the 2k best continuations of each source's k live beams.

    The 2k best of the n x (k V) table run_score + (the rules applied to
    log_softmax(logits)) (see the module doc), without building that table.

    Without the table: log-probabilities are logit - lse (lse: _log_normalizer), monotone in
    the logit within a row, so a row's best continuations are among its largest logits. The
    tokens are split into groups (_group_layout); the 2k-th largest group maximum t of a row
    bounds its 2k-th best logit from below, and only the groups whose maximum reaches
    t - (a rounding margin: scores equal after float64 rounding) are read again, their
    tokens >= that bound scored exactly as the table would score them; each source's 2k best
    of those are the table's 2k best. A forced token: its k continuations, then the table's
    -inf entries in index order (_forced_candidates). Rows with fewer than 2k finite logits
    and vocabularies below 2k tokens go through the table (_full_candidates).

    Args:
        logits: (n k, V) logits of the live beams (k rows per source, in order).
        run_score: (n, k) float64, the beams' summed log-probabilities.
        rules: the `Rules`.
        length: the tokens so far, the start token included.
        k: beams per source.

    Returns:
        `(top, top_score)`: (n, 2k) int64 flat indices beam * V + token, best first, ties to
            the lower index; (n, 2k) float64 run_score + log-probability.

    Raises:
        ValueError: a row holding NaN or +inf, or no finite logit (as check_logits).
    """
    z = np.asarray(logits)
    if z.dtype != np.float32:
        z = z.astype(np.float32)
    run_score = np.asarray(run_score, dtype=np.float64)
    n = run_score.shape[0]
    R, V = z.shape
    n2 = 2 * k
    if V == 0:
        check_logits(z, length - 1)                       # raises: no logit at all
    W, nb = _group_layout(V, n2)
    gmax = np.empty((R, nb + (V > W * nb)), np.float32)
    if nb:
        np.max(z[:, :W * nb].reshape(R, W, nb), axis=1, out=gmax[:, :nb])
    if V > W * nb:
        np.max(z[:, W * nb:], axis=1, out=gmax[:, nb])
    check_logits(gmax, length - 1)           # a row's maximum: the largest of its groups'
    forced = rules.forced(length)
    if forced is not None and k * V >= n2 + k:
        return _forced_candidates(forced, run_score, V, n2)
    rows = np.arange(R)
    tok = _group_tokens(np.argmax(gmax, axis=1), W, nb, V)     # each row's best group
    vals = z[rows[:, None], np.maximum(tok, 0)]
    vals[tok < 0] = -np.inf
    lse = _log_normalizer(z, tok[rows, np.argmax(vals, axis=1)])
    if V < n2 or gmax.shape[1] < n2 or forced is not None:
        return _full_candidates(z, lse, run_score, rules, length, n2)
    banned = rules.banned
    if banned.size:                          # their groups' maxima without them
        for g in np.unique(np.where(banned < W * nb, banned % max(nb, 1), nb)):
            tok = _group_tokens(np.array([g]), W, nb, V)[0]
            tok = tok[tok >= 0]
            vals = z[:, tok]
            vals[:, _banned(tok, banned)] = -np.inf
            gmax[:, g] = vals.max(axis=1)
    G = gmax.shape[1]
    t = np.partition(gmax, G - n2, axis=1)[:, G - n2].astype(np.float64)     # (R,)
    run = run_score.reshape(-1)                                              # (R,)
    margin = 2.0 ** -48 * (np.abs(t) + np.abs(lse) + np.abs(run) + 1.0)
    bound = t - margin
    if not np.isfinite(bound).all():         # fewer than 2k finite choices in a row
        return _full_candidates(z, lse, run_score, rules, length, n2)
    bound32 = np.nextafter(bound.astype(np.float32), np.float32(-np.inf))   # <= bound
    rows, groups = np.nonzero(gmax >= bound32[:, None])
    tok = _group_tokens(groups, W, nb, V)                                    # (C, W)
    vals = z[rows[:, None], np.maximum(tok, 0)]
    keep = (tok >= 0) & (vals >= bound32[rows][:, None])
    if banned.size:
        keep &= ~_banned(tok, banned)
    r, c = np.nonzero(keep)
    r_e, tok_e = rows[r], tok[r, c]
    score = run[r_e] + (vals[r, c].astype(np.float64) - lse[r_e])
    flat = (r_e % k) * V + tok_e
    src = r_e // k
    order = np.lexsort((flat, -score, src))          # by source, best first, lower index
    counts = np.bincount(src, minlength=n)
    starts = np.cumsum(counts) - counts
    pick = order[starts[:, None] + np.arange(n2)]    # each source holds >= 2k candidates
    return flat[pick].astype(np.int64), score[pick]


def beam(decoder, B, k, rules, *, start_id, length_penalty=1.0,
         early_stopping=False):
    """Beam search with k beams per source, by transformers' rules (see the module doc).

    Args:
        decoder: a decoder with `step` / `reorder` (see fastattn.generate.search), k rows
            per live source.
        B: the number of sources.
        k: beams per source.
        rules: the `Rules`.
        start_id: the decoder start token.
        length_penalty: the exponent on the generated length in a hypothesis' score
            (default 1.0).
        early_stopping: True, False (the default) or "never", as transformers'.

    Returns:
        B token lists: the best hypothesis of each source (the start token left out).
    """
    k = check_slots(k, "beam")
    lp = float(length_penalty)
    live_src = np.arange(B)
    run_seq = [[[start_id] for _ in range(k)] for _ in range(B)]
    run_score = np.full((B, k), _FLOOR)
    run_score[:, 0] = 0.0
    fin = [[(_FLOOR, None) for _ in range(k)] for _ in range(B)]    # (score, tokens or None)
    tokens = np.full(B * k, start_id, dtype=np.int64)
    max_len = rules.max_length
    for length in range(1, max_len):
        n = len(live_src)
        logits = decoder.step(tokens)
        V = logits.shape[1]
        top, top_score = beam_candidates(logits, run_score[live_src], rules, length, k)
        parent, tok = top // V, top % V
        last = length + 1 >= max_len
        hits = np.ones_like(tok, bool) if last else (tok == rules.eos_id)
        rows, keep_src = [], []
        for i, src in enumerate(live_src):
            old = run_seq[src]
            cands = [old[parent[i, j]] + [int(tok[i, j])] for j in range(top.shape[1])]
            # the k best continuations that did not finish live on
            running = [j for j in range(top.shape[1]) if not hits[i, j]][:k]
            if running:
                sel = np.asarray(running)
                scores = top_score[i, sel]
            else:
                sel, scores = np.zeros(0, np.int64), np.zeros(0)
            # finished: eos (or the last position) among the first k candidates
            merged = list(fin[src])
            for j in range(min(k, top.shape[1])):
                if hits[i, j] and top_score[i, j] > _FLOOR / 2:
                    merged.append((top_score[i, j] / (length ** lp), cands[j]))
            order = sorted(range(len(merged)), key=lambda m: -merged[m][0])[:k]   # stable
            fin[src] = [merged[m] for m in order]
            new_seq = [cands[j] for j in sel]
            new_score = np.full(k, _FLOOR)
            new_score[:len(sel)] = scores
            while len(new_seq) < k:                     # fewer than k candidates (V < 2k)
                new_seq.append(list(new_seq[-1] if new_seq else old[0]))
            run_seq[src], run_score[src] = new_seq, new_score
            full = all(s is not None for _, s in fin[src])
            if last or not len(sel):
                continue
            if early_stopping is True and full:
                continue
            if full:
                gen = (max_len - 1) if early_stopping == "never" and lp > 0 else length
                if new_score[0] / (gen ** lp) <= min(sc for sc, _ in fin[src]):
                    continue
            keep_src.append(i)
            pj = parent[i, sel] if len(sel) else np.zeros(0, np.int64)
            pj = np.concatenate([pj, np.full(k - len(pj), pj[-1] if len(pj) else 0)])
            rows.extend(i * k + pj)
        if not keep_src:
            break
        keep_src = np.asarray(keep_src)
        decoder.reorder(np.asarray(rows, dtype=np.int64),
                        None if len(keep_src) == n else keep_src)
        tokens = np.asarray([run_seq[src][j][-1] for src in live_src[keep_src]
                             for j in range(k)], dtype=np.int64)
        live_src = live_src[keep_src]
    out = []
    for src in range(B):
        best = next((s for _, s in fin[src] if s is not None), None)
        if best is None:                            # nothing finished: the best live beam
            best = run_seq[src][int(np.argmax(run_score[src]))]
        out.append(_strip(best))
    return out
