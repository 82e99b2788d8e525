"""Vocab (token <-> id) and the special tokens every tokenizer puts first.

Specials come first in the vocabulary, in the order given by ``specials`` (default
``<pad> <unk> <start> <end>`` = ids 0..3; ``specials=()`` for none). Their roles are known by
these four names (``pad_id``, ``unk_id``, ``start_id``, ``end_id`` are None when absent); any
other name is an extra special without a role.
"""
from __future__ import annotations

import numbers
from collections import Counter

import numpy as np

__all__ = ["SPECIALS", "PAD", "UNK", "START", "END", "Vocab"]

# one name per special token (not a tuple unpacking, so that documentation tools see each)
PAD = "<pad>"        # padding: id 0 in the default vocabulary
UNK = "<unk>"        # a token the vocabulary does not hold
START = "<start>"    # the first token of a target
END = "<end>"        # the token that ends generation
SPECIALS = (PAD, UNK, START, END)


def _check_specials(specials):
    if isinstance(specials, str) or not hasattr(specials, "__iter__"):
        raise TypeError(f"specials must be a sequence of str, got {type(specials).__name__}")
    specials = tuple(specials)
    for s in specials:
        if not isinstance(s, str) or not s:
            raise TypeError(f"specials must be non-empty str, got {s!r}")
    dup = [s for s, n in Counter(specials).items() if n > 1]
    if dup:
        raise ValueError(f"special token {dup[0]!r} is given twice in specials={specials!r}")
    return specials


class _SpecialIds:
    """pad_id, unk_id, start_id, end_id: the ids of the four special roles, None when absent.
    Specials come first in every vocabulary, so a role's id is its place in ``_specials``."""

    def _special(self, name):
        return self._specials.index(name) if name in self._specials else None

    @property
    def pad_id(self):
        return self._special(PAD)

    @property
    def unk_id(self):
        return self._special(UNK)

    @property
    def start_id(self):
        return self._special(START)

    @property
    def end_id(self):
        return self._special(END)


class Vocab(_SpecialIds):
    """Token <-> id: the specials first (ids 0..k-1, in the order given), then `tokens`.

    `pad_id`, `unk_id`, `start_id` and `end_id` are the ids of the four special roles, None
    when absent.

    Args:
        tokens: the non-special tokens, in id order (default none).
        specials: the special tokens, first in the vocabulary (default
            `("<pad>", "<unk>", "<start>", "<end>")`; `()` for none).
    """

    def __init__(self, tokens=(), specials=SPECIALS):
        self._specials = _check_specials(specials)
        self._itos = list(self._specials)
        self._stoi = {s: i for i, s in enumerate(self._itos)}
        for t in tokens:
            if not isinstance(t, str):
                raise TypeError(f"Vocab: tokens must be str, got {type(t).__name__} {t!r}")
            if t in self._stoi:
                what = "a special token" if t in self._specials else "given twice"
                raise ValueError(f"Vocab: token {t!r} is {what}")
            self._stoi[t] = len(self._itos)
            self._itos.append(t)
        self._special_ids = frozenset(range(len(self._specials)))

    def add(self, token):
        """The id of a token, appended at the end if it is new.

        Args:
            token: a str.

        Returns:
            Its id.
        """
        if not isinstance(token, str):
            raise TypeError(f"Vocab.add: token must be str, got {type(token).__name__}")
        i = self._stoi.get(token)
        if i is None:
            i = self._stoi[token] = len(self._itos)
            self._itos.append(token)
        return i

    def __len__(self):
        return len(self._itos)

    def __contains__(self, token):
        return token in self._stoi

    def __iter__(self):
        return iter(self._itos)

    def __eq__(self, other):
        return (isinstance(other, Vocab) and self._specials == other._specials
                and self._itos == other._itos)

    def __repr__(self):
        return f"Vocab({len(self)} tokens, specials={self._specials!r})"

    @property
    def specials(self):
        """The special tokens, in id order (ids 0..k-1)."""
        return self._specials

    @property
    def special_ids(self):
        """The ids of the special tokens."""
        return self._special_ids

    @property
    def tokens(self):
        """The non-special tokens in id order."""
        return self._itos[len(self._specials):]

    def token_to_id(self, token):
        """The id of a token in the vocabulary.

        Args:
            token: a str.

        Returns:
            Its id.

        Raises:
            TypeError: `token` is not a str.
            KeyError: an absent token (named).
        """
        if not isinstance(token, str):
            raise TypeError(f"token_to_id: token must be str, got {type(token).__name__}")
        try:
            return self._stoi[token]
        except KeyError:
            raise KeyError(f"token {token!r} is not in the vocabulary") from None

    def id_to_token(self, i):
        """The token of an id.

        Args:
            i: an id in 0..len-1.

        Returns:
            The token (a str).

        Raises:
            TypeError: `i` is not an integer.
            ValueError: an id outside 0..len-1 (named).
        """
        return self._itos[self._check_id(i)]

    def lookup(self, token):
        """The id of a token; an absent token gives `<unk>`'s.

        Args:
            token: a str.

        Returns:
            Its id, or `<unk>`'s for an absent token.

        Raises:
            ValueError: an absent token (named) when the vocabulary has no `<unk>`.
        """
        i = self._stoi.get(token)
        if i is not None:
            return i
        unk = self.unk_id
        if unk is None:
            if not isinstance(token, str):
                raise TypeError(f"lookup: token must be str, got {type(token).__name__}")
            raise ValueError(f"token {token!r} is not in the vocabulary and there is no "
                             f"{UNK} token to map it to")
        return unk

    def _check_id(self, i):
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, numbers.Integral):
            raise TypeError(f"token ids must be int, got {type(i).__name__} {i!r}")
        i = int(i)
        if not 0 <= i < len(self._itos):
            raise ValueError(f"token id {i} is out of range for a vocabulary of "
                             f"{len(self._itos)} tokens (0..{len(self._itos) - 1})")
        return i
