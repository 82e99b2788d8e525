"""Shared pieces of the runner tests: a small trained run, its corpus, one thread.

The run is a "tiny" preset model (d 128, 2 + 2 layers) trained for a few seconds to reverse
word sequences: enough for outputs that vary in length and end with <end>; the tests check
the plumbing (order, resume, errors, engines), not the translations' quality.
"""
import json

import numpy as np

WORDS = "one two three four five six seven eight nine ten eleven twelve".split()


def sentences(n, seed=0, lo=1, hi=12):
    """n sentences of lo..hi words (seeded); some repeat, lengths vary."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(lo, hi + 1)))) for _ in range(n)]


def train_tiny_run(out):
    """A run directory in `out`: the tiny preset, a word tokenizer, about 100 steps."""
    from fastattn.train.run import train_run

    pairs = [(s, " ".join(reversed(s.split()))) for s in sentences(400, seed=1)]
    run, _ = train_run(pairs, out, model="tiny", tokenizer="word", steps=100,
                       batch_tokens=512, lr=3e-3, warmup=20, valid=0, dropout=0.0,
                       progress=False)
    return run


def write_lines(path, lines, end="\n"):
    path.write_bytes(b"".join((t if isinstance(t, bytes) else t.encode()) + end.encode()
                              for t in lines))
    return path


def read_records(path):
    return [json.loads(line) for line in path.read_bytes().splitlines()]
