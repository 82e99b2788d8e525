"""Pretrained encoder-decoder models from local Hugging Face directories, on fastattn's model.

Marian / OPUS-MT, M2M100 / NLLB-200 dense and BART / mBART directories load with
`load_pretrained(DIR)`, which gives a `Translator` (logits, generate, translate, save) that
searches by transformers' rules. Nothing here downloads; weights are read as safetensors
(never unpickled); the tokenizers need the `hf` extra. Guide: docs/pretrained.md.
"""
from .config import FAMILIES, Architecture, read_config
from .model import (MANIFEST, Translator, build_model, is_model_dir, load_pretrained,
                    to_state_dict)
from .tokenizer import load_tokenizer
from .weights import CONVERT_COMMAND, expected_shapes, read_weights

__all__ = ["load_pretrained", "Translator", "build_model", "to_state_dict", "is_model_dir",
           "MANIFEST", "load_tokenizer",
           "FAMILIES", "Architecture", "read_config", "read_weights", "expected_shapes",
           "CONVERT_COMMAND"]
