"""A pretrained model directory's weights: safetensors only, checked against the architecture
before anything is read.

The tensors are the Hugging Face state dict's, under their own names (``model.encoder.layers.0.
self_attn.q_proj.weight``, ...; see expected_shapes). The encoder and the decoder each read
their own token table, model.encoder.embed_tokens.weight / model.decoder.embed_tokens.weight,
where the files hold it (transformers 5 unties them from model.shared when
tie_word_embeddings is false, and saves each); embeddings tied in the model are stored once,
so a table left out is, with shared embeddings, the first of model.shared.weight, the other
side's table and lm_head.weight that the files hold, and an output projection left out is the
decoder's token table. A missing
final_logits_bias is zeros (transformers does the same); Marian's sinusoidal position table,
which old files carry, is recomputed, not read.

pytorch_model.bin is a pickle: fastattn never unpickles it. Such a directory is refused with
the one command that converts it (transformers reads the pickle once, on a machine that trusts
the file, and writes model.safetensors beside it).
"""
import os

import numpy as np

from .. import io as _io

__all__ = ["read_weights", "expected_shapes", "CONVERT_COMMAND"]

CONVERT_COMMAND = ('python -c "from transformers import AutoModelForSeq2SeqLM as M; '
                   'M.from_pretrained({d}).save_pretrained({d}, safe_serialization=True)"')

_SHARED = ("model.shared.weight", "model.encoder.embed_tokens.weight",
           "model.decoder.embed_tokens.weight", "lm_head.weight")
_DTYPES = ("F32", "F16", "BF16")
_MAX_INDEX = 16 << 20


def _layer(prefix, d, f, cross):
    shapes = {}
    attns = ("self_attn", "encoder_attn") if cross else ("self_attn",)
    for a in attns:
        for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{prefix}{a}.{p}.weight"] = (d, d)
            shapes[f"{prefix}{a}.{p}.bias"] = (d,)
        shapes[f"{prefix}{a}_layer_norm.weight"] = (d,)
        shapes[f"{prefix}{a}_layer_norm.bias"] = (d,)
    shapes.update({f"{prefix}fc1.weight": (f, d), f"{prefix}fc1.bias": (f,),
                   f"{prefix}fc2.weight": (d, f), f"{prefix}fc2.bias": (d,),
                   f"{prefix}final_layer_norm.weight": (d,),
                   f"{prefix}final_layer_norm.bias": (d,)})
    return shapes


def expected_shapes(arch):
    """The shape of every tensor the architecture reads, under the Hugging Face names.

    They include the encoder's and the decoder's token tables (each filled in from the shared
    one when the files leave it out), lm_head.weight and final_logits_bias (its logits_bias;
    each filled in when the files leave it out).

    Args:
        arch: the `Architecture`.

    Returns:
        {name: shape tuple}.
    """
    d, f = arch.d_model, arch.dim_feedforward
    shapes = {"model.encoder.embed_tokens.weight": (arch.vocab_size, d),
              "model.decoder.embed_tokens.weight": (arch.decoder_vocab_size, d)}
    shapes["lm_head.weight"] = (arch.decoder_vocab_size, d)
    if arch.logits_bias:
        shapes["final_logits_bias"] = (1, arch.decoder_vocab_size)
    for side, n in (("encoder", arch.encoder_layers), ("decoder", arch.decoder_layers)):
        if arch.positions == "learned":
            shapes[f"model.{side}.embed_positions.weight"] = (arch.max_positions + 2, d)
        if arch.layernorm_embedding:
            shapes[f"model.{side}.layernorm_embedding.weight"] = (d,)
            shapes[f"model.{side}.layernorm_embedding.bias"] = (d,)
        if arch.norm_first:
            shapes[f"model.{side}.layer_norm.weight"] = (d,)
            shapes[f"model.{side}.layer_norm.bias"] = (d,)
        for i in range(n):
            shapes.update(_layer(f"model.{side}.layers.{i}.", d, f, side == "decoder"))
    return shapes


def _fail(path, what):
    raise ValueError(f"{path}: {what}")


def _files(directory):
    """{tensor name: file} from model.safetensors, or from the shards a
    model.safetensors.index.json names; the refusal of a pickle-only directory."""
    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, "rb") as f:
            data = f.read(_MAX_INDEX + 1)
        if len(data) > _MAX_INDEX:
            _fail(index, "is larger than 16 MiB: not a shard index")
        try:
            raw = _io._json(data.decode("utf-8"), index)
        except UnicodeDecodeError as exc:
            _fail(index, f"is not UTF-8 ({exc.reason} at byte {exc.start})")
        wmap = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            _fail(index, "has no weight_map of tensor names to shard files")
        files = {}
        for name, shard in wmap.items():
            if os.path.basename(shard) != shard or not shard.endswith(".safetensors"):
                _fail(index, f"names the shard {shard!r} for {name!r}: shards must be "
                             "safetensors files in the model directory")
            files[name] = os.path.join(directory, shard)
        return files
    if os.path.exists(single):
        return None
    for pickled in ("pytorch_model.bin", "pytorch_model.bin.index.json"):
        path = os.path.join(directory, pickled)
        if os.path.exists(path):
            _fail(path, "is a pickle, which fastattn never unpickles (it can run code); convert "
                        "the directory to safetensors once, where you trust the file:\n  "
                        + CONVERT_COMMAND.format(d=repr(directory)))
    raise FileNotFoundError(f"{directory}: no model.safetensors (or shard index) in the model "
                            "directory")


def read_weights(directory, arch):
    """Read every tensor `expected_shapes(arch)` lists from a directory's safetensors file(s).

    Each file's header is checked against its size, and every tensor's dtype and shape against
    the architecture, before any data is read.

    Args:
        directory: the model directory (str or path-like).
        arch: its `Architecture`.

    Returns:
        {Hugging Face name: float32 array}.

    Raises:
        FileNotFoundError: no model.safetensors (or shard index) in the directory.
        ValueError: a malformed or mismatched file or tensor (both named), or a
            pytorch_model.bin only (with the command that converts it).
    """
    directory = os.fspath(directory)
    where = _files(directory)
    want = expected_shapes(arch)
    opened = {}
    try:
        if where is None:
            path = os.path.join(directory, "model.safetensors")
            opened[path] = _io._open(path, "read_weights")
            where = {name: path for name in opened[path][1].tensors}
        else:
            for path in sorted(set(where.values())):
                opened[path] = _io._open(path, "read_weights")
            for name, path in where.items():
                if name not in opened[path][1].tensors:
                    _fail(path, f"holds no tensor {name!r}, which the shard index puts there")
        stored = {name: (path, opened[path][1].tensors[name]) for name, path in where.items()}

        def source(name):
            if name in stored:
                return name
            if name in _SHARED[1:3] and arch.share_embeddings:
                return next((n for n in _SHARED if n in stored), None)
            if name == "lm_head.weight" and arch.tie_output:
                table = "model.decoder.embed_tokens.weight"
                return source(table) if table != name else None
            return None

        plan = {}
        for name, shape in want.items():
            src = source(name)
            if src is None:
                if name == "final_logits_bias":
                    continue
                path = sorted(opened)[0]
                untied = " (tie_word_embeddings is false)" if name == "lm_head.weight" else ""
                _fail(path, f"has no tensor {name!r}, which a {arch.family} model of this "
                            f"configuration needs{untied}")
            path, (dtype, got, _, _) = stored[src]
            if dtype not in _DTYPES:
                _fail(path, f"tensor {src!r} is {dtype}: a weight must be F32, F16 or BF16")
            if tuple(got) != shape:
                _fail(path, f"tensor {src!r} has shape {tuple(got)}; config.json implies "
                            f"{shape} for {name!r}")
            plan[name] = (path, src)
        out = {}
        for name, (path, src) in plan.items():
            f, header = opened[path]
            out[name] = _io._read_tensor(f, header, src, path, "read_weights").astype(
                np.float32, copy=False)
        if arch.logits_bias and "final_logits_bias" not in out:
            out["final_logits_bias"] = np.zeros((1, arch.decoder_vocab_size), np.float32)
        return out
    finally:
        for f, _ in opened.values():
            f.close()
