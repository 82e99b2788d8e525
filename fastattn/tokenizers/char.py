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

