"""``fastattn train`` killed with SIGKILL, then ``--resume``: the run finishes with the same
model.safetensors, bit for bit, and the same history (timings aside) as one run without a
stop. The kills come at fixed points: after a periodic checkpoint is complete, inside a
checkpoint write (its temporary directory half written), between a checkpoint's rename and
the ``latest`` pointer, while an old checkpoint is being removed, while the best model is
written, while the run's own model.safetensors is written; and once from outside, as a user
would, after the first checkpoint appears. What the killed process left behind (.tmp-*,
.trash-*, half-written files) is gone once the resumed run has started.

The child process runs fastattn.cli.main with one checkpoint or io function wrapped to
SIGKILL itself at its point, so every kill lands at the same place on every machine. One
OpenMP thread, a tiny model, 40 steps: a run takes about two seconds."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ARGS = ("--model", "tiny", "--tokenizer", "word", "--steps", "40", "--batch-tokens", "64",
        "--valid", "0.2", "--eval-every", "5", "--exact-sample", "2", "--checkpoint-every", "4",
        "--quiet")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
WORDS = "one two three four five six seven eight nine ten".split()

CHILD = r"""
import importlib, os, signal, sys
from fastattn import cli, io
from fastattn.train import checkpoint
fit = importlib.import_module("fastattn.train.fit")       # the module (the package exports
                                                          # the function under that name)

where, at = sys.argv[1], int(sys.argv[2])
saving = {"step": None, "fsync_dirs": 0}


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def wrap(module, name, before=None, after=None):
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        if before is not None:
            before(*args, **kwargs)
        out = real(*args, **kwargs)
        if after is not None:
            after(*args, **kwargs)
        return out
    setattr(module, name, wrapped)


def starting(checkpoint_dir, **kw):
    saving.update(step=kw["state"]["step"], fsync_dirs=0)


def saved(checkpoint_dir, **kw):
    if where == "after-checkpoint" and saving["step"] == at:
        die()


wrap(fit, "save_checkpoint", before=starting, after=saved)
if where == "inside-checkpoint":        # the model is in the temporary directory, the rest not
    wrap(io, "save_state_dict", before=lambda *a, **k: saving["step"] == at and die())
elif where == "before-latest":          # renamed into place, `latest` still on the one before
    def fsync_dir(path):
        if saving["step"] == at:
            saving["fsync_dirs"] += 1
            if saving["fsync_dirs"] == 2:
                die()
    wrap(checkpoint, "_fsync_dir", before=fsync_dir)
elif where == "removing-old":           # an old checkpoint renamed to .trash-*, half removed
    def rmtree(path, *a, **k):
        if saving["step"] == at and ".trash-" in os.path.basename(path):
            os.remove(os.path.join(path, "model.safetensors"))
            die()
    wrap(checkpoint.shutil, "rmtree", before=rmtree)
elif where == "writing-best":           # best-step-N half written
    def write_text(path, text):
        if path.endswith("best.json") and ("best-step-%08d" % at) in path:
            die()
    wrap(checkpoint, "_write_text", before=write_text)
elif where == "writing-model":          # the run's model.safetensors: a temporary half written
    def save(model, path):
        if os.path.basename(str(path)) == "model.safetensors" and "checkpoints" not in str(path):
            fd, tmp = io.create_temporary(os.path.dirname(os.path.abspath(path)),
                                          io.TEMPORARY_PREFIX, io.TEMPORARY_SUFFIX)
            os.write(fd, b"\0" * 1000)
            die()
    wrap(io, "save", before=save)
sys.exit(cli.main(sys.argv[3:]))
"""


def write_pairs(path):
    import random
    rng = random.Random(0)
    lines = []
    for _ in range(24):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        lines.append(f"{' '.join(words)}\t{' '.join(reversed(words))}\n")
    path.write_text("".join(lines))
    return path


def train(data, out, *extra):
    return subprocess.run([sys.executable, "-m", "fastattn.cli", "train", str(data), "--out",
                           str(out), *extra], capture_output=True, text=True, timeout=300,
                          env=ENV)


def killed_at(where, at, data, out):
    res = subprocess.run([sys.executable, "-c", CHILD, where, str(at), "train", str(data),
                          "--out", str(out), *ARGS], capture_output=True, text=True,
                         timeout=300, env=ENV)
    assert res.returncode == -signal.SIGKILL, (res.returncode, res.stderr[-2000:])


def untimed_history(run):
    records = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("seconds", "tokens_per_s")}
            for r in records]


def leftovers(run):
    return sorted(str(p.relative_to(run)) for p in run.rglob("*")
                  if p.name.startswith((".tmp-", ".trash-", ".latest-", ".fastattn-"))
                  or p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pairs(tmp_path_factory.mktemp("data") / "pairs.tsv")


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """The run without a stop: (model bytes, history without timings)."""
    run = tmp_path_factory.mktemp("reference") / "run"
    res = train(data, run, *ARGS)
    assert res.returncode == 0, res.stderr
    return (run / "model.safetensors").read_bytes(), untimed_history(run)


def check_resume(data, run, reference, *args):
    res = train(data, run, *args, "--resume")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    model, history = reference
    assert (run / "model.safetensors").read_bytes() == model        # bit for bit
    assert untimed_history(run) == history
    assert leftovers(run) == []
    return res


@pytest.mark.parametrize("where, at, left", [
    ("after-checkpoint", 8, []),
    ("inside-checkpoint", 12, ["checkpoints/.tmp-step-00000012-"]),
    ("before-latest", 16, []),
    ("removing-old", 16, ["checkpoints/.trash-step-00000004-"]),
    ("writing-best", 5, ["checkpoints/.tmp-best-step-00000005-"]),     # the first evaluation
    ("writing-model", 40, [".fastattn-"]),
])
def test_killed_at_a_fixed_point_resumes_to_the_same_model(data, reference, tmp_path, where,
                                                           at, left):
    run = tmp_path / "run"
    killed_at(where, at, data, run)
    found = leftovers(run)
    for prefix in left:                                   # the kill left this behind
        assert any(f.startswith(prefix) for f in found), (prefix, found)
    if where == "before-latest":
        assert (run / "checkpoints" / "step-00000016").is_dir()
        assert (run / "checkpoints" / "latest").read_text() == "step-00000012\n"
    if where == "after-checkpoint":               # the run's settings come from config.json
        check_resume(data, run, reference)
    else:
        check_resume(data, run, reference, *ARGS)


def test_killed_from_outside_after_the_first_checkpoint(data, reference, tmp_path):
    run = tmp_path / "run"
    first = run / "checkpoints" / "step-00000004"
    proc = subprocess.Popen([sys.executable, "-m", "fastattn.cli", "train", str(data), "--out",
                             str(run), *ARGS], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV)
    try:
        deadline = time.monotonic() + 240
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        rc = proc.wait(timeout=60)
    assert rc == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (run / "model.safetensors").exists()
    check_resume(data, run, reference, *ARGS)


def test_resume_that_finds_nothing_says_so_on_stderr_even_with_quiet(data, tmp_path):
    run = tmp_path / "run"
    res = train(data, run, *ARGS, "--steps", "2", "--resume")
    assert res.returncode == 0, res.stderr
    assert f"fastattn train: --resume: nothing to resume in {run} (no config.json): " \
           "starting a new run\n" in res.stderr
    import shutil
    shutil.rmtree(run / "checkpoints")
    res = train(data, run, "--resume", "--quiet")
    assert res.returncode == 0, res.stderr
    assert f"fastattn train: --resume: no checkpoint in {run / 'checkpoints'}: starting the " \
           "run over from step 0, with its settings\n" in res.stderr
