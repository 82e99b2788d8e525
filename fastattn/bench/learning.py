"""The ``learning`` case: does training generalise? fastattn against PyTorch's tutorial loop.

A position-sensitive task (``TASKS``: reverse, rotate or sort the words of short sentences
over a vocabulary of a few dozen words) is drawn from a seed: training pairs and held-out test
pairs whose sources never occur in training. Then, for each seed:

- ``fastattn``: what ``fastattn train`` runs (fastattn.train.run.train_run, in this process,
  with the settings of the command line ``LearningSetup.train_args``) on the training pairs
  written as a TSV, then greedy completion of the test sources through the run it wrote, as
  ``fastattn complete RUN_DIR`` does;
- ``torch``: the model of PyTorch's translation tutorial (nn.Transformer, the tutorial's
  TokenEmbedding and PositionalEncoding, its xavier_uniform_ loop over the parameters,
  CrossEntropyLoss with label smoothing, AdamW) of the same size, trained on the same batches
  (the token-budget batches fit() forms, from the run's own tokenizer and training split) with
  the same learning-rate schedule, gradient clipping and dropout, then greedy decoding with
  padding masks.

Reported: held-out exact match (the whole completion equals the target) and wall time of
training plus decoding, per implementation and seed. It is a benchmark, not a test: the figures
are what one machine measured.
"""
from __future__ import annotations

import contextlib
import io as _io
import math
import os
import random
import tempfile
import time

import numpy as np

from ..train.defaults import DEFAULT_STEPS, PRESET_LR, default_warmup
from .base import Case
from .report import fmt_ms
from .torch_models import require_torch, torch_generate, tutorial_seq2seq

__all__ = ["TASKS", "task_pairs", "LearningSetup", "fastattn_learning", "torch_learning",
           "LEARNING_CASES", "LEARNING_TARGETS", "LEARNING_TASKS", "run_learning_case"]

LEARNING_TASKS = (("reverse", 0), ("sort", 1))     # (task, seed) of the learning case


def _reverse(words):
    return words[::-1]


def _rotate(words):
    return words[1:] + words[:1]


def _sort(words):
    return sorted(words)


TASKS = {"reverse": _reverse, "rotate": _rotate, "sort": _sort}


def task_words(n=40):
    """n pronounceable two-letter words: ba, be, bi, ..."""
    return [c + v for c in "bdfgklmnprstvz" for v in "aeiou"][:n]


def task_pairs(task, n, seed, *, vocab=40, lengths=(3, 8)):
    """The (source, target) pairs of a task, with distinct sources, in a seeded random order.

    Args:
        task: the task's name (a key of TASKS).
        n: the number of pairs.
        seed: the generator's seed.
        vocab: the number of words the sources are drawn from (default 40).
        lengths: the sources' shortest and longest length in words (default (3, 8)).

    Returns:
        A list of (source, target) str pairs.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    rng, words, seen, pairs = random.Random(seed), task_words(vocab), set(), []
    while len(pairs) < n:
        src = [rng.choice(words) for _ in range(rng.randint(*lengths))]
        key = " ".join(src)
        if key not in seen:
            seen.add(key)
            pairs.append((key, " ".join(TASKS[task](src))))
    return pairs


class LearningSetup:
    """One task and budget: train (n_train pairs) and test (n_test pairs, sources unseen)
    drawn from `seed`; the training options both implementations use. The defaults are
    ``fastattn train``'s for the preset (fastattn.train.defaults): its default budget.

    Args:
        task: the task's name (default "reverse").
        seed: the pairs' and the run's seed (default 0).
        n_train: training pairs (default 4000).
        n_test: held-out test pairs (default 150).
        model: the preset (default "tiny").
        steps: training steps (None, the default: the preset's).
        batch_tokens: fit's (default 4096).
        lr: fit's (None, the default: the preset's).
        warmup: fit's (None, the default: fit's).
        schedule: fit's (default "inverse_sqrt").
        dropout: the model's (default 0.1).
        label_smoothing: fit's (default 0.1).
        clip_norm: fit's (default 1.0).
        valid: the share held out for validation (default 0.05).
    """

    def __init__(self, task="reverse", seed=0, *, n_train=4000, n_test=150, model="tiny",
                 steps=None, batch_tokens=4096, lr=None, warmup=None,
                 schedule="inverse_sqrt", dropout=0.1, label_smoothing=0.1, clip_norm=1.0,
                 valid=0.05):
        pairs = task_pairs(task, n_train + n_test, seed)
        self.task, self.seed = task, seed
        self.train, self.test = pairs[:n_train], pairs[n_train:]
        steps = DEFAULT_STEPS[model] if steps is None else steps
        self.model, self.steps, self.batch_tokens = model, steps, batch_tokens
        self.lr = PRESET_LR[model] if lr is None else lr
        self.warmup = default_warmup(steps) if warmup is None else warmup
        self.schedule = schedule
        self.dropout, self.label_smoothing, self.clip_norm = dropout, label_smoothing, clip_norm
        self.valid = valid

    def train_settings(self):
        """The settings train_run (fastattn.train.run) takes for this setup, as
        ``fastattn train`` parses them from train_args (ints and floats as its options are)."""
        return dict(model=self.model, tokenizer="word", steps=int(self.steps),
                    batch_tokens=int(self.batch_tokens), lr=float(self.lr),
                    warmup=int(self.warmup), schedule=self.schedule,
                    dropout=float(self.dropout), label_smoothing=float(self.label_smoothing),
                    clip_norm=float(self.clip_norm), valid=float(self.valid),
                    seed=int(self.seed))

    def train_args(self, tsv, out):
        """The `fastattn train` command line for this setup: what fastattn_learning runs.

        To rerun one by hand.

        Args:
            tsv: the training pairs' TSV file.
            out: the run directory.

        Returns:
            The command line's arguments.
        """
        args = ["train", tsv, "--out", out]
        for name, value in self.train_settings().items():
            args += ["--" + name.replace("_", "-"), str(value)]
        return args + ["--quiet"]


def exact_match(outputs, pairs):
    """Fraction of outputs equal to their pair's target (words compared, case ignored)."""
    return sum(o.split() == t.lower().split() for o, (_, t) in zip(outputs, pairs)) / len(pairs)


def fastattn_learning(setup, work_dir=None):
    """Train as `fastattn train` does (setup.train_args) and complete the test sources.

    The harness does not import the command's module (fastattn.cli): it calls what the
    command's train runs in one process, train_run on the pairs read from the TSV, with the
    settings the command line gives (train_settings) and --quiet's JSON-lines progress.

    Args:
        setup: the `LearningSetup`.
        work_dir: where the run goes (None, the default: a temporary directory).

    Returns:
        dict(exact, seconds, run_dir): seconds is reading the pairs, training and completion.
    """
    from ..train import read_pairs
    from ..train.run import load_run, train_run

    work = work_dir or tempfile.mkdtemp(prefix="fastattn-learning-")
    os.makedirs(work, exist_ok=True)
    tsv, out = os.path.join(work, "train.tsv"), os.path.join(work, "run")
    with open(tsv, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in setup.train)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(_io.StringIO()), contextlib.redirect_stderr(_io.StringIO()):
        train_run(read_pairs(tsv), out, progress="json", data=tsv, **setup.train_settings())
    run = load_run(out)
    outputs = []
    for i in range(0, len(setup.test), 64):
        outputs += run.complete([s for s, _ in setup.test[i:i + 64]], max_new_tokens=32)
    seconds = time.perf_counter() - t0
    return dict(exact=exact_match(outputs, setup.test), seconds=seconds, run_dir=out)


def torch_learning(setup):
    """The tutorial's model and loop on the batches ``fastattn train`` forms for the setup
    (the same training split, the same word tokenizer trained on it, fit()'s batch order for
    the seed), the same schedule, optimiser settings and clipping, then greedy decoding of the
    test sources.

    Args:
        setup: the `LearningSetup`.

    Returns:
        dict(exact, seconds, loss): seconds is training plus decoding.
    """
    torch = require_torch()
    from .. import get_num_threads
    from ..train import batching
    from ..train.evaluate import EncodedPairs
    from ..train.fit import _schedule
    from ..train.run import MAX_LEN, PRESETS, split_pairs, train_tokenizer

    torch.set_num_threads(get_num_threads())
    torch.manual_seed(setup.seed)
    t0 = time.perf_counter()
    train, _ = split_pairs(setup.train, setup.valid, setup.seed)
    tok = train_tokenizer("word", [t for p in train for t in p])
    cfg = dict(PRESETS[setup.model], src_vocab_size=tok.vocab_size,
               tgt_vocab_size=tok.vocab_size, pad_id=tok.pad_id, max_len=MAX_LEN,
               activation="relu", layer_norm_eps=1e-5, norm_first=False)
    tm = tutorial_seq2seq(cfg, dropout=setup.dropout).train()
    data = EncodedPairs(train, tok, tok, cfg["max_len"])
    window = batching.default_window(data.src_lens, data.tgt_lens, setup.batch_tokens)
    schedule = _schedule(setup.schedule, setup.lr, setup.warmup, cfg["emb_size"], setup.steps)
    opt = torch.optim.AdamW(tm.parameters(), lr=schedule(1), betas=(0.9, 0.98), eps=1e-9,
                            weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=tok.pad_id,
                                        label_smoothing=setup.label_smoothing)
    V, step, epoch = cfg["tgt_vocab_size"], 0, 0
    while step < setup.steps:
        plan = batching.epoch_batches(data.src_lens, data.tgt_lens, setup.batch_tokens,
                                      seed=setup.seed, epoch=epoch, window=window)
        for idx in plan[:setup.steps - step]:
            src, tgt, _ = data.batch(idx, tok.pad_id)
            src, tgt = torch.from_numpy(src), torch.from_numpy(tgt)
            for group in opt.param_groups:
                group["lr"] = schedule(step + 1)
            opt.zero_grad()
            logits = tm(src, tgt[:, :-1])
            loss = loss_fn(logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
            loss.backward()
            if setup.clip_norm:
                torch.nn.utils.clip_grad_norm_(tm.parameters(), setup.clip_norm)
            opt.step()
            step += 1
        epoch += 1
    tm.eval()
    outputs = []
    for i in range(0, len(setup.test), 64):
        ids, _ = tok.encode_batch([s for s, _ in setup.test[i:i + 64]], add_start_end=True)
        out = torch_generate(tm, ids, max_new_tokens=32, start_id=tok.start_id,
                             end_id=tok.end_id, pad_id=tok.pad_id, src_pad_id=tok.pad_id)
        outputs += [tok.decode(row.tolist()) for row in out]
    seconds = time.perf_counter() - t0
    return dict(exact=exact_match(outputs, setup.test), seconds=seconds,
                loss=float(loss.item()))


# ---- the benchmark case ------------------------------------------------------------------------

RUN_ONE = {"fastattn": fastattn_learning, "torch": torch_learning}


def _build(rng):
    return {"setups": [LearningSetup(task, seed) for task, seed in LEARNING_TASKS]}


def _impl(impl):
    def factory(inputs):
        if impl == "torch":
            require_torch()
        return lambda: [RUN_ONE[impl](s) for s in inputs["setups"]]
    return factory


def _case():
    s = LearningSetup()
    return Case("learning", "learning: held-out exact match after fastattn train --model tiny "
                f"(default budget: {s.steps} steps of {s.batch_tokens} tokens) vs the torch "
                "tutorial loop; " + ", ".join(f"{t} (seed {d})" for t, d in LEARNING_TASKS),
                _build, {"fastattn": _impl("fastattn"), "torch": _impl("torch")},
                kind="learning", slow=(), repeats={"fastattn": 1, "torch": 1}, warm=False)


def run_learning_case(case, row):
    """Fill `row` (runner.empty_row) for the learning case: for each setup, fastattn then torch
    (interleaved); <impl>_times_ms (training plus decoding, per setup), <impl>_exact (held-out
    exact match per setup), tasks.

    Args:
        case: the learning case.
        row: the row to fill.
    """
    setups = case.inputs()["setups"]
    impls = []
    for impl in case.implementations:
        try:
            case.callable(impl)
            impls.append(impl)
        except Exception as exc:            # torch missing: the table says why
            row[f"{impl}_status"] = f"n/a: {exc}"
    results = {impl: [] for impl in impls}
    for setup in setups:
        for impl in impls:
            results[impl].append(RUN_ONE[impl](setup))
    row["tasks"] = [f"{s.task} (seed {s.seed})" for s in setups]
    for impl, rs in results.items():
        row[f"{impl}_times_ms"] = [r["seconds"] * 1e3 for r in rs]
        row[f"{impl}_exact"] = [r["exact"] for r in rs]
    row["notes"].append(f"held-out exact match (greedy, {len(setups[0].test)} unseen sources "
                        "each): " + "; ".join(
                            f"{task}: " + ", ".join(f"{impl} {100 * results[impl][i]['exact']:.1f}%"
                                                    for impl in impls)
                            for i, task in enumerate(row["tasks"])))
    row["notes"].append("ms = training + decoding per task, median over the tasks")
    return row


def _exact_target(rows):
    r = next((r for r in rows if r["case"] == "learning"), None)
    if r is None or not r.get("fastattn_exact"):
        return None, "not run"
    v = min(r["fastattn_exact"])
    return v, "lowest over the tasks: " + ", ".join(
        f"{t} {100 * e:.1f}%" for t, e in zip(r["tasks"], r["fastattn_exact"]))


def _vs_torch_target(rows):
    r = next((r for r in rows if r["case"] == "learning"), None)
    if r is None or not r.get("fastattn_exact"):
        return None, "not run"
    if not r.get("torch_exact"):
        return None, f"torch not measured ({r['torch_status']})"
    gaps = [t - f for f, t in zip(r["fastattn_exact"], r["torch_exact"])]
    v = max(gaps)
    return v, f"largest gap {100 * v:+.1f} points (torch - fastattn); wall time fastattn " \
              f"{fmt_ms(r['fastattn_ms'] / 1e3)} s, torch {fmt_ms(r['torch_ms'] / 1e3)} s " \
              "(median per task)"


LEARNING_CASES = (_case(),)
LEARNING_TARGETS = (
    ("learning", "held-out exact match >= 90% on every task", _exact_target,
     lambda v: v >= 0.9),
    ("learning", "held-out exact match within 5 points of torch", _vs_torch_target,
     lambda v: v <= 0.05),
)
