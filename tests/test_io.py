"""fastattn.io: safetensors save/load round trips exactly; broken, foreign or mismatched files
are a ValueError naming the problem; nothing is ever unpickled."""
import ast
import json
import pickle
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
    assert imported <= {"json", "os", "numpy", "safetensors"}, imported
