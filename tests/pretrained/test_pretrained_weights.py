"""fastattn.pretrained.read_weights against models transformers makes and saves (tiny, random
weights): every tensor the architecture needs, tied embeddings resolved, and the directories it
must refuse: a pickle, a truncated file, a tensor of the wrong shape, a missing one."""
import json

import numpy as np
import pytest

from fastattn import io
from fastattn.pretrained import expected_shapes, read_config, read_weights

SMALL = dict(vocab_size=120, d_model=48, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
             decoder_ffn_dim=96, max_position_embeddings=64)
CLASSES = {"marian": ("MarianConfig", "MarianMTModel"),
           "m2m_100": ("M2M100Config", "M2M100ForConditionalGeneration"),
           "bart": ("BartConfig", "BartForConditionalGeneration"),
           "mbart": ("MBartConfig", "MBartForConditionalGeneration")}


def make(tmp_path, family, **extra):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg_cls, model_cls = (getattr(transformers, n) for n in CLASSES[family])
    if family == "marian":
        extra = dict(pad_token_id=119, decoder_start_token_id=119, **extra)
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**SMALL, **extra)).eval()
    if family in ("marian", "bart", "mbart"):
        model.final_logits_bias.normal_()            # zeros as made: make it count
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize("family", list(CLASSES))
def test_every_tensor_equals_transformers(tmp_path, family):
    model = make(tmp_path, family)
    arch = read_config(tmp_path)
    got = read_weights(tmp_path, arch)
    assert set(got) == set(expected_shapes(arch))
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for name, arr in got.items():
        assert arr.dtype == np.float32 and arr.shape == expected_shapes(arch)[name], name
        np.testing.assert_array_equal(arr, sd[name], err_msg=name)
    np.testing.assert_array_equal(got["lm_head.weight"],
                                  got["model.decoder.embed_tokens.weight"])


def test_pickle_only_directory_is_refused_with_the_command(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04 not unpickled")
    with pytest.raises(ValueError, match=r"(?s)pytorch_model.bin: is a pickle, which fastattn "
                                         r"never unpickles.*safe_serialization=True"):
        read_weights(tmp_path, None)


def test_no_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        read_weights(tmp_path, None)


def test_truncated_and_edited_files(tmp_path):
    make(tmp_path, "marian")
    arch = read_config(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors, meta = io.read_state_dict(path)
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) - 100])                      # truncated
    with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors "
                                         r"file: .*truncated"):
        read_weights(tmp_path, arch)
    bad = dict(tensors)
    bad["model.encoder.layers.1.fc1.weight"] = np.zeros((97, 48), np.float32)
    io.save_state_dict(bad, path, meta)
    with pytest.raises(ValueError, match=r"tensor 'model.encoder.layers.1.fc1.weight' has "
                                         r"shape \(97, 48\); config.json implies \(96, 48\)"):
        read_weights(tmp_path, arch)
    bad = {k: v for k, v in tensors.items() if k != "model.decoder.layers.0.fc2.bias"}
    io.save_state_dict(bad, path, meta)
    with pytest.raises(ValueError, match="has no tensor 'model.decoder.layers.0.fc2.bias'"):
        read_weights(tmp_path, arch)
    bad = dict(tensors)
    bad["model.decoder.layers.0.fc2.bias"] = np.zeros(48, np.int32)
    io.save_state_dict(bad, path, meta)
    with pytest.raises(ValueError, match="is I32: a weight must be F32, F16 or BF16"):
        read_weights(tmp_path, arch)


def test_sharded_directory(tmp_path):
    make(tmp_path, "bart")
    arch = read_config(tmp_path)
    tensors, meta = io.read_state_dict(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    for shard, part in shards.items():
        io.save_state_dict({n: tensors[n] for n in part}, tmp_path / shard, meta)
    index = {"weight_map": {n: s for s, part in shards.items() for n in part}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    got = read_weights(tmp_path, arch)
    for name in expected_shapes(arch):
        np.testing.assert_array_equal(got[name], tensors.get(name, got[name]))
    index["weight_map"]["model.shared.weight"] = "../elsewhere.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="shards must be safetensors files in the model"):
        read_weights(tmp_path, arch)
