"""fastattn.pretrained.read_config: each family's config.json, as transformers saves it and as
a hand-written one leaving out its defaults, read into the architecture fastattn builds; and
the directories it must refuse, naming the file and the key."""
import json
import math

import pytest

from fastattn.pretrained import FAMILIES, read_config
from fastattn.pretrained.config import FAMILY_DEFAULTS

SMALL = dict(vocab_size=120, d_model=48, encoder_layers=2, decoder_layers=3,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
             decoder_ffn_dim=96, max_position_embeddings=64)


def write(tmp_path, cfg, raw=None):
    (tmp_path / "config.json").write_text(raw if raw is not None else json.dumps(cfg))
    return tmp_path


# what each family is: (norm_first, layernorm_embedding, positions, logits_bias)
LAYOUT = {"marian": (False, False, "sinusoidal", True),
          "m2m_100": (True, False, "sinusoidal_offset", False),
          "bart": (False, True, "learned", True),
          "mbart": (True, True, "learned", True)}


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_configs(tmp_path, family):
    """A config saved by transformers' own class reads back as that family's architecture."""
    transformers = pytest.importorskip("transformers")
    cls = {"marian": "MarianConfig", "m2m_100": "M2M100Config", "bart": "BartConfig",
           "mbart": "MBartConfig"}[family]
    extra = dict(pad_token_id=119, decoder_start_token_id=119) if family == "marian" else {}
    getattr(transformers, cls)(**SMALL, **extra).save_pretrained(tmp_path)
    a = read_config(tmp_path)
    assert (a.family, a.vocab_size, a.d_model, a.nhead, a.encoder_layers, a.decoder_layers,
            a.dim_feedforward, a.max_positions) == (family, 120, 48, 4, 2, 3, 96, 64)
    assert (a.norm_first, a.layernorm_embedding, a.positions, a.logits_bias) == LAYOUT[family]
    assert a.activation == ("relu" if family == "m2m_100" else "gelu")
    assert a.embed_scale == (math.sqrt(48) if family == "m2m_100" else 1.0)


def test_defaults_fill_left_out_keys(tmp_path):
    """An OPUS-MT-like config written by hand with only what differs from Marian's defaults."""
    a = read_config(write(tmp_path, {"model_type": "marian", "d_model": 512,
                                     "encoder_layers": 6, "decoder_layers": 6,
                                     "encoder_attention_heads": 8,
                                     "decoder_attention_heads": 8, "encoder_ffn_dim": 2048,
                                     "decoder_ffn_dim": 2048, "activation_function": "swish",
                                     "scale_embedding": True, "max_position_embeddings": 512}))
    d = FAMILY_DEFAULTS["marian"]
    assert (a.vocab_size, a.pad_id, a.eos_id, a.decoder_start_id, a.forced_eos_id) == \
        (d["vocab_size"], d["pad_token_id"], d["eos_token_id"], d["decoder_start_token_id"],
         d["forced_eos_token_id"])
    assert a.activation == "silu" and a.embed_scale == math.sqrt(512) and a.share_embeddings


@pytest.mark.parametrize("cfg, pattern", [
    ({}, "has no model_type"),
    ({"model_type": "t5"}, r"model_type 't5' \(T5 \(relative attention bias\)\) is not "
                           r"supported: fastattn runs marian"),
    ({"model_type": "nllb-moe"}, "mixture of experts"),
    ({"model_type": "marian", "normalize_before": True}, "normalize_before = True"),
    ({"model_type": "bart", "add_final_layer_norm": True}, "add_final_layer_norm"),
    ({**SMALL, "model_type": "bart", "decoder_attention_heads": 8},
     "encoder_attention_heads = 4 and decoder_attention_heads = 8 differ"),
    ({**SMALL, "model_type": "bart", "decoder_ffn_dim": 64}, "encoder_ffn_dim = 96"),
    ({**SMALL, "model_type": "bart", "d_model": 50}, "d_model = 50 is not a multiple of the 4"),
    ({**SMALL, "model_type": "bart", "activation_function": "tanh"},
     "activation_function 'tanh' is not supported"),
    ({**SMALL, "model_type": "bart", "pad_token_id": 120}, "pad_token_id = 120 is outside"),
    ({**SMALL, "model_type": "bart", "d_model": "48"}, "d_model must be an integer"),
    ({**SMALL, "model_type": "bart", "encoder_layers": True}, "encoder_layers must be an int"),
    ({**SMALL, "model_type": "m2m_100", "decoder_start_token_id": None},
     "decoder_start_token_id is null"),
    ({**SMALL, "model_type": "marian", "decoder_vocab_size": 7,
      "pad_token_id": 5, "decoder_start_token_id": 5, "eos_token_id": 0},
     "share_encoder_decoder_embeddings is true but decoder_vocab_size = 7"),
    ({**SMALL, "model_type": "bart", "scale_embedding": "yes"}, "scale_embedding must be true"),
])
def test_refused_configs_name_the_file_and_key(tmp_path, cfg, pattern):
    with pytest.raises(ValueError, match=pattern) as exc:
        read_config(write(tmp_path, cfg))
    assert "config.json" in str(exc.value)


@pytest.mark.parametrize("raw, pattern", [
    ('{"model_type": "bart", "model_type": "marian"}', "duplicate key"),
    ('{"model_type": "bart",', "not valid JSON"),
    ('["bart"]', "must hold a JSON object"),
    (b'{"model_type": "\xff"}', "is not UTF-8"),
    ('{"a": "' + "x" * (1 << 20) + '"}', "larger than 1 MiB"),
])
def test_files_that_lie(tmp_path, raw, pattern):
    path = tmp_path / "config.json"
    path.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
    with pytest.raises(ValueError, match=pattern):
        read_config(tmp_path)


def test_no_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        read_config(tmp_path)
