"""WordTokenizer: one token per word.

Lowercases by default; splits on whitespace; punctuation separates words and is dropped,
except an apostrophe between two word characters ("won't" stays one token, the quotes around
'quoted' are dropped). Punctuation is every character of Unicode category P* plus the ASCII
punctuation of ``string.punctuation`` (so "$", "<", "+" count too); apostrophes are U+0027 and
U+2019. ``decode`` joins words with single spaces.
"""
from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

from .base import _CasedTokenizer, _check_texts, _count_kept, _register
from .vocab import SPECIALS

__all__ = ["WordTokenizer"]

_APOSTROPHES = frozenset("'\u2019")
_ASCII_PUNCT = frozenset(string.punctuation)
_CHUNKS = re.compile(r"\S+")       # what str.split() gives: \s is exactly str.isspace


def _is_punct(c):
    return c in _ASCII_PUNCT or unicodedata.category(c)[0] == "P"


@_register
class WordTokenizer(_CasedTokenizer):
    """One token per word (see the module docstring for the splitting rules).

    ``train(texts, vocab_size=None, min_freq=1)``: ids follow the specials in order of first
    occurrence in `texts`. Words seen fewer than ``min_freq`` times are left out.
    ``vocab_size`` caps the whole vocabulary (specials included): the most frequent words are
    kept, ties broken by first occurrence. ``decode`` joins the words with single spaces.

    Args:
        lowercase: lowercase the text before splitting it (default True).
        specials: the special tokens, first in the vocabulary (default
            `("<pad>", "<unk>", "<start>", "<end>")`; `()` for none).
    """

    def __init__(self, lowercase=True, *, specials=SPECIALS):
        super().__init__(lowercase, specials=specials)

    def _split(self, text, limit=None):
        """The words of `text` (the first `limit` or more of them, when given)."""
        if self.lowercase:
            text = text.lower()
        words = []
        for m in _CHUNKS.finditer(text):      # one whitespace-free chunk at a time
            if limit is not None and len(words) >= limit:
                break
            chunk = m.group()
            if chunk.isalnum():               # letters and digits only: one word, found fast
                words.append(chunk)
                continue
            n, start = len(chunk), None       # start: where the current word began
            for j, c in enumerate(chunk):
                if not _is_punct(c) or (c in _APOSTROPHES and start is not None and j + 1 < n
                                        and not _is_punct(chunk[j + 1])):   # won't, rock'n'roll
                    if start is None:
                        start = j
                elif start is not None:                        # punctuation separates words
                    words.append(chunk[start:j])
                    start = None
                    if limit is not None and len(words) >= limit:
                        return words
            if start is not None:
                words.append(chunk[start:])
        return words

    def _split_upto(self, text, limit):
        return self._split(text, limit)[:limit]

    def _split_run_head(self, tail, after_word, limit):
        """Every word of the cut run but the last is whole (a word's end is decided by the
        character after it, which the window holds), unless str.lower gave a capital sigma
        in one its final form for want of a cased letter after the window: then the words
        must be the same with a cased letter ("a") after it, else a larger window is tried."""
        words = self._split(tail, limit + 1)[:limit + 1][:-1]
        if self.lowercase and "\u03a3" in tail and \
                self._split(tail + "a", limit + 1)[:len(words)] != words:
            return []
        return words

    def _makes(self, token):
        if token.isalnum():     # the common case, fast: letters and digits are never split
            return not self.lowercase or token.lower() == token
        return self._split(token) == [token]

    def _join(self, tokens):
        return " ".join(tokens)

    def train(self, texts, vocab_size=None, min_freq=1):
        """Learn the vocabulary from texts.

        Args:
            texts: a str or an iterable of str.
            vocab_size: the whole vocabulary's size, specials included: the most frequent words
                are kept, ties broken by first occurrence. None (the default): every word.
            min_freq: words seen fewer times are left out (default 1).

        Returns:
            self.
        """
        texts = _check_texts(texts, "WordTokenizer.train")
        counts, first = Counter(), {}
        for text in texts:
            for w in self._split(text):
                counts[w] += 1
                first.setdefault(w, len(first))
        kept = _count_kept(self, counts, first, vocab_size, min_freq)
        kept.sort(key=first.__getitem__)
        self.vocab = self._new_vocab(kept)
        return self

