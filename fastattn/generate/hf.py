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
  generated length ** length_penalty, is not above the worst of them;
- ``"never"``: as False, but with length_penalty > 0 the best live beam is divided by the
  longest possible generated length (max_length - 1);

or at max_length. The result is its best finished hypothesis.
"""
import numpy as np

from .sampling import check_logits, log_softmax

__all__ = ["Rules", "greedy", "beam", "EARLY_STOPPING"]

EARLY_STOPPING = (True, False, "never")
_FLOOR = -1.0e9          # transformers' "very large negative" beam score


class Rules:
    """What transformers' logits processors do to these models' scores (see the module doc):
    banned ids, a forced first token, a forced last token, and the longest sequence."""

    def __init__(self, max_length, eos_id, banned=(), forced_bos_id=None, forced_eos_id=None):
        self.max_length, self.eos_id = int(max_length), eos_id
        self.banned = np.asarray(sorted(set(banned)), dtype=np.int64)
        self.forced_bos_id, self.forced_eos_id = forced_bos_id, forced_eos_id

    def apply(self, scores, length):
        """scores (R, V) float, for the token after `length` tokens (start included), in
        place -> scores."""
        if self.banned.size:
            scores[:, self.banned] = -np.inf
        forced = None
        if length == 1 and self.forced_bos_id is not None:
            forced = self.forced_bos_id
        if length == self.max_length - 1 and self.forced_eos_id is not None:
            forced = self.forced_eos_id
        if forced is not None:
            scores[:] = -np.inf
            scores[:, forced] = 0.0
        return scores


def _strip(seq):
    """A sequence without its start token."""
    return [int(x) for x in seq[1:]]


def greedy(decoder, B, rules, *, start_id):
    """Greedy decoding of B sources -> B token lists (start token left out)."""
    seqs = [[start_id] for _ in range(B)]
    live = np.arange(B)
    tokens = np.full(B, start_id, dtype=np.int64)
    for length in range(1, rules.max_length):
        logits = check_logits(decoder.step(tokens), length - 1).astype(np.float32)
        nxt = np.argmax(rules.apply(logits, length), axis=1)
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


def beam(decoder, B, k, rules, *, start_id, length_penalty=1.0,
         early_stopping=False):
    """Beam search with k beams per source -> B token lists (the best hypothesis of each,
    start token left out). The decoder's rows: k per live source."""
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
        logits = check_logits(decoder.step(tokens), length - 1)
        logp = rules.apply(log_softmax(logits), length).reshape(n, k, -1)
        V = logp.shape[2]
        flat = (run_score[live_src][:, :, None] + logp).reshape(n, k * V)
        top = _best(flat, 2 * k)                                          # (n, 2k)
        top_score = np.take_along_axis(flat, top, axis=1)
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
