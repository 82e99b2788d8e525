"""A pretrained model directory's tokenizer, read without transformers: the same ids and the same
text as transformers' own tokenizer for that directory (AutoTokenizer.from_pretrained), through
sentencepiece or tokenizers (the extra fastattn[hf]), imported only here.

What each tokenizer class reads, and the special tokens it adds around a text X:

```text
MarianTokenizer     source.spm, target.spm, vocab.json      X </s>
(marian)            (+ target_vocab.json with separate_vocabs); sentencepiece cuts the
                    text, vocab.json numbers the pieces (<unk> where it lacks one); a
                    leading ">>fra<<" stays one token (the target language of multilingual
                    models); decode joins pieces with source.spm (target.spm and
                    target_vocab.json with separate_vocabs), as transformers 5 does
M2M100Tokenizer     vocab.json, sentencepiece.bpe.model     __en__ X </s>
(m2m_100)           language tokens __xx__ numbered after vocab.json, in the order of
                    fairseq's list (tokenizer_config.json's language_codes)
NllbTokenizer       tokenizer.json                           eng_Latn X </s>
(m2m_100)           (legacy_behaviour: X </s> eng_Latn)
BartTokenizer       tokenizer.json, or vocab.json + merges.txt   <s> X </s>
(bart)              (byte-level BPE, as RobertaTokenizer)
MBartTokenizer      tokenizer.json                           X </s> en_XX
MBart50Tokenizer    tokenizer.json                           en_XX X </s>
(mbart)
```

sentencepiece reads the Marian and M2M100 files, tokenizers the rest. tokenizer.json is used as
written, with its normaliser and pre-tokeniser (the special tokens are added here, as the class
adds them). transformers 5 keeps only the vocabulary of the file and rebuilds the rest from the
class's defaults: on a tokenizer.json that transformers 5 wrote the two agree; on an older one
they can differ (its MBartTokenizer drops the file's NFKC normaliser, where the file, like the
model's own sentencepiece, maps "½" to "1⁄2"). The class is tokenizer_config.json's
tokenizer_class, else config.json's, else the family's (for m2m_100: NLLB where the directory
has a tokenizer.json and no vocab.json). The source language is encode_batch's src_lang, else
tokenizer_config.json's, else the class default (en, eng_Latn, en_XX). Language tokens are
always special: never split in a text, dropped by decode (transformers 5 does so where the
directory lists them as special tokens, as the published ones do).

Refused, naming the file: missing files (with the list the class needs), files over a size cap,
a vocab.json that is not an object of str -> int, special tokens missing from the vocabulary,
and a tokenizer from another model: ids beyond config.json's vocab_size (decoder_vocab_size for
what decode reads), or pad / eos ids that differ from config.json's.

Truncation (max_length) keeps the special tokens and the first max_length - (their number)
tokens of the text, as transformers' truncation=True does (truncation_side "left": the last,
from the whole text). Before tokenising, a text longer than the window, 16 * (kept + 8) + 256
characters, is cut at the window's last space that follows a non-space (in its last quarter;
else at its end), and the window grows fourfold, up to 1024 * (kept + 8) + 16384 characters,
until the cut text gives 8 tokens more than are kept. None of these tokenisers lets a token span
a space, so a cut on a space changes nothing that is kept; a cut mid-word (text without spaces:
Chinese, Japanese, Thai) relies on the 8 tokens of margin; only past the cap (over a thousand
characters a token: not text) can the kept tokens differ from transformers'.
"""
import importlib
import os
import re

import numpy as np

from .. import io as _io

__all__ = ["load_tokenizer", "PretrainedTokenizer"]

INSTALL = 'pip install "fastattn[hf]"'

# size caps (the largest real files: NLLB's tokenizer.json 17 MB, M2M100's vocab.json 4 MB)
_MAX_TOKENIZER_JSON = 256 << 20
_MAX_VOCAB = 64 << 20
_MAX_MODEL = 64 << 20           # a sentencepiece model
_MAX_CONFIG = 16 << 20          # tokenizer_config.json, special_tokens_map.json

# the text cut of max_length (see the module doc)
_WINDOW, _WINDOW_ADD = 16, 256
_CAP, _CAP_ADD = 1024, 16384
_MARGIN = 8

# fairseq's M2M100 language lists (transformers' M2M100Tokenizer): token __xx__ has id
# len(vocab.json) + its place here
M2M100_LANGUAGES = {
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy "
               "ga gd gl gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo "
               "lt lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq "
               "sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu").split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
# the language tokens of tokenizer.json-based classes: its special added tokens of this shape
_LANG_PATTERN = {"NllbTokenizer": re.compile(r"[a-z]{3}_[A-Z][a-z]{3}"),
                 "MBartTokenizer": re.compile(r"[a-z]{2}_[A-Z]{2}"),
                 "MBart50Tokenizer": re.compile(r"[a-z]{2}_[A-Z]{2}")}
_DEFAULT_SRC = {"M2M100Tokenizer": "en", "NllbTokenizer": "eng_Latn", "MBartTokenizer": "en_XX",
                "MBart50Tokenizer": "en_XX"}
_CLASSES = {"marian": ("MarianTokenizer",), "m2m_100": ("M2M100Tokenizer", "NllbTokenizer"),
            "bart": ("BartTokenizer", "RobertaTokenizer"),
            "mbart": ("MBartTokenizer", "MBart50Tokenizer")}
_BYTE_LEVEL = "tokenizer.json, or vocab.json and merges.txt"
_NEEDS = {"MarianTokenizer": "source.spm, target.spm and vocab.json",
          "M2M100Tokenizer": "vocab.json and sentencepiece.bpe.model",
          "NllbTokenizer": "tokenizer.json", "BartTokenizer": _BYTE_LEVEL,
          "RobertaTokenizer": _BYTE_LEVEL, "MBartTokenizer": "tokenizer.json",
          "MBart50Tokenizer": "tokenizer.json"}
_SAVE_HINT = ("(transformers writes it: python -c \"from transformers import AutoTokenizer as T; "
              "T.from_pretrained(DIR).save_pretrained(DIR)\", once, where it is installed)")


def _need(module, family):
    """import `module` (sentencepiece or tokenizers), or say which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"reading a {family} model's tokenizer needs the {module} package: "
                          f"{INSTALL}") from None


def _fail(path, what):
    raise ValueError(f"{path}: {what}")


def _read(path, cap):
    """The bytes of `path`, refused past `cap` bytes (read no further than that)."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        size = f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap} bytes"
        _fail(path, f"is larger than {size}: not a tokenizer file")
    return data


def _text(path, cap):
    data = _read(path, cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(path, f"is not UTF-8 ({exc.reason} at byte {exc.start})")


def _json_object(path, cap=_MAX_CONFIG):
    raw = _io._json(_text(path, cap), path)
    if not isinstance(raw, dict):
        _fail(path, f"must hold a JSON object, got {type(raw).__name__}")
    return raw


def _vocab(path):
    """vocab.json: a JSON object of piece -> id (ints >= 0)."""
    raw = _io._json(_text(path, _MAX_VOCAB), path)
    if not isinstance(raw, dict):
        _fail(path, f"must hold a JSON object of token -> id, got {type(raw).__name__}")
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            _fail(path, f"must map each token to an integer id >= 0; {_io._short(k)} -> "
                        f"{_io._short(v)}")
    return raw


def _token(value, where, key):
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        _fail(where, f"{key} must be a token string, got {_io._short(value)}")
    return value


def _config(directory):
    """tokenizer_config.json (optional) and, as transformers reads it, special_tokens_map.json
    over it where the config lists no added_tokens_decoder; the added tokens as
    {content: (id, special, lstrip, rstrip)}."""
    path = os.path.join(directory, "tokenizer_config.json")
    cfg = _json_object(path) if os.path.exists(path) else {}
    legacy = os.path.join(directory, "special_tokens_map.json")
    if "added_tokens_decoder" not in cfg and os.path.exists(legacy):
        cfg.update(_json_object(legacy))
    entries = cfg.get("added_tokens_decoder") or {}
    if not isinstance(entries, dict):
        _fail(path, "added_tokens_decoder must be an object of id -> token")
    added = {}
    for k, v in entries.items():
        if not (isinstance(k, str) and k.isdigit()) or not isinstance(v, dict):
            _fail(path, f"added_tokens_decoder entry {_io._short(k)} is not id -> token")
        flags = tuple(bool(v.get(f, False)) for f in ("special", "lstrip", "rstrip"))
        added[_token(v, path, "added_tokens_decoder")] = (int(k),) + flags
    return cfg, added, path


def _named(cfg, path, key, default):
    value = cfg.get(key, default)
    return default if value is None else _token(value, path, key)


def _extras(cfg, path):
    """The extra special tokens a config lists (v5's extra_special_tokens, v4's
    additional_special_tokens)."""
    out = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = cfg.get(key) or []
        if isinstance(value, dict):             # v5: {name: token}
            value = list(value.values())
        if not isinstance(value, list):
            _fail(path, f"{key} must be a list of tokens")
        out += [_token(v, path, key) for v in value]
    return out


def _clean_up(text):
    """transformers' clean_up_tokenization (where tokenizer_config.json asks for it)."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                 (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def _word_end(text, lo, hi):
    """The largest p in (lo, hi] with text[p] a space after a non-space, else hi."""
    p = text.rfind(" ", lo, hi + 1)
    while p > lo:
        if not text[p - 1].isspace():
            return p
        p = text.rfind(" ", lo, p)
    return hi


class PretrainedTokenizer:
    """A model directory's tokenizer (see the module doc); made by `load_tokenizer`.

    Attributes:
        family: the model family ("marian", "m2m_100", "bart", "mbart").
        kind: transformers' class name of the tokenizer.
        pad_id: the padding token id.
        eos_id: the end-of-sequence token id.
        vocab_size: the ids `encode_batch` can produce: the largest + 1.
        lang_codes: the language codes `lang_id` and `src_lang` take (Marian: its ">>xx<<"
            tokens, which go at the start of a text).

    Args:
        family: the model family.
        kind: transformers' class name of the tokenizer.
        directory: the model directory its files are read from.
    """

    def __init__(self, family, kind, directory):
        self.family, self.kind, self.directory = family, kind, directory
        self.pad_id = self.eos_id = self.vocab_size = None
        self.lang_codes = ()
        self._langs = {}               # code -> id
        self._src = None               # the default source language
        self._legacy = False
        self._clean = False
        self._cut_left = False

    # -- what each backend provides ---------------------------------------------------------
    def _pieces_batch(self, texts):
        """[[id, ...]] of each text without special tokens."""
        raise NotImplementedError

    def _decode(self, ids):
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------
    def _frame(self, src_lang):
        """(prefix, suffix) ids around a text's tokens."""
        if self.kind == "MarianTokenizer":
            return [], [self.eos_id]
        if self.kind in ("BartTokenizer", "RobertaTokenizer"):
            return [self._bos], [self.eos_id]
        if src_lang is None:
            src_lang = self._src
        lang = self.lang_id(src_lang, "src_lang")
        if self.kind == "MBartTokenizer" or self._legacy:
            return [], [self.eos_id, lang]
        return [lang], [self.eos_id]

    def lang_id(self, code, what="language code"):
        """The token id of a language code.

        NLLB / M2M100: the forced first target token; mBART: the decoder's start.

        Args:
            code: the language code, one of `lang_codes`.
            what: how an error message names the code (default "language code").

        Returns:
            The token id (an int).

        Raises:
            ValueError: a code the tokenizer does not have, or a family without language codes.
        """
        if self.family in ("marian", "bart"):
            hint = (" (Marian's multilingual models take the target language as a '>>xx<<' "
                    "token at the start of each source text)") if self.family == "marian" else ""
            raise ValueError(f"{self.family} models have no {what}{hint}")
        if not isinstance(code, str) or code not in self._langs:
            known = (f"it knows {len(self.lang_codes)} codes, e.g. "
                     f"{', '.join(self.lang_codes[:6])}") if self.lang_codes else \
                "it has no language codes (a tokenizer.json without them)"
            raise ValueError(f"unknown {what} {code!r} for this {self.kind}: {known}")
        return self._langs[code]

    def _texts(self, texts):
        if isinstance(texts, (str, bytes)) or not isinstance(texts, (list, tuple)):
            raise TypeError(f"texts must be a list of strings, got {type(texts).__name__}")
        out = []
        for i, t in enumerate(texts):
            if isinstance(t, (bytes, bytearray)):
                try:
                    t = bytes(t).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"texts[{i}] is not valid UTF-8 ({exc.reason} at byte "
                                     f"{exc.start})") from None
            elif not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, not a string")
            out.append(t)
        return out

    @staticmethod
    def _utf8(texts, first):
        for i, t in enumerate(texts):
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"texts[{first[i]}] is not valid UTF-8 text: {exc.reason} at "
                                 f"character {exc.start} (bytes decoded with surrogateescape?)"
                                 ) from None

    def _pieces_cut(self, texts, keep):
        """Each text's tokens, the first `keep` of them, read from a cut of the text (module
        doc) where the text is long."""
        out = [[] for _ in texts]
        todo = list(range(len(texts)))
        limit = _WINDOW * (keep + _MARGIN) + _WINDOW_ADD
        cap = _CAP * (keep + _MARGIN) + _CAP_ADD
        if not keep:                           # only the special tokens: nothing to read
            self._utf8([t[:limit] for t in texts], todo)
            return out
        while todo:
            cut = []
            for i in todo:
                t = texts[i]
                cut.append(t if len(t) <= limit else t[:_word_end(t, limit * 3 // 4, limit)])
            self._utf8(cut, todo)
            again = []
            for i, t, ids in zip(todo, cut, self._pieces_batch(cut)):
                if len(ids) >= keep + _MARGIN or len(t) == len(texts[i]) or limit >= cap:
                    out[i] = ids[:keep]
                else:
                    again.append(i)
            todo, limit = again, min(4 * limit, cap)
        return out

    def encode_batch(self, texts, *, src_lang=None, max_length=None):
        """Tokenize a batch of texts, with the model's special tokens, right-padded with pad_id.

        The same as transformers' `tok(texts, padding=True)` input_ids and
        `attention_mask == 0` (with `truncation=True, max_length=max_length` when given).

        Args:
            texts: a list of strings.
            src_lang: the source language code (NLLB, M2M100, mBART); None (the default) for
                the tokenizer's default.
            max_length: the most tokens a text keeps, special tokens included; None (the
                default) for no limit.

        Returns:
            `(ids, key_padding_mask)`: int64 (B, S) and bool (B, S), True at padding.
        """
        texts = self._texts(texts)
        if src_lang is not None and self.family in ("marian", "bart"):
            self.lang_id(src_lang, "src_lang")         # the refusal
        prefix, suffix = self._frame(src_lang)
        special = len(prefix) + len(suffix)
        if max_length is None:
            self._utf8(texts, range(len(texts)))
            pieces = self._pieces_batch(texts)
        else:
            if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) \
                    or max_length < max(special, 1):
                raise ValueError(f"max_length must be an integer >= {max(special, 1)} (this "
                                 f"{self.kind} adds {special} special tokens), got "
                                 f"{max_length!r}")
            keep = int(max_length) - special
            if self._cut_left:                 # truncation_side "left": keep the last tokens
                self._utf8(texts, range(len(texts)))
                pieces = [p[len(p) - keep:] if len(p) > keep else p
                          for p in self._pieces_batch(texts)]
            else:
                pieces = self._pieces_cut(texts, keep)
        rows = [prefix + p + suffix for p in pieces]
        width = max((len(r) for r in rows), default=0)
        ids = np.full((len(rows), width), self.pad_id, np.int64)
        mask = np.ones((len(rows), width), bool)
        for b, r in enumerate(rows):
            ids[b, :len(r)] = r
            mask[b, :len(r)] = False
        return ids, mask

    def decode(self, ids):
        """The text of one sequence of target ids, the special tokens dropped.

        Pad, eos, language codes ... are dropped, as transformers' `tok.decode(ids,
        skip_special_tokens=True)`.

        Args:
            ids: a list or 1-D array of integer ids.

        Returns:
            The text.

        Raises:
            ValueError: not one sequence of integers, or an id outside the target vocabulary.
        """
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(f"decode takes one sequence of integer ids, got an array of shape "
                             f"{arr.shape} and dtype {arr.dtype}")
        seq = [int(i) for i in arr]
        bad = [i for i in seq if not 0 <= i < self._target_size]
        if bad:
            raise ValueError(f"id {bad[0]} is outside the model's target vocabulary of "
                             f"{self._target_size} ids")
        text = self._decode(seq)
        return _clean_up(text) if self._clean else text

    def _check(self, arch, path, source_top, target_top, pad, eos):
        """A tokenizer from another model is refused: ids past config.json's vocabulary, other
        pad / eos ids."""
        for top, size, key in ((source_top, arch.vocab_size, "vocab_size"),
                               (target_top, arch.decoder_vocab_size, "decoder_vocab_size")):
            if top >= size:
                _fail(path, f"has token ids up to {top}, but config.json's {key} is {size}: "
                            "a tokenizer of another model")
        for name, got, want in (("pad", pad, arch.pad_id), ("eos", eos, arch.eos_id)):
            if got != want:
                _fail(path, f"gives the {name} token id {got}, but config.json's "
                            f"{name}_token_id is {want}: a tokenizer of another model")
        self.pad_id, self.eos_id = pad, eos
        self.vocab_size = source_top + 1
        self._target_size = arch.decoder_vocab_size

    def __repr__(self):
        return (f"PretrainedTokenizer({self.kind}, family={self.family!r}, vocab_size="
                f"{self.vocab_size}, directory={self.directory!r})")


class _SentencePiece(PretrainedTokenizer):
    """MarianTokenizer and M2M100Tokenizer: sentencepiece cuts, vocab.json numbers."""

    def __init__(self, family, kind, directory, arch, cfg, added, cfg_path):
        super().__init__(family, kind, directory)
        spm = _need("sentencepiece", family)
        marian = kind == "MarianTokenizer"
        files = ("source.spm", "target.spm", "vocab.json") if marian else \
            ("vocab.json", "sentencepiece.bpe.model")
        paths = {f: os.path.join(directory, f) for f in files}
        separate = marian and bool(cfg.get("separate_vocabs", False))
        if separate:
            paths["target_vocab.json"] = os.path.join(directory, "target_vocab.json")
        missing = [f for f, p in paths.items() if not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(f"{directory}: no {', '.join(missing)}: a {kind} reads "
                                    f"{_NEEDS[kind]}{' and target_vocab.json' * separate}")

        def load(name):
            proc, data = spm.SentencePieceProcessor(), _read(paths[name], _MAX_MODEL)
            try:
                proc.LoadFromSerializedProto(data)
            except Exception as exc:             # sentencepiece raises RuntimeError / OSError
                _fail(paths[name], f"is not a sentencepiece model ({exc})")
            return proc

        vocab_path = paths["vocab.json"]
        self._vocab = _vocab(vocab_path)
        if marian:
            self._spm = load("source.spm")
            target_spm = load("target.spm") if separate else self._spm
            target = _vocab(paths["target_vocab.json"]) if separate else self._vocab
        else:
            self._spm = target_spm = load("sentencepiece.bpe.model")
            target = self._vocab
        self._target_spm = target_spm
        self._inverse = {v: k for k, v in target.items()}
        self._marian = marian
        unk = _named(cfg, cfg_path, "unk_token", "<unk>")
        names = {"eos": _named(cfg, cfg_path, "eos_token", "</s>"), "unk": unk,
                 "pad": _named(cfg, cfg_path, "pad_token", "<pad>")}
        if not marian:
            names["bos"] = _named(cfg, cfg_path, "bos_token", "<s>")
            names["sep"] = _named(cfg, cfg_path, "sep_token", "</s>")
            codes = cfg.get("language_codes", "m2m100")
            if codes not in M2M100_LANGUAGES:
                _fail(cfg_path, f"language_codes {_io._short(codes)} is not one of "
                                f"{', '.join(M2M100_LANGUAGES)}")
            base = len(self._vocab)
            self._langs = {c: base + i for i, c in enumerate(M2M100_LANGUAGES[codes])}
            self.lang_codes = tuple(self._langs)
            self._src = cfg.get("src_lang") or _DEFAULT_SRC[kind]
        else:
            self._langs = {}
            self.lang_codes = tuple(k for k in self._vocab if k.startswith(">>")
                                    and k.endswith("<<"))
        # special tokens: id, skipped by decode, lstrip, rstrip
        special = {}
        lang_tokens = {f"__{c}__": i for c, i in self._langs.items()}
        for tok in list(names.values()) + _extras(cfg, cfg_path) + list(added):
            if tok in special:
                continue
            if tok in added:
                i, is_special, lstrip, rstrip = added[tok]
            elif tok in lang_tokens:
                i, is_special, lstrip, rstrip = lang_tokens[tok], True, False, False
            elif tok in self._vocab:
                i, is_special, lstrip, rstrip = self._vocab[tok], True, False, False
            else:
                _fail(vocab_path, f"has no id for the special token {tok!r}")
            special[tok] = (i, is_special, lstrip, rstrip)
        for tok, i in lang_tokens.items():
            special.setdefault(tok, (i, True, False, False))
        self._special = special
        self._special_ids = {v[0] for v in special.values() if v[1]}
        self._unk = special[unk][0]
        self._unk_token = unk
        # id -> token as transformers' convert_ids_to_tokens: added tokens, then vocab.json
        self._tokens = {**self._inverse, **{v[0]: t for t, v in special.items()}}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in sorted(
            special, key=len, reverse=True)) + ")")
        ids = list(self._vocab.values()) + [v[0] for v in special.values()]
        target_ids = list(target.values()) + [v[0] for v in special.values()]
        self._check(arch, vocab_path, max(ids), max(target_ids),
                    special[names["pad"]][0], special[names["eos"]][0])
        self._clean = bool(cfg.get("clean_up_tokenization_spaces", False))

    def _pieces_one(self, text):
        # transformers' PreTrainedTokenizer.tokenize: split on the special tokens first
        parts = self._split.split(text)
        for j in range(1, len(parts), 2):
            _, _, lstrip, rstrip = self._special[parts[j]]
            if lstrip:
                parts[j - 1] = parts[j - 1].rstrip()
            if rstrip:
                parts[j + 1] = parts[j + 1].lstrip()
        out = []
        for j, part in enumerate(parts):
            if j % 2:
                out.append(self._special[part][0])
                continue
            if not part:
                continue
            if self._marian and part.startswith(">>") and (end := part.find("<<")) != -1:
                out.append(self._vocab.get(part[:end + 2], self._unk))
                part = part[end + 2:]
            out += [self._vocab.get(p, self._unk) for p in self._spm.encode(part, out_type=str)]
        return out

    def _pieces_batch(self, texts):
        return [self._pieces_one(t) for t in texts]

    def _decode(self, ids):
        spm, tokens = self._target_spm, []
        for i in ids:
            if i in self._special_ids:
                continue
            tok = self._tokens.get(i)
            if tok is None:
                if not self._marian:            # M2M100: vocab.json's decoder.get(i, unk)
                    tok = self._unk_token
                elif i < spm.get_piece_size():  # Marian: the sentencepiece model's piece
                    tok = spm.id_to_piece(i) or self._unk_token
                else:
                    raise ValueError(f"id {i} is outside the tokenizer's vocabulary "
                                     f"({len(self._inverse)} tokens)")
            tokens.append(tok)
        out, run = "", []
        gap = " " if self._marian else ""
        for tok in tokens:
            if tok in self._special:       # a special token's text stays as it is
                out += spm.decode_pieces(run) + tok + gap
                run = []
            else:
                run.append(tok)
        out += spm.decode_pieces(run)
        if self._marian:
            out = out.replace("\u2581", " ")
        return out.strip()


class _Tokenizers(PretrainedTokenizer):
    """NllbTokenizer, BartTokenizer, MBartTokenizer, MBart50Tokenizer: the tokenizers library,
    from tokenizer.json (BART also from vocab.json + merges.txt)."""

    def __init__(self, family, kind, directory, arch, cfg, added, cfg_path):
        super().__init__(family, kind, directory)
        lib = _need("tokenizers", family)
        path = os.path.join(directory, "tokenizer.json")
        bart = kind in ("BartTokenizer", "RobertaTokenizer")
        if os.path.exists(path):
            text = _text(path, _MAX_TOKENIZER_JSON)
            try:
                tok = lib.Tokenizer.from_str(text)
            except Exception as exc:               # tokenizers raises its own Exception
                _fail(path, f"is not a tokenizers file ({exc})")
        elif bart and all(os.path.exists(os.path.join(directory, f))
                          for f in ("vocab.json", "merges.txt")):
            path = os.path.join(directory, "vocab.json")
            tok = self._byte_level(lib, directory, cfg, added, cfg_path)
        else:
            lacks = [f for f in ("vocab.json", "merges.txt")
                     if bart and not os.path.exists(os.path.join(directory, f))]
            nor = f" (nor {' and '.join(lacks)})" if lacks else ""
            hint = "" if bart else " " + _SAVE_HINT
            raise FileNotFoundError(f"{directory}: no tokenizer.json{nor}: a {kind} reads "
                                    f"{_NEEDS[kind]}{hint}")
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self._top = max(tok.get_vocab(with_added_tokens=True).values(), default=0)

        def tid(key, default):
            name = _named(cfg, cfg_path, key, default)
            i = tok.token_to_id(name)
            if i is None:
                _fail(path, f"has no token {name!r} ({key} of {os.path.basename(cfg_path)})")
            return i

        pad, eos = tid("pad_token", "<pad>"), tid("eos_token", "</s>")
        if bart:
            self._bos = tid("cls_token", "<s>")
            eos_frame = tid("sep_token", "</s>")
            if eos_frame != eos:
                _fail(cfg_path, "sep_token and eos_token differ: not a BART tokenizer")
        else:
            pattern = _LANG_PATTERN[kind]
            self._langs = {t.content: i for i, t in tok.get_added_tokens_decoder().items()
                           if t.special and pattern.fullmatch(t.content)}
            self.lang_codes = tuple(sorted(self._langs))
            self._src = cfg.get("src_lang") or _DEFAULT_SRC[kind]
            self._legacy = kind == "NllbTokenizer" and bool(cfg.get("legacy_behaviour", False))
        self._check(arch, path, self._top, self._top, pad, eos)
        bpe = type(tok.model).__name__ == "BPE"
        self._clean = bool(cfg.get("clean_up_tokenization_spaces", False)) and (not bpe or bool(
            cfg.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))

    @staticmethod
    def _byte_level(lib, directory, cfg, added, cfg_path):
        """BART's vocab.json + merges.txt as transformers 5's RobertaTokenizer builds them."""
        vocab = _vocab(os.path.join(directory, "vocab.json"))
        path = os.path.join(directory, "merges.txt")
        merges = []
        for n, line in enumerate(_text(path, _MAX_VOCAB).splitlines(), 1):
            if not line or (n == 1 and line.startswith("#version")):
                continue
            pair = line.split(" ")
            if len(pair) != 2:
                _fail(path, f"line {n} is not two tokens separated by a space")
            merges.append(tuple(pair))
        try:
            tok = lib.Tokenizer(lib.models.BPE(vocab, merges, continuing_subword_prefix="",
                                               end_of_word_suffix="", fuse_unk=False))
        except Exception as exc:
            _fail(path, f"does not fit vocab.json ({exc})")
        prefix = bool(cfg.get("add_prefix_space", False))
        tok.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=prefix)
        tok.decoder = lib.decoders.ByteLevel()
        names = [_named(cfg, cfg_path, k, d) for k, d in (
            ("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>"),
            ("sep_token", "</s>"), ("pad_token", "<pad>"), ("cls_token", "<s>"),
            ("mask_token", "<mask>"))] + _extras(cfg, cfg_path)
        specials = []
        for name in dict.fromkeys(names + [t for t, v in added.items() if v[1]]):
            _, _, lstrip, rstrip = added.get(name, (None, True, False, False))
            specials.append(lib.AddedToken(name, special=True, normalized=False,
                                           lstrip=lstrip, rstrip=rstrip))
        tok.add_special_tokens(specials)
        return tok

    def _pieces_batch(self, texts):
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def _decode(self, ids):
        return self._tok.decode(ids, skip_special_tokens=True)


def _kind(directory, family, cfg, cfg_path):
    """transformers' tokenizer class for the directory: tokenizer_config.json's
    tokenizer_class, else config.json's, else the family's."""
    kind = cfg.get("tokenizer_class")
    where = cfg_path
    if kind is None:
        where = os.path.join(directory, "config.json")
        kind = _json_object(where, 1 << 20).get("tokenizer_class")
    if kind is None:
        if family == "m2m_100":
            has = {f: os.path.exists(os.path.join(directory, f))
                   for f in ("tokenizer.json", "vocab.json")}
            return "NllbTokenizer" if has["tokenizer.json"] and not has["vocab.json"] \
                else "M2M100Tokenizer"
        return _CLASSES[family][0]
    if not isinstance(kind, str):
        _fail(where, f"tokenizer_class must be a string, got {_io._short(kind)}")
    base = kind[:-4] if kind.endswith("Fast") else kind
    if base not in _CLASSES[family]:
        _fail(where, f"tokenizer_class {kind!r} is not one fastattn reads for {family} models "
                     f"({', '.join(_CLASSES[family])})")
    return base


def load_tokenizer(directory, arch):
    """The tokenizer of a pretrained model directory; reads only local files.

    Args:
        directory: the model directory (str or path-like).
        arch: the `Architecture` its config.json gave (`read_config`).

    Returns:
        The `PretrainedTokenizer`.

    Raises:
        FileNotFoundError: a missing tokenizer (the files it needs named).
        ValueError: a file that is refused (named).
        ImportError: sentencepiece / tokenizers missing (how to install them said).
    """
    directory = os.fspath(directory)
    family = arch.family
    if family not in _CLASSES:
        raise ValueError(f"no tokenizer for model family {family!r}")
    cfg, added, cfg_path = _config(directory)
    kind = _kind(directory, family, cfg, cfg_path)
    side = cfg.get("truncation_side", "right")
    if side not in ("right", "left"):
        _fail(cfg_path, f"truncation_side must be 'right' or 'left', got {_io._short(side)}")
    cls = _SentencePiece if kind in ("MarianTokenizer", "M2M100Tokenizer") else _Tokenizers
    tok = cls(family, kind, directory, arch, cfg, added, cfg_path)
    tok._cut_left = side == "left"
    return tok
