"""fastattn.io: safetensors save/load round trips exactly; broken, foreign or mismatched files
are a ValueError naming the problem; nothing is ever unpickled."""
import ast
import json
import os
import pickle
import stat
import re
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import fastattn.io as fio
from fastattn import nn as fnn

C, H, F = 32, 4, 64
V_SRC, V_TGT, PAD = 17, 19, 1


def transformer(**kw):
    seed = kw.pop("seed", 1)
    cfg = dict(d_model=C, nhead=H, num_encoder_layers=2, num_decoder_layers=1,
               dim_feedforward=F, norm_first=True, activation="gelu", layer_norm_eps=1e-6)
    cfg.update(kw)
    m = fnn.Transformer(**cfg, seed=seed)
    rng = np.random.default_rng(2)
    for _, p in m.named_parameters():             # every tensor distinct, biases non-zero
        p[...] += 0.1 * rng.standard_normal(p.shape).astype(np.float32)
    return m


def seq2seq(**kw):
    cfg = dict(pad_id=PAD, max_len=64, norm_first=False, activation="relu")
    cfg.update(kw)
    return fnn.Seq2SeqTransformer(2, 1, C, H, V_SRC, V_TGT, F, seed=3, **cfg)


def transformer_inputs(rng):
    return (rng.standard_normal((2, 6, C)).astype(np.float32),
            rng.standard_normal((2, 4, C)).astype(np.float32))


def token_inputs(rng):
    src = rng.integers(2, V_SRC, size=(2, 6))
    tgt = rng.integers(2, V_TGT, size=(2, 4))
    src[1, 4:] = PAD
    tgt[1, 3:] = PAD
    return src, tgt


def outputs(model, rng, kind):
    if kind == "transformer":
        src, tgt = transformer_inputs(rng)
        return model(src, tgt, tgt_is_causal=True)
    src, tgt = token_inputs(rng)
    return model(src, tgt)


MAKERS = {"transformer": transformer, "seq2seq": seq2seq}


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sb[k].dtype == np.float32, k
        assert np.array_equal(sa[k], sb[k]), k


@pytest.fixture
def saved(tmp_path):
    """(model, path) of a saved Transformer."""
    m = transformer()
    path = tmp_path / "model.safetensors"
    fio.save(m, path)
    return m, path


def rewrite(path, out, *, tensors=None, metadata=None):
    """Copy the file at `path` to `out` with tensors / metadata edited by the given callables."""
    t, meta = fio.read_state_dict(path)
    if tensors is not None:
        t = tensors(dict(t))
    if metadata is not None:
        meta = metadata(dict(meta))
    save_file(t, str(out), metadata=meta)
    return out


# ----------------------------------------------------------------------------------------------
# round trip


@pytest.mark.parametrize("kind", ["transformer", "seq2seq"])
def test_round_trip_exact(tmp_path, kind):
    m = MAKERS[kind]()
    path = tmp_path / f"{kind}.safetensors"
    fio.save(m, path)
    loaded = fio.load(path)
    assert type(loaded) is type(m)
    assert loaded.config == m.config
    assert loaded.backend == "fast"
    assert_same_state(m, loaded)
    assert np.array_equal(outputs(loaded, np.random.default_rng(5), kind),
                          outputs(m, np.random.default_rng(5), kind))


@pytest.mark.parametrize("kind", ["transformer", "seq2seq"])
def test_load_reference_backend(tmp_path, kind):
    m = MAKERS[kind]()
    path = tmp_path / "m.safetensors"
    fio.save(m, str(path))                         # str paths as well as Path
    ref = fio.load(str(path), backend="reference")
    assert {mod.backend for mod in ref.modules()} == {"reference"}
    assert_same_state(m, ref)
    out_ref = outputs(ref, np.random.default_rng(6), kind)
    out_fast = outputs(m, np.random.default_rng(6), kind)
    assert np.array_equal(out_ref, outputs(m.to_backend("reference"),
                                           np.random.default_rng(6), kind))
    tol = 1e-5 * float(np.abs(out_ref).max())
    assert np.max(np.abs(out_fast - out_ref)) <= tol
    with pytest.raises(ValueError, match="backend"):
        fio.load(path, backend="gpu")


def test_round_trip_keeps_config_details(tmp_path):
    m = transformer(bias=False, layer_norm_eps=1e-3, norm_first=False, activation="relu")
    fio.save(m, tmp_path / "a.safetensors")
    loaded = fio.load(tmp_path / "a.safetensors")
    assert loaded.config == m.config
    assert loaded.config["bias"] is False and loaded.config["layer_norm_eps"] == 1e-3
    assert_same_state(m, loaded)
    s = seq2seq(pad_id=None, max_len=32)
    fio.save(s, tmp_path / "b.safetensors")
    s2 = fio.load(tmp_path / "b.safetensors")
    assert s2.config == s.config and s2.pad_id is None
    assert s2.positional_encoding.max_len == 32
    assert_same_state(s, s2)


def test_file_holds_torch_keys_and_metadata(saved):
    m, path = saved
    tensors, meta = fio.read_state_dict(path)
    assert set(tensors) == set(m.state_dict())
    for k, v in m.state_dict().items():
        assert tensors[k].dtype == np.float32 and np.array_equal(tensors[k], v), k
    assert meta["class"] == "Transformer"
    assert json.loads(meta["config"]) == m.config


def test_save_rejects_other_objects(tmp_path):
    with pytest.raises(TypeError, match="Transformer"):
        fio.save(fnn.Linear(4, 4), tmp_path / "x.safetensors")
    with pytest.raises(TypeError):
        fio.save({"w": np.zeros(3, np.float32)}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


# ----------------------------------------------------------------------------------------------
# broken or foreign files


@pytest.mark.parametrize("keep", [0, 5, 8, 100, -9, -1])
def test_truncated_file(saved, tmp_path, keep):
    _, path = saved
    data = path.read_bytes()
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    with pytest.raises(ValueError, match="truncated.safetensors"):
        fio.load(bad)


def test_garbage_file(tmp_path):
    bad = tmp_path / "garbage.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="garbage.safetensors"):
        fio.load(bad)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        fio.load(tmp_path / "absent.safetensors")


def test_file_without_fastattn_metadata(saved, tmp_path):
    m, _ = saved
    plain = tmp_path / "plain.safetensors"
    save_file(dict(m.state_dict()), str(plain))
    with pytest.raises(ValueError, match="not written by fastattn"):
        fio.load(plain)
    other = tmp_path / "other.safetensors"
    save_file(dict(m.state_dict()), str(other), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="not written by fastattn"):
        fio.load(other)


@pytest.mark.parametrize("edit", [
    lambda meta: {**meta, "class": "Linear"},
    lambda meta: {**meta, "class": "os.system"},
    lambda meta: {**meta, "format": "fastattn/999"},
    lambda meta: {k: v for k, v in meta.items() if k != "class"},
])
def test_wrong_format_or_class(saved, tmp_path, edit):
    _, path = saved
    bad = rewrite(path, tmp_path / "bad.safetensors", metadata=edit)
    with pytest.raises(ValueError, match="not written by fastattn"):
        fio.load(bad)


def test_wrong_shape_tensor_named(saved, tmp_path):
    _, path = saved
    key = "decoder.layers.0.multihead_attn.in_proj_weight"

    def shrink(t):
        t[key] = np.ascontiguousarray(t[key][:, :C - 1])
        return t

    bad = rewrite(path, tmp_path / "bad.safetensors", tensors=shrink)
    with pytest.raises(ValueError) as exc:
        fio.load(bad)
    msg = str(exc.value)
    assert key in msg and str((3 * C, C)) in msg and str((3 * C, C - 1)) in msg


def test_missing_tensor_named(saved, tmp_path):
    _, path = saved
    key = "encoder.layers.1.linear2.bias"

    def drop(t):
        del t[key]
        return t

    bad = rewrite(path, tmp_path / "bad.safetensors", tensors=drop)
    with pytest.raises(ValueError, match=r"missing.*encoder\.layers\.1\.linear2\.bias"):
        fio.load(bad)


def test_unexpected_tensor_named(saved, tmp_path):
    _, path = saved

    def add(t):
        t["encoder.layers.9.linear1.weight"] = np.zeros((F, C), np.float32)
        return t

    bad = rewrite(path, tmp_path / "bad.safetensors", tensors=add)
    with pytest.raises(ValueError, match=r"unexpected.*encoder\.layers\.9\.linear1\.weight"):
        fio.load(bad)


def test_config_for_another_size_names_shapes(saved, tmp_path):
    _, path = saved

    def bigger(meta):
        cfg = json.loads(meta["config"])
        cfg["dim_feedforward"] = 2 * F
        return {**meta, "config": json.dumps(cfg)}

    bad = rewrite(path, tmp_path / "bad.safetensors", metadata=bigger)
    with pytest.raises(ValueError, match=rf"linear1\.weight.*\({2 * F}, {C}\)"):
        fio.load(bad)


@pytest.mark.parametrize("change", [
    dict(d_model=30),                 # not divisible by nhead 4
    dict(nhead=0),
    dict(num_encoder_layers=-1),
    dict(activation="tanh"),
    dict(unknown_option=1),
    dict(backend="reference"),        # clashes with load's own backend argument
])
def test_config_that_does_not_build(saved, tmp_path, change):
    _, path = saved

    def edit(meta):
        cfg = json.loads(meta["config"])
        cfg.update(change)
        return {**meta, "config": json.dumps(cfg)}

    bad = rewrite(path, tmp_path / "bad.safetensors", metadata=edit)
    with pytest.raises(ValueError, match="config"):
        fio.load(bad)


@pytest.mark.parametrize("config", ["{not json", "[1, 2, 3]", "null", '"text"'])
def test_config_not_a_json_object(saved, tmp_path, config):
    _, path = saved
    bad = rewrite(path, tmp_path / "bad.safetensors",
                  metadata=lambda meta: {**meta, "config": config})
    with pytest.raises(ValueError, match="config"):
        fio.load(bad)


def test_config_missing(saved, tmp_path):
    _, path = saved
    bad = rewrite(path, tmp_path / "bad.safetensors",
                  metadata=lambda meta: {k: v for k, v in meta.items() if k != "config"})
    with pytest.raises(ValueError, match="config"):
        fio.load(bad)


# ----------------------------------------------------------------------------------------------
# nothing is unpickled


class _Tripwire:
    """Unpickling this creates the file at `marker` (harmless, but proof that it ran)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("fmt", ["pickle", "npy"])
def test_pickle_and_npy_files_are_never_loaded(tmp_path, fmt):
    marker = tmp_path / "unpickled.txt"
    bad = tmp_path / f"model.{fmt}"
    if fmt == "pickle":
        bad.write_bytes(pickle.dumps({"weights": _Tripwire(marker)}))
    else:
        np.save(bad, np.array([_Tripwire(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        fio.load(bad)
    with pytest.raises(ValueError):
        fio.read_state_dict(bad)
    assert not marker.exists()


def _code_without_docstrings(source):
    """The module's code as ast.unparse writes it: no comments, no docstrings."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    getattr(body[0], "value", None), ast.Constant) and isinstance(
                    body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def test_io_source_never_unpickles():
    source = Path(fio.__file__).read_text()
    code = _code_without_docstrings(source)
    for needle in ("pickle", "allow_pickle=True", "torch.load", "np.load", "numpy.load",
                   "joblib", "dill", "marshal", "eval(", "exec("):
        assert needle not in code, needle
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported <= {"json", "os", "tempfile", "numpy", "safetensors"}, imported


# ----------------------------------------------------------------------------------------------
# the shape table is the models' own


SHAPE_CONFIGS = [
    ("Transformer", dict(d_model=C, nhead=H, num_encoder_layers=2, num_decoder_layers=1,
                         dim_feedforward=F, norm_first=False)),
    ("Transformer", dict(d_model=24, nhead=3, num_encoder_layers=1, num_decoder_layers=3,
                         dim_feedforward=40, norm_first=True, activation="gelu")),
    ("Transformer", dict(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                         dim_feedforward=8, norm_first=True, bias=False)),
    ("Transformer", dict(d_model=16, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                         dim_feedforward=16, norm_first=False, bias=False)),
    ("Seq2SeqTransformer", dict(num_encoder_layers=2, num_decoder_layers=1, emb_size=C, nhead=H,
                                src_vocab_size=V_SRC, tgt_vocab_size=V_TGT, dim_feedforward=F)),
    ("Seq2SeqTransformer", dict(num_encoder_layers=1, num_decoder_layers=3, emb_size=24,
                                nhead=2, src_vocab_size=50, tgt_vocab_size=7,
                                dim_feedforward=12, norm_first=True, pad_id=0, max_len=16)),
    # the pretrained families' options: BART's learned tables, embedding norm, no final norms
    ("Seq2SeqTransformer", dict(num_encoder_layers=1, num_decoder_layers=2, emb_size=8,
                                nhead=2, src_vocab_size=11, tgt_vocab_size=9,
                                dim_feedforward=12, pad_id=1, max_len=16, embed_scale=1.0,
                                positions="learned", layernorm_embedding=True,
                                final_norm=False, decoder_padding_mask=False,
                                padding_idx=True)),
    ("Seq2SeqTransformer", dict(num_encoder_layers=1, num_decoder_layers=1, emb_size=8,
                                nhead=2, src_vocab_size=11, tgt_vocab_size=11,
                                dim_feedforward=12, pad_id=1, max_len=16,
                                positions="sinusoidal_padding", activation="silu")),
]


@pytest.mark.parametrize("name, cfg", SHAPE_CONFIGS)
def test_shape_table_is_the_models_state_dict(tmp_path, name, cfg):
    model = fio.SAVABLE[name](**cfg, seed=0)
    table = list(fio.state_dict_shapes(name, model.config))
    assert table == [(k, v.shape) for k, v in model.state_dict().items()]   # order as well
    optional = set(fio.OPTIONAL_KEYS[name])                                   # all checked
    assert set(model.config) - optional == set(fio.CONFIG_KEYS[name])
    assert set(model.config) <= set(fio.CONFIG_KEYS[name]) | optional
    fio.save(model, tmp_path / "m.safetensors")
    assert_same_state(model, fio.load(tmp_path / "m.safetensors"))


# ----------------------------------------------------------------------------------------------
# hostile files: each is a ValueError naming the file, fast, with no large allocation


def raw_parts(path):
    """(header dict, tensor data bytes) of a safetensors file, parsed by hand."""
    data = Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_raw(out, header, data=b"", length=None):
    """A file of 8-byte length, header (a dict, or bytes as given) and data; `length` lies."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    out.write_bytes((len(head) if length is None else length).to_bytes(8, "little")
                    + head + data)
    return out


def with_config(path, out, **change):
    header, data = raw_parts(path)
    cfg = json.loads(header["__metadata__"]["config"])
    cfg.update(change)
    header["__metadata__"]["config"] = json.dumps(cfg)
    return write_raw(out, header, data)


def with_tensor(path, out, key, array):
    """The file at `path` with tensor `key` replaced by `array` (any dtype, shape)."""
    tensors, meta = fio.read_state_dict(path)
    tensors[key] = array
    save_file(tensors, str(out), metadata=meta)
    return out


def fails(path, *patterns, load=fio.load):
    """load(path) raises a ValueError naming the file and matching every regex in patterns."""
    with pytest.raises(ValueError) as exc:
        load(path)
    msg = str(exc.value)
    assert str(path) in msg, msg
    for p in patterns:
        assert re.search(p, msg), (p, msg)
    return msg


@pytest.fixture
def saved_s2s(tmp_path):
    m = seq2seq()
    path = tmp_path / "s2s.safetensors"
    fio.save(m, path)
    return m, path


def test_huge_dim_feedforward_fails_fast_and_small(saved, tmp_path):
    _, path = saved
    bad = with_config(path, tmp_path / "huge_ff.safetensors", dim_feedforward=10**12)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"huge_ff\.safetensors.*linear1\.weight: expected "
                                         r"shape \(1000000000000, 32\), file has \(64, 32\)"):
        fio.load(bad)
    assert time.perf_counter() - t0 < 0.25
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="huge_ff.safetensors"):
            fio.load(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak                       # the file is 125 KB; nothing model-sized


@pytest.mark.parametrize("key", ["num_encoder_layers", "num_decoder_layers"])
@pytest.mark.parametrize("kind", ["transformer", "seq2seq"])
def test_million_layers_fail_fast(saved, saved_s2s, tmp_path, key, kind):
    _, path = saved if kind == "transformer" else saved_s2s
    bad = with_config(path, tmp_path / "deep.safetensors", **{key: 10**6})
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"deep\.safetensors.*missing tensors: .*layers\.\d+\."
                                         r".*the config implies more than \d+ tensors"):
        fio.load(bad)
    assert time.perf_counter() - t0 < 0.25


@pytest.mark.parametrize("key", ["d_model", "nhead", "num_encoder_layers", "num_decoder_layers",
                                 "dim_feedforward"])
@pytest.mark.parametrize("value", [-1, 0, 32.0, 1.5, "32", True, None, [32], {"n": 32}])
def test_bad_size_values(saved, tmp_path, key, value):
    _, path = saved
    bad = with_config(path, tmp_path / "badsize.safetensors", **{key: value})
    fails(bad, "config", f"{key} must be a positive int")


@pytest.mark.parametrize("change, msg", [
    (dict(layer_norm_eps=0), "layer_norm_eps must be"),
    (dict(layer_norm_eps=-1e-5), "layer_norm_eps must be"),
    (dict(layer_norm_eps=float("nan")), "layer_norm_eps must be"),
    (dict(layer_norm_eps=float("inf")), "layer_norm_eps must be"),
    (dict(layer_norm_eps=1e-300), "layer_norm_eps must be"),   # 0 as float32
    (dict(layer_norm_eps="1e-5"), "layer_norm_eps must be"),
    (dict(layer_norm_eps=True), "layer_norm_eps must be"),
    (dict(norm_first=1), "norm_first must be true or false"),
    (dict(bias="false"), "bias must be true or false"),
    (dict(activation=3), "activation must be a string"),
    (dict(activation="tanh"), "activation"),                   # refused by the constructor
])
def test_bad_other_values(saved, tmp_path, change, msg):
    _, path = saved
    bad = with_config(path, tmp_path / "badval.safetensors", **change)
    fails(bad, "config", msg)


@pytest.mark.parametrize("change, msg", [
    (dict(src_vocab_size=0), "src_vocab_size must be a positive int"),
    (dict(tgt_vocab_size="19"), "tgt_vocab_size must be a positive int"),
    (dict(emb_size=-32), "emb_size must be a positive int"),
    (dict(pad_id=1.0), "pad_id must be null or an int"),
    (dict(pad_id=True), "pad_id must be null or an int"),
    (dict(max_len=0), "max_len must be a positive int"),
    (dict(max_len=10**12), "max_len=1000000000000 needs a positional table"),
    (dict(bias=False), "unknown keys 'bias'"),                  # the translation model has none
])
def test_bad_seq2seq_values(saved_s2s, tmp_path, change, msg):
    _, path = saved_s2s
    bad = with_config(path, tmp_path / "bads2s.safetensors", **change)
    fails(bad, "config", msg)


def test_other_vocab_size_names_the_embedding(saved_s2s, tmp_path):
    _, path = saved_s2s
    bad = with_config(path, tmp_path / "vocab.safetensors", src_vocab_size=10**9)
    with pytest.raises(ValueError, match=r"vocab\.safetensors.*src_tok_emb\.embedding\.weight: "
                                         rf"expected shape \(1000000000, {C}\)"):
        fio.load(bad)


def test_config_with_a_key_missing(saved, tmp_path):
    _, path = saved
    header, data = raw_parts(path)
    cfg = json.loads(header["__metadata__"]["config"])
    del cfg["dim_feedforward"]
    header["__metadata__"]["config"] = json.dumps(cfg)
    bad = write_raw(tmp_path / "nokey.safetensors", header, data)
    fails(bad, "config lacks dim_feedforward")


def test_config_nested_deeply(saved, tmp_path):
    _, path = saved
    header, data = raw_parts(path)
    header["__metadata__"]["config"] = "[" * 100_000 + "]" * 100_000
    bad = write_raw(tmp_path / "nestcfg.safetensors", header, data)
    fails(bad, "config is nested too deeply")


def _first_tensor(header):
    """(name, info) of the tensor whose data comes first."""
    return min(((k, v) for k, v in header.items() if k != "__metadata__"),
               key=lambda kv: kv[1]["data_offsets"])


def _last_tensor(header):
    return max(((k, v) for k, v in header.items() if k != "__metadata__"),
               key=lambda kv: kv[1]["data_offsets"])


def _edit_first(h):
    _first_tensor(h)[1]["data_offsets"][0] += 4


def _overlap(h):
    """The last tensor's range starts 4 bytes early (it overlaps the one before it)."""
    info = _last_tensor(h)[1]
    info["data_offsets"] = [info["data_offsets"][0] - 4, info["data_offsets"][1] - 4]


def _past_end(h):
    info = _last_tensor(h)[1]
    info["data_offsets"] = [info["data_offsets"][0] + 8, info["data_offsets"][1] + 8]


def _swap_ranges(h):
    """Two equal-size tensors exchange their byte ranges: still a valid tiling."""
    a, b = "encoder.layers.0.norm1.weight", "encoder.layers.0.norm2.weight"
    h[a]["data_offsets"], h[b]["data_offsets"] = h[b]["data_offsets"], h[a]["data_offsets"]


@pytest.mark.parametrize("edit, msg", [
    (_past_end, r"bytes \[\d+, \d+\) are not inside the \d+ bytes of tensor data"),
    (_overlap, "overlaps"),
    (_edit_first, r"needs \d+ bytes"),
    (lambda h: _first_tensor(h)[1].update(data_offsets=[4, 4 + _first_tensor(h)[1]
                                                         ["data_offsets"][1]]),
     "leaves a gap after the start of the data"),
    (lambda h: _last_tensor(h)[1].update(dtype="F16"), r"needs \d+ bytes"),
    (lambda h: _last_tensor(h)[1].update(shape=[-1, 32]), "non-negative ints"),
    (lambda h: _last_tensor(h)[1].update(shape=[32.0]), "non-negative ints"),
    (lambda h: _last_tensor(h)[1].update(data_offsets=[True, 4]), "two ints"),
    (lambda h: _last_tensor(h)[1].update(data_offsets=[0]), "two ints"),
    (lambda h: _last_tensor(h)[1].update(dtype="F4"), "unknown dtype 'F4'"),
    (lambda h: _last_tensor(h)[1].update(extra=1), "expected {dtype, shape, data_offsets}"),
    (lambda h: h.update(x=[1, 2]), "expected {dtype, shape, data_offsets}"),
    (lambda h: h["__metadata__"].update(n=1), "__metadata__ must map text to text"),
    (lambda h: h.update(__metadata__="format"), "__metadata__ must map text to text"),
])
def test_header_that_lies(saved, tmp_path, edit, msg):
    _, path = saved
    header, data = raw_parts(path)
    edit(header)
    bad = write_raw(tmp_path / "lies.safetensors", header, data)
    with pytest.raises(ValueError, match=rf"lies\.safetensors is not a readable safetensors "
                                         rf"file: .*{msg}"):
        fio.load(bad)
    with pytest.raises(ValueError, match="lies.safetensors"):
        fio.read_state_dict(bad)


def test_out_of_order_ranges_are_valid(saved, tmp_path):
    """safetensors ties no tensor to a position: ranges in any order that tile the data load."""
    m, path = saved
    header, data = raw_parts(path)
    _swap_ranges(header)
    a, b = "encoder.layers.0.norm1.weight", "encoder.layers.0.norm2.weight"
    swapped = write_raw(tmp_path / "swapped.safetensors", header, data)
    loaded = fio.load(swapped)
    sd = m.state_dict()
    assert np.array_equal(loaded.state_dict()[a], sd[b])
    assert np.array_equal(loaded.state_dict()[b], sd[a])


@pytest.mark.parametrize("length, msg", [
    (2**64 - 1, "header length 18446744073709551615 is larger than"),
    (None, "header length .* is larger than"),           # one byte past the end of the file
])
def test_header_length_larger_than_file(saved, tmp_path, length, msg):
    _, path = saved
    header, data = raw_parts(path)
    head = json.dumps(header).encode()
    bad = write_raw(tmp_path / "long.safetensors", head, data,
                    length=length if length is not None else len(head) + len(data) + 1)
    with pytest.raises(ValueError, match=rf"long\.safetensors.*{msg}"):
        fio.load(bad)


def test_trailing_bytes_after_the_data(saved, tmp_path):
    _, path = saved
    header, data = raw_parts(path)
    bad = write_raw(tmp_path / "tail.safetensors", header, data + b"\0" * 8)
    with pytest.raises(ValueError, match=r"tail\.safetensors.*8 bytes of data follow"):
        fio.load(bad)


@pytest.mark.parametrize("head, msg", [
    (b"{not json", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
    (b'{"__metadata__": {"format": "fastattn/1", "class": "\xff\xfe"}}', "not UTF-8"),
    (b'{"__metadata__": {"format": "\xc3\x28"}}', "not UTF-8"),
    (b'{"__metadata__": {}, "__metadata__": {}}', "duplicate key '__metadata__'"),
    (b"[]", "JSON list, not an object"),
    (b"null", "JSON NoneType, not an object"),
    (b"", "not valid JSON"),
], ids=["garbage", "nested-lists", "nested-objects", "non-utf8-class", "non-utf8-format",
        "duplicate-key", "list", "null", "empty"])
def test_header_not_json(tmp_path, head, msg):
    bad = write_raw(tmp_path / "head.safetensors", head)
    with pytest.raises(ValueError, match=rf"head\.safetensors is not a readable safetensors "
                                         rf"file: the header (is )?.*{msg}"):
        fio.load(bad)


def test_empty_file_and_directory(tmp_path):
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.safetensors .*the file is empty"):
        fio.load(empty)
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"folder\.safetensors is a directory"):
        fio.load(folder)
    with pytest.raises(ValueError, match=r"folder\.safetensors is a directory"):
        fio.read_state_dict(folder)


KEY = "encoder.layers.0.linear1.weight"


@pytest.mark.parametrize("dtype, msg", [
    (np.bool_, "dtype BOOL (bool is not a weight"),
    (np.int32, "dtype I32 (integer weights are not converted"),
    (np.int64, "dtype I64 (integer weights are not converted"),
    (np.uint8, "dtype U8 (integer weights are not converted"),
    (np.complex64, "dtype C64 (not a supported float type"),
])
def test_non_float_tensors_are_refused(saved, tmp_path, dtype, msg):
    m, path = saved
    w = m.state_dict()[KEY]
    bad = with_tensor(path, tmp_path / "dtype.safetensors", KEY, (w > 0).astype(dtype))
    with pytest.raises(ValueError, match=rf"dtype\.safetensors .*wrong dtype: "
                                         rf"{KEY.replace('.', '[.]')}: {msg.replace('(', '[(]')}"):
        fio.load(bad)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, "bfloat16"])
def test_other_floats_become_float32(saved, tmp_path, dtype):
    m, path = saved
    header, data = raw_parts(path)
    tensors, meta = fio.read_state_dict(path)
    if dtype == "bfloat16":                             # NumPy has none: write the bytes
        w = tensors[KEY]
        top = (w.view(np.uint32) >> 16).astype("<u2")   # truncation: values bf16 can hold
        want = (top.astype(np.uint32) << 16).view(np.float32)
        tensors[KEY] = np.zeros(0, np.float32)         # placeholder, rewritten below
        save_file(tensors, str(tmp_path / "tmp.safetensors"), metadata=meta)
        header, data = raw_parts(tmp_path / "tmp.safetensors")
        end = len(data)
        header[KEY] = {"dtype": "BF16", "shape": list(w.shape),
                       "data_offsets": [end, end + top.nbytes]}
        conv = write_raw(tmp_path / "conv.safetensors", header, data + top.tobytes())
    else:
        want = tensors[KEY].astype(dtype)
        conv = with_tensor(path, tmp_path / "conv.safetensors", KEY, want)
        want = want.astype(np.float32)
    loaded = fio.load(conv)
    got = loaded.state_dict()[KEY]
    assert got.dtype == np.float32 and np.array_equal(got, want)
    for k, v in m.state_dict().items():
        if k != KEY:
            assert np.array_equal(loaded.state_dict()[k], v), k


def test_float64_outside_float32_range_is_refused(saved, tmp_path):
    m, path = saved
    w = m.state_dict()[KEY].astype(np.float64)
    w[0, 0] = 1e300
    bad = with_tensor(path, tmp_path / "f64.safetensors", KEY, w)
    with pytest.raises(ValueError, match=rf"f64\.safetensors: tensor {KEY} \(float64\) holds "
                                         "values outside float32's range"):
        fio.load(bad)


def test_reader_agrees_with_safetensors(tmp_path):
    from safetensors import safe_open
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 4)).astype(np.float16),
               "b": rng.standard_normal(5), "c": rng.integers(-9, 9, (2, 2, 2), np.int8),
               "d": np.zeros((0, 3), np.float32), "e": rng.integers(0, 2, 7).astype(bool),
               "f": rng.standard_normal((1,)).astype(np.float32)}
    path = tmp_path / "mixed.safetensors"
    save_file(tensors, str(path), metadata={"k": "v"})
    mine, meta = fio.read_state_dict(path)
    assert meta == {"k": "v"}
    with safe_open(str(path), framework="numpy") as f:
        assert set(mine) == set(f.keys())
        for k in f.keys():
            ref = f.get_tensor(k)
            assert mine[k].dtype == ref.dtype and mine[k].shape == ref.shape, k
            assert np.array_equal(mine[k], ref), k


def test_save_state_dict_round_trips_and_the_library_reads_it(tmp_path):
    from safetensors.numpy import load_file
    tensors = {"step": np.array(7, np.int64), "lr": np.array(0.5, np.float64),
               "m.w": np.arange(6, dtype=np.float32).reshape(2, 3),
               "big": np.arange(4, dtype=">f4")}
    path = tmp_path / "state.safetensors"
    fio.save_state_dict(tensors, path, metadata={"k": "v"})
    mine, meta = fio.read_state_dict(path)
    assert meta == {"k": "v"} and list(mine) == list(tensors)
    for k, want in tensors.items():
        assert mine[k].shape == want.shape and mine[k].dtype == want.dtype.newbyteorder("=")
        assert np.array_equal(mine[k], want), k
    assert set(load_file(str(path))) == set(tensors)
    with pytest.raises(ValueError, match="'o' has dtype object"):
        fio.save_state_dict({"o": np.array([None])}, tmp_path / "x.safetensors")


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(tmp_path, umask):
    """As open() does (the run directory's JSON files), not 0600 as a temporary file is."""
    old = os.umask(umask)
    try:
        fio.save(transformer(), tmp_path / "model.safetensors")
        fio.save_state_dict({"a": np.zeros(2, np.float32)}, tmp_path / "state.safetensors")
    finally:
        os.umask(old)
    for name in ("model.safetensors", "state.safetensors"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o666 & ~umask, name
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors", "state.safetensors"]


def test_huge_rank_shape_is_checked_quickly(saved, tmp_path):
    _, path = saved
    header, data = raw_parts(path)
    _last_tensor(header)[1]["shape"] = [10**9] * 200_000
    bad = write_raw(tmp_path / "rank.safetensors", header, data)
    t0 = time.perf_counter()
    fails(bad, r"needs more than \d+ bytes")
    assert time.perf_counter() - t0 < 0.5


def test_float8_is_refused(saved, tmp_path):
    m, path = saved
    header, data = raw_parts(path)
    info = header[KEY]
    n = int(np.prod(info["shape"]))
    begin, end = info["data_offsets"]
    info["dtype"] = "F8_E4M3"              # a quarter of the bytes: move the others down
    data = data[:begin] + b"\0" * n + data[end:]
    for other in header.values():
        if other is not info and "data_offsets" in other and other["data_offsets"][0] >= end:
            other["data_offsets"] = [o - (end - begin - n) for o in other["data_offsets"]]
    info["data_offsets"] = [begin, begin + n]
    bad = write_raw(tmp_path / "f8.safetensors", header, data)
    fails(bad, rf"wrong dtype: {re.escape(KEY)}: dtype F8_E4M3 \(not a supported float type")
    fails(bad, rf"tensor '{re.escape(KEY)}' has dtype F8_E4M3, which NumPy cannot hold",
          load=fio.read_state_dict)


def test_state_dict_shapes_knows_only_savable_classes():
    with pytest.raises(ValueError, match="Linear"):
        list(fio.state_dict_shapes("Linear", {}))


# ----------------------------------------------------------------------------------------------
# quantized models: saved as they are, never quantized again on load

QUANT = ("int8", "bf16")


@pytest.fixture(params=QUANT)
def saved_quantized(request, tmp_path):
    """(quantized Seq2SeqTransformer, its compute type, path)."""
    m = seq2seq().quantize(request.param)
    path = tmp_path / f"{request.param}.safetensors"
    fio.save(m, path)
    return m, request.param, path


def quantized_params(model):
    from fastattn.ops import QuantizedWeight
    return {k: v for k, v in model.named_parameters() if isinstance(v, QuantizedWeight)}


def test_quantized_round_trip_is_exact(saved_quantized):
    m, kind, path = saved_quantized
    loaded = fio.load(path)
    assert loaded.compute_type == kind
    got, want = quantized_params(loaded), quantized_params(m)
    assert list(got) == list(want) and want
    for k in want:
        assert got[k].dtype == kind and np.array_equal(got[k].data, want[k].data), k
        if kind == "int8":
            assert np.array_equal(got[k].scale, want[k].scale), k
    assert_same_state(m, loaded)                  # the float32 rest, and the dequantized values
    assert np.array_equal(outputs(loaded, np.random.default_rng(5), "seq2seq"),
                          outputs(m, np.random.default_rng(5), "seq2seq"))
    ref = fio.load(path, backend="reference")
    assert ref.compute_type == kind and ref.backend == "reference"


def test_quantized_file_stores_int8_with_scales_or_bf16(saved_quantized):
    m, kind, path = saved_quantized
    header, _ = raw_parts(path)
    assert header["__metadata__"]["compute_type"] == kind
    for k, w in quantized_params(m).items():
        assert header[k]["dtype"] == {"int8": "I8", "bf16": "BF16"}[kind]
        assert header[k]["shape"] == list(w.shape)
        if kind == "int8":
            assert header[k + "_scale"] == {**header[k + "_scale"], "dtype": "F32",
                                            "shape": [w.shape[0]]}
        else:
            assert k + "_scale" not in header
    assert header["src_tok_emb.embedding.weight"]["dtype"] == "F32"
    assert Path(path).stat().st_size < 0.6 * sum(v.nbytes for v in seq2seq().state_dict().values())


def test_quantized_file_reads_back_in_the_safetensors_library(saved_quantized):
    m, kind, path = saved_quantized
    if kind == "bf16":
        torch = pytest.importorskip("torch")
        from safetensors.torch import load_file
        t = load_file(str(path))
        for k, w in quantized_params(m).items():
            assert t[k].dtype == torch.bfloat16
            assert np.array_equal(t[k].float().numpy(), w.dequantize()), k
    else:
        from safetensors.numpy import load_file
        t = load_file(str(path))
        for k, w in quantized_params(m).items():
            assert np.array_equal(t[k], w.data) and np.array_equal(t[k + "_scale"], w.scale)


@pytest.mark.parametrize("kind", QUANT)
def test_load_with_compute_type_quantizes_a_float32_file_once(tmp_path, kind):
    m = seq2seq()
    path = tmp_path / "f32.safetensors"
    fio.save(m, path)
    loaded = fio.load(path, compute_type=kind)
    want = seq2seq().quantize(kind)
    assert loaded.compute_type == kind
    for k, w in quantized_params(want).items():
        assert np.array_equal(quantized_params(loaded)[k].data, w.data), k
    assert np.array_equal(outputs(loaded, np.random.default_rng(5), "seq2seq"),
                          outputs(want, np.random.default_rng(5), "seq2seq"))
    assert fio.load(path, compute_type="float32").compute_type == "float32"


def test_load_as_float32_dequantizes_and_other_types_are_refused(saved_quantized, tmp_path):
    m, kind, path = saved_quantized
    f32 = fio.load(path, compute_type="float32")
    assert f32.compute_type == "float32"
    assert_same_state(m, f32)
    other = {"int8": "bf16", "bf16": "int8"}[kind]
    with pytest.raises(ValueError, match=f"holds {kind} weights; converting them to {other} "
                                         "would quantize twice"):
        fio.load(path, compute_type=other)
    with pytest.raises(ValueError, match="compute_type must be None or one of"):
        fio.load(path, compute_type="fp8")


def test_save_refuses_a_mixed_model(tmp_path):
    m = seq2seq()
    m.transformer.encoder.quantize("int8")
    with pytest.raises(ValueError, match="different types"):
        fio.save(m, tmp_path / "mixed.safetensors")


def _edit_tensor(path, out, key, fn):
    """The file at `path` with the raw bytes of tensor `key` replaced by fn(bytes)."""
    header, data = raw_parts(path)
    begin, end = header[key]["data_offsets"]
    return write_raw(out, header, data[:begin] + fn(data[begin:end]) + data[end:])


def test_lying_quantized_files_are_refused(saved_quantized, tmp_path):
    m, kind, path = saved_quantized
    key = next(iter(quantized_params(m)))
    header, data = raw_parts(path)
    header["__metadata__"]["compute_type"] = "int4"
    fails(write_raw(tmp_path / "type.safetensors", header, data), "unknown compute_type")
    header, data = raw_parts(path)
    del header["__metadata__"]["compute_type"]             # quantized tensors, float32 file
    nometa = write_raw(tmp_path / "nometa.safetensors", header, data)
    if kind == "int8":
        fails(nometa, rf"wrong dtype: {re.escape(key)}: dtype I8")
    else:                                   # bfloat16 tensors of a float32 file: widened
        widened = fio.load(nometa)
        assert widened.compute_type == "float32"
        assert_same_state(m, widened)
    if kind == "int8":
        neg = np.float32(-1.0).tobytes()
        bad = _edit_tensor(path, tmp_path / "neg.safetensors", key + "_scale",
                           lambda b: neg + b[4:])
        fails(bad, rf"tensor {re.escape(key)}: .*scale")
        t, meta = fio.read_state_dict(path)
        del t[key + "_scale"]
        out = tmp_path / "noscale.safetensors"
        fio._write(str(out), {k: ("I8" if v.dtype == np.int8 else "F32", v)
                              for k, v in t.items()}, meta)
        fails(out, rf"missing tensors: {re.escape(key)}_scale")
    header, data = raw_parts(path)
    header["__metadata__"]["compute_type"] = {"int8": "bf16", "bf16": "int8"}[kind]
    fails(write_raw(tmp_path / "other.safetensors", header, data), "wrong dtype|missing tensors")


@pytest.mark.parametrize("pad_id, words", [
    (V_SRC, rf"pad_id {V_SRC} is outside the vocabulary \(ids 0\.\.{V_SRC - 1}"),
    (10**6, r"pad_id 1000000 is outside the vocabulary"),
    (-1, r"pad_id -1 is outside the vocabulary"),
])
def test_a_pad_id_outside_the_vocabulary_is_refused_at_load(saved_s2s, tmp_path, pad_id,
                                                            words):
    _, path = saved_s2s
    bad = with_config(path, tmp_path / "pad.safetensors", pad_id=pad_id)
    fails(bad, words)
