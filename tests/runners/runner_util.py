"""Shared pieces of the runner tests: a small trained run, its corpus, one thread.

The run is a "tiny" preset model (d 128, 2 + 2 layers) trained for a few seconds to reverse
word sequences: enough for outputs that vary in length and end with <end>; the tests check
the plumbing (order, resume, errors, engines), not the translations' quality.

The fixtures (``run``, ``run_dir``) live here, imported by each test file (which also uses
tests/conftest.py's ``single_thread``), rather than in a conftest.py: a second conftest
module would shadow the one in tests/ that the other test files import helpers from. The run is trained once per process.

The runs and engines here use one fastattn thread: on a shared 2-core machine a two-thread
team waiting on a busy core made the tiny model's batches many times slower, and the
outputs do not depend on the thread count (tests/test_threads.py).
"""
import atexit
import functools
import json
import pathlib
import shutil
import tempfile

import numpy as np
import pytest

import fastattn

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


@functools.lru_cache(maxsize=None)
def shared_run():
    """The loaded trained run (fastattn.train.run.Run), trained once per process with one
    thread in a temporary folder removed at exit; its directory is run.path."""
    folder = tempfile.mkdtemp(prefix="fastattn-runners-")
    atexit.register(shutil.rmtree, folder, True)
    before = fastattn.get_num_threads()
    fastattn.set_num_threads(1)
    try:
        return train_tiny_run(pathlib.Path(folder) / "run")
    finally:
        fastattn.set_num_threads(before)


@pytest.fixture(scope="session")
def run():
    return shared_run()


@pytest.fixture(scope="session")
def run_dir():
    return shared_run().path
