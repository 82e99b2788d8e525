"""The shared tokenizer API: encode, decode, batches, files; the base the tokenizers build on.

``Tokenizer`` holds a ``Vocab`` and does everything that does not depend on how text is split:
``encode``/``decode`` (specials dropped), ``encode_batch``/``decode_batch`` (DESIGN's data
conventions: ids int64 (B, L) padded with ``pad_id`` on the right, ``key_padding_mask`` bool
(B, L) with True = padding), and the JSON files (``save``, ``load``, ``to_dict``,
``from_dict``). A subclass splits and joins text and learns its vocabulary.
"""
from __future__ import annotations

import json
import numbers
import os

import numpy as np

from .vocab import END, PAD, SPECIALS, START, Vocab, _check_specials, _SpecialIds

__all__ = ["FORMAT", "Tokenizer", "NotFittedError", "load"]

FORMAT = "fastattn-tokenizer/1"
_CLASSES = {}              # class name -> tokenizer class: what a file may name


def _register(cls):
    """Class decorator: files may name `cls` (save writes its name, load rebuilds it)."""
    _CLASSES[cls.__name__] = cls
    return cls


class NotFittedError(RuntimeError):
    """A tokenizer was used before train() gave it a vocabulary."""


# ---- argument checks ----------------------------------------------------------------------------

def _check_text(text, where):
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be str, got {type(text).__name__}")
    return text


def _check_texts(texts, where):
    """A list of str from a str (one text) or an iterable of str."""
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, (bytes, bytearray)) or not hasattr(texts, "__iter__"):
        raise TypeError(f"{where}: texts must be a str or an iterable of str, "
                        f"got {type(texts).__name__}")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"{where}: texts[{i}] must be str, got {type(t).__name__}")
    return out


def _check_int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


# ---- the shared tokenizer API -------------------------------------------------------------------

class Tokenizer(_SpecialIds):
    """Base class: encode/decode/encode_batch/save/load over a Vocab; subclasses split and join.

    A subclass provides ``_split(text) -> list of token strings``, ``_join(tokens) -> text``,
    ``_config()`` (its constructor arguments) and ``train(texts, vocab_size=None, ...)``,
    which learns the vocabulary and returns self.
    """

    def __init__(self, *, specials=SPECIALS):
        self._specials = _check_specials(specials)
        self.vocab = None

    # -- subclass hooks
    def _split(self, text):
        raise NotImplementedError

    def _join(self, tokens):
        raise NotImplementedError

    def _config(self):
        return {"specials": list(self._specials)}

    def _state(self):
        return {}

    def _set_state(self, state, where):
        if state:
            raise ValueError(f"{where}: unexpected fields {sorted(state)}")

    # -- properties
    @property
    def is_fitted(self):
        return self.vocab is not None

    def _require_fitted(self, what):
        if self.vocab is None:
            raise NotFittedError(f"{type(self).__name__}.{what}: the tokenizer is not trained; "
                                 f"call train(texts) first")
        return self.vocab

    @property
    def vocab_size(self):
        """Number of ids, specials included (the embedding's num_embeddings)."""
        return len(self._require_fitted("vocab_size"))

    @property
    def specials(self):
        return self._specials


    def _new_vocab(self, tokens):
        """The trained Vocab; a learned token spelling a special token is refused."""
        clash = [t for t in tokens if t in self._specials]
        if clash:
            raise ValueError(f"{type(self).__name__}: the text holds the token {clash[0]!r}, "
                             f"which is also a special token; choose other specials")
        return Vocab(tokens, self._specials)

    # -- encode / decode
    def tokenize(self, text):
        """The token strings of `text` (before the vocabulary lookup)."""
        self._require_fitted("tokenize")
        return self._split(_check_text(text, f"{type(self).__name__}.tokenize"))

    def encode(self, text, *, add_start_end=False):
        """Token ids (list of int) of `text`; with add_start_end, wrapped in <start> ... <end>."""
        vocab = self._require_fitted("encode")
        _check_text(text, f"{type(self).__name__}.encode")
        lookup = vocab.lookup
        ids = [lookup(t) for t in self._split(text)]
        if add_start_end:
            start, end = self._start_end("encode")
            ids = [start] + ids + [end]
        return ids

    def _start_end(self, where):
        if self.start_id is None or self.end_id is None:
            raise ValueError(f"{type(self).__name__}.{where}: add_start_end needs the {START} "
                             f"and {END} special tokens; specials={self._specials!r}")
        return self.start_id, self.end_id

    def decode(self, ids):
        """Text of a sequence of ids; special tokens are dropped."""
        vocab = self._require_fitted("decode")
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"decode: ids must be a sequence of int, got {type(ids).__name__}")
        if isinstance(ids, np.ndarray):
            if ids.ndim != 1:
                raise ValueError(f"decode: ids must be 1-D, got shape {ids.shape} "
                                 f"(decode_batch takes a (B, L) array)")
            if ids.dtype.kind not in "iu":
                raise TypeError(f"decode: ids must be integers, got dtype {ids.dtype}")
            ids = ids.tolist()
        elif not hasattr(ids, "__iter__"):
            raise TypeError(f"decode: ids must be a sequence of int, got {type(ids).__name__}")
        check, itos, special = vocab._check_id, vocab._itos, vocab.special_ids
        tokens = []
        for i in ids:
            i = check(i)
            if i not in special:
                tokens.append(itos[i])
        return self._join(tokens)

    def decode_batch(self, ids):
        """One text per row of a (B, L) id array (padding and other specials dropped)."""
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"decode_batch: ids must be (B, L), got shape {ids.shape}")
        return [self.decode(row) for row in ids]

    def encode_batch(self, texts, add_start_end=False, max_length=None):
        """(ids int64 (B, L), key_padding_mask bool (B, L), True = padding) for a list of texts.

        L is the longest encoded text (after truncation). ``max_length`` keeps the first
        max_length ids; with ``add_start_end`` the <end> token is kept as the last id, so the
        row is <start>, the first max_length - 2 text ids, <end>. Needs a <pad> token.
        """
        where = f"{type(self).__name__}.encode_batch"
        self._require_fitted("encode_batch")
        if isinstance(texts, str) or not hasattr(texts, "__iter__"):
            raise TypeError(f"{where}: texts must be a list of str, got {type(texts).__name__}")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"{where}: texts[{i}] must be str, got {type(t).__name__}")
        pad = self.pad_id
        if pad is None:
            raise ValueError(f"{where}: padding needs the {PAD} special token; "
                             f"specials={self._specials!r}")
        if add_start_end:
            start, end = self._start_end("encode_batch")
        if max_length is not None:
            max_length = _check_int(max_length, "max_length", 2 if add_start_end else 1)
        rows = []
        for t in texts:
            ids = self.encode(t)
            if add_start_end:
                if max_length is not None:
                    ids = ids[:max_length - 2]
                ids = [start] + ids + [end]
            elif max_length is not None:
                ids = ids[:max_length]
            rows.append(ids)
        L = max((len(r) for r in rows), default=0)
        out = np.full((len(rows), L), pad, dtype=np.int64)
        mask = np.ones((len(rows), L), dtype=bool)
        for b, r in enumerate(rows):
            out[b, :len(r)] = r
            mask[b, :len(r)] = False
        return out, mask

    # -- files
    def to_dict(self):
        """The JSON-ready description that save() writes and from_dict()/load() read."""
        d = {"format": FORMAT, "class": type(self).__name__, "config": self._config(),
             "tokens": None if self.vocab is None else self.vocab.tokens}
        d.update(self._state())
        return d

    @classmethod
    def from_dict(cls, d, *, where="from_dict"):
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise ValueError(f"{where}: not a fastattn tokenizer (format {d.get('format')!r}, "
                             f"expected {FORMAT!r})")
        name = d.get("class")
        klass = _CLASSES.get(name)
        if klass is None:
            raise ValueError(f"{where}: unknown tokenizer class {name!r} "
                             f"(known: {', '.join(_CLASSES)})")
        if cls is not Tokenizer and klass is not cls:
            raise ValueError(f"{where}: the file holds a {name}, not a {cls.__name__}")
        config = d.get("config")
        if not isinstance(config, dict):
            raise ValueError(f"{where}: config must be an object, got {config!r}")
        try:
            tok = klass(**config)
        except TypeError as exc:
            raise ValueError(f"{where}: config {config!r} does not build a {name}: {exc}") from None
        tokens = d.get("tokens")
        rest = {k: v for k, v in d.items() if k not in ("format", "class", "config", "tokens")}
        if tokens is None:
            if any(v is not None for v in rest.values()):
                raise ValueError(f"{where}: an unfitted tokenizer with fitted fields "
                                 f"{sorted(rest)}")
            return tok
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"{where}: tokens must be a list of str")
        try:
            tok.vocab = Vocab(tokens, tok._specials)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        tok._set_state(rest, where)
        return tok

    def save(self, path):
        """Write the tokenizer to `path` as JSON (UTF-8; non-ASCII escaped, so any str fits)."""
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, ensure_ascii=True, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path):
        """Read a file written by save(); ``Tokenizer.load`` accepts any tokenizer class."""
        path = os.fspath(path)
        with open(path, encoding="utf-8") as f:
            try:
                d = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"load: {path} is not a JSON tokenizer file: {exc}") from None
        return cls.from_dict(d, where=f"load {path}")

    def __eq__(self, other):
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    def __repr__(self):
        size = "not trained" if self.vocab is None else f"vocab_size={len(self.vocab)}"
        return f"{type(self).__name__}({size}, specials={self._specials!r})"


# ---- shared by the counting tokenizers (word, character) ----------------------------------------

def _count_kept(tok, counts, first, vocab_size, min_freq):
    """Keep tokens with count >= min_freq; with vocab_size (total, specials included) keep the
    most frequent, ties broken by first occurrence (the order of the result is unspecified)."""
    min_freq = _check_int(min_freq, "min_freq", 1)
    kept = [t for t in counts if counts[t] >= min_freq]
    if vocab_size is not None:
        vocab_size = _check_int(vocab_size, "vocab_size", len(tok._specials))
        kept.sort(key=lambda t: (-counts[t], first[t]))
        kept = kept[:vocab_size - len(tok._specials)]
    return kept


class _CasedTokenizer(Tokenizer):
    """A tokenizer with a ``lowercase`` option (kept in its saved config)."""

    def __init__(self, lowercase, *, specials=SPECIALS):
        super().__init__(specials=specials)
        if not isinstance(lowercase, bool):
            raise TypeError(f"lowercase must be bool, got {type(lowercase).__name__}")
        self.lowercase = lowercase

    def _config(self):
        return {"lowercase": self.lowercase, **super()._config()}


def load(path):
    """Rebuild the tokenizer (of whichever class) that ``save(path)`` wrote."""
    return Tokenizer.load(path)
