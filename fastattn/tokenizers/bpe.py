"""BPETokenizer: byte-pair encoding over characters (Sennrich et al. 2016).

Trained as in the worked example "she sells seashells by the seashore" (the class docstring
gives the rules: the end-of-word symbol, the tie-break, the refused merges); ``decode`` is the
exact inverse of ``encode`` for any text whose characters were seen in training.
"""
from __future__ import annotations

import heapq
import re
from collections import Counter

from .base import Tokenizer, _check_int, _check_texts, _register
from .files import kind, short
from .vocab import SPECIALS

__all__ = ["END_OF_WORD", "BPETokenizer"]

END_OF_WORD = "</w>"      # the seed's "_" in "she_", a symbol of its own at every word end
_RUNS = re.compile(r"\S+|\s+")      # \s is exactly str.isspace, the set str.split() uses


@_register
class BPETokenizer(Tokenizer):
    """Byte-pair encoding over characters, with an end-of-word symbol (the seed's worked example).

    Training (``train(texts, vocab_size=None, num_merges=None)``, exactly one of the two):

    1. Pre-tokenize on whitespace: the words are the maximal runs of non-whitespace characters
       (``str.split()``), counted over all texts.
    2. Each word is its characters followed by the end-of-word symbol ``"</w>"`` -- the seed's
       "she_" is ``s h e </w>`` here. The marker is a symbol of its own, so it is merged like
       any other ("e" + "</w>" -> "e</w>", the seed's "e_").
    3. The base vocabulary is: the specials, ``</w>``, then every character of the training
       texts (whitespace included) in code point order -- the seed's "_, a, b, e, h, l, ...".
    4. Repeat: count every adjacent symbol pair over all words (weighted by word frequency; in
       "aaa" the pair (a, a) counts twice) and merge the most frequent one. Ties: the
       lexicographically smallest pair, comparing (left, right) as a tuple of str by code
       point -- so ("e", "</w>") < ("h", "e") < ("s", "e") < ("s", "h"). A merge joins every
       occurrence in every word, left to right without overlap. It stops after `num_merges`
       merges, when the vocabulary reaches `vocab_size` (specials included), or when no pair
       is left. A pair is never merged if its result would spell a special token (text holding
       "<pad>" stays in pieces), or would end in "</w>" without being word-final (text holding
       "</w>" itself), or was merged before; so every token string has one meaning. Should two
       merges spell the same token ("ab"+"c", "a"+"bc"), it is one vocabulary entry.

    Pair counts are kept incrementally: a merge re-counts only the distinct words that hold the
    merged pair (an index pair -> words), and a heap gives the next best pair, so a merge
    costs in proportion to the words that hold its pair, not to the whole text. That cost grows
    with the length of those words, so text without whitespace (Chinese, Japanese, minified
    code) is one long "word" per run and trains slowly: split it first.

    Encoding: whitespace runs and words alternate. A word becomes its characters + ``</w>`` and
    the merges are applied in the order they were learned (each merge to every occurrence,
    left to right), which reproduces the training segmentation. A single space between two
    words is implied by the first word's ``</w>``; every other whitespace character (leading,
    trailing, newlines, tabs, runs of several spaces) is a token of its own. So
    ``decode(encode(text)) == text`` exactly for every text whose characters were seen in
    training (and unseen characters are ``<unk>``, dropped by decode).
    Decoding: a token made only of whitespace is that whitespace; a token ending in ``</w>``
    ends a word, and the next word starts after one space unless whitespace tokens come
    between them; specials are dropped.

    Args:
        specials: the special tokens, first in the vocabulary (default
            `("<pad>", "<unk>", "<start>", "<end>")`; `()` for none).
    """

    def __init__(self, *, specials=SPECIALS):
        super().__init__(specials=specials)
        if END_OF_WORD in self._specials:
            raise ValueError(f"{END_OF_WORD!r} is the BPE end-of-word symbol; it cannot be a "
                             f"special token")
        self.merges = []          # learned order: list of (left, right) token strings
        self._ranks = {}
        self._cache = {}

    # -- training
    def train(self, texts, vocab_size=None, num_merges=None):
        """Learn the merges from texts (see the class docstring for the rules).

        Give exactly one of vocab_size and num_merges.

        Args:
            texts: a str or an iterable of str.
            vocab_size: stop when the whole vocabulary, specials included, reaches this size.
            num_merges: stop after this many merges.

        Returns:
            self.

        Raises:
            ValueError: both or neither of vocab_size and num_merges given.
        """
        texts = _check_texts(texts, "BPETokenizer.train")
        if (vocab_size is None) == (num_merges is None):
            raise ValueError("BPETokenizer.train: give exactly one of vocab_size and num_merges")
        if num_merges is not None:
            num_merges = _check_int(num_merges, "num_merges", 0)
        chars = set()
        word_counts = Counter()
        for t in texts:
            chars.update(t)
            word_counts.update(t.split())
        base = [END_OF_WORD] + sorted(chars)
        if vocab_size is not None:
            vocab_size = _check_int(vocab_size, "vocab_size", 0)
            smallest = len(self._specials) + len(base)
            if vocab_size < smallest:
                raise ValueError(f"vocab_size={vocab_size} is smaller than the base vocabulary: "
                                 f"{len(self._specials)} specials + {END_OF_WORD} + "
                                 f"{len(chars)} characters = {smallest}")
        vocab = self._new_vocab(base)
        merges = _learn_merges(word_counts, vocab, frozenset(self._specials),
                               num_merges, vocab_size)
        self._set_fitted(vocab, merges)
        return self

    def _set_fitted(self, vocab, merges):
        self.vocab = vocab
        self.merges = [tuple(m) for m in merges]
        self._ranks = {m: r for r, m in enumerate(self.merges)}
        self._cache = {}

    # -- encoding
    def _word(self, word):
        """Pieces of one word (no whitespace in it): its characters + </w>, merged in order."""
        pieces = self._cache.get(word)
        if pieces is not None:
            return pieces
        syms = self._merge(list(word) + [END_OF_WORD])
        if len(self._cache) >= 100_000:
            self._cache.clear()
        self._cache[word] = syms
        return syms

    def _merge(self, syms):
        """The symbols `syms` with the merges applied in the order they were learned."""
        ranks = self._ranks
        last = -1
        while len(syms) > 1:
            best = None
            best_rank = len(ranks)
            for pair in zip(syms, syms[1:]):
                r = ranks.get(pair)
                if r is not None and last < r < best_rank:
                    best, best_rank = pair, r
            if best is None:
                break
            a, b = best
            merged, i, n = [], 0, len(syms)
            while i < n:
                if i + 1 < n and syms[i] == a and syms[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(syms[i])
                    i += 1
            syms, last = merged, best_rank
        return syms

    def _split_upto(self, text, limit):
        return self._split(text, limit)[:limit]

    def _split_run_head(self, tail, after_word, limit):
        """A whitespace run's characters are tokens (a lone space after a word and before
        the run: none); the cut run's pieces are its characters merged without </w> (the
        word goes on past the window), kept where they end in the run's first half: a merge
        decides a pair by its neighbours, so what follows the cut changes the pieces near it
        only, while the run is merged in windows of bounded size (a run of millions of
        characters is never merged whole)."""
        run = tail.lstrip()
        lead = tail[:len(tail) - len(run)]
        if not run:              # whitespace up to the window's end, and maybe on after it
            return list(lead[:limit]) if len(lead) > 1 else []
        tokens = [] if lead == " " and after_word else list(lead[:limit])
        half, at = len(run) // 2, 0
        for piece in self._merge(list(run)):
            at += len(piece)
            if at > half or len(tokens) >= limit:
                break
            tokens.append(piece)
        return tokens

    def _split(self, text, limit=None):
        """The tokens of `text` (the first `limit` or more of them, when given)."""
        out = []
        n = len(text)
        for m in _RUNS.finditer(text):
            if limit is not None and len(out) >= limit:
                break
            run = m.group()
            if run[0].isspace():
                if run == " " and m.start() > 0 and m.end() < n:
                    continue                      # one space between two words: implied
                out.extend(run)
            else:
                out.extend(self._word(run))
        return out

    def _join(self, tokens):
        out, pending = [], False
        for t in tokens:
            if t.isspace():
                out.append(t)
                pending = False
                continue
            if pending:
                out.append(" ")
            if t.endswith(END_OF_WORD):
                out.append(t[:-len(END_OF_WORD)])
                pending = True
            else:
                out.append(t)
                pending = False
        return "".join(out)

    # -- files
    def _state(self):
        return {"merges": None if self.vocab is None else [list(m) for m in self.merges]}

    _STATE_FIELDS = ("merges",)

    def _load_trained(self, vocab, state, where):
        """Take a file's tokens and merges only if training could have made them: the tokens
        are </w>, single characters and the results of the merges; each merge joins two
        symbols that exist by then (</w>, a character of the tokens, or an earlier merge's
        result) and is one the trainer would make (see _bad_merge)."""
        merges = state["merges"]
        if not isinstance(merges, list):
            raise ValueError(f"{where}: merges must be a list of [left, right] pairs, got "
                             f"{kind(merges)}")
        if END_OF_WORD not in vocab:
            raise ValueError(f"{where}: the tokens lack the end-of-word symbol {END_OF_WORD!r}")
        made = {END_OF_WORD}                 # the symbols that exist so far
        made.update(t for t in vocab.tokens if len(t) == 1)
        merged = set()
        specials = frozenset(self._specials)
        for r, m in enumerate(merges):
            problem = _bad_merge(m, made, merged, specials, vocab)
            if problem:
                raise ValueError(f"{where}: bad merge merges[{r}] = {short(m)}: {problem}")
            merged.add(tuple(m))
            made.add(m[0] + m[1])
        for t in vocab.tokens:
            if t not in made:
                raise ValueError(f"{where}: the token {short(t)} is neither a single character, "
                                 f"{END_OF_WORD!r} nor the result of a merge")
        self._set_fitted(vocab, merges)

    def __repr__(self):
        if self.vocab is None:
            return super().__repr__()
        return (f"BPETokenizer(vocab_size={len(self.vocab)}, merges={len(self.merges)}, "
                f"specials={self._specials!r})")


def _bad_merge(m, made, merged, specials, vocab):
    """What is wrong with merge `m` read from a file (None if nothing): the rules the trainer
    keeps (see BPETokenizer), given the symbols `made` so far and the pairs `merged` before."""
    if not (isinstance(m, list) and len(m) == 2 and all(isinstance(s, str) for s in m)):
        return f"a merge is a [left, right] pair of str, got {kind(m)}"
    a, b = m
    for part in (a, b):
        if part not in made:
            return (f"{short(part)} is neither a character of the tokens, {END_OF_WORD!r} nor "
                    f"the result of an earlier merge")
        if any(c.isspace() for c in part):
            return f"{short(part)} holds whitespace, which never occurs inside a word"
    if a.endswith(END_OF_WORD):
        return "its left part ends a word, so nothing follows it"
    if (a, b) in merged:
        return "the pair is merged twice"
    new = a + b
    if new in specials:
        return f"it spells the special token {new!r}"
    if new.endswith(END_OF_WORD) and not b.endswith(END_OF_WORD):
        return f"it spells {END_OF_WORD!r} inside a word"
    if new not in vocab:
        return f"its result {short(new)} is not in the tokens"
    return None


def _learn_merges(word_counts, vocab, specials, num_merges, vocab_size):
    """The BPE merge loop (see BPETokenizer); adds the merged tokens to `vocab` (in place).

    words[w] is word w as a list of symbol ids, freq[w] its count; counts[pair] is the summed
    frequency of that adjacent pair over all words; where[pair] holds the words that may contain
    it (entries can be stale: a word listed is re-checked); the heap holds (-count, left str,
    right str, left id, right id), and an entry is current only if its count still matches.
    """
    sym = vocab._stoi                   # token str -> id, shared with the vocab
    strs = vocab._itos                  # id -> token str
    eow = sym[END_OF_WORD]
    words, freq = [], []
    for word, f in word_counts.items():
        words.append([sym[c] for c in word] + [eow])
        freq.append(f)
    counts, where = {}, {}
    for w, syms in enumerate(words):
        f = freq[w]
        for pair in zip(syms, syms[1:]):
            counts[pair] = counts.get(pair, 0) + f
            s = where.get(pair)
            if s is None:
                where[pair] = {w}
            else:
                s.add(w)
    heap = [(-c, strs[a], strs[b], a, b) for (a, b), c in counts.items()]
    heapq.heapify(heap)
    done = set()                        # merged or refused pairs: never merged (again)
    merges = []

    def finished():
        if num_merges is not None:
            return len(merges) >= num_merges
        return len(vocab) >= vocab_size

    while heap and not finished():
        negc, sa, sb, a, b = heapq.heappop(heap)
        pair = (a, b)
        if pair in done or counts.get(pair) != -negc:
            continue                    # stale entry
        done.add(pair)
        new = sa + sb
        if new in specials or (new.endswith(END_OF_WORD) and not sb.endswith(END_OF_WORD)):
            continue                    # refused: the token string would be ambiguous
        new_id = vocab.add(new)
        merges.append((sa, sb))
        changed = {}
        for w in where.pop(pair, ()):
            syms = words[w]
            n = len(syms)
            out, i = [], 0
            while i < n:
                if i + 1 < n and syms[i] == a and syms[i + 1] == b:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            if len(out) == n:
                continue                # stale index entry
            f = freq[w]
            old_pairs = Counter(zip(syms, syms[1:]))
            new_pairs = Counter(zip(out, out[1:]))
            for p, k in old_pairs.items():
                changed[p] = changed.get(p, 0) - k * f
            for p, k in new_pairs.items():
                changed[p] = changed.get(p, 0) + k * f
                if p not in old_pairs:
                    s = where.get(p)
                    if s is None:
                        where[p] = {w}
                    else:
                        s.add(w)
            words[w] = out
        for p, d in changed.items():
            if d == 0:
                continue
            c = counts.get(p, 0) + d
            if c > 0:
                counts[p] = c
                if p not in done:
                    heapq.heappush(heap, (-c, strs[p[0]], strs[p[1]], p[0], p[1]))
            else:
                counts.pop(p, None)
                where.pop(p, None)
    return merges

