"""The translator every runner shares: a run's model and tokenizers with one set of generation
options; texts in, one ``Result`` per text out, in order.

    tr = Translator.from_run(load_run("run"), batch_tokens=4096, method="greedy")
    results = tr.translate(["first line", "second line"])      # [Result(output, ...), ...]

How a list of texts is translated (``translate``; the file runner does the same per window):

1. each text is encoded alone (``encode``) with the run's source tokenizer, wrapped in
   <start> ... <end> when the tokenizer has them (as ``Seq2SeqTransformer.translate`` does);
   an empty text is not run through the model: its output is "" (as ``fastattn complete``);
2. a source longer than ``max_source_tokens`` (default: the model's max_len positions, which it
   cannot exceed; only the head of a long text is split: ``Tokenizer.encode_head``) is cut
   (``too_long="truncate"``: <start>, the first ids, <end>, as
   ``encode_batch(max_length=...)`` cuts; the result says ``truncated``) or not translated
   (``too_long="skip"``: the result has an ``error`` and no output);
3. the sources are sorted by length and cut into batches of at most ``batch_tokens`` padded
   source ids (``fastattn.train.batching.epoch_batches`` without shuffling: B * longest <=
   batch_tokens; a source over the budget alone is a batch of its own), so little of a batch
   is padding; the batches run in the order of their first text (``plan``);
4. each batch is padded on the right with a key padding mask and generated
   (``model.generate``), and each row decoded with the target tokenizer (specials dropped).

The outputs equal ``model.translate(texts, ...)``'s text for text (greedy and beam search:
a source's tokens do not depend on the others in its batch or on the padding; the tests
check it). Sampling draws from one generator per batch, seeded from (seed, the batch's ids),
so a batch repeats its draws, but a text's sample depends on its batch (seed=None: not
reproducible).

``run_state`` and ``run_from_state`` carry a run to another process (Ray's object store, a
Dask worker): the weights as NumPy arrays, the tokenizers and configs as plain data; the
rebuilt model uses the given arrays as its weights, without a copy (read-only arrays are fine
for inference).
"""
from __future__ import annotations

import hashlib
import json
import numbers
import zlib
from typing import NamedTuple, Optional

import numpy as np

from .. import tokenizers
from ..nn import Seq2SeqTransformer
from ..ops import QuantizedWeight
from ..train.batching import check_budget, epoch_batches

__all__ = ["Translator", "Result", "DEFAULT_BATCH_TOKENS", "TOO_LONG", "run_state",
           "run_from_state", "run_hash", "record", "PretrainedRun", "load_any"]

DEFAULT_BATCH_TOKENS = 4096      # padded source ids per generated batch
TOO_LONG = ("truncate", "skip")
DEFAULT_MAX_NEW_TOKENS = 64      # as Run.complete and Seq2SeqTransformer.translate
SKIP_COUNT = 4096                # too_long="skip" counts tokens up to this (or 4x the limit)


class Result(NamedTuple):
    """One text's result (a named tuple).

    Args:
        output: the translation, or None when it was not translated.
        error: why not, else None (the default).
        truncated: its source was cut to max_source_tokens (default False).
        source_tokens: ids the model read (default 0).
        tokens: ids it generated, <end> included (default 0).
    """
    output: Optional[str]
    error: Optional[str] = None
    truncated: bool = False
    source_tokens: int = 0
    tokens: int = 0


class Translator:
    """A model, its tokenizers and the options of one translation job (see the module
    docstring). Every option is checked here, before any text is read.

    Args:
        model: a `Seq2SeqTransformer`.
        src_tokenizer: encodes the sources.
        tgt_tokenizer: decodes the outputs.
        batch_tokens: the most padded source ids per batch (default 4096).
        too_long: "truncate" (the default) or "skip", for a source longer than
            max_source_tokens.
        max_source_tokens: the longest source; None (the default) for the model's max_len.
        **generate_kwargs: passed to `model.generate` (method, max_new_tokens, beam_size,
            temperature, top_k, top_p, seed, ...); start_id, end_id and pad_id default to the
            target tokenizer's specials and max_new_tokens to 64.

    Raises:
        ValueError: a bad option (named).
        TypeError: an option of the wrong type (named)."""

    def __init__(self, model, src_tokenizer, tgt_tokenizer, *, batch_tokens=DEFAULT_BATCH_TOKENS,
                 too_long="truncate", max_source_tokens=None, **generate_kwargs):
        from ..pretrained import Translator as Pretrained
        self.pretrained = None
        if isinstance(model, Pretrained):
            self._init_pretrained(model, batch_tokens, too_long, max_source_tokens,
                                  generate_kwargs)
            return
        if not isinstance(model, Seq2SeqTransformer):
            raise TypeError(f"model must be a Seq2SeqTransformer, got {type(model).__name__}")
        for side, tok in (("src", src_tokenizer), ("tgt", tgt_tokenizer)):
            size = model.config[f"{side}_vocab_size"]
            if tok.vocab_size != size:
                raise ValueError(f"{side}_tokenizer does not match the model: it has "
                                 f"{tok.vocab_size} tokens, the model's {side}_vocab_size is "
                                 f"{size}")
        self.model, self.src, self.tgt = model, src_tokenizer, tgt_tokenizer
        self.batch_tokens = check_budget(batch_tokens)
        if too_long not in TOO_LONG:
            raise ValueError(f"too_long must be one of {', '.join(map(repr, TOO_LONG))}, got "
                             f"{too_long!r}")
        self.too_long = too_long
        self.add_start_end = src_tokenizer.start_id is not None and \
            src_tokenizer.end_id is not None
        self.max_source_tokens = _max_source(max_source_tokens, model.max_len,
                                             2 if self.add_start_end else 1)
        t = tgt_tokenizer
        kw = dict(start_id=t.start_id, end_id=t.end_id,
                  pad_id=t.pad_id if t.pad_id is not None else 0,
                  max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
        kw.update(generate_kwargs)
        if kw["start_id"] is None:
            raise ValueError("the target tokenizer has no <start> token; pass start_id")
        seed = kw.pop("seed", None)
        if seed is not None and (not isinstance(seed, numbers.Integral) or
                                 isinstance(seed, bool) or seed < 0):
            raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}")
        model.generate(np.zeros((0, 1), np.int64), **kw)    # checks every option, runs nothing
        self.seed = None if seed is None else int(seed)
        self.generate_kwargs = kw
        if src_tokenizer.pad_id is None:
            raise ValueError("the source tokenizer has no <pad> token to pad batches with")
        self.pad_id = src_tokenizer.pad_id

    def _init_pretrained(self, tr, batch_tokens, too_long, max_source_tokens, kw):
        """A pretrained model (fastattn.pretrained.Translator): its own tokenizer, searched
        by transformers' rules (greedy, or beam with beam_size); src_lang / tgt_lang for the
        multilingual families."""
        self.pretrained, self.model = tr, tr.model
        self.batch_tokens = check_budget(batch_tokens)
        if too_long not in TOO_LONG:
            raise ValueError(f"too_long must be one of {', '.join(map(repr, TOO_LONG))}, got "
                             f"{too_long!r}")
        self.too_long = too_long
        kw = dict(kw)
        method = kw.pop("method", "greedy")
        if method not in ("greedy", "beam"):
            raise ValueError(f"method {method!r}: a pretrained model is searched by "
                             "transformers' greedy or beam rules (method 'greedy' or 'beam')")
        beam = kw.pop("beam_size", 4)
        beam = beam if method == "beam" else 1
        unknown = sorted(set(kw) - {"max_new_tokens", "src_lang", "tgt_lang", "length_penalty",
                                    "early_stopping", "seed"})
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not options of a pretrained model's "
                             "search (method, beam_size, max_new_tokens, length_penalty, "
                             "early_stopping, src_lang, tgt_lang)")
        kw.pop("seed", None)                        # greedy and beam draw nothing
        kw.setdefault("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        self.tok = tr.tokenizer
        self.src_lang, self.tgt_lang = kw.pop("src_lang", None), kw.pop("tgt_lang", None)
        search = dict(beam_size=beam, **kw)
        self.generate_kwargs = dict(method=method, src_lang=self.src_lang,
                                    tgt_lang=self.tgt_lang, **search)
        if self.tgt_lang is not None:
            search["forced_bos_id"] = self.tok.lang_id(self.tgt_lang)
        if self.src_lang is not None:
            self.tok.encode_batch([""], src_lang=self.src_lang)          # a known code?
        tr.generate(np.zeros((0, 1), np.int64), **search)    # checks every option, runs nothing
        self._search = search
        self.seed, self.add_start_end = None, False
        self.max_source_tokens = _max_source(max_source_tokens, tr.arch.max_positions, 1)
        self.pad_id = tr.arch.pad_id

    @classmethod
    def from_run(cls, run, **options):
        """A Translator over a loaded run or pretrained model.

        Args:
            run: a `fastattn.train.run.Run` or a `PretrainedRun`.
            **options: the Translator's options (batch_tokens, too_long, ... and generate's).

        Returns:
            The `Translator`.
        """
        if isinstance(run, PretrainedRun):
            return cls(run.translator, None, None, **options)
        return cls(run.model, run.src_tokenizer, run.tgt_tokenizer, **options)

    def options(self):
        """The options that decide the outputs, as JSON-ready data (the file runner keeps them
        to refuse resuming a file with other options)."""
        return dict(batch_tokens=self.batch_tokens, too_long=self.too_long,
                    max_source_tokens=self.max_source_tokens, seed=self.seed,
                    **self.generate_kwargs)

    # -- one text ------------------------------------------------------------------------------
    def encode(self, text):
        """Encode one source text.

        Args:
            text: the source.

        Returns:
            `(ids, truncated, error)`: ids None for a text that is not run through the model
                (empty: error None; too long with too_long="skip": the error).
        """
        if not text:
            return None, False, None
        if self.pretrained is not None:
            return self._encode_pretrained(text)
        # only the head of a long text is split into tokens (a line of millions of
        # characters costs what its first max_source_tokens do); the ids are encode()'s
        limit, wrap = self.max_source_tokens, 2 if self.add_start_end else 0
        ids, more = self.src.encode_head(text, limit - wrap)
        if more and self.too_long == "skip":
            most = max(SKIP_COUNT, 4 * limit)                  # tokens counted, at most
            counted, beyond = self.src.encode_head(text, most - wrap)
            count = f"more than {most}" if beyond else f"{len(counted) + wrap}"
            return None, False, (f"too long: {count} source tokens, at most {limit} "
                                 f"(too_long='skip')")
        if self.add_start_end:
            ids = [self.src.start_id] + ids + [self.src.end_id]
        if not ids:                # no token, and no <start> <end> to wrap it: nothing to read
            return None, False, None
        return ids, more, None

    def _encode_pretrained(self, text):
        """encode() with a pretrained model's tokenizer, which cuts a source itself (its
        special tokens kept)."""
        limit = self.max_source_tokens
        ids = self.tok.encode_batch([text], src_lang=self.src_lang, max_length=limit + 1)[0][0]
        if len(ids) <= limit:
            return ids.tolist(), False, None
        if self.too_long == "skip":
            return None, False, (f"too long: more than {limit} source tokens "
                                 f"(too_long='skip')")
        return self.tok.encode_batch([text], src_lang=self.src_lang,
                                     max_length=limit)[0][0].tolist(), True, None

    # -- batches -------------------------------------------------------------------------------
    def beams(self):
        """Decoder rows per source: beam_size with beam search, else 1."""
        if self.pretrained is not None:
            return self._search["beam_size"]
        kw = self.generate_kwargs
        return kw.get("beam_size", 4) if kw.get("method", "greedy") == "beam" else 1

    def plan(self, lengths):
        """Cut sources into batches of similar lengths under the token budget.

        A beam of k slots decodes k rows per source, so with beam search a source counts k
        times (B * k * longest <= batch_tokens): the decoder's state stays what greedy's
        batches hold, whatever the beam (the outputs do not depend on the batches).

        Args:
            lengths: the sources' lengths, in ids.

        Returns:
            int64 index arrays into `lengths`, sorted by length within a batch, each under
                batch_tokens padded ids, in the order of their first index.
        """
        if len(lengths) == 0:
            return []
        k = self.beams()
        lengths = np.asarray(lengths, dtype=np.int64) * k
        batches = epoch_batches(lengths, lengths, self.batch_tokens, window=len(lengths),
                                shuffle=False)
        return sorted(batches, key=lambda b: int(b.min()))

    def generate(self, rows):
        """Run the model on encoded sources.

        Args:
            rows: source id lists.

        Returns:
            `(outputs, generated token counts)`, one per row, in order.
        """
        B, S = len(rows), max(map(len, rows))
        ids = np.full((B, S), self.pad_id, dtype=np.int64)
        for b, r in enumerate(rows):
            ids[b, :len(r)] = r
        if self.pretrained is not None:
            kpm = np.arange(S)[None, :] >= np.array([len(r) for r in rows])[:, None]
            out = self.pretrained.generate(ids, src_key_padding_mask=kpm, **self._search)
            return [self.tok.decode(r) for r in out], [len(r) for r in out]
        kw = self.generate_kwargs
        if kw.get("method") == "sample" and self.seed is not None:
            kw = dict(kw, seed=[self.seed, zlib.crc32(ids.tobytes())])
        out = self.model.generate(ids, src_key_padding_mask=ids == self.pad_id, **kw)
        counts = _generated(out, kw["end_id"])
        # decoded up to <end>: the padding after it is specials, dropped by decode anyway
        return [self.tgt.decode(row[:1 + n]) for row, n in zip(out.tolist(), counts)], counts

    def translate(self, texts):
        """Translate texts.

        Args:
            texts: the sources (str; anything else gives an error result).

        Returns:
            One `Result` per text, in order.
        """
        results, encoded = [None] * len(texts), {}
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                results[i] = Result(None, f"the source must be a str, got "
                                          f"{type(text).__name__}")
                continue
            ids, truncated, error = self.encode(text)
            if ids is None:
                results[i] = Result(None if error else "", error)
            else:
                encoded[i] = (ids, truncated)
        todo = list(encoded)
        for batch in self.plan([len(encoded[i][0]) for i in todo]):
            rows = [todo[j] for j in batch]
            outputs, counts = self.generate([encoded[i][0] for i in rows])
            for i, output, n in zip(rows, outputs, counts):
                ids, truncated = encoded[i]
                results[i] = Result(output, None, truncated, len(ids), n)
        return results


def record(source, result, line_id=None):
    """The output record of one source.

    Args:
        source: the source text.
        result: its `Result`.
        line_id: the record's "id", or None (the default) for none.

    Returns:
        {"id" (when given), "source", "output"}, plus "truncated": true for a cut source and
            "error" for one not translated.
    """
    rec = {} if line_id is None else {"id": line_id}
    rec.update(source=source, output=result.output)
    if result.truncated:
        rec["truncated"] = True
    if result.error is not None:
        rec["error"] = result.error
    return rec


def _max_source(value, model_max, least):
    if value is None:
        return model_max
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or \
            not least <= value <= model_max:
        raise ValueError(f"max_source_tokens must be an int in [{least}, {model_max}] (the "
                         f"model's max_len), got {value!r}")
    return int(value)


def _generated(out, end_id):
    """Generated ids per row of generate's (B, T) output (start token excluded, <end>
    included, the padding after it not)."""
    gen = out[:, 1:]
    if end_id is None or gen.shape[1] == 0:
        return [gen.shape[1]] * len(out)
    ended = gen == end_id
    return np.where(ended.any(axis=1), ended.argmax(axis=1) + 1, gen.shape[1]).tolist()


# ---- a run as plain data, for other processes -------------------------------------------------

class PretrainedRun:
    """A pretrained model directory (fastattn.pretrained.load_pretrained) as the runners take
    a run: ``path``, ``translator`` (the pretrained Translator) and its ``model``.

    Args:
        path: the model directory.
        translator: its `fastattn.pretrained.Translator`.
    """

    def __init__(self, path, translator):
        self.path, self.translator, self.model = path, translator, translator.model


def load_any(path, *, compute_type=None):
    """Load a run directory or a pretrained model directory.

    Args:
        path: a run directory (fastattn train's), or a pretrained model directory (a Hugging
            Face one, or one Translator.save wrote).
        compute_type: the weights' compute type on loading; None (the default) keeps the
            stored one.

    Returns:
        A `Run`, or a `PretrainedRun`.
    """
    from ..pretrained import is_model_dir, load_pretrained
    from ..train.run import load_run

    if is_model_dir(path):
        return PretrainedRun(path, load_pretrained(path, compute_type=compute_type))
    return load_run(path, compute_type=compute_type)


def run_hash(run):
    """SHA-256 (hex) of what decides a run's outputs: the model's config, weights and compute
    type (quantized weights hash as their dequantized values), and both tokenizers (a
    pretrained model: its architecture, generation settings and tokenizer files).

    Args:
        run: a loaded `Run` or `PretrainedRun`.

    Returns:
        The hex digest.
    """
    h = hashlib.sha256()
    if isinstance(run, PretrainedRun):
        import dataclasses
        import os

        from ..pretrained.model import _TOKENIZER_FILES
        tr = run.translator
        h.update(json.dumps([dataclasses.asdict(tr.arch), tr.generation], sort_keys=True,
                            default=str).encode())
        for name in _TOKENIZER_FILES:
            p = os.path.join(run.path, name)
            if os.path.isfile(p):
                with open(p, "rb") as f:
                    h.update(name.encode() + hashlib.sha256(f.read()).digest())
    h.update(json.dumps(run.model.config, sort_keys=True).encode())
    h.update(run.model.compute_type.encode())
    for key, arr in run.model.state_dict().items():
        h.update(key.encode())
        h.update(np.ascontiguousarray(arr).view(np.uint8))
    if isinstance(run, PretrainedRun):
        return h.hexdigest()
    for tok in (run.src_tokenizer, run.tgt_tokenizer):
        h.update(json.dumps(tok.to_dict(), sort_keys=True).encode())
    return h.hexdigest()


def run_state(run):
    """A loaded run as plain data: {"config", "compute_type", "weights" (the parameters'
    arrays as stored: a quantized weight as its int8 data plus "<key>_scale", or its bf16
    bits), "src_tokenizer", "tgt_tokenizer" (their to_dict()), "run_config", "path"}. A
    pretrained model travels as its directory's path and compute type: the workers read the
    directory themselves (on a filesystem they share with the driver).

    Args:
        run: a loaded `Run` or `PretrainedRun`.

    Returns:
        The state, a dict of plain data.
    """
    if isinstance(run, PretrainedRun):
        return {"pretrained": run.path, "compute_type": run.model.compute_type}
    weights = {}
    for key, value in run.model.named_parameters():
        if isinstance(value, QuantizedWeight):
            weights[key] = value.data
            if value.scale is not None:
                weights[key + "_scale"] = value.scale
        else:
            weights[key] = value
    return {"config": dict(run.model.config), "compute_type": run.model.compute_type,
            "weights": weights, "src_tokenizer": run.src_tokenizer.to_dict(),
            "tgt_tokenizer": run.tgt_tokenizer.to_dict(), "run_config": run.config,
            "path": run.path}


def run_from_state(state):
    """The Run that `run_state` described.

    Args:
        state: what `run_state` returned.

    Returns:
        The run, its model in eval mode with the given arrays as its weights (no copy; they
            may be read-only).
    """
    from ..train.run import Run

    if "pretrained" in state:
        from ..pretrained import load_pretrained
        return PretrainedRun(state["pretrained"], load_pretrained(
            state["pretrained"], compute_type=state["compute_type"]))
    model = Seq2SeqTransformer(**state["config"]).eval()
    weights, compute_type = state["weights"], state.get("compute_type", "float32")
    quantized = {}
    for key, module, name in model._named_slots():
        own, given = getattr(module, name), weights[key]
        if compute_type != "float32" and name in module._quantizable:
            quantized[key] = QuantizedWeight.from_stored(compute_type, given,
                                                         weights.get(key + "_scale"))
            continue
        if given.shape != own.shape or given.dtype != np.float32 or \
                not given.flags.c_contiguous:
            raise ValueError(f"run_from_state: {key} must be C-contiguous float32 "
                             f"{own.shape}, got {given.dtype} {given.shape}")
        setattr(module, name, given)
    if quantized:
        model._set_quantized(quantized)
    else:
        model.invalidate_caches()
    src = tokenizers.Tokenizer.from_dict(state["src_tokenizer"], where="src_tokenizer")
    tgt = tokenizers.Tokenizer.from_dict(state["tgt_tokenizer"], where="tgt_tokenizer")
    return Run(state["path"], model, src, tgt, state["run_config"])
