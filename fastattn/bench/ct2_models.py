"""The CTranslate2 twin of the generation cases. ctranslate2 is optional: it is imported here,
lazily, on first use, and a missing install raises Unavailable (the table shows "n/a").

- ``ct2_translator(model, compute_type)``: a ``ctranslate2.Translator`` computing the function of
  a fastattn Seq2SeqTransformer, built from its state_dict through ``ctranslate2.specs`` (no
  torch, no converter of another toolkit), CTranslate2 quantising the float32 weights itself
  for compute_type="int8";
- ``ct2_generate(translator, src, ...)``: greedy or beam search by CTranslate2's own decoder,
  laid out as Seq2SeqTransformer.generate's output (end_id=None: exactly max_new_tokens);
- ``ct2_score(translator, src, tgt)``: CTranslate2's teacher-forced log-probabilities.

How the model is represented (each point checked by tests/test_bench_ct2.py):

- token embeddings scaled by sqrt(C) (the spec's scale_embeddings) plus fastattn's own
  sinusoidal table given as the spec's position table (CTranslate2's built-in table has another
  layout: sin and cos halves concatenated, positions counted from 1);
- post-norm layers (norm_first=False) with nn.Transformer's final encoder and decoder norms: the
  specs only declare the final norm for pre-norm stacks, so they are built pre-norm and then
  switched to post-norm; CTranslate2 applies a present final norm either way. norm_first=True
  maps to pre-norm with its final norm, as nn.Transformer;
- self-attention's in_proj (q, k, v rows) is CTranslate2's fused projection; the
  cross-attention's splits into the query rows and the fused key/value rows;
- vocabularies are the strings "t0" .. "t{V-1}" (id i <-> "t{i}"); the start token is not
  stored in the model (decoder_start_token=None) but given per call as a one-token target
  prefix, so the first step is fed start_id at position 0, as in fastattn.generate; the
  configuration's unk/bos/eos tokens are "t0" (unused: no end token is searched for, see
  ct2_generate).
"""
import atexit
import os
import shutil
import tempfile

import numpy as np

from .. import get_num_threads
from .torch_models import Unavailable

__all__ = ["COMPUTE_TYPES", "optional_ctranslate2", "require_ctranslate2",
           "ctranslate2_version", "ct2_spec", "ct2_model_dir", "ct2_translator",
           "release_translators", "ct2_generate", "ct2_score", "token_strings"]

COMPUTE_TYPES = ("float32", "int8")

_ct2_cache = []
_dirs = {}          # id(model) -> (model, directory): the float32 conversion, kept for the run
_translators = {}   # (id(model), compute_type, inter, intra) -> (model, Translator)


def optional_ctranslate2():
    """The ctranslate2 module, or None when it is not installed (imported once, on first use)."""
    if not _ct2_cache:
        try:
            import ctranslate2
        except ImportError:
            ctranslate2 = None
        _ct2_cache.append(ctranslate2)
    return _ct2_cache[0]


def require_ctranslate2():
    """The ctranslate2 module; Unavailable when it is not installed."""
    ct2 = optional_ctranslate2()
    if ct2 is None:
        raise Unavailable("ctranslate2 is not installed (pip install ctranslate2)")
    return ct2


def ctranslate2_version():
    """The installed ctranslate2's version, or None without it."""
    ct2 = optional_ctranslate2()
    return None if ct2 is None else ct2.__version__


def token_strings(n):
    """The vocabulary of n ids: "t0" .. "t{n-1}".

    Args:
        n: the vocabulary size.

    Returns:
        The list of strings.
    """
    return [f"t{i}" for i in range(n)]


def _set_linear(spec, weight, bias):
    spec.weight = weight
    spec.bias = bias


def _set_norm(spec, w, prefix):
    spec.gamma = w[prefix + ".weight"]
    spec.beta = w[prefix + ".bias"]


def _set_attention(spec, w, prefix, C, self_attention):
    """torch's MultiheadAttention (in_proj rows q, k, v; out_proj) -> CTranslate2's linear list:
    self-attention [qkv, out], cross-attention [q, kv, out]."""
    wi, bi = w[prefix + ".in_proj_weight"], w[prefix + ".in_proj_bias"]     # (3C, C), (3C,)
    if self_attention:
        _set_linear(spec.linear[0], wi, bi)
    else:
        _set_linear(spec.linear[0], wi[:C], bi[:C])
        _set_linear(spec.linear[1], wi[C:], bi[C:])
    _set_linear(spec.linear[-1], w[prefix + ".out_proj.weight"], w[prefix + ".out_proj.bias"])


def _set_ffn(spec, w, prefix, norm):
    _set_norm(spec.layer_norm, w, f"{prefix}.{norm}")
    _set_linear(spec.linear_0, w[prefix + ".linear1.weight"], w[prefix + ".linear1.bias"])
    _set_linear(spec.linear_1, w[prefix + ".linear2.weight"], w[prefix + ".linear2.bias"])


def ct2_spec(model):
    """A ctranslate2.specs.TransformerSpec holding the weights of `model`, a fastattn
    Seq2SeqTransformer (float32 copies of its state_dict), its vocabularies registered and its
    configuration set (layer norm epsilon, no decoder start token).

    Args:
        model: a fastattn Seq2SeqTransformer.

    Returns:
        The spec.
    """
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec
    cfg = model.config
    C, H = cfg["emb_size"], cfg["nhead"]
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    if cfg["activation"] not in activations:
        raise ValueError(f"ct2_spec: activation {cfg['activation']!r} has no CTranslate2 "
                         f"equivalent here (relu or gelu)")
    w = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in model.state_dict().items()}
    pe = np.ascontiguousarray(model.positional_encoding.pe, dtype=np.float32)  # (max_len, C)

    # Built pre-norm so the specs declare the final layer norms; nn.Transformer has them in
    # both layouts, and CTranslate2 applies a present final norm whatever pre_norm says.
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg["num_encoder_layers"], cfg["num_decoder_layers"]), H, pre_norm=True,
        activation=activations[cfg["activation"]])
    enc, dec = spec.encoder, spec.decoder
    enc.pre_norm = dec.pre_norm = bool(cfg["norm_first"])

    enc.embeddings[0].weight = w["src_tok_emb.embedding.weight"]
    dec.embeddings.weight = w["tgt_tok_emb.embedding.weight"]
    enc.scale_embeddings = dec.scale_embeddings = True                  # x sqrt(C)
    enc.position_encodings.encodings = pe
    dec.position_encodings.encodings = pe.copy()
    for i, layer in enumerate(enc.layer):
        p = f"transformer.encoder.layers.{i}"
        _set_attention(layer.self_attention, w, p + ".self_attn", C, True)
        _set_norm(layer.self_attention.layer_norm, w, p + ".norm1")
        _set_ffn(layer.ffn, w, p, "norm2")
    for i, layer in enumerate(dec.layer):
        p = f"transformer.decoder.layers.{i}"
        _set_attention(layer.self_attention, w, p + ".self_attn", C, True)
        _set_norm(layer.self_attention.layer_norm, w, p + ".norm1")
        _set_attention(layer.attention, w, p + ".multihead_attn", C, False)
        _set_norm(layer.attention.layer_norm, w, p + ".norm2")
        _set_ffn(layer.ffn, w, p, "norm3")
    _set_norm(enc.layer_norm, w, "transformer.encoder.norm")
    _set_norm(dec.layer_norm, w, "transformer.decoder.norm")
    _set_linear(dec.projection, w["generator.weight"], w["generator.bias"])

    spec.register_source_vocabulary(token_strings(cfg["src_vocab_size"]))
    spec.register_target_vocabulary(token_strings(cfg["tgt_vocab_size"]))
    spec.config.layer_norm_epsilon = float(cfg["layer_norm_eps"])
    spec.config.decoder_start_token = None       # given per call: the target prefix
    spec.config.unk_token = spec.config.bos_token = spec.config.eos_token = "t0"
    return spec


@atexit.register
def _remove_dirs():
    for _, directory in _dirs.values():
        shutil.rmtree(directory, ignore_errors=True)
    _dirs.clear()


def ct2_model_dir(model, directory=None):
    """Convert a float32 model into a CTranslate2 model directory.

    Args:
        model: a fastattn Seq2SeqTransformer (float32).
        directory: where to write; None (the default) for a temporary directory, made once
            per model and removed when the process exits.

    Returns:
        The directory's path.
    """
    if directory is not None:
        spec = ct2_spec(model)
        spec.validate()
        spec.optimize(quantization="float32")
        spec.save(os.fspath(directory))
        return os.fspath(directory)
    cached = _dirs.get(id(model))
    if cached is not None and cached[0] is model:
        return cached[1]
    path = tempfile.mkdtemp(prefix="fastattn-ct2-")
    _dirs[id(model)] = (model, path)
    try:
        return ct2_model_dir(model, path)
    except BaseException:
        del _dirs[id(model)]
        shutil.rmtree(path, ignore_errors=True)
        raise


def _openmp_cap(n):
    """n threads, at most OMP_THREAD_LIMIT: CTranslate2 (4.8.5) asked for more intra threads
    than OpenMP starts returns wrong tokens (OMP_THREAD_LIMIT=1, intra_threads=2: greedy
    tokens that differ from its own 1-thread run); fastattn's kernels split their work over
    the threads actually started, so only CTranslate2 needs the cap."""
    limit = os.environ.get("OMP_THREAD_LIMIT", "").strip()
    return min(n, int(limit)) if limit.isdigit() and int(limit) > 0 else n


def release_translators():
    """Drop the cached translators, so that their threads end (the runner calls it after each
    case). Where torch is imported too, CTranslate2's OpenMP calls bind to the libgomp that
    fastattn loaded (torch puts it in the global symbol scope); each translator thread then
    holds a team of that runtime, and once its teams hold more threads than there are CPUs,
    libgomp stops spinning between regions in every team: each fastattn region then waits for
    a futex wake-up, which makes small calls (a one-row product, a decode step) several times
    slower until the translator's threads end."""
    _translators.clear()


def ct2_translator(model, compute_type, *, directory=None, inter_threads=1, intra_threads=None):
    """A ctranslate2.Translator (CPU) running `model`, a fastattn Seq2SeqTransformer, in
    compute_type "float32" or "int8" (CTranslate2 quantises the float32 weights when loading;
    its other CPU types pass through). intra_threads=None: fastattn.get_num_threads(); either
    is capped at OMP_THREAD_LIMIT (_openmp_cap). Built once per (model, compute_type, threads)
    when directory is None (see ct2_model_dir).

    Args:
        model: a fastattn Seq2SeqTransformer.
        compute_type: "float32" or "int8".
        directory: as ct2_model_dir's (default None).
        inter_threads: CTranslate2's inter_threads (default 1).
        intra_threads: CTranslate2's intra_threads (None, the default:
            fastattn.get_num_threads()).

    Returns:
        The ctranslate2.Translator.
    """
    ct2 = require_ctranslate2()
    intra = _openmp_cap(get_num_threads() if intra_threads is None else int(intra_threads))
    key = (id(model), compute_type, int(inter_threads), intra)
    cached = _translators.get(key) if directory is None else None
    if cached is not None and cached[0] is model:
        return cached[1]
    path = ct2_model_dir(model, directory)
    tr = ct2.Translator(path, device="cpu", compute_type=compute_type,
                        inter_threads=int(inter_threads), intra_threads=intra)
    if directory is None:
        _translators[key] = (model, tr)
    return tr


def _sources(src_ids):
    src = np.asarray(src_ids)
    if src.ndim != 2 or src.dtype.kind not in "iu":
        raise ValueError(f"expected (B, S) integer token ids, got {src.dtype} {src.shape}")
    return [[f"t{i}" for i in row] for row in src.tolist()]


def _ids(tokens):
    return [int(t[1:]) for t in tokens]


def ct2_generate(translator, src_ids, *, max_new_tokens, start_id, method="greedy",
                 beam_size=4, length_penalty=1.0):
    """Generate max_new_tokens tokens per source with CTranslate2's own search -> int64
    (B, 1 + max_new_tokens), each row start_id then the generated ids, as
    Seq2SeqTransformer.generate(..., end_id=None) returns them.

    The whole batch goes in one call (max_batch_size = B); no end token is searched for
    (end_token=[]) and max_decoding_length = max_new_tokens, so every row has exactly
    max_new_tokens tokens; sources are not truncated (max_input_length=0). Beam search keeps
    beam_size hypotheses and ranks the finished ones by summed log-probability /
    `length ** length_penalty`, fastattn.generate's formula (with no end token every hypothesis
    has the same length, so the penalty changes no choice in either). greedy is beam_size=1.

    Not offered: an end token. With one, the two would part: CTranslate2 leaves the end token
    out of a finished hypothesis's length, fastattn.generate counts it.

    Args:
        translator: a ct2_translator.
        src_ids: (B, S) source ids.
        max_new_tokens: the tokens generated per source.
        start_id: the decoder's first token.
        method: "greedy" (the default) or "beam".
        beam_size: beams for "beam" (default 4).
        length_penalty: beam search's length exponent (default 1.0).

    Returns:
        int64 (B, 1 + max_new_tokens).
    """
    if method not in ("greedy", "beam"):
        raise ValueError(f"ct2_generate: method must be 'greedy' or 'beam', got {method!r}")
    source = _sources(src_ids)
    B = len(source)
    if B == 0 or max_new_tokens == 0:
        return np.full((B, 1), start_id, dtype=np.int64)
    results = translator.translate_batch(
        source, [[f"t{start_id}"]] * B, max_batch_size=B,
        beam_size=beam_size if method == "beam" else 1, num_hypotheses=1,
        length_penalty=length_penalty, end_token=[], min_decoding_length=0,
        max_decoding_length=max_new_tokens, max_input_length=0)
    out = np.empty((B, 1 + max_new_tokens), dtype=np.int64)
    out[:, 0] = start_id
    for b, r in enumerate(results):
        hyp = r.hypotheses[0]
        if len(hyp) != max_new_tokens:
            raise RuntimeError(f"ct2_generate: CTranslate2 returned {len(hyp)} tokens for "
                               f"source {b}, expected {max_new_tokens}")
        out[b, 1:] = _ids(hyp)
    return out


def ct2_score(translator, src_ids, tgt_ids):
    """CTranslate2's teacher-forced log-probabilities: the decoder reads tgt_ids (B, T) (the
    first being the start token) and scores tgt_ids[:, 1:] -> float32 (B, T - 1), what
    log_softmax(model(src_ids, tgt_ids[:, :-1])) gives at those ids. (CTranslate2 also scores
    an end token after the last position; that score is dropped.)

    Args:
        translator: a ct2_translator.
        src_ids: (B, S) source ids.
        tgt_ids: (B, T) target ids, the start token first.

    Returns:
        float32 (B, T - 1) log-probabilities.
    """
    tgt = np.asarray(tgt_ids)
    results = translator.score_batch(_sources(src_ids), _sources(tgt), max_batch_size=len(tgt),
                                     max_input_length=0)
    T = tgt.shape[1] - 1
    return np.array([r.log_probs[:T] for r in results], dtype=np.float32).reshape(-1, T)
