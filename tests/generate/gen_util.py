"""Shared helpers of the fastattn.generate tests: small random models, padded source batches,
and the oracle every decoding test leans on, the greedy loop over the full forward.

Models are small (2 + 2 layers, d_model 32, 4 heads, d_ff 64) and random, so their outputs are
arbitrary but deterministic; where an end token is needed, one is picked from the generated
tokens so that rows end at different steps.
"""

import numpy as np
import pytest

from conftest import assert_close
from fastattn import nn as fnn
from tolerances import TOL

C, H, F = 32, 4, 64                # d_model, heads, d_ff
V_SRC, V_TGT = 23, 29              # vocabularies
PAD, START = 0, 1                  # target specials of the random models (end: picked per test)
S = 7                              # source length
LENGTHS = (7, 4, 2, 6)             # source lengths of the padded batch
STEPS = 10                         # max_new_tokens

TORCH_WARNINGS = [   # torch's encoder on a padded batch (nested tensors; see tests/nn)
    pytest.mark.filterwarnings("ignore:.*nested tensor.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True.*:UserWarning"),
]


def model(backend="fast", *, seed=0, **cfg):
    """A random model with torch's construction init (N(0, 1) embeddings) whose target
    embeddings are scaled down (x 0.1): at random init the scaled embedding of the last token
    dominates the decoder's stream and the model mostly echoes it; smaller, the source matters
    and the rows of a batch differ. (The default xavier init makes untrained outputs nearly
    constant: these tests need varied ones, not a model that learns.)"""
    cfg.setdefault("init", "torch")
    m = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, backend=backend, seed=seed, **cfg)
    m.tgt_tok_emb.embedding.weight *= np.float32(0.1)
    return m


def twins(seed=0, **cfg):
    """The same random model on the fast and on the reference backend."""
    return model("fast", seed=seed, **cfg), model("reference", seed=seed, **cfg)


def source_batch(seed=0, lengths=LENGTHS, length=S):
    """(ids (B, length) with ids in [1, V_SRC) and PAD after each row's length, padding mask)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, V_SRC, size=(len(lengths), length))
    kpm = np.arange(length)[None, :] >= np.asarray(lengths)[:, None]
    ids[kpm] = PAD
    return ids, kpm


def ending_token(out):
    """A generated token of `out` (B, T), not the start token, whose first occurrences fall at
    the most different steps (ties: the lower id): as end_id, rows end at different steps."""
    gen = out[:, 1:]
    best, key = None, None
    for w in np.unique(gen[gen != out[0, 0]]):
        firsts = {int(np.argmax(r == w)) if (r == w).any() else -1 for r in gen}
        if key is None or len(firsts) > key:
            best, key = int(w), len(firsts)
    return best


def cut_at_end(rows, end, pad):
    """Rows that ran every step -> generate's layout: each row cut after its first end token
    (the start token excluded), padded with pad, the width that of the longest row."""
    rows = [list(map(int, r)) for r in rows]
    if end is not None:
        rows = [r[:r.index(end, 1) + 1] if end in r[1:] else r for r in rows]
    out = np.full((len(rows), max(map(len, rows))), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def assert_tokens(actual, expected, name="tokens"):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == np.int64, f"{name}: dtype {actual.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    bad = np.argwhere(actual != expected)
    assert not bad.size, (f"{name}: {len(bad)} tokens differ, first at {tuple(bad[0])}\n"
                          f"actual\n{actual}\nexpected\n{expected}")


def forward_greedy(m, src, steps, start, end=None, src_key_padding_mask=None):
    """Greedy decoding the way a prototype writes it, with no cache: each step runs the full
    forward model(src, prefix) (causal target) and takes the argmax of the last position.
    Rows are cut after their end token and padded with PAD, as generate lays them out."""
    prefix = np.full((src.shape[0], 1), start, dtype=np.int64)
    for _ in range(steps):
        no_pad = np.zeros(prefix.shape, bool)          # generated tokens are never padding
        logits = m(src, prefix, src_key_padding_mask=src_key_padding_mask,
                   tgt_key_padding_mask=no_pad)
        prefix = np.concatenate([prefix, np.argmax(logits[:, -1], axis=1)[:, None]], axis=1)
        if end is not None and (prefix[:, 1:] == end).any(axis=1).all():
            break
    return cut_at_end(prefix, end, PAD) if end is not None else prefix


def flat_model(seed=25):
    """Next-token distributions close to uniform (generator scaled down): samples vary."""
    m = model(seed=seed)
    m.generator.weight *= 0.02
    m.generator.bias *= 0.02
    return m


TOKENS = dict(pad=0, start=1, end=2, a=3, b=4, c=5, d=6)
V7 = len(TOKENS)


def table(rows):
    """{previous token name: {next token name: probability}} -> (V7, V7) probabilities; rows
    not given (pad, end: never extended by a live hypothesis) are uniform."""
    p = np.full((V7, V7), 1.0 / V7)
    for prev, nxt in rows.items():
        p[TOKENS[prev]] = 0.0
        for name, q in nxt.items():
            p[TOKENS[prev], TOKENS[name]] = q
    assert_close(p.sum(1), np.ones(V7), **TOL["probability_table"], name="row sums", dtype=None,
                 equal_nan=False)
    return p


def ids(*names):
    return [TOKENS[n] for n in names]


def constant_model(p, backend="fast"):
    """Every step's logits are exactly log p (generator weight 0, bias log p)."""
    m = fnn.Seq2SeqTransformer(1, 1, C, H, 5, len(p), F, backend=backend, seed=30)
    m.generator.weight[...] = 0
    m.generator.bias[...] = np.log(np.maximum(p, 1e-12))
    return m
