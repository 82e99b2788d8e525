"""A pretrained model directory run by fastattn: `load_pretrained(path)` gives a `Translator`.

The model is fastattn's own Seq2SeqTransformer with the options the families need (see
fastattn.pretrained.config and Seq2SeqTransformer's docstring): nothing of transformers runs.
Its weights are the Hugging Face tensors under fastattn's names (``to_state_dict``): q, k and
v projections stacked into in_proj_weight, self_attn_layer_norm / encoder_attn_layer_norm /
final_layer_norm as norm1 / norm2 (/ norm3), fc1 / fc2 as linear1 / linear2, the token tables
copied to both embeddings where shared, lm_head as the generator with final_logits_bias (zeros
for M2M100) as its bias.

A directory ``Translator.save`` wrote (``fastattn-pretrained.json`` beside ``model.safetensors``
in fastattn's own format, float32 or quantized) loads without transformers, torch or the
tokenizer libraries; the tokenizer's files are copied with it, and texts (``translate``) need
the ``hf`` extra to read them.
"""
import dataclasses
import inspect
import json
import math
import numbers
import os
import shutil

import numpy as np

from .. import io as _io
from ..generate import MAX_BEAM_SIZE, _Decoding
from ..generate import hf as _search
from ..nn import Seq2SeqTransformer
from .config import Architecture, read_config
from .weights import read_weights

__all__ = ["load_pretrained", "Translator", "to_state_dict", "build_model", "is_model_dir",
           "MANIFEST"]

MANIFEST = "fastattn-pretrained.json"       # what Translator.save writes beside the weights
_MODEL_FILE = "model.safetensors"
_GEN_KEYS = ("max_length", "max_new_tokens", "num_beams", "length_penalty", "early_stopping",
             "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id",
             "decoder_start_token_id")
_MAX_JSON = 1 << 20
# the tokenizer files a converted directory keeps (whichever the source directory has)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "vocab.json", "merges.txt", "source.spm", "target.spm",
                    "sentencepiece.bpe.model", "added_tokens.json")


def _layer_state(out, w, src, dst, cross):
    """One Hugging Face layer's tensors (prefix src) under fastattn's names (prefix dst)."""
    attns = (("self_attn", "self_attn"), ("encoder_attn", "multihead_attn")) if cross else \
        (("self_attn", "self_attn"),)
    for hf, fa in attns:
        out[f"{dst}{fa}.in_proj_weight"] = np.concatenate(
            [w[f"{src}{hf}.{p}_proj.weight"] for p in "qkv"], axis=0)
        out[f"{dst}{fa}.in_proj_bias"] = np.concatenate(
            [w[f"{src}{hf}.{p}_proj.bias"] for p in "qkv"], axis=0)
        out[f"{dst}{fa}.out_proj.weight"] = w[f"{src}{hf}.out_proj.weight"]
        out[f"{dst}{fa}.out_proj.bias"] = w[f"{src}{hf}.out_proj.bias"]
    out[f"{dst}linear1.weight"], out[f"{dst}linear1.bias"] = w[src + "fc1.weight"], \
        w[src + "fc1.bias"]
    out[f"{dst}linear2.weight"], out[f"{dst}linear2.bias"] = w[src + "fc2.weight"], \
        w[src + "fc2.bias"]
    norms = ["self_attn_layer_norm"] + (["encoder_attn_layer_norm"] if cross else []) + \
        ["final_layer_norm"]
    for j, hf in enumerate(norms, 1):
        out[f"{dst}norm{j}.weight"] = w[f"{src}{hf}.weight"]
        out[f"{dst}norm{j}.bias"] = w[f"{src}{hf}.bias"]


def to_state_dict(arch, weights):
    """The state_dict of `build_model(arch)` from the Hugging Face tensors.

    Args:
        arch: the `Architecture`.
        weights: `read_weights`' {Hugging Face name: array}.

    Returns:
        {fastattn state_dict key: array}.
    """
    w = weights
    out = {}
    for side, n in (("encoder", arch.encoder_layers), ("decoder", arch.decoder_layers)):
        for i in range(n):
            _layer_state(out, w, f"model.{side}.layers.{i}.", f"transformer.{side}.layers.{i}.",
                         side == "decoder")
        if arch.norm_first:
            out[f"transformer.{side}.norm.weight"] = w[f"model.{side}.layer_norm.weight"]
            out[f"transformer.{side}.norm.bias"] = w[f"model.{side}.layer_norm.bias"]
    out["generator.weight"] = w["lm_head.weight"]
    out["generator.bias"] = (w["final_logits_bias"].reshape(-1) if arch.logits_bias else
                             np.zeros(arch.decoder_vocab_size, np.float32))
    out["src_tok_emb.embedding.weight"] = w["model.encoder.embed_tokens.weight"]
    out["tgt_tok_emb.embedding.weight"] = w["model.decoder.embed_tokens.weight"]
    for side, fa in (("encoder", "src"), ("decoder", "tgt")):
        if arch.positions == "learned":
            out[f"{fa}_pos_emb.weight"] = w[f"model.{side}.embed_positions.weight"]
        if arch.layernorm_embedding:
            out[f"{fa}_emb_norm.weight"] = w[f"model.{side}.layernorm_embedding.weight"]
            out[f"{fa}_emb_norm.bias"] = w[f"model.{side}.layernorm_embedding.bias"]
    return out


_POSITIONS = {"sinusoidal": "sinusoidal_halves", "sinusoidal_offset": "sinusoidal_padding",
              "learned": "learned"}


def model_config(arch):
    """The Seq2SeqTransformer keyword arguments of an Architecture."""
    return dict(num_encoder_layers=arch.encoder_layers, num_decoder_layers=arch.decoder_layers,
                emb_size=arch.d_model, nhead=arch.nhead, src_vocab_size=arch.vocab_size,
                tgt_vocab_size=arch.decoder_vocab_size, dim_feedforward=arch.dim_feedforward,
                dropout=0.0, activation=arch.activation, norm_first=arch.norm_first,
                layer_norm_eps=1e-5, pad_id=arch.pad_id, max_len=arch.max_positions,
                embed_scale=arch.embed_scale, positions=_POSITIONS[arch.positions],
                layernorm_embedding=arch.layernorm_embedding, final_norm=arch.norm_first,
                decoder_padding_mask=False, padding_idx=True)


def build_model(arch, weights=None, *, backend="fast"):
    """The Seq2SeqTransformer (eval mode) of an architecture.

    Args:
        arch: the `Architecture`.
        weights: `read_weights`' dict to load, or None (the default) for freshly initialised
            weights (torch's initialisation, seed 0).
        backend: "fast" (the default) or "reference".

    Returns:
        The `Seq2SeqTransformer`.
    """
    model = Seq2SeqTransformer(**model_config(arch), backend=backend, init="torch", seed=0)
    if weights is not None:
        model.load_state_dict(to_state_dict(arch, weights))
    return model.eval()


# ---- generation settings ----------------------------------------------------------------------

def _read_json(path):
    with open(path, "rb") as f:
        data = f.read(_MAX_JSON + 1)
    if len(data) > _MAX_JSON:
        raise ValueError(f"{path}: is larger than 1 MiB")
    try:
        raw = _io._json(data.decode("utf-8"), path)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(raw).__name__}")
    return raw


def _generation_defaults(directory, arch):
    """generation_config.json's settings these searches follow ({} without one); a
    ValueError naming the file and key for a value of the wrong kind."""
    path = os.path.join(directory, "generation_config.json")
    if not os.path.exists(path):
        return {}
    raw = _read_json(path)
    out = {}
    for key in _GEN_KEYS:
        v = raw.get(key)
        if v is None:
            continue
        ok = {"length_penalty": isinstance(v, (int, float)) and not isinstance(v, bool)
              and math.isfinite(v),
              "early_stopping": v in (True, False, "never"),
              "bad_words_ids": isinstance(v, list) and all(
                  isinstance(b, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                              for t in b) for b in v)}.get(
            key, isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        if not ok:
            raise ValueError(f"{path}: {key} = {v!r} is not a valid value")
        if key.endswith("token_id") and v >= arch.decoder_vocab_size:
            raise ValueError(f"{path}: {key} = {v} is outside the vocabulary of "
                             f"{arch.decoder_vocab_size} tokens")
        out[key] = v
    return out


def _check_int(name, v, lo, hi=None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo or \
            (hi is not None and v > hi):
        upper = "" if hi is None else f" and <= {hi}"
        raise ValueError(f"generate: {name} must be an int >= {lo}{upper}, got {v!r}")
    return int(v)


class Translator:
    """A pretrained encoder-decoder model: token ids or texts in (made by `load_pretrained`).

    - `logits(src_ids, tgt_ids)`: (B, T, V) float32, teacher-forced, as transformers'
      `model(input_ids, attention_mask, decoder_input_ids=tgt_ids).logits`;
    - `generate(src_ids, ...)`: a list of token lists (no decoder start token, no padding;
      the forced BOS and the final EOS tokens included, as transformers' output holds them);
    - `translate(texts, ...)`: a list of strings (the tokenizer's decode, special tokens
      skipped); needs the tokenizer (the `hf` extra).

    Args:
        model: the fastattn `Seq2SeqTransformer`, holding the weights.
        arch: its `Architecture`.
        directory: the model directory, where the tokenizer's files are read from; None (the
            default) for none.
        generation: the settings read from generation_config.json (the defaults of
            `generate`), or None (the default) for none.
        tokenizer: a tokenizer to use, or None (the default) to load the directory's on first
            use."""

    def __init__(self, model, arch, *, directory=None, generation=None, tokenizer=None):
        self.model, self.arch, self.directory = model, arch, directory
        self.generation = dict(generation or {})
        self._tokenizer = tokenizer

    def __repr__(self):
        a = self.arch
        return (f"Translator({a.family}, {a.encoder_layers}+{a.decoder_layers} layers, d_model "
                f"{a.d_model}, vocab {a.decoder_vocab_size}, {self.compute_type})")

    @property
    def compute_type(self):
        """The model's compute type ("float32", or the type its linear weights are quantized to)."""
        return self.model.compute_type

    @property
    def tokenizer(self):
        """The directory's tokenizer (loaded on first use; needs the ``hf`` extra)."""
        if self._tokenizer is None:
            if self.directory is None:
                raise ValueError("Translator: no model directory to read a tokenizer from")
            from .tokenizer import load_tokenizer
            self._tokenizer = load_tokenizer(self.directory, self.arch)
        return self._tokenizer

    # -- token ids ----------------------------------------------------------------------------
    def _src(self, src_ids, src_key_padding_mask):
        src = np.asarray(src_ids)
        if src.dtype.kind not in "iu" or src.ndim != 2:
            raise ValueError(f"src_ids must be (B, S) integer token ids, got "
                             f"{src.dtype} {src.shape}")
        if src.shape[1] > self.arch.max_positions:
            raise ValueError(f"src_ids: {src.shape[1]} tokens exceed the model's "
                             f"{self.arch.max_positions} positions")
        if src_key_padding_mask is None:
            kpm = src == self.arch.pad_id
        else:
            kpm = np.asarray(src_key_padding_mask)
            if kpm.shape != src.shape or kpm.dtype != bool:
                raise ValueError(f"src_key_padding_mask must be bool {src.shape} like src_ids, "
                                 f"got {kpm.dtype} {kpm.shape}")
        return src.astype(np.int64), kpm

    def logits(self, src_ids, tgt_ids, *, src_key_padding_mask=None):
        """Teacher-forced logits of a target given a source.

        The target sees every earlier position (its padding, at the end, changes no earlier
        position's logits).

        Args:
            src_ids: (B, S) integer source token ids.
            tgt_ids: (B, T) integer target token ids, the decoder's input (start token first).
            src_key_padding_mask: (B, S) bool, True = padding; None (the default) takes the
                source's padding from the pad id.

        Returns:
            (B, T, V) float32 logits.

        Raises:
            ValueError: ids of the wrong rank or type, or longer than the model's positions.
        """
        src, kpm = self._src(src_ids, src_key_padding_mask)
        tgt = np.asarray(tgt_ids)
        if tgt.ndim != 2 or tgt.shape[0] != src.shape[0] or tgt.dtype.kind not in "iu":
            raise ValueError(f"tgt_ids must be (B, T) integer token ids with B = "
                             f"{src.shape[0]}, got {tgt.dtype} {tgt.shape}")
        if tgt.shape[1] > self.arch.max_positions:
            raise ValueError(f"tgt_ids: {tgt.shape[1]} tokens exceed the model's "
                             f"{self.arch.max_positions} positions")
        return self.model(src, tgt.astype(np.int64), src_key_padding_mask=kpm)

    def _settings(self, beam_size, max_new_tokens, length_penalty, early_stopping,
                  decoder_start_id, forced_bos_id):
        g, a = self.generation, self.arch
        V = a.decoder_vocab_size
        beam = g.get("num_beams", 1) if beam_size is None else beam_size
        beam = _check_int("beam_size", beam, 1, min(MAX_BEAM_SIZE, V))
        if max_new_tokens is None:
            max_length = g["max_new_tokens"] + 1 if "max_new_tokens" in g else \
                g.get("max_length", a.max_positions)
        else:
            max_length = _check_int("max_new_tokens", max_new_tokens, 0) + 1
        if max_length - 1 > a.max_positions:
            raise ValueError(f"generate: {max_length - 1} new tokens exceed the model's "
                             f"{a.max_positions} positions (max_new_tokens)")
        lp = g.get("length_penalty", 1.0) if length_penalty is None else length_penalty
        if isinstance(lp, bool) or not isinstance(lp, numbers.Real) or not math.isfinite(lp):
            raise ValueError(f"generate: length_penalty must be a finite number, got {lp!r}")
        es = g.get("early_stopping", False) if early_stopping is None else early_stopping
        if es not in _search.EARLY_STOPPING or isinstance(es, (int, float)) and \
                not isinstance(es, bool):
            raise ValueError(f"generate: early_stopping must be True, False or 'never', got "
                             f"{es!r}")
        start = decoder_start_id if decoder_start_id is not None else \
            g.get("decoder_start_token_id", a.decoder_start_id)
        if start is None:                      # transformers falls back to the BOS token
            start = a.bos_id
        if start is None:
            raise ValueError(f"generate: this {a.family} model has no decoder start token "
                             "nor BOS token: give decoder_start_id")
        start = _check_int("decoder_start_id", start, 0, V - 1)
        fbos = forced_bos_id if forced_bos_id is not None else \
            g.get("forced_bos_token_id", a.forced_bos_id)
        if fbos is not None:
            fbos = _check_int("forced_bos_id", fbos, 0, V - 1)
        feos = g.get("forced_eos_token_id", a.forced_eos_id)
        banned = {a.pad_id} | {b[0] for b in g.get("bad_words_ids", ()) if len(b) == 1}
        rules = _search.Rules(max_length, a.eos_id, banned, fbos, feos)
        return beam, rules, float(lp), es, start

    def generate(self, src_ids, *, beam_size=None, max_new_tokens=None, length_penalty=None,
                 early_stopping=None, src_key_padding_mask=None, decoder_start_id=None,
                 forced_bos_id=None):
        """Token ids in, token ids out, by transformers' search rules (`fastattn.generate.hf`).

        Each default (None) is taken from generation_config.json, else the one given below.

        Args:
            src_ids: (B, S) integer token ids as the tokenizer makes them (right padding with
                the pad id).
            beam_size: the number of beams; 1 (the default) is greedy.
            max_new_tokens: the most tokens to generate (default: up to the model's max
                positions).
            length_penalty: beam search's length penalty (default 1.0).
            early_stopping: True, False (the default) or "never", as transformers'.
            src_key_padding_mask: (B, S) bool, True = padding; None (the default) takes it from
                the pad id.
            decoder_start_id: the decoder's first token (default: the config's).
            forced_bos_id: the token forced first (default: the config's, if any).

        Returns:
            B lists of generated ids (no decoder start token, no padding; the forced BOS and
                the final EOS included).

        Raises:
            ValueError: a bad option or ids, or more new tokens than the model's positions.
        """
        src, kpm = self._src(src_ids, src_key_padding_mask)
        k, rules, lp, es, start = self._settings(beam_size, max_new_tokens, length_penalty,
                                                 early_stopping, decoder_start_id,
                                                 forced_bos_id)
        B = src.shape[0]
        if B == 0:
            return []
        if rules.max_length <= 1:
            return [[] for _ in range(B)]
        cache = self.model.init_cache(src, kpm, beams=k, max_len=rules.max_length - 1)
        decoder = _Decoding(self.model, cache)
        if k == 1:
            return _search.greedy(decoder, B, rules, start_id=start)
        return _search.beam(decoder, B, k, rules, start_id=start, length_penalty=lp,
                            early_stopping=es)

    # -- texts --------------------------------------------------------------------------------
    def translate(self, texts, *, src_lang=None, tgt_lang=None, beam_size=None,
                  max_new_tokens=None, max_input_tokens=None, **generate_kwargs):
        """Texts in, texts out: tokenized, generated, and decoded with special tokens skipped.

        Needs the directory's tokenizer (the `hf` extra). mBART-cc25, which starts decoding
        with the language code instead of forcing it, takes
        `decoder_start_id=translator.tokenizer.lang_id(code)`.

        Args:
            texts: a list of strings.
            src_lang: the source language code (NLLB / M2M100 / mBART); None (the default) for
                models without one.
            tgt_lang: the target language code, forced as the first generated token as
                transformers' forced_bos_token_id (NLLB, M2M100, mBART-50); None (the default)
                for models without one.
            beam_size: as in `generate`.
            max_new_tokens: as in `generate`.
            max_input_tokens: inputs are cut to this many tokens (default: the model's
                positions).
            **generate_kwargs: passed on to `generate`.

        Returns:
            A list of strings, one per text.

        Raises:
            TypeError: `texts` is a single string.
        """
        if isinstance(texts, str):
            raise TypeError("translate: texts must be a list of strings, got a single str")
        texts = list(texts)
        if not texts:
            return []
        tok = self.tokenizer
        limit = self.arch.max_positions if max_input_tokens is None else \
            _check_int("max_input_tokens", max_input_tokens, 1, self.arch.max_positions)
        ids, kpm = tok.encode_batch(texts, src_lang=src_lang, max_length=limit)
        if tgt_lang is not None:
            generate_kwargs.setdefault("forced_bos_id", tok.lang_id(tgt_lang))
        out = self.generate(ids, src_key_padding_mask=kpm, beam_size=beam_size,
                            max_new_tokens=max_new_tokens, **generate_kwargs)
        return [tok.decode(row) for row in out]

    # -- quantized copies ---------------------------------------------------------------------
    def quantize(self, compute_type):
        """Quantize the model's linear weights in place (see `Module.quantize`).

        Args:
            compute_type: "int8", "bf16" or "bfloat16".

        Returns:
            self.
        """
        self.model.quantize(compute_type)
        return self

    def save(self, directory):
        """Write a directory `load_pretrained` reads without transformers or torch.

        It holds the model in fastattn's format (model.safetensors, as quantized),
        fastattn-pretrained.json (the architecture and generation settings) and the
        tokenizer's files, copied.

        Args:
            directory: the directory to write (created if needed).
        """
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        _io.save(self.model, os.path.join(directory, _MODEL_FILE))
        for name in _TOKENIZER_FILES if self.directory is not None else ():
            src = os.path.join(self.directory, name)
            if os.path.isfile(src) and os.path.realpath(src) != os.path.realpath(
                    os.path.join(directory, name)):
                shutil.copyfile(src, os.path.join(directory, name))
        manifest = {"format": "fastattn-pretrained", "version": 1,
                    "architecture": dataclasses.asdict(self.arch),
                    "generation": self.generation}
        tmp = os.path.join(directory, MANIFEST + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
        os.replace(tmp, os.path.join(directory, MANIFEST))
        return directory


def _load_converted(directory, compute_type, backend):
    path = os.path.join(directory, MANIFEST)
    raw = _read_json(path)
    fields = {f.name for f in dataclasses.fields(Architecture)}
    arch_raw = raw.get("architecture")
    if raw.get("format") != "fastattn-pretrained" or not isinstance(arch_raw, dict) or \
            set(arch_raw) != fields or not isinstance(raw.get("generation"), dict):
        raise ValueError(f"{path}: not a manifest Translator.save wrote (format, architecture "
                         "and generation expected)")
    arch = Architecture(**arch_raw)
    model = _io.load(os.path.join(directory, _MODEL_FILE), backend=backend,
                     compute_type=compute_type)
    want = model_config(arch)
    defaults = {k: v.default for k, v in
                inspect.signature(Seq2SeqTransformer.__init__).parameters.items()}
    got = {k: model.config.get(k, defaults.get(k)) for k in want if k != "dropout"}
    if any(got[k] != want[k] for k in got):
        bad = [k for k in got if got[k] != want[k]][:3]
        raise ValueError(f"{path}: the architecture contradicts {_MODEL_FILE}'s config "
                         f"({', '.join(f'{k}: {want[k]!r} vs {got[k]!r}' for k in bad)})")
    return Translator(model.eval(), arch, directory=directory, generation=raw["generation"])


def is_model_dir(path):
    """Whether `path` is a pretrained model directory `load_pretrained` takes.

    That is a config.json naming a model_type, or a directory `Translator.save` wrote; not a
    fastattn run directory.

    Args:
        path: a path (str or path-like).

    Returns:
        True or False.
    """
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return True
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        return False
    try:
        return "model_type" in _read_json(cfg)
    except (OSError, ValueError):
        return False


def load_pretrained(path, *, compute_type=None, backend="fast"):
    """Load a pretrained translation model directory as a `Translator`.

    Refusals name the file: an unsupported model_type or setting, a tensor missing or of the
    wrong shape, a truncated file, a pytorch_model.bin (never unpickled; the command that
    converts it is in the message).

    Args:
        path: a Hugging Face directory of a Marian / OPUS-MT, M2M100 / NLLB-200 (dense), BART
            or mBART model (config.json, model.safetensors, the tokenizer's files), or one that
            `Translator.save` wrote.
        compute_type: None (the default: float32; a saved directory as it was saved),
            "float32", "int8", "bf16" or "bfloat16" (the linear weights quantized once, while
            loading).
        backend: "fast" (the default, the C kernels) or "reference" (the NumPy twin).

    Returns:
        The `Translator`.

    Raises:
        FileNotFoundError: `path` is not a directory.
        ValueError: a bad `compute_type`, or a directory fastattn cannot load (the file and
            the problem named).
    """
    directory = os.fspath(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"load_pretrained: {directory} is not a directory")
    if compute_type is not None and compute_type not in _io.COMPUTE_TYPES:
        raise ValueError(f"load_pretrained: compute_type must be one of {_io.COMPUTE_TYPES}, "
                         f"got {compute_type!r}")
    if os.path.exists(os.path.join(directory, MANIFEST)):
        return _load_converted(directory, compute_type, backend)
    arch = read_config(directory)
    generation = _generation_defaults(directory, arch)
    model = build_model(arch, read_weights(directory, arch), backend=backend)
    if compute_type not in (None, "float32"):
        model.quantize(compute_type)
    return Translator(model, arch, directory=directory, generation=generation)
