"""Corpus-runner cases: what fastattn.runners adds around generation, and Ray's actors against
threads. Not run by default (``fastattn bench --case runner runner_ray``): each first trains
its model.

    runner      translate_file over RUNNER_LINES lines of a text file (reading, tokenising,
                length-sorted token-budget batching, generation, decoding, writing JSON lines
                with a sync at the end) against model.generate alone over the very same
                batches, tokenised and padded beforehand (in the table's "numpy" column: the
                harness's second implementation slot); both at the run's thread count. The
                target: translate_file's time at most 10% over generate's.
    runner_ray  the same lines through fastattn.runners.ray.translate_dataset on a local Ray
                (``ray.init(num_cpus=2)``, started once, untimed): 2 actors x 1 thread,
                against translate_file in this process on 2 threads ("numpy" column). A Ray
                call is the whole job as a user runs it: its actors start (a process each,
                fastattn imported, the model built from the object store), translate, and the
                rows come back to the driver. The target: Ray's lines/s at least 0.9x the
                threads'. Needs Ray (``pip install "fastattn[ray]"``); without it the row
                says n/a.

The model: the "tiny" preset (d 128, 2 + 2 layers, ff 512) trained for TRAIN_STEPS steps to
reverse sequences of words (seconds), with a word tokenizer, so generation stops at <end> as a
trained model's does; the corpus: RUNNER_LINES seeded lines of 1 to 16 of those words.
Each call takes seconds, so each implementation gets a few timed calls, its checking call
timed as the first; the outputs are not compared here (the runner tests do that).
"""
import functools
import os
import tempfile

import numpy as np

from .. import get_num_threads, set_num_threads
from .base import Case, Unavailable
from .report import fmt_ms

__all__ = ["RUNNER_CASES", "RUNNER_TARGETS", "RUNNER_LINES", "TRAIN_STEPS"]

RUNNER_LINES = 10_000
TRAIN_STEPS = 100
WORDS = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen").split()
REPEATS = {"fastattn": 3, "numpy": 3}


def _sentences(rng, n, lo=1, hi=16):
    return [" ".join(rng.choice(WORDS, int(rng.integers(lo, hi + 1)))) for _ in range(n)]


@functools.lru_cache(maxsize=None)
def _setup():
    """(temporary directory, trained Run, input file): made once per process."""
    from ..train.run import train_run

    tmp = tempfile.TemporaryDirectory(prefix="fastattn-bench-runner-")
    rng = np.random.default_rng(0)
    pairs = [(s, " ".join(reversed(s.split()))) for s in _sentences(rng, 1000)]
    run, _ = train_run(pairs, os.path.join(tmp.name, "run"), model="tiny", tokenizer="word",
                       steps=TRAIN_STEPS, batch_tokens=1024, lr=3e-3, warmup=20, valid=0,
                       dropout=0.0, progress=False)
    src = os.path.join(tmp.name, "corpus.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.write("\n".join(_sentences(rng, RUNNER_LINES)) + "\n")
    return tmp, run, src


def _build(rng):
    tmp, run, src = _setup()
    return {"run": run, "src": src, "out": os.path.join(tmp.name, "out.jsonl")}


def _translate_file(threads=None):
    """translate_file over the corpus (on `threads` threads, restored after; None: as set)."""
    def factory(inputs):
        from ..runners import translate_file

        def run():
            before = get_num_threads()
            if threads is not None:
                set_num_threads(threads)
            try:
                return translate_file(inputs["run"], inputs["src"], inputs["out"],
                                      overwrite=True, progress=False)["lines"]
            finally:
                set_num_threads(before)
        return run
    return factory


def _generate_batches(inputs):
    """model.generate over translate_file's batches, made beforehand (what the runner adds
    nothing to)."""
    from ..runners import DEFAULT_WINDOW, Translator

    run = inputs["run"]
    tr = Translator.from_run(run)
    with open(inputs["src"], encoding="utf-8") as f:
        lines = f.read().split("\n")[:-1]
    batches = []
    for w in range(0, len(lines), DEFAULT_WINDOW):
        rows = [tr.encode(t)[0] for t in lines[w:w + DEFAULT_WINDOW]]
        for batch in tr.plan([len(r) for r in rows]):
            ids = np.full((len(batch), max(len(rows[j]) for j in batch)), tr.pad_id, np.int64)
            for b, j in enumerate(batch):
                ids[b, :len(rows[j])] = rows[j]
            batches.append((ids, ids == tr.pad_id))

    def run_generate():
        n = 0
        for ids, mask in batches:
            n += len(run.model.generate(ids, src_key_padding_mask=mask, **tr.generate_kwargs))
        return n
    return run_generate


def _ray_actors(inputs):
    """translate_dataset with 2 actors x 1 thread on a local Ray started once (untimed)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise Unavailable("needs Ray: pip install 'fastattn[ray]'") from None
    from ..runners.ray import translate_dataset

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    with open(inputs["src"], encoding="utf-8") as f:
        ds = ray.data.from_items([{"source": t} for t in f.read().split("\n")[:-1]])
    ds = ds.materialize()                          # the rows in the object store beforehand

    def run_ray():
        return len(translate_dataset(ds, inputs["run"], concurrency=2, num_cpus_per_worker=1,
                                     ).take_all())
    return run_ray


def _case(name, title, impls):
    case = Case(name, title, _build, impls, kind="time", slow=(), repeats=REPEATS, warm=False,
                timed_first=("fastattn", "numpy"))
    case.check = False             # line counts, not outputs (tests/runners compares those)
    return case


RUNNER_CASES = (
    _case("runner", f"corpus runner: translate_file over {RUNNER_LINES:,} lines, tiny preset "
                    "(numpy column: model.generate on the same batches, tokenised beforehand)",
          {"fastattn": _translate_file(), "numpy": _generate_batches}),
    _case("runner_ray", f"corpus runner on Ray: 2 actors x 1 thread over {RUNNER_LINES:,} lines "
                        "(numpy column: translate_file, 1 process x 2 threads)",
          {"fastattn": _ray_actors, "numpy": _translate_file(threads=2)}),
)


# ---- targets (registered in targets.py) -------------------------------------------------------

def _row(rows, name):
    return next((r for r in rows if r["case"] == name), None)


def _times(rows, name):
    r = _row(rows, name)
    if r is None:
        return None, "not run"
    if r["fastattn_ms"] is None or r["numpy_ms"] is None:
        why = r["fastattn_status"] if r["fastattn_ms"] is None else r["numpy_status"]
        return None, f"not measured ({why})"
    return r, None


def _overhead(rows):
    r, why = _times(rows, "runner")
    if r is None:
        return None, why
    v = r["fastattn_ms"] / r["numpy_ms"] - 1.0
    return v, (f"{100 * v:+.1f}% (translate_file {fmt_ms(r['fastattn_ms'])} ms, generate "
               f"{fmt_ms(r['numpy_ms'])} ms, {r['threads']} threads)")


def _ray_share(rows):
    r, why = _times(rows, "runner_ray")
    if r is None:
        return None, why
    v = r["numpy_ms"] / r["fastattn_ms"]
    return v, (f"{v:.2f}x (Ray 2 x 1 thread {fmt_ms(r['fastattn_ms'])} ms, 1 process x 2 "
               f"threads {fmt_ms(r['numpy_ms'])} ms)")


RUNNER_TARGETS = (
    ("runner", "translate_file time <= 1.10x generate's on the same batches", _overhead,
     lambda v: v <= 0.10),
    ("runner_ray", "2 Ray actors x 1 thread lines/s >= 0.9x 1 process x 2 threads",
     _ray_share, lambda v: v >= 0.9),
)
