"""Shared pieces of the training tests: a tiny task, a tiny model, one thread.

The tiny models run with one OpenMP thread (tests/conftest.py's ``single_thread``, used by each test file):
their steps take ~3 ms, and on a shared 2-core machine a two-thread team waiting on a busy
core made them up to 50x slower. Results within one process are bitwise repeatable at any
thread count; the tests compare runs within one process only.
"""
import numpy as np

import fastattn
from fastattn.nn import Seq2SeqTransformer
from fastattn.tokenizers import CharTokenizer

LETTERS = "abcdefgh"
TIMING = ("seconds", "tokens_per_s")      # the only fields two identical runs may differ in


def words(n, seed=0, lo=3, hi=6, letters=LETTERS):
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list(letters), int(rng.integers(lo, hi + 1))))
            for _ in range(n)]


def char_tokenizer(texts=None):
    return CharTokenizer().train(texts if texts is not None else [LETTERS])


def tiny_model(tok, dropout=0.0, max_len=16, seed=0):
    """d_model 32, 2 heads, 1 encoder + 1 decoder layer, FFN 64."""
    return Seq2SeqTransformer(1, 1, 32, 2, tok.vocab_size, tok.vocab_size, 64, dropout,
                              pad_id=tok.pad_id, max_len=max_len, seed=seed)


def untimed(history):
    """The records without their wall-clock fields."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in history.records]
