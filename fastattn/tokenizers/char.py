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

    Args:
        lowercase: lowercase the text before splitting it (default False).
        specials: the special tokens, first in the vocabulary (default
            `("<pad>", "<unk>", "<start>", "<end>")`; `()` for none).
    """

    def __init__(self, lowercase=False, *, specials=SPECIALS):
        super().__init__(lowercase, specials=specials)

    def _split(self, text):
        return list(text.lower() if self.lowercase else text)

    def _split_head(self, text, n):
        """One token per character, at least one per character once lowercased: the first
        n + 1 characters say all. str.lower maps each character on its own except a capital
        sigma, whose final form depends on whether a cased letter follows (past characters
        that case ignores): the head is taken once its first n lowered characters are the
        same whether a cased letter ("a") or anything else follows it, else a longer head."""
        m = n + 1
        head = text[:m]
        if not self.lowercase:
            return list(head[:n]), len(head) > n
        low = head.lower()
        while "\u03a3" in head and m < len(text) and (head + "a").lower()[:n] != low[:n]:
            m *= 2
            head = text[:m]
            low = head.lower()
        return list(low[:n]), len(text) > n

    def _join(self, tokens):
        return "".join(tokens)

    def train(self, texts, vocab_size=None, min_freq=1):
        """Learn the vocabulary from texts.

        Args:
            texts: a str or an iterable of str.
            vocab_size: the whole vocabulary's size, specials included: the most frequent
                characters are kept, ties broken by first occurrence. None (the default):
                every character.
            min_freq: characters seen fewer times are left out (default 1).

        Returns:
            self.
        """
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

