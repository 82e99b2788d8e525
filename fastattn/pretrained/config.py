"""A pretrained model directory's config.json read into the architecture fastattn runs.

The four families of encoder-decoder translation and summarisation models people have as
Hugging Face directories differ from the seed Transformer in a few settled ways, which become
options of fastattn's own modules rather than a second model stack:

```text
Marian (marian)     post-norm; token * sqrt(d) where scale_embedding; sinusoidal positions
                    from 0 (sin in the first half of the features, cos in the second);
                    final_logits_bias added to the logits
M2M100, NLLB        pre-norm with a final layer norm after each stack; token * sqrt(d)
(m2m_100)           where scale_embedding; sinusoidal positions counted from the pad id
                    + 1 over the tokens that are not padding (padding: a zero row)
BART (bart)         post-norm; learned positions at 2 + position; a layer norm right after
                    token * scale + positions (layernorm_embedding); final_logits_bias
mBART (mbart)       as BART, but pre-norm with a final layer norm after each stack
```

Every layer: attention with biases on q, k, v and out (scores scaled by `head_dim ** -0.5`),
layer norms with eps 1e-5, a feed-forward of activation_function ("swish" / "silu" -> silu,
"gelu" exact, "relu", "gelu_new" / "gelu_fast" / "gelu_pytorch_tanh" -> gelu_tanh).

transformers writes every key when it saves a config; a config.json written otherwise may leave
out the keys whose value is its family's default, and those defaults (transformers' config
classes', recorded in FAMILY_DEFAULTS) fill them in. What fastattn cannot run is refused by
name: another model_type (T5's relative attention bias, NLLB's mixture of experts, FSMT, ...),
different encoder and decoder widths, and settings the family's code never honours.
"""
import math
import os
from dataclasses import dataclass

from .. import io as _io

__all__ = ["Architecture", "read_config", "FAMILIES"]

FAMILIES = ("marian", "m2m_100", "bart", "mbart")

# transformers' config classes' defaults (MarianConfig, M2M100Config, BartConfig, MBartConfig)
_COMMON = dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
               decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096,
               max_position_embeddings=1024, tie_word_embeddings=True, scale_embedding=False,
               activation_function="gelu", pad_token_id=1, bos_token_id=0, eos_token_id=2,
               forced_bos_token_id=None, forced_eos_token_id=2)
FAMILY_DEFAULTS = {
    "marian": {**_COMMON, "vocab_size": 58101, "pad_token_id": 58100, "bos_token_id": None,
               "eos_token_id": 0, "decoder_start_token_id": 58100, "forced_eos_token_id": 0,
               "share_encoder_decoder_embeddings": True},
    "m2m_100": {**_COMMON, "vocab_size": 128112, "activation_function": "relu",
                "scale_embedding": True, "decoder_start_token_id": 2,
                "forced_eos_token_id": None},
    "bart": {**_COMMON, "vocab_size": 50265, "decoder_start_token_id": 2},
    "mbart": {**_COMMON, "vocab_size": 50265, "decoder_start_token_id": None},
}

# activation_function -> fastattn's name (transformers' ACT2FN entries these models use)
_ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu",
                "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh"}

# settings of older configs that each family's code never reads: a value other than the one
# its fixed layout means would describe another model (the Marian converter refuses them too)
_FIXED = {
    "marian": {"normalize_before": False, "normalize_embedding": False,
               "static_position_embeddings": True, "add_final_layer_norm": False},
    "bart": {"normalize_before": False, "add_final_layer_norm": False},
    "mbart": {},
    "m2m_100": {},
}

# what another model_type is, for the refusal
_OTHERS = {"nllb-moe": "NLLB's mixture of experts", "t5": "T5 (relative attention bias)",
           "mt5": "mT5 (relative attention bias)", "fsmt": "FSMT",
           "pegasus": "Pegasus", "blenderbot": "Blenderbot", "led": "LED", "plbart": "PLBart"}


@dataclass(frozen=True)
class Architecture:
    """What fastattn builds for a pretrained model, read from its config.json.

    Made by `read_config`; each field is also an attribute (the dataclass is frozen).

    Args:
        family: one of `FAMILIES`: "marian", "m2m_100", "bart" or "mbart".
        vocab_size: the source (and shared) vocabulary size.
        d_model: the model width.
        nhead: attention heads.
        encoder_layers: encoder layers.
        decoder_layers: decoder layers.
        dim_feedforward: the feed-forward hidden width.
        activation: fastattn's name: "relu", "gelu", "gelu_tanh" or "silu".
        max_positions: the most positions the position table holds.
        norm_first: pre-norm layers (and a final layer norm after each stack).
        layernorm_embedding: a layer norm right after token * scale + positions.
        positions: "sinusoidal" (Marian), "sinusoidal_offset" (M2M100) or "learned" (BART,
            mBART: 2 + position).
        embed_scale: sqrt(d_model) with scale_embedding, else 1.
        logits_bias: final_logits_bias added to the logits.
        share_embeddings: one token table for encoder and decoder.
        tie_output: the output projection is the decoder's token table.
        decoder_vocab_size: the target vocabulary size.
        pad_id: the padding token id.
        eos_id: the end-of-sequence token id.
        bos_id: the beginning-of-sequence token id, or None.
        decoder_start_id: the decoder's first token, or None (mBART: the target language
            code, given later).
        forced_bos_id: the token forced first in generation, or None.
        forced_eos_id: the token forced at the last position, or None.
    """

    family: str                 # one of FAMILIES
    vocab_size: int
    d_model: int
    nhead: int
    encoder_layers: int
    decoder_layers: int
    dim_feedforward: int
    activation: str             # fastattn's name: "relu" | "gelu" | "gelu_tanh" | "silu"
    max_positions: int
    norm_first: bool            # pre-norm layers (and a final layer norm after each stack)
    layernorm_embedding: bool   # a layer norm right after token * scale + positions
    positions: str              # "sinusoidal" (Marian), "sinusoidal_offset" (M2M100),
                                # "learned" (BART, mBART: 2 + position)
    embed_scale: float          # sqrt(d_model) with scale_embedding, else 1
    logits_bias: bool           # final_logits_bias added to the logits
    share_embeddings: bool      # one token table for encoder and decoder
    tie_output: bool            # the output projection is the decoder's token table
    decoder_vocab_size: int
    pad_id: int
    eos_id: int
    bos_id: object              # int or None
    decoder_start_id: object    # int or None (mBART: the target language code, given later)
    forced_bos_id: object       # int or None
    forced_eos_id: object       # int or None


def _fail(path, what):
    raise ValueError(f"{path}: {what}")


def _int(cfg, key, path, lo=0, optional=False):
    v = cfg[key]
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        _fail(path, f"{key} must be an integer >= {lo}{' or null' if optional else ''}, "
                    f"got {v!r}")
    return v


def _bool(cfg, key, path):
    v = cfg[key]
    if not isinstance(v, bool):
        _fail(path, f"{key} must be true or false, got {v!r}")
    return v


def read_config(directory):
    """Read a model directory's config.json into the `Architecture` fastattn runs.

    Args:
        directory: the model directory (str or path-like).

    Returns:
        The `Architecture`.

    Raises:
        FileNotFoundError: the directory has no config.json.
        ValueError: a config fastattn cannot run or that contradicts itself (the file and the
            key named).
    """
    path = os.path.join(os.fspath(directory), "config.json")
    try:
        with open(path, "rb") as f:
            data = f.read((1 << 20) + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no config.json in the model directory") from None
    if len(data) > 1 << 20:
        _fail(path, "is larger than 1 MiB: not a model configuration")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(path, f"is not UTF-8 ({exc.reason} at byte {exc.start})")
    raw = _io._json(text, path)
    if not isinstance(raw, dict):
        _fail(path, f"must hold a JSON object, got {type(raw).__name__}")
    family = raw.get("model_type")
    if family not in FAMILIES:
        known = ", ".join(FAMILIES)
        if family is None:
            _fail(path, f"has no model_type (fastattn runs {known})")
        what = _OTHERS.get(family, repr(family))
        _fail(path, f"model_type {family!r} ({what}) is not supported: fastattn runs {known}")
    cfg = {**FAMILY_DEFAULTS[family], **raw}
    for key, meant in _FIXED[family].items():
        if key in raw and raw[key] != meant:
            _fail(path, f"{key} = {raw[key]!r}: {family} models are built with {key} = "
                        f"{meant!r}; this configuration describes another model")
    d = _int(cfg, "d_model", path, 1)
    heads = {k: _int(cfg, k, path, 1) for k in ("encoder_attention_heads",
                                                  "decoder_attention_heads")}
    ffn = {k: _int(cfg, k, path, 1) for k in ("encoder_ffn_dim", "decoder_ffn_dim")}
    if heads["encoder_attention_heads"] != heads["decoder_attention_heads"]:
        _fail(path, f"encoder_attention_heads = {heads['encoder_attention_heads']} and "
                    f"decoder_attention_heads = {heads['decoder_attention_heads']} differ: "
                    "fastattn's stacks share one head count")
    if ffn["encoder_ffn_dim"] != ffn["decoder_ffn_dim"]:
        _fail(path, f"encoder_ffn_dim = {ffn['encoder_ffn_dim']} and decoder_ffn_dim = "
                    f"{ffn['decoder_ffn_dim']} differ: fastattn's stacks share one width")
    nhead = heads["encoder_attention_heads"]
    if d % nhead:
        _fail(path, f"d_model = {d} is not a multiple of the {nhead} attention heads")
    act = cfg["activation_function"]
    if act not in _ACTIVATIONS:
        _fail(path, f"activation_function {act!r} is not supported (fastattn runs "
                    f"{', '.join(sorted(_ACTIVATIONS))})")
    vocab = _int(cfg, "vocab_size", path, 1)
    share = family != "marian" or _bool(cfg, "share_encoder_decoder_embeddings", path)
    dec_vocab = _int(cfg, "decoder_vocab_size", path, 1) if family == "marian" and \
        cfg.get("decoder_vocab_size") is not None else vocab
    if share and dec_vocab != vocab:
        _fail(path, f"share_encoder_decoder_embeddings is true but decoder_vocab_size = "
                    f"{dec_vocab} differs from vocab_size = {vocab}")
    ids = {}
    for key, optional in (("pad_token_id", False), ("eos_token_id", False),
                          ("bos_token_id", True), ("decoder_start_token_id", True),
                          ("forced_bos_token_id", True), ("forced_eos_token_id", True)):
        v = _int(cfg, key, path, 0, optional)
        if v is not None and v >= dec_vocab:
            _fail(path, f"{key} = {v} is outside the vocabulary of {dec_vocab} tokens")
        ids[key] = v
    if family != "mbart" and ids["decoder_start_token_id"] is None:
        _fail(path, "decoder_start_token_id is null: a generation would not know its first "
                    "token")
    norm_first = family in ("m2m_100", "mbart")
    return Architecture(
        family=family, vocab_size=vocab, d_model=d, nhead=nhead,
        encoder_layers=_int(cfg, "encoder_layers", path, 0),
        decoder_layers=_int(cfg, "decoder_layers", path, 0),
        dim_feedforward=ffn["encoder_ffn_dim"], activation=_ACTIVATIONS[act],
        max_positions=_int(cfg, "max_position_embeddings", path, 1),
        norm_first=norm_first, layernorm_embedding=family in ("bart", "mbart"),
        positions={"marian": "sinusoidal", "m2m_100": "sinusoidal_offset"}.get(family,
                                                                               "learned"),
        embed_scale=math.sqrt(d) if _bool(cfg, "scale_embedding", path) else 1.0,
        logits_bias=family != "m2m_100", share_embeddings=share,
        tie_output=_bool(cfg, "tie_word_embeddings", path),
        decoder_vocab_size=dec_vocab, pad_id=ids["pad_token_id"], eos_id=ids["eos_token_id"],
        bos_id=ids["bos_token_id"], decoder_start_id=ids["decoder_start_token_id"],
        forced_bos_id=ids["forced_bos_token_id"], forced_eos_id=ids["forced_eos_token_id"])
