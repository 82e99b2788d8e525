"""Held-out evaluation of a Seq2SeqTransformer on text pairs: loss, perplexity, exact match.

```python
ev = Evaluator(pairs, src_tokenizer=tok, tgt_tokenizer=tok, max_len=model.max_len)
ev(model)    # {"valid_loss": ..., "valid_ppl": ..., "valid_exact": ..., "exact_pairs": n}
```

What fit() runs at every evaluation and ``fastattn evaluate RUN_DIR DATA`` runs once:

- loss: the mean cross-entropy over every target token of the pairs (token-weighted across
  batches, no label smoothing, padding ignored), teacher-forced, in model.eval() mode; its
  exp is the perplexity. NaN when no pair fits the model.
- exact match: greedy decoding (``model.generate``, method "greedy") of the sources of a fixed
  sample of the pairs (``exact_sample`` of them, drawn once from ``seed``; None: all); a pair
  counts when the generated ids, up to and including <end>, equal its target's ids exactly
  (token ids are compared, so what the tokenizer cannot tell apart, such as case with a
  lowercasing tokenizer, is equal). None when the sample is empty.

Pairs are encoded as fit() encodes them (``EncodedPairs``): sources wrapped in <start> ...
<end> when the source tokenizer has both, targets always; a pair whose source is longer than
max_len (or empty) or whose target, less one, is longer, is left out and counted in
``skipped``.
"""
from __future__ import annotations

import math

import numpy as np

from . import batching
from .defaults import EXACT_SAMPLE

__all__ = ["Evaluator", "EncodedPairs", "EXACT_SAMPLE"]


def _encode(tok, texts, start_end):
    return [np.asarray(tok.encode(t, add_start_end=start_end), dtype=np.int64) for t in texts]


class EncodedPairs:
    """Encoded (source, target) pairs that fit a model of max_len positions: ``src`` and
    ``tgt`` (lists of int64 id arrays), their lengths ``src_lens`` / ``tgt_lens``, and
    ``skipped`` (how many pairs were left out).

    Args:
        pairs: the (source, target) str pairs.
        src_tok: encodes the sources.
        tgt_tok: encodes the targets.
        max_len: the model's positions.
    """

    def __init__(self, pairs, src_tok, tgt_tok, max_len):
        src_se = src_tok.start_id is not None and src_tok.end_id is not None
        src = _encode(src_tok, [p[0] for p in pairs], src_se)
        tgt = _encode(tgt_tok, [p[1] for p in pairs], True)
        # the encoder reads the source, the decoder tgt[:-1]: both must fit the positions
        keep = [i for i in range(len(pairs))
                if 0 < len(src[i]) <= max_len and len(tgt[i]) - 1 <= max_len]
        self.skipped = len(pairs) - len(keep)
        self.src = [src[i] for i in keep]
        self.tgt = [tgt[i] for i in keep]
        self.src_lens = np.array([len(s) for s in self.src], np.int64)
        self.tgt_lens = np.array([len(t) for t in self.tgt], np.int64)

    def __len__(self):
        return len(self.src)

    def batch(self, idx, pad_id):
        """A padded batch of some pairs.

        Args:
            idx: the pairs' indices.
            pad_id: the padding id.

        Returns:
            `(src, tgt, tokens)`: (B, S) and (B, T) int64 padded with pad_id, and the number
                of target tokens predicted.
        """
        return (batching.collate(self.src, idx, pad_id), batching.collate(self.tgt, idx, pad_id),
                int(self.tgt_lens[idx].sum() - len(idx)))


class Evaluator:
    """Loss, perplexity and greedy exact match of a model on fixed pairs (see the module
    docstring). Calling it returns {"valid_loss", "valid_ppl", "valid_exact", "exact_pairs"}
    and leaves the model in the mode it found it in.

    Args:
        pairs: the (source, target) str pairs.
        src_tokenizer: encodes the sources.
        tgt_tokenizer: encodes the targets.
        max_len: the model's positions (longer pairs are skipped).
        batch_tokens: the most padded ids per side in a batch (default 4096).
        exact_sample: pairs decoded for exact match (default 100; None: all; 0: none).
        seed: the sample's seed (default 0).
    """

    DECODE_ROWS = 64          # sources decoded together

    def __init__(self, pairs, *, src_tokenizer, tgt_tokenizer, max_len, batch_tokens=4096,
                 exact_sample=EXACT_SAMPLE, seed=0):
        self.data = EncodedPairs(pairs, src_tokenizer, tgt_tokenizer, max_len)
        self.tgt_tok = tgt_tokenizer
        self.pad = tgt_tokenizer.pad_id
        n = len(self.data)
        self.plan = batching.epoch_batches(self.data.src_lens, self.data.tgt_lens,
                                           batching.check_budget(batch_tokens), shuffle=False,
                                           window=max(1, n))
        if exact_sample is not None and (not isinstance(exact_sample, int) or
                                         isinstance(exact_sample, bool) or exact_sample < 0):
            raise ValueError(f"exact_sample must be an int >= 0 or None (all pairs), got "
                             f"{exact_sample!r}")
        k = n if exact_sample is None else min(exact_sample, n)
        chosen = np.arange(n) if k == n else np.sort(
            np.random.default_rng(seed).choice(n, k, replace=False))
        # decoded in batches of similar source lengths (less padding)
        self.exact_idx = chosen[np.argsort(self.data.src_lens[chosen], kind="stable")]

    @property
    def skipped(self):
        """How many pairs were left out (too long for the model, or empty).
    """
        return self.data.skipped

    def loss(self, model):
        """The mean cross-entropy per target token, in eval mode.

        Args:
            model: the `Seq2SeqTransformer`.

        Returns:
            `(loss, target tokens)`.
        """
        total, count = 0.0, 0
        for idx in self.plan:
            src, tgt, tokens = self.data.batch(idx, self.pad)
            total += model.loss(src, tgt) * tokens
            count += tokens
        return (total / count if count else float("nan")), count

    def exact(self, model):
        """The fraction of the sampled pairs whose greedy output equals the target.

        Args:
            model: the `Seq2SeqTransformer`.

        Returns:
            A float in [0, 1], or None when the sample is empty.
        """
        idx = self.exact_idx
        if not len(idx):
            return None
        tok, hits = self.tgt_tok, 0
        for start in range(0, len(idx), self.DECODE_ROWS):
            part = idx[start:start + self.DECODE_ROWS]
            src = batching.collate(self.data.src, part, self.pad)
            longest = int(self.data.tgt_lens[part].max())
            out = model.generate(src, max_new_tokens=longest - 1, start_id=tok.start_id,
                                 end_id=tok.end_id, pad_id=self.pad)
            for row, i in zip(out, part):
                want = self.data.tgt[i]                     # <start> ... <end>
                got = row[:len(want)]
                hits += len(got) == len(want) and bool(np.array_equal(got, want))
        return hits / len(idx)

    def __call__(self, model):
        training = model.training
        model.eval()
        try:
            loss, _ = self.loss(model)
            exact = self.exact(model)
        finally:
            if training:
                model.train()
        try:
            ppl = math.exp(loss)
        except OverflowError:
            ppl = float("inf")
        return {"valid_loss": loss, "valid_ppl": ppl, "valid_exact": exact,
                "exact_pairs": int(len(self.exact_idx))}
