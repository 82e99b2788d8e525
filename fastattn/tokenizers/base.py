"""The shared tokenizer API: encode, decode, batches, files; the base the tokenizers build on.

``Tokenizer`` holds a ``Vocab`` and does everything that does not depend on how text is split:
``encode``/``decode`` (specials dropped), ``encode_batch``/``decode_batch`` (DESIGN's data
conventions: ids int64 (B, L) padded with ``pad_id`` on the right, ``key_padding_mask`` bool
(B, L) with True = padding), and the JSON files (``save``, ``load``, ``to_dict``,
``from_dict``). A subclass splits and joins text and learns its vocabulary.

A file is untrusted: ``from_dict`` checks every field against what ``to_dict`` writes and hands
the tokens (and a subclass's own fields, BPE's merges) to the subclass, which accepts only what
its ``train`` could have made; every problem is a ValueError naming the file and the problem.
"""
from __future__ import annotations

import numbers
import os
import re

import numpy as np

from .files import clip, kind, read_json, short, write_json
from .vocab import END, PAD, SPECIALS, START, Vocab, _check_specials, _SpecialIds

HEAD_WINDOW = 4096         # characters: encode_head's first window holds at least this many
# the place after the last word of a window, searched in the reversed window: a whitespace
# character before (in the text: after) a non-whitespace one; \s is exactly str.isspace
_WORD_END = re.compile(r"\s(?=\S)")

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
    """The tokenizers' shared API: encode, decode, encode_batch, save and load over a `Vocab`.

    Subclasses split and join text. `pad_id`, `unk_id`, `start_id` and `end_id` are the ids
    of the four special roles, None when absent.

    A subclass provides ``_split(text) -> list of token strings``, ``_join(tokens) -> text``,
    ``_config()`` (its constructor arguments) and ``train(texts, vocab_size=None, ...)``,
    which learns the vocabulary and returns self. One that keeps more than its vocabulary
    (BPE's merges) names the fields in ``_STATE_FIELDS`` and writes and checks them in
    ``_state()`` and ``_load_trained()``.

    Args:
        specials: the special tokens, first in the vocabulary (default
            `("<pad>", "<unk>", "<start>", "<end>")`; `()` for none).
    """

    _STATE_FIELDS = ()

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
        """The fields of _STATE_FIELDS, for to_dict (None each while untrained)."""
        return {}

    def _load_trained(self, vocab, state, where):
        """Take `vocab` and `state` (the _STATE_FIELDS) read from a file, after checking that
        they are what train() could have made; ValueError starting with `where` otherwise.
        Here: every token is one that _split produces whole (see _makes)."""
        for t in vocab.tokens:
            if not self._makes(t):
                raise ValueError(f"{where}: the token {short(t)} is not one a "
                                 f"{type(self).__name__}({self._config_text()}) makes "
                                 f"(it splits into {short(self._split(t))})")
        self.vocab = vocab

    def _makes(self, token):
        """Whether splitting text can give `token`: splitting it gives back itself alone."""
        return self._split(token) == [token]

    def _config_text(self):
        return ", ".join(f"{k}={v!r}" for k, v in self._config().items() if k != "specials")

    # -- properties
    @property
    def is_fitted(self):
        """True once train() (or load) has given the tokenizer its vocabulary."""
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
        """The special tokens, in id order."""
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
        """The token strings of a text, before the vocabulary lookup.

        Args:
            text: a str.

        Returns:
            A list of str.
        """
        self._require_fitted("tokenize")
        return self._split(_check_text(text, f"{type(self).__name__}.tokenize"))

    def encode(self, text, *, add_start_end=False):
        """The token ids of a text.

        Args:
            text: a str.
            add_start_end: wrap the ids in `<start>` ... `<end>` (default False).

        Returns:
            A list of int.

        Raises:
            TypeError: `text` is not a str.
            ValueError: a token not in the vocabulary when there is no `<unk>`, or
                add_start_end without those specials.
            NotFittedError: the tokenizer is not trained.
        """
        vocab = self._require_fitted("encode")
        _check_text(text, f"{type(self).__name__}.encode")
        lookup = vocab.lookup
        ids = [lookup(t) for t in self._split(text)]
        if add_start_end:
            start, end = self._start_end("encode")
            ids = [start] + ids + [end]
        return ids

    def encode_head(self, text, max_tokens):
        """The ids of the first `max_tokens` tokens of `text`, splitting only its head.

        The ids are those `encode(text)` gives (no <start>/<end>), but a long text costs what
        its head does: the text is read in growing windows that end where a word ends (a
        whitespace run starts), where every tokenizer splits the head as it splits the whole
        text (see `_split_head`).

        Args:
            text: the text.
            max_tokens: how many tokens to keep.

        Returns:
            `(ids, more)`: the first ids, and whether the text has more tokens than that.
        """
        vocab = self._require_fitted("encode_head")
        _check_text(text, f"{type(self).__name__}.encode_head")
        n = _check_int(max_tokens, "max_tokens", 0)
        tokens, more = self._split_head(text, n)
        lookup = vocab.lookup
        return [lookup(t) for t in tokens], more

    def _head_window(self, n):
        """The first window (characters) that encode_head splits for n tokens."""
        return max(HEAD_WINDOW, 4 * (n + 1) * (self._longest_token() + 1))

    def _longest_token(self):
        """Characters in the longest vocabulary entry (what one token can cover)."""
        longest = getattr(self, "_longest", None)
        if longest is None or longest[0] is not self.vocab:
            longest = self._longest = (self.vocab, max(map(len, self.vocab.tokens), default=1))
        return longest[1]

    def _split_head(self, text, n):
        """(tokens, more): _split(text)[:n] and whether _split(text) has more, splitting only
        a head of the text. Windows grow 4x from _head_window(n). A window is split up to the
        end of its last word (before a whitespace run that follows a non-whitespace
        character): what follows a whitespace run never changes the tokens before it, in any
        tokenizer, so those are the whole text's first tokens. The rest of the window (a
        whitespace run, then a run without whitespace, cut by the window) goes to
        _split_run_head, which gives those of its tokens that it can be sure of."""
        size = self._head_window(n)
        while size < len(text):
            window = text[:size + 1]
            m = _WORD_END.search(window[::-1])        # the last whitespace after a non-space
            cut = 0 if m is None else len(window) - 1 - m.start()
            tokens = self._split_upto(window[:cut], n + 1) if cut else []
            if len(tokens) <= n:
                tokens += self._split_run_head(window[cut:], cut > 0, n + 1 - len(tokens))
            if len(tokens) > n:
                return tokens[:n], True
            size *= 4
        tokens = self._split_upto(text, n + 1)
        return tokens[:n], len(tokens) > n

    def _split_upto(self, text, limit):
        """_split(text)[:limit]; a subclass may stop splitting there (a window of a few
        windows' length can hold millions of tokens after a long run)."""
        return self._split(text)[:limit]

    def _split_run_head(self, tail, after_word, limit):
        """The first tokens (at most `limit`) of `tail` -- whitespace, then a run without
        whitespace that the window cuts (the text goes on) -- that no character after the
        window can change (after_word: a word comes before the tail). Here none: a larger
        window is tried."""
        return []

    def _start_end(self, where):
        if self.start_id is None or self.end_id is None:
            raise ValueError(f"{type(self).__name__}.{where}: add_start_end needs the {START} "
                             f"and {END} special tokens; specials={self._specials!r}")
        return self.start_id, self.end_id

    def decode(self, ids):
        """The text of a sequence of ids; special tokens are dropped.

        Args:
            ids: a list or 1-D array of int.

        Returns:
            The text.

        Raises:
            TypeError: ids that are not integers.
            ValueError: ids not 1-D, or an id outside the vocabulary (named).
        """
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
        """One text per row of an id array (padding and other specials dropped).

        Args:
            ids: (B, L) integer ids.

        Returns:
            A list of B str.
        """
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"decode_batch: ids must be (B, L), got shape {ids.shape}")
        return [self.decode(row) for row in ids]

    def encode_batch(self, texts, add_start_end=False, max_length=None):
        """Encode a list of texts into a padded batch. Needs a `<pad>` token.

        Args:
            texts: a list of str.
            add_start_end: wrap each row in `<start>` ... `<end>` (default False).
            max_length: keep the first max_length ids of each text; with `add_start_end` the
                `<end>` token is kept as the last id, so the row is `<start>`, the first
                max_length - 2 text ids, `<end>`. None (the default) keeps every id.

        Returns:
            `(ids, key_padding_mask)`: int64 (B, L) padded with pad_id on the right, and bool
                (B, L) with True = padding; L is the longest encoded text (after truncation).
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
            if max_length is None:
                ids = self.encode(t)
            else:      # only the head of a long text is split (what is kept is the same)
                ids = self.encode_head(t, max_length - 2 if add_start_end else max_length)[0]
            if add_start_end:
                ids = [start] + ids + [end]
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
        """Rebuild the tokenizer that `to_dict()` described.

        Args:
            d: the description; untrusted (a file's content).
            where: how error messages start (default "from_dict").

        Returns:
            The tokenizer, of the class `d` names.

        Raises:
            ValueError: anything `to_dict()` would not have written (what is wrong said); no
                other exception escapes.
        """
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object, got {kind(d)}")
        fmt = d.get("format")
        if not isinstance(fmt, str) or fmt != FORMAT:
            raise ValueError(f"{where}: not a fastattn tokenizer (format {short(fmt)}, "
                             f"expected {FORMAT!r})")
        name = d.get("class")
        klass = _CLASSES.get(name) if isinstance(name, str) else None
        if klass is None:
            raise ValueError(f"{where}: unknown tokenizer class {short(name)} "
                             f"(known: {', '.join(_CLASSES)})")
        if cls is not Tokenizer and klass is not cls:
            raise ValueError(f"{where}: the file holds a {name}, not a {cls.__name__}")
        fields = ("format", "class", "config", "tokens") + klass._STATE_FIELDS
        missing = [k for k in fields if k not in d]
        if missing:
            raise ValueError(f"{where}: a {name} needs the field(s) {', '.join(missing)}")
        unexpected = [k for k in d if k not in fields]
        if unexpected:
            raise ValueError(f"{where}: unexpected field(s) {short(unexpected)} for a {name}")
        tok = klass._from_config(d["config"], where)
        tokens = d["tokens"]
        state = {k: d[k] for k in klass._STATE_FIELDS}
        if tokens is None:                              # saved before training
            given = [k for k, v in state.items() if v is not None]
            if given:
                raise ValueError(f"{where}: an untrained {name} (tokens null) with "
                                 f"{', '.join(given)}")
            return tok
        if not isinstance(tokens, list):
            raise ValueError(f"{where}: tokens must be a list of str (or null), got "
                             f"{kind(tokens)}")
        for i, t in enumerate(tokens):
            if not isinstance(t, str):
                raise ValueError(f"{where}: tokens must be a list of str; tokens[{i}] is "
                                 f"{kind(t)}")
        try:
            vocab = Vocab(tokens, tok._specials)
        except ValueError as exc:                       # a token twice, or a special's name
            raise ValueError(f"{where}: {clip(str(exc))}") from None
        tok._load_trained(vocab, state, where)
        return tok

    @classmethod
    def _from_config(cls, config, where):
        """A new untrained tokenizer built from a file's config (its constructor arguments)."""
        name = cls.__name__
        if not isinstance(config, dict):
            raise ValueError(f"{where}: config must be an object, got {kind(config)}")
        keys = list(cls()._config())
        wrong = ([f"missing {k!r}" for k in keys if k not in config]
                 + [f"unexpected {short(k)}" for k in config if k not in keys])
        if not wrong and not isinstance(config["specials"], list):
            wrong = [f"specials must be a list of str, got {kind(config['specials'])}"]
        if not wrong:
            try:
                return cls(**config)
            except (TypeError, ValueError) as exc:      # wrong types, a special given twice
                wrong = [clip(str(exc))]
        raise ValueError(f"{where}: config does not build a {name}: {'; '.join(wrong)}")

    def save(self, path):
        """Write the tokenizer as JSON (UTF-8, non-ASCII escaped).

        Args:
            path: the file to write (str or path-like).

        Raises:
            ValueError: a token holding a surrogate pair, which a JSON file cannot hold (see
                `files.write_json`).
        """
        path = os.fspath(path)
        write_json(path, self.to_dict(), f"save {path}")

    @classmethod
    def load(cls, path):
        """Read a file written by `save()`; `Tokenizer.load` accepts any tokenizer class.

        Args:
            path: the file (str or path-like); untrusted.

        Returns:
            The tokenizer.

        Raises:
            FileNotFoundError: `path` does not exist.
            ValueError: any problem with the file (the file and what is wrong named; see
                `from_dict` and `files.read_json`), or a file of another class.
        """
        path = os.fspath(path)
        where = f"load {path}"
        return cls.from_dict(read_json(path, where), where=where)

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
    """Rebuild the tokenizer, of whichever class, that `save(path)` wrote.

    Args:
        path: the file (str or path-like); untrusted.

    Returns:
        The tokenizer.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: any problem with the file (the file and what is wrong named).
    """
    return Tokenizer.load(path)
