"""Sequence generation for Seq2SeqTransformer: greedy, beam search and sampling (search only).

```python
out = model.generate(src_ids, max_new_tokens=64, start_id=2, end_id=3)   # (B, T) int64
```

The model does the math, one position per step (``model.init_cache`` / ``model.step``, through
its layers' own decode steps); this package only chooses tokens (``sampling``) and keeps the
hypotheses (``search``). How a step runs:

- the encoder runs once; each decoder layer's cross-attention keys and values are projected
  once per source and shared by that source's beams (the beams are the attention's queries);
- self-attention keys and values go into a cache preallocated per layer, (rows, H, T_max, D),
  written in place at each step; only the last position runs through the decoder and only its
  logits are computed; on the fast backend the weights are streamed once per step, packed;
- rows that have finished are dropped from the work (their caches compacted away), and beams
  are reordered by gathering cache rows.

Both backends run the same steps (the reference backend with the NumPy twin's ops), so they
produce the same tokens (up to float32 rounding in near-ties), and the tokens are those of the
greedy loop over the full forward ``model(src, prefix)``.

Output: int64 (B, T), each row beginning with start_id, T = 1 + the longest generated row
(at most 1 + max_new_tokens), each row padded with pad_id after its end_id. end_id=None never
stops early.

Beam search: every source keeps ``beam_size`` slots, 1 <= beam_size <= min(MAX_BEAM_SIZE,
the target vocabulary size) (a ValueError otherwise: a wider beam cannot hold distinct
hypotheses, and each slot is a row of decoder state). At each step, the slots' live hypotheses
are extended by every token and the ``beam_size`` best continuations (by summed log
probability; ties to the lower slot, then the lower token id) fill the slots. A continuation
ending in end_id is finished: it is set aside with the score
``sum log p / (generated length) ** length_penalty`` (the end token counts) and its slot stays
empty from then on. A source stops when no live hypothesis is left, or at max_new_tokens,
where the live ones are scored the same way; the best finished-or-live hypothesis wins (ties:
the first found). So beam_size=1 is exactly greedy decoding.

Sampling: logits / temperature, then top_k (keep the k largest), then top_p (keep the smallest
set of most likely tokens whose probability reaches top_p), then one draw per row from a
NumPy Generator seeded with ``seed``: the same seed gives the same output. The logits are
max-subtracted before the division by the temperature, so a tiny temperature tends to greedy;
only a kept token can be drawn.

NaN or +inf logits (or a row without a finite logit) raise ValueError naming the step, in
every method (see ``sampling``).
"""
import math
import numbers

import numpy as np

from . import sampling, search
from .search import MAX_BEAM_SIZE, check_beam, pad_rows

__all__ = ["generate", "METHODS", "MAX_BEAM_SIZE", "pad_rows"]

METHODS = ("greedy", "beam", "sample")


# ---- argument checks ---------------------------------------------------------------------------

def _int(name, value, lo, hi=None, allow_none=False):
    if value is None and allow_none:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"generate: {name} must be an int, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        upper = "" if hi is None else f" and <= {hi}"
        raise ValueError(f"generate: {name} must be >= {lo}{upper}, got {value}")
    return int(value)


def _real(name, value, positive=True):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"generate: {name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"generate: {name} must be > 0, got {value!r}")
    return float(value)


def _check(model, src_ids, max_new_tokens, start_id, end_id, pad_id, src_key_padding_mask,
           method, beam_size, length_penalty, temperature, top_k, top_p):
    V = model.tgt_vocab_size
    src = np.asarray(src_ids)
    if src.dtype.kind not in "iu":
        raise TypeError(f"generate: src_ids must be integer token ids, got dtype {src.dtype}")
    if src.ndim != 2:
        raise ValueError(f"generate: src_ids must be (B, S), got shape {src.shape}")
    if method not in METHODS:
        raise ValueError(f"generate: method must be one of {METHODS}, got {method!r}")
    args = dict(
        max_new_tokens=_int("max_new_tokens", max_new_tokens, 0),
        start_id=_int("start_id", start_id, 0, V - 1),
        end_id=_int("end_id", end_id, 0, V - 1, allow_none=True),
        pad_id=_int("pad_id", pad_id, 0, V - 1),
        beam_size=_int("beam_size", beam_size, 1),
        length_penalty=_real("length_penalty", length_penalty, positive=False),
        temperature=_real("temperature", temperature),
        top_k=_int("top_k", top_k, 1, allow_none=True),
        top_p=None if top_p is None else _real("top_p", top_p),
    )
    if method == "beam":
        check_beam(args["beam_size"], V)
    if args["top_p"] is not None and args["top_p"] > 1:
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p!r}")
    # positions 0 .. max_new_tokens - 1 are fed to the decoder (the last token never is)
    if args["max_new_tokens"] > model.max_len:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens} exceeds the model's "
                         f"max_len={model.max_len} positions")
    if src_key_padding_mask is not None:
        kpm = np.asarray(src_key_padding_mask)
        if kpm.shape != src.shape:
            raise ValueError(f"generate: src_key_padding_mask must have the shape of src_ids "
                             f"{src.shape}, got {kpm.shape}")
    return src, args


class _Decoding:
    """A model's decode step and its cache, as the search loops see a decoder."""

    def __init__(self, model, cache):
        self.model, self.cache = model, cache

    def step(self, tokens):
        return self.model.step(tokens, self.cache)

    def reorder(self, rows, sources=None):
        self.cache.reorder(rows, sources)


def generate(model, src_ids, *, max_new_tokens, start_id, end_id=None, pad_id=0,
             src_key_padding_mask=None, method="greedy", beam_size=4, length_penalty=1.0,
             temperature=1.0, top_k=None, top_p=None, seed=None):
    """Generate target ids for a batch of sources with a Seq2SeqTransformer.

    The methods and their rules are described in the module docstring.

    Args:
        model: the `Seq2SeqTransformer` (its backend runs the steps).
        src_ids: (B, S) integer source token ids.
        max_new_tokens: the most tokens to generate per row (at most the model's positions).
        start_id: the decoder's first token; every output row begins with it.
        end_id: the token that ends a row; None (the default) never stops early.
        pad_id: the token that pads the output after a row's end_id, and marks the source's
            padding when `src_key_padding_mask` is None (default 0).
        src_key_padding_mask: (B, S) bool, True = padding; None (the default) takes it from
            `pad_id`.
        method: "greedy" (the default), "beam" or "sample".
        beam_size: beams per source for "beam" (default 4; 1 is greedy).
        length_penalty: beam search's exponent on the generated length (default 1.0).
        temperature: the sampling temperature, > 0 (default 1.0).
        top_k: sample from the k largest logits only; None (the default) for all.
        top_p: sample from the smallest set of tokens whose probability reaches top_p, in
            (0, 1]; None (the default) for all.
        seed: the sampling generator's seed (numpy.random.default_rng); the same seed gives
            the same output, None (the default) a fresh one each call.

    Returns:
        int64 (B, T): rows starting with start_id, padded with pad_id after their end_id;
            T = 1 + the longest generated row.

    Raises:
        TypeError: src_ids or an option of the wrong type.
        ValueError: a bad shape or option, max_new_tokens beyond the model's positions, or
            NaN / +inf logits (the step named).
    """
    src, a = _check(model, src_ids, max_new_tokens, start_id, end_id, pad_id,
                    src_key_padding_mask, method, beam_size, length_penalty, temperature, top_k,
                    top_p)
    B = src.shape[0]
    if B == 0 or a["max_new_tokens"] == 0:
        return np.full((B, 1), a["start_id"], dtype=np.int64)
    k = a["beam_size"] if method == "beam" else 1
    cache = model.init_cache(src, src_key_padding_mask, beams=k, max_len=a["max_new_tokens"])
    decoder = _Decoding(model, cache)
    kw = dict(max_new_tokens=a["max_new_tokens"], start_id=a["start_id"], end_id=a["end_id"],
              pad_id=a["pad_id"])
    if method == "beam":
        return search.beam(decoder, B, k, length_penalty=a["length_penalty"], **kw)
    if method == "greedy":
        return search.single(decoder, B, sampling.greedy, **kw)
    rng = np.random.default_rng(seed)
    return search.single(decoder, B, lambda logits: sampling.sample(
        logits, rng, a["temperature"], a["top_k"], a["top_p"]), **kw)
