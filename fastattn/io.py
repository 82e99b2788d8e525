"""Save and load models as safetensors files; nothing is ever unpickled.

The file holds the model's state_dict (torch's keys and layouts, float32) and, in its text
metadata, the class name and constructor config, so ``load(path)`` rebuilds the right class:

```python
fastattn.io.save(model, "model.safetensors")
model = fastattn.io.load("model.safetensors", backend="fast")
```

A weight file is untrusted input. ``load`` reads only the header first (8-byte length, JSON)
and checks it against the file's real size; it then validates the stored config (types,
positive sizes) and compares the tensors that config implies (``state_dict_shapes``) with the
header's names, shapes and dtypes. Only then is a model built and the data read, so a file
that lies about its sizes costs no more memory than the file itself.

Errors are ValueError with the file and the problem named: not a safetensors file (truncated,
sizes or offsets that do not fit the file, a header that is not UTF-8 JSON), a directory or an
empty file, not written by fastattn, a config that does not build a model, a missing or
unexpected tensor, a tensor of the wrong shape or dtype. A missing file is FileNotFoundError.

Dtypes: float32 is loaded as is; float16, bfloat16 and float64 are converted to float32 (a
float64 value outside float32's range is refused, not turned into inf); integer, bool and other
tensors are refused, since every entry of a float32 fastattn state_dict is a float parameter.

Quantized models (``model.quantize("int8" | "bf16")``) are saved as they are: the metadata
says ``compute_type``; an int8 linear weight is an I8 tensor under its own key plus a float32
``<key>_scale`` tensor (one scale per output row); a bf16 one is a BF16 tensor. Loading one
never requantizes: the stored values are the model's. ``load(path, compute_type=...)``
converts once while loading: a float32 file to "int8" or "bf16" (quantized from the float32
weights), a quantized file to "float32" (dequantized); int8 <-> bf16 is refused (it would
quantize twice).
"""
import json
import os

import numpy as np

from . import nn, ops
from .nn.module import COMPUTE_TYPES

FORMAT = "fastattn/1"
BACKENDS = ("fast", "reference")
SAVABLE = {"Transformer": nn.Transformer, "Seq2SeqTransformer": nn.Seq2SeqTransformer}

__all__ = ["save", "load", "read_state_dict", "save_state_dict", "state_dict_shapes"]

# safetensors dtype -> (NumPy dtype, little-endian, or None where NumPy has none; item bytes)
DTYPES = {
    "BOOL": ("?", 1), "U8": ("u1", 1), "I8": ("i1", 1), "U16": ("<u2", 2), "I16": ("<i2", 2),
    "U32": ("<u4", 4), "I32": ("<i4", 4), "U64": ("<u8", 8), "I64": ("<i8", 8),
    "F16": ("<f2", 2), "BF16": (None, 2), "F32": ("<f4", 4), "F64": ("<f8", 8),
    "C64": ("<c8", 8), "F8_E5M2": (None, 1), "F8_E4M3": (None, 1), "F8_E8M0": (None, 1),
}
CONVERTED = ("F16", "BF16", "F64")        # widened or rounded to float32 by load
MAX_HEADER = 100_000_000                  # bytes; the safetensors library's own limit
PE_FLOATS = 1 << 24                       # positional table always allowed (64 MiB float32)
LISTED = 5                                # problems of each kind named in an error
SCALE = "_scale"                          # suffix of an int8 weight's per-row scales
# what a quantized linear weight is stored as, per compute type
QUANTIZED = {"int8": "I8", "bf16": "BF16", "bfloat16": "BF16"}
# the file save writes beside its target before renaming it: .fastattn-<random>.tmp
TEMPORARY_PREFIX, TEMPORARY_SUFFIX = ".fastattn-", ".tmp"


def save(model, path):
    """Write a model to a safetensors file.

    The file is written beside `path` and renamed over it, so a reader never sees half a file;
    its permissions follow the umask, as `open()` gives. The metadata holds the class name and
    the constructor config, so `load` rebuilds the model.

    Args:
        model: a `Transformer` or `Seq2SeqTransformer`, float32 or quantized to one compute
            type.
        path: the file to write (str or path-like); replaced if it exists.

    Raises:
        TypeError: `model` is not a Transformer or Seq2SeqTransformer.
        ValueError: the stored config cannot rebuild the model (a `custom_encoder` /
            `custom_decoder`, an activation that is a plain Python function), or its parts
            were quantized to different types.
    """
    name = type(model).__name__
    if name not in SAVABLE or not isinstance(model, SAVABLE[name]):
        raise TypeError(f"save: can save {', '.join(SAVABLE)}, got {type(model).__name__}")
    custom = getattr(model, "custom_parts", ())
    if custom:
        raise ValueError(f"save: this {name} was built with {' and '.join(custom)}, which "
                         "its config cannot rebuild; save model.state_dict() yourself")
    if not isinstance(model.config["activation"], str):
        raise ValueError(f"save: activation is the Python callable "
                         f"{model.config['activation']!r}, which a file cannot hold (torch's "
                         "relu / gelu callables are saved by name; any other is not)")
    compute_type = model.compute_type
    if compute_type == "mixed":
        raise ValueError("save: parts of the model were quantized to different types; "
                         "quantize() the whole model to one type first")
    tensors = {}                                      # key -> (safetensors dtype, array)
    for k, v in model.named_parameters():
        if isinstance(v, ops.QuantizedWeight):
            tensors[k] = (QUANTIZED[v.dtype], v.data)
            if v.dtype == "int8":
                tensors[k + SCALE] = ("F32", v.scale)
        else:
            tensors[k] = ("F32", np.asarray(v, np.float32))
    metadata = {"format": FORMAT, "class": name, "config": json.dumps(model.config)}
    if compute_type != "float32":
        metadata["compute_type"] = compute_type
    _write(os.fspath(path), tensors, metadata)


def save_state_dict(state_dict, path, metadata=None):
    """Write a dict of NumPy arrays as a safetensors file (what `read_state_dict` reads back).

    The file is written beside `path` and renamed over it. Each array keeps its dtype, under
    its safetensors name (float32 F32, int64 I64, ...). The file's permissions follow the
    umask, as `open()` gives (the safetensors library's writer makes it 0600).

    Args:
        state_dict: {key: NumPy array}.
        path: the file to write (str or path-like).
        metadata: {str: str} text metadata to store, or None (the default) for none.

    Raises:
        ValueError: an array's dtype has no safetensors name.
    """
    tensors = {}
    for key, arr in state_dict.items():
        arr = np.asarray(arr)
        name = _NUMPY_DTYPES.get(arr.dtype.newbyteorder("<"))
        if name is None:
            raise ValueError(f"save_state_dict: {_short(key)} has dtype {arr.dtype}, which "
                             "safetensors does not hold")
        tensors[key] = (name, arr)
    _write(os.fspath(path), tensors, dict(metadata or {}))


_NUMPY_DTYPES = {np.dtype(code): name for name, (code, _) in DTYPES.items() if code is not None}


def create_temporary(folder, prefix, suffix=""):
    """(fd, path) of a new file named prefix + random + suffix in `folder`, opened for
    writing (binary). Unlike tempfile.mkstemp (always 0600) its permissions follow the
    umask, as open() gives, so a file renamed into place reads like its neighbours."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        path = os.path.join(folder, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue


def _write(path, tensors, metadata):
    """A safetensors file of tensors {key: (dtype, array)} (the safetensors library's NumPy
    writer has no bfloat16): 8-byte little-endian header length, the JSON header padded with
    spaces to a multiple of 8, then the tensors' bytes in key order, little-endian."""
    header, at = {"__metadata__": metadata}, 0
    for k, (dtype, arr) in tensors.items():
        header[k] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [at, at + arr.nbytes]}
        at += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = create_temporary(folder, TEMPORARY_PREFIX, TEMPORARY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for _, arr in tensors.values():
                little = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
                f.write(np.ascontiguousarray(little).data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- the header: read and checked against the file, no tensor data touched -----------------

def _short(value, n=60):
    r = repr(value)
    return r if len(r) <= n else r[:n] + "..."


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {_short(k)}")
        d[k] = v
    return d


def _json(text, what):
    """json.loads that refuses duplicate keys and reports deep nesting as ValueError."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


class _Header:
    """A checked safetensors header: tensors {name: (dtype, shape, begin, end)} with byte
    ranges relative to data_start, metadata {str: str}."""

    def __init__(self, tensors, metadata, data_start):
        self.tensors, self.metadata, self.data_start = tensors, metadata, data_start


def _read_header(f, size):
    """Parse and check the header of the open file `f` of `size` bytes; ValueError (without
    the file name, which the caller adds) on anything that does not fit."""
    if size == 0:
        raise ValueError("the file is empty")
    if size < 8:
        raise ValueError(f"the file has {size} bytes, fewer than the 8-byte header length "
                         "(truncated?)")
    n = int.from_bytes(f.read(8), "little")
    if n > size - 8:
        raise ValueError(f"the header length {n} is larger than the {size - 8} bytes that "
                         "follow it (truncated?)")
    if n > MAX_HEADER:
        raise ValueError(f"the header length {n} exceeds the safetensors limit {MAX_HEADER}")
    raw = f.read(n)
    if len(raw) != n:
        raise ValueError("the file ended inside the header (truncated?)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"the header is not UTF-8: {exc}") from None
    header = _json(text, "the header")
    if not isinstance(header, dict):
        raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("__metadata__ must map text to text")
    data_size = size - 8 - n
    tensors = {}
    for name, info in header.items():
        where = f"tensor {_short(name)}"
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{where}: expected {{dtype, shape, data_offsets}}, got "
                             f"{_short(info)}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise ValueError(f"{where}: unknown dtype {_short(dtype)}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ValueError(f"{where}: shape must be a list of non-negative ints, got "
                             f"{_short(shape)}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) for o in offsets)):
            raise ValueError(f"{where}: data_offsets must be two ints, got {_short(offsets)}")
        begin, end = offsets
        if not 0 <= begin <= end <= data_size:
            raise ValueError(f"{where}: bytes [{begin}, {end}) are not inside the "
                             f"{data_size} bytes of tensor data (truncated?)")
        nbytes = 0 if 0 in shape else DTYPES[dtype][1]
        for d in shape:                               # stop early: no giant products
            if nbytes > data_size:
                break
            nbytes *= d
        if end - begin != nbytes:
            needs = f"more than {data_size}" if nbytes > data_size else str(nbytes)
            raise ValueError(f"{where}: {dtype} {_short(tuple(shape))} needs {needs} bytes, "
                             f"its offsets [{begin}, {end}) hold {end - begin}")
        tensors[name] = (dtype, tuple(shape), begin, end)
    # as the safetensors library requires: the ranges tile the data, no gap, no overlap
    at, prev = 0, None
    for name, (_, _, begin, end) in sorted(tensors.items(), key=lambda t: t[1][2:]):
        if begin != at:
            kind = "overlaps" if begin < at else "leaves a gap after"
            raise ValueError(f"tensor {_short(name)} at bytes [{begin}, {end}) {kind} "
                             f"{'the start of the data' if prev is None else _short(prev)}")
        at, prev = end, name
    if at != data_size:
        raise ValueError(f"{data_size - at} bytes of data follow the last tensor")
    return _Header(tensors, metadata, 8 + n)


def _open(path, what):
    """(open binary file, checked header) of `path`; FileNotFoundError if absent, else
    ValueError naming the file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{what}: {path} is a directory, not a safetensors file")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{what}: {path} is not a regular file")
    f = open(path, "rb")                              # FileNotFoundError passes through
    try:
        header = _read_header(f, os.fstat(f.fileno()).st_size)
    except ValueError as exc:
        f.close()
        raise ValueError(f"{what}: {path} is not a readable safetensors file: {exc}") from None
    except BaseException:
        f.close()
        raise
    return f, header


def _read_tensor(f, header, name, path, what, raw_bf16=False):
    """The data of tensor `name` as a NumPy array (BF16 widened to float32, or with raw_bf16
    its bits as uint16)."""
    dtype, shape, begin, end = header.tensors[name]
    np_dtype = DTYPES[dtype][0]
    if dtype == "BF16":
        np_dtype = "<u2"
    elif np_dtype is None:
        raise ValueError(f"{what}: {path}: tensor {_short(name)} has dtype {dtype}, which NumPy "
                         "cannot hold")
    arr = np.empty(shape, np.dtype(np_dtype))        # end - begin bytes, checked against the file
    f.seek(header.data_start + begin)
    got = f.readinto(memoryview(arr).cast("B")) if arr.nbytes else 0
    if got != end - begin:
        raise ValueError(f"{what}: {path} ended inside tensor {_short(name)} (truncated?)")
    if dtype == "BF16" and not raw_bf16:              # bfloat16 = the top half of a float32
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(arr.dtype.newbyteorder("="), copy=False)


def read_state_dict(path):
    """Read every tensor and the text metadata of a safetensors file.

    The header is checked against the file's size before any tensor is read.

    Args:
        path: the safetensors file (str or path-like).

    Returns:
        `(state_dict, metadata)`: {key: NumPy array in its stored dtype; bfloat16, which NumPy
            lacks, widened to float32} and {str: str}.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: the file is not a well-formed safetensors file.
    """
    f, header = _open(path, "read_state_dict")
    with f:
        tensors = {k: _read_tensor(f, header, k, os.fspath(path), "read_state_dict")
                   for k in header.tensors}
    return tensors, header.metadata


# ---- the config and the tensors it implies -------------------------------------------------

def state_dict_shapes(class_name, config):
    """The tensors a saved model of this class and config holds, without building it.

    Nothing is allocated, so a config can be checked against a file's header before a model is
    built.

    Args:
        class_name: "Transformer" or "Seq2SeqTransformer".
        config: the constructor config, as in `model.config`.

    Yields:
        `(state_dict key, shape)` pairs, in state_dict order.
    """
    for key, shape, _ in _tensor_specs(class_name, config):
        yield key, shape


def _tensor_specs(class_name, config):
    """(key, shape, quantizable) for state_dict_shapes; quantizable: a linear weight, which
    quantize() converts."""
    if class_name not in SAVABLE:
        raise ValueError(f"state_dict_shapes: class must be one of {', '.join(SAVABLE)}, "
                         f"got {_short(class_name)}")
    seq2seq = class_name == "Seq2SeqTransformer"
    C = config["emb_size"] if seq2seq else config["d_model"]
    F = config["dim_feedforward"]
    bias = True if seq2seq else config["bias"]        # the translation model always has biases
    top = "transformer." if seq2seq else ""

    def linear(name, out_features, in_features):
        yield f"{name}.weight", (out_features, in_features), True
        if bias:
            yield f"{name}.bias", (out_features,), False

    def attention(name):
        yield f"{name}.in_proj_weight", (3 * C, C), True
        if bias:
            yield f"{name}.in_proj_bias", (3 * C,), False
        yield from linear(f"{name}.out_proj", C, C)

    def norm(name):
        yield f"{name}.weight", (C,), False
        if bias:
            yield f"{name}.bias", (C,), False

    for stack, attentions, norms in (("encoder", ("self_attn",), 2),
                                     ("decoder", ("self_attn", "multihead_attn"), 3)):
        for i in range(config[f"num_{stack}_layers"]):
            layer = f"{top}{stack}.layers.{i}"
            for a in attentions:
                yield from attention(f"{layer}.{a}")
            yield from linear(f"{layer}.linear1", F, C)
            yield from linear(f"{layer}.linear2", C, F)
            for j in range(1, norms + 1):
                yield from norm(f"{layer}.norm{j}")
        if config.get("final_norm", True):
            yield from norm(f"{top}{stack}.norm")
    if seq2seq:
        yield from linear("generator", config["tgt_vocab_size"], C)
        yield "src_tok_emb.embedding.weight", (config["src_vocab_size"], C), False
        yield "tgt_tok_emb.embedding.weight", (config["tgt_vocab_size"], C), False
        if config.get("positions") == "learned":
            for side in ("src", "tgt"):
                yield f"{side}_pos_emb.weight", (config["max_len"] + 2, C), False
        if config.get("layernorm_embedding"):
            for side in ("src", "tgt"):
                yield from norm(f"{side}_emb_norm")


def _positive_int(v):
    return _is_int(v) and v > 0


def _flag(v):
    return isinstance(v, bool)


def _text(v):
    return isinstance(v, str)


def _eps(v):                      # positive, finite, and not zero once stored as float32
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            and np.isfinite(v) and np.float32(v) > 0)


def _pad_id(v):
    return v is None or _is_int(v)


def _probability(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1


_RULES = {_positive_int: "a positive int", _flag: "true or false", _text: "a string",
          _eps: "a positive finite number (above float32's smallest)",
          _pad_id: "null or an int", _probability: "a probability in [0, 1)"}
# The keys model.config holds (what save writes), each with the rule its value must meet.
CONFIG_KEYS = {
    "Transformer": dict(d_model=_positive_int, nhead=_positive_int,
                        num_encoder_layers=_positive_int, num_decoder_layers=_positive_int,
                        dim_feedforward=_positive_int, activation=_text, layer_norm_eps=_eps,
                        norm_first=_flag, bias=_flag),
    "Seq2SeqTransformer": dict(num_encoder_layers=_positive_int,
                               num_decoder_layers=_positive_int, emb_size=_positive_int,
                               nhead=_positive_int, src_vocab_size=_positive_int,
                               tgt_vocab_size=_positive_int, dim_feedforward=_positive_int,
                               activation=_text, norm_first=_flag, layer_norm_eps=_eps,
                               pad_id=_pad_id, max_len=_positive_int),
}
def _scale(v):
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                         and 0 < v < float("inf"))


def _positions(v):
    return v in ("sinusoidal", "sinusoidal_halves", "sinusoidal_padding", "learned")


_RULES.update({_scale: "null or a positive finite number",
               _positions: "one of 'sinusoidal', 'sinusoidal_halves', 'sinusoidal_padding', "
                           "'learned'"})
# Keys a config may lack (files written before they existed, or the options of the pretrained
# families, written only where they differ from the tutorial's): the constructor's default.
OPTIONAL_KEYS = {
    "Transformer": {"dropout": _probability},
    "Seq2SeqTransformer": {"dropout": _probability, "embed_scale": _scale,
                           "positions": _positions, "layernorm_embedding": _flag,
                           "final_norm": _flag, "decoder_padding_mask": _flag,
                           "padding_idx": _flag}}


def _check_config(class_name, config):
    """ValueError unless `config` holds exactly the keys save writes, each of its type."""
    if not isinstance(config, dict):
        raise ValueError(f"the config is a JSON {type(config).__name__}, not an object")
    keys = dict(CONFIG_KEYS[class_name])
    missing = [k for k in keys if k not in config]
    keys.update((k, rule) for k, rule in OPTIONAL_KEYS[class_name].items() if k in config)
    unknown = [k for k in config if k not in keys]
    if missing or unknown:
        raise ValueError("the config " + "; ".join(
            p for p in (missing and "lacks " + ", ".join(missing),
                        unknown and "has unknown keys " + ", ".join(map(_short, unknown[:LISTED])))
            if p))
    bad = [f"{k} must be {_RULES[rule]}, got {_short(config[k])}"
           for k, rule in keys.items() if not rule(config[k])]
    if bad:
        raise ValueError("the config is invalid: " + "; ".join(bad))
    pad = config.get("pad_id")
    if pad is not None:            # an id of both vocabularies (padding masks, embeddings)
        V = min(config["src_vocab_size"], config["tgt_vocab_size"])
        if not 0 <= pad < V:
            raise ValueError(f"the config is invalid: pad_id {pad} is outside the vocabulary "
                             f"(ids 0..{V - 1}: src_vocab_size {config['src_vocab_size']}, "
                             f"tgt_vocab_size {config['tgt_vocab_size']})")
    C = config.get("d_model", config.get("emb_size"))
    if C % config["nhead"]:
        raise ValueError(f"the config is invalid: {C} features do not split into "
                         f"{config['nhead']} heads")


def _expected(class_name, config, compute_type):
    """(key, shape, dtypes allowed) of every tensor a file of `compute_type` holds."""
    floats = ("F32",) + CONVERTED
    for key, shape, quantizable in _tensor_specs(class_name, config):
        if not quantizable or compute_type == "float32":
            yield key, shape, floats
            continue
        yield key, shape, (QUANTIZED[compute_type],)
        if compute_type == "int8":
            yield key + SCALE, shape[:1], ("F32",)


def _compare(class_name, config, header, compute_type="float32"):
    """The problems (at most LISTED of each kind) between the tensors `config` implies (for a
    file of `compute_type`) and the header; the expected table is cut off once it outgrows the
    file (10**6 layers cost nothing)."""
    have = header.tensors
    mismatched, dtypes, missing, seen = [], [], [], set()
    n_missing = 0
    cut = False
    for key, shape, allowed in _expected(class_name, config, compute_type):
        if len(seen) + n_missing >= len(have) + LISTED:
            cut = True
            break
        if key not in have:
            n_missing += 1
            if len(missing) < LISTED:
                missing.append(key)
            continue
        seen.add(key)
        dtype, stored, _, _ = have[key]
        if stored != shape:
            mismatched.append(f"{key}: expected shape {shape}, file has {stored}")
        elif dtype not in allowed:
            if len(allowed) == 1:
                why = f"a {compute_type} file stores it as {allowed[0]}"
            else:
                why = ("bool is not a weight" if dtype == "BOOL" else
                       "integer weights are not converted" if dtype[0] in "IU" else
                       "not a supported float type") + "; fastattn weights are float32"
            dtypes.append(f"{key}: dtype {dtype} ({why})")
    problems = []
    if mismatched:
        problems.append("shape mismatch: " + _few(mismatched))
    if dtypes:
        problems.append("wrong dtype: " + _few(dtypes))
    if missing:
        more = (f" (the config implies more than {len(have) + LISTED} tensors; the file holds "
                f"{len(have)})" if cut else f" ({n_missing} in all)" if n_missing > LISTED
                else "")
        problems.append("missing tensors: " + ", ".join(missing) + more)
    if not cut:
        unexpected = [_short(k) for k in have if k not in seen]
        if unexpected:
            problems.append("unexpected tensors: " + _few(unexpected, ", "))
    return problems


def _few(items, sep="; "):
    more = f" ... ({len(items)} in all)" if len(items) > LISTED else ""
    return sep.join(items[:LISTED]) + more


def load(path, *, backend="fast", compute_type=None):
    """Rebuild the model saved by `save` and load its weights strictly.

    The class and config come from the file's metadata. The header, the config and every
    tensor's name, shape and dtype are checked before a model is built or any data is read.

    Args:
        path: the safetensors file (str or path-like).
        backend: "fast" (the default, the C kernels) or "reference" (the NumPy twin).
        compute_type: None (the default) keeps the file's: "float32", or the type a quantized
            model was saved with, its values as stored. "int8" / "bf16" quantizes a float32
            file once, while loading; "float32" dequantizes a quantized file. A quantized file
            is never quantized again (int8 to bf16 or back is refused).

    Returns:
        The model (`Transformer` or `Seq2SeqTransformer`), in eval mode on `backend`.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: a bad `backend` or `compute_type`, or a file that is not a well-formed
            fastattn model (the file and the problem named).
    """
    if backend not in BACKENDS:                      # the caller's mistake, not the file's
        raise ValueError(f"load: backend must be one of {BACKENDS}, got {_short(backend)}")
    if compute_type is not None and compute_type not in COMPUTE_TYPES:
        raise ValueError(f"load: compute_type must be None or one of {COMPUTE_TYPES}, got "
                         f"{_short(compute_type)}")
    f, header = _open(path, "load")
    path = os.fspath(path)
    with f:
        meta = header.metadata
        if meta.get("format") != FORMAT or meta.get("class") not in SAVABLE:
            raise ValueError(f"load: {path} was not written by fastattn.io.save (metadata "
                             f"format={_short(meta.get('format'))}, "
                             f"class={_short(meta.get('class'))})")
        name = meta["class"]
        stored = meta.get("compute_type", "float32")
        if stored not in COMPUTE_TYPES:
            raise ValueError(f"load: {path} has an unknown compute_type {_short(stored)} in its "
                             f"metadata (expected one of {COMPUTE_TYPES})")
        if compute_type not in (None, "float32", stored) and stored != "float32":
            raise ValueError(f"load: {path} holds {stored} weights; converting them to "
                             f"{compute_type} would quantize twice: load the float32 model, "
                             f"or this file as {stored} or float32")
        try:
            if "config" not in meta:
                raise ValueError("the metadata holds no config")
            config = _json(meta["config"], "the config")
            _check_config(name, config)
        except ValueError as exc:
            raise ValueError(f"load: the config stored in {path} does not build a {name}: "
                             f"{exc}") from None
        problems = _compare(name, config, header, stored)
        if problems:
            raise ValueError(f"load: {path} does not match its config ({name}): "
                             + " | ".join(problems))
        if name == "Seq2SeqTransformer":             # the positional table is not in the file
            floats = config["max_len"] * config["emb_size"]
            weights = sum((end - begin) // DTYPES[dtype][1]
                          for dtype, _, begin, end in header.tensors.values())
            if floats > max(PE_FLOATS, weights):
                raise ValueError(f"load: the config stored in {path} does not build a {name}: "
                                 f"max_len={config['max_len']} needs a positional table of "
                                 f"{floats} floats, more than the {weights} weights in the "
                                 f"file (and than {PE_FLOATS})")
        try:
            model = SAVABLE[name](**config, backend=backend)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"load: the config stored in {path} does not build a "
                             f"{name}: {exc}") from None
        quantized = {k for k, _, q in _tensor_specs(name, config) if q} \
            if stored != "float32" else set()
        tensors, qweights = {}, {}
        for key, (dtype, _, _, _) in header.tensors.items():
            if key in quantized:
                data = _read_tensor(f, header, key, path, "load", raw_bf16=True)
                scale = _read_tensor(f, header, key + SCALE, path, "load") \
                    if stored == "int8" else None
                try:
                    qweights[key] = ops.QuantizedWeight.from_stored(stored, data, scale)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"load: {path}: tensor {key}: {exc}") from None
                continue
            if stored == "int8" and key.endswith(SCALE) and key[:-len(SCALE)] in quantized:
                continue                              # read with its weight
            arr = _read_tensor(f, header, key, path, "load")
            with np.errstate(over="ignore"):         # overflow is refused just below
                tensors[key] = arr.astype(np.float32, copy=False)
            if dtype == "F64" and not np.array_equal(np.isfinite(arr),
                                                     np.isfinite(tensors[key])):
                raise ValueError(f"load: {path}: tensor {key} (float64) holds values "
                                 "outside float32's range")
    try:
        missing, _ = model.load_state_dict(tensors, strict=not quantized)
    except ValueError as exc:
        raise ValueError(f"load: {path} does not match its config: {exc}") from None
    if quantized:                     # _compare checked the names: missing == quantized
        model._set_quantized(qweights)
    if compute_type is not None and compute_type != stored:
        model.quantize(compute_type)                  # converted once, here
    return model
