"""Save and load models as safetensors files; nothing is ever unpickled.

The file holds the model's state_dict (torch's keys and layouts, float32) and, in its text
metadata, the class name and constructor config, so ``load(path)`` rebuilds the right class:

    fastattn.io.save(model, "model.safetensors")
    model = fastattn.io.load("model.safetensors", backend="fast")

Errors are ValueError with the file and the problem named: not a safetensors file (or a
truncated one), not written by fastattn, a config that does not build a model, a missing or
unexpected tensor, a tensor of the wrong shape.
"""
import json
import os

import numpy as np

from . import nn

FORMAT = "fastattn/1"
SAVABLE = {"Transformer": nn.Transformer, "Seq2SeqTransformer": nn.Seq2SeqTransformer}

__all__ = ["save", "load", "read_state_dict"]


def _safetensors():
    try:
        from safetensors import safe_open
        from safetensors.numpy import save_file
    except ImportError as exc:                        # a declared dependency; say what to do
        raise ImportError("fastattn.io needs the safetensors package: pip install "
                          "safetensors") from exc
    return safe_open, save_file


def save(model, path):
    """Write `model` (Transformer or Seq2SeqTransformer) to `path` in safetensors format."""
    name = type(model).__name__
    if name not in SAVABLE or not isinstance(model, SAVABLE[name]):
        raise TypeError(f"save: can save {', '.join(SAVABLE)}, got {type(model).__name__}")
    _, save_file = _safetensors()
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32)
               for k, v in model.state_dict().items()}
    metadata = {"format": FORMAT, "class": name, "config": json.dumps(model.config)}
    save_file(tensors, os.fspath(path), metadata=metadata)


def read_state_dict(path):
    """(state_dict, metadata) of a safetensors file: NumPy arrays, text metadata."""
    safe_open, _ = _safetensors()
    path = os.fspath(path)
    try:
        with safe_open(path, framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError:
        raise
    except Exception as exc:     # safetensors reports header/size problems with its own type
        raise ValueError(f"load: {path} is not a readable safetensors file "
                         f"(truncated or corrupt?): {exc}") from None
    return tensors, metadata


def load(path, *, backend="fast"):
    """Rebuild the model saved at `path` (class and config from the metadata), load its
    weights strictly and return it on `backend`."""
    tensors, meta = read_state_dict(path)
    if meta.get("format") != FORMAT or meta.get("class") not in SAVABLE:
        raise ValueError(f"load: {path} was not written by fastattn.io.save (metadata "
                         f"format={meta.get('format')!r}, class={meta.get('class')!r})")
    try:
        config = json.loads(meta["config"])
        model = SAVABLE[meta["class"]](**config, backend=backend)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"load: the config stored in {path} does not build a "
                         f"{meta['class']}: {exc}") from None
    try:
        model.load_state_dict(tensors, strict=True)
    except ValueError as exc:
        raise ValueError(f"load: {path} does not match its config: {exc}") from None
    return model
