"""Tokenizers: text <-> int64 token ids for the models (pure Python + NumPy).

    from fastattn.tokenizers import WordTokenizer, CharTokenizer, BPETokenizer
    tok = BPETokenizer().train(texts, vocab_size=8000)
    ids, key_padding_mask = tok.encode_batch(batch, add_start_end=True, max_length=128)
    tok.save("tok.json"); tok = fastattn.tokenizers.load("tok.json")

Three tokenizers over one ``Vocab`` (token <-> id):

- ``WordTokenizer``: one token per word. Lowercases by default; splits on whitespace;
  punctuation separates words and is dropped, except an apostrophe between two word characters
  ("won't" stays one token, the quotes around 'quoted' are dropped). Punctuation is every
  character of Unicode category P* plus the ASCII punctuation of ``string.punctuation`` (so
  "$", "<", "+" count too); apostrophes are U+0027 and U+2019. ``decode`` joins words with
  single spaces.
- ``CharTokenizer``: one token per Unicode code point (no normalisation); ``decode`` is the
  exact inverse for text whose characters were fitted.
- ``BPETokenizer``: byte-pair encoding over characters (Sennrich et al. 2016), trained as in the
  worked example "she sells seashells by the seashore" (see ``BPETokenizer``); ``decode`` is the
  exact inverse of ``encode`` for any text whose characters were seen in training.

Special tokens come first in the vocabulary, in the order given by ``specials`` (default
``<pad> <unk> <start> <end>`` = ids 0..3; ``specials=()`` for none). Their roles are known by
these four names (``pad_id``, ``unk_id``, ``start_id``, ``end_id`` are None when absent); any
other name is an extra special without a role. ``decode`` drops every special. A token that is
not in the vocabulary encodes as ``<unk>`` when there is one, else it is a ValueError naming it.

Batches follow DESIGN's data conventions: ids int64 (B, L) padded with ``pad_id`` on the right,
``key_padding_mask`` bool (B, L) with True = padding.

Files: ``save(path)`` writes JSON holding the class name, the constructor config, the tokens
and (BPE) the merges; ``fastattn.tokenizers.load(path)`` rebuilds the right class, and
``Class.load(path)`` checks the class too. Nothing is executed or unpickled.

Errors: text that is not a str is a TypeError; an id outside the vocabulary is a ValueError
naming the id; using a tokenizer before ``fit``/``train`` is a ``NotFittedError``
(a RuntimeError) saying so.
"""
from __future__ import annotations

import heapq
import json
import numbers
import os
import re
import string
import unicodedata
from collections import Counter

import numpy as np

__all__ = [
    "SPECIALS", "END_OF_WORD", "Vocab", "Tokenizer", "WordTokenizer", "CharTokenizer",
    "BPETokenizer", "NotFittedError", "load",
]

SPECIALS = ("<pad>", "<unk>", "<start>", "<end>")
PAD, UNK, START, END = SPECIALS
END_OF_WORD = "</w>"      # BPE: the seed's "_" in "she_", a symbol of its own at every word end
FORMAT = "fastattn-tokenizer/1"

_APOSTROPHES = frozenset("'\u2019")
_ASCII_PUNCT = frozenset(string.punctuation)
_RUNS = re.compile(r"\S+|\s+")      # \s is exactly str.isspace, the set str.split() uses


class NotFittedError(RuntimeError):
    """A tokenizer was used before fit()/train() gave it a vocabulary."""


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


def _is_punct(c):
    return c in _ASCII_PUNCT or unicodedata.category(c)[0] == "P"


# ---- Vocab ------------------------------------------------------------------------------------

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
    """Token <-> id: the specials first (ids 0..k-1, in the order given), then ``tokens``.

    ``token_to_id`` raises KeyError naming an absent token; ``id_to_token`` raises ValueError
    naming an id outside 0..len-1; ``lookup`` maps an absent token to ``<unk>`` when there is
    one, else raises ValueError naming it.
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
        """The id of `token`, appended at the end if it is new."""
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
        return self._specials

    @property
    def special_ids(self):
        return self._special_ids

    @property
    def tokens(self):
        """The non-special tokens in id order."""
        return self._itos[len(self._specials):]


    def token_to_id(self, token):
        if not isinstance(token, str):
            raise TypeError(f"token_to_id: token must be str, got {type(token).__name__}")
        try:
            return self._stoi[token]
        except KeyError:
            raise KeyError(f"token {token!r} is not in the vocabulary") from None

    def id_to_token(self, i):
        return self._itos[self._check_id(i)]

    def lookup(self, token):
        """The id of `token`; an absent token gives <unk>, or ValueError without <unk>."""
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


# ---- the shared tokenizer API -------------------------------------------------------------------

class Tokenizer(_SpecialIds):
    """Base class: encode/decode/encode_batch/save/load over a Vocab; subclasses split and join.

    A subclass provides ``_split(text) -> list of token strings``, ``_join(tokens) -> text``,
    ``_config()`` (its constructor arguments) and its own fit/train.
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
            verb = "train" if isinstance(self, BPETokenizer) else "fit"
            raise NotFittedError(f"{type(self).__name__}.{what}: the tokenizer is not fitted; "
                                 f"call {verb}(texts) first")
        return self.vocab

    @property
    def vocab_size(self):
        """Number of ids, specials included (the embedding's num_embeddings)."""
        return len(self._require_fitted("vocab_size"))

    @property
    def specials(self):
        return self._specials


    def _new_vocab(self, tokens):
        """The fitted Vocab; a learned token spelling a special token is refused."""
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
        size = "not fitted" if self.vocab is None else f"vocab_size={len(self.vocab)}"
        return f"{type(self).__name__}({size}, specials={self._specials!r})"


# ---- word level ------------------------------------------------------------------------------

def _fit_counts(tok, counts, first, min_freq, max_size):
    """Keep tokens with count >= min_freq; with max_size (total, specials included) keep the
    most frequent, ties broken by first occurrence. Returns the kept tokens sorted by `first`."""
    min_freq = _check_int(min_freq, "min_freq", 1)
    kept = [t for t in counts if counts[t] >= min_freq]
    if max_size is not None:
        max_size = _check_int(max_size, "max_size", len(tok._specials))
        kept.sort(key=lambda t: (-counts[t], first[t]))
        kept = kept[:max_size - len(tok._specials)]
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


class WordTokenizer(_CasedTokenizer):
    """One token per word (see the module docstring for the splitting rules).

    ``fit(texts, min_freq=1, max_size=None)``: ids follow the specials in order of first
    occurrence in `texts`. ``max_size`` bounds the whole vocabulary (specials included): the
    most frequent words are kept, ties broken by first occurrence. ``decode`` joins the words
    with single spaces.
    """

    def __init__(self, lowercase=True, *, specials=SPECIALS):
        super().__init__(lowercase, specials=specials)

    def _split(self, text):
        if self.lowercase:
            text = text.lower()
        words = []
        for chunk in text.split():
            cur = []
            n = len(chunk)
            for j, c in enumerate(chunk):
                if not _is_punct(c):
                    cur.append(c)
                elif (c in _APOSTROPHES and cur and j + 1 < n
                      and not _is_punct(chunk[j + 1])):        # in-word: won't, rock'n'roll
                    cur.append(c)
                elif cur:                                      # punctuation separates words
                    words.append("".join(cur))
                    cur = []
            if cur:
                words.append("".join(cur))
        return words

    def _join(self, tokens):
        return " ".join(tokens)

    def fit(self, texts, min_freq=1, max_size=None):
        texts = _check_texts(texts, "WordTokenizer.fit")
        counts, first = Counter(), {}
        for text in texts:
            for w in self._split(text):
                counts[w] += 1
                first.setdefault(w, len(first))
        kept = _fit_counts(self, counts, first, min_freq, max_size)
        kept.sort(key=first.__getitem__)
        self.vocab = self._new_vocab(kept)
        return self


# ---- character level -------------------------------------------------------------------------

class CharTokenizer(_CasedTokenizer):
    """One token per Unicode code point, whitespace included; ``decode`` concatenates.

    ``fit(texts, min_freq=1, max_size=None)``: ids follow the specials in code point order (the
    seed's sorted [a, c, d, e, ...]); ``max_size`` bounds the whole vocabulary (specials
    included), keeping the most frequent characters, ties broken by first occurrence.
    ``lowercase`` (default False) lowercases before splitting.
    """

    def __init__(self, lowercase=False, *, specials=SPECIALS):
        super().__init__(lowercase, specials=specials)

    def _split(self, text):
        return list(text.lower() if self.lowercase else text)

    def _join(self, tokens):
        return "".join(tokens)

    def fit(self, texts, min_freq=1, max_size=None):
        texts = _check_texts(texts, "CharTokenizer.fit")
        counts, first = Counter(), {}
        for text in texts:
            if self.lowercase:
                text = text.lower()
            for c in dict.fromkeys(text):
                first.setdefault(c, len(first))
            counts.update(text)
        kept = sorted(_fit_counts(self, counts, first, min_freq, max_size))
        self.vocab = self._new_vocab(kept)
        return self


# ---- byte-pair encoding ----------------------------------------------------------------------

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
    merged pair (an index pair -> words), and a heap gives the next best pair. 1 MB of
    English-like text trains to 8000 tokens in about a second. The cost of a merge grows with
    the length of the words that hold its pair, so text without whitespace (Chinese, Japanese,
    minified code) is one long "word" per run and trains slowly: split it first.

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

    fit = train

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
        syms = list(word)
        syms.append(END_OF_WORD)
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
        if len(self._cache) >= 100_000:
            self._cache.clear()
        self._cache[word] = syms
        return syms

    def _split(self, text):
        out = []
        n = len(text)
        for m in _RUNS.finditer(text):
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

    def _set_state(self, state, where):
        merges = state.pop("merges", None)
        super()._set_state(state, where)
        if not isinstance(merges, list):
            raise ValueError(f"{where}: merges must be a list of [left, right] pairs")
        for m in merges:
            if (not isinstance(m, list) or len(m) != 2
                    or not all(isinstance(s, str) and s in self.vocab for s in m)
                    or m[0] + m[1] not in self.vocab):
                raise ValueError(f"{where}: bad merge {m!r} (each part and the result must be "
                                 f"in the vocabulary)")
        self._set_fitted(self.vocab, merges)

    def __repr__(self):
        if self.vocab is None:
            return super().__repr__()
        return (f"BPETokenizer(vocab_size={len(self.vocab)}, merges={len(self.merges)}, "
                f"specials={self._specials!r})")


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


_CLASSES = {"WordTokenizer": WordTokenizer, "CharTokenizer": CharTokenizer,
            "BPETokenizer": BPETokenizer}


def load(path):
    """Rebuild the tokenizer (of whichever class) that ``save(path)`` wrote."""
    return Tokenizer.load(path)
