"""CharTokenizer: one token per Unicode code point (no normalisation), whitespace included.

``decode`` concatenates, so it is the exact inverse of ``encode`` for text whose characters
were seen in training.
"""
from __future__ import annotations

from collections import Counter

from .base import _CasedTokenizer, _check_texts, _count_kept, _register
from .vocab import SPECIALS

__all__ = ["CharTokenizer"]


@_register
class CharTokenizer(_CasedTokenizer):
    """One token per Unicode code point, whitespace included; ``decode`` concatenates.

    ``train(texts, vocab_size=None, min_freq=1)``: ids follow the specials in code point order
    (the seed's sorted [a, c, d, e, ...]). Characters seen fewer than ``min_freq`` times are
    left out. ``vocab_size`` caps the whole vocabulary (specials included), keeping the most
    frequent characters, ties broken by first occurrence.
    ``lowercase`` (default False) lowercases before splitting.
    """

    def __init__(self, lowercase=False, *, specials=SPECIALS):
        super().__init__(lowercase, specials=specials)

    def _split(self, text):
        return list(text.lower() if self.lowercase else text)

    def _split_head(self, text, n):
        """One token per character: the first n + 1 characters say all (str.lower maps each
        character on its own, at least one character out, except a capital sigma, whose
        final form depends on what follows: then the shared rule, windows cut after words)."""
        head = text[:n + 1]
        if self.lowercase:
            if "\u03a3" in head:
                return super()._split_head(text, n)
            head = head.lower()
        return list(head[:n]), len(head) > n

    def _join(self, tokens):
        return "".join(tokens)

    def train(self, texts, vocab_size=None, min_freq=1):
        """Learn the vocabulary from `texts` (a str or an iterable of str); returns self."""
        texts = _check_texts(texts, "CharTokenizer.train")
        counts, first = Counter(), {}
        for text in texts:
            if self.lowercase:
                text = text.lower()
            for c in dict.fromkeys(text):
                first.setdefault(c, len(first))
            counts.update(text)
        kept = sorted(_count_kept(self, counts, first, vocab_size, min_freq))
        self.vocab = self._new_vocab(kept)
        return self

