"""One run per run directory: ``fastattn train --out DIR`` locks DIR for the run's lifetime
(a second run into it stops at once, naming it), refuses a DIR that holds a run or other
files unless --resume or --overwrite, and --overwrite leaves nothing of the old run behind.
Also the train command's other errors: an --out that is a file, no permission, a full disk,
a diverging run; each one line on standard error, a nonzero exit and the state left as it
was. Tiny models and few steps: these check the plumbing."""
import argparse
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import child_env
from fastattn import cli
from fastattn.train.checkpoint import (DirectoryInUse, LOCK_FILE, latest_checkpoint,
                                       list_checkpoints, load_checkpoint, lock_directory)
from fastattn.train.run import RunDirError, load_run, train_run

PAIRS = [("one two three", "three two one"), ("four five", "five four"),
         ("six seven eight", "eight seven six"), ("two four six", "six four two")]
TRAIN = ("--model", "tiny", "--tokenizer", "word", "--batch-tokens", "64", "--valid", "0",
         "--quiet")
ENV = child_env({"OMP_NUM_THREADS": "1"})


def cli_args(*args):
    return [sys.executable, "-m", "fastattn.cli", *map(str, args)]


def run_cli(*args, timeout=180):
    return subprocess.run(cli_args(*args), capture_output=True, text=True, timeout=timeout,
                          env=ENV)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS))
    return path


def snapshot(directory):
    """{relative path: bytes} of every file under `directory` but the lock file."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            if name != LOCK_FILE:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, directory)] = f.read()
    return out


def one_line_error(res, *words):
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("fastattn train: "), res.stderr
    for w in words:
        assert w in last, (w, last)
    return last


# ---- the lock ----------------------------------------------------------------------------------

def test_two_concurrent_trains_into_one_dir_one_proceeds_the_other_stops_at_once(data,
                                                                                 tmp_path):
    run = tmp_path / "run"
    long = ("--steps", "100000", "--checkpoint-every", "100000")   # runs until killed
    procs = [subprocess.Popen(cli_args("train", data, "--out", run, *TRAIN, *long),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=ENV) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped = [p for p in procs if p.poll() is not None]
        assert len(stopped) == 1, "neither run stopped: both hold the directory"
        loser = stopped[0]
        winner = procs[1 - procs.index(loser)]
        err = loser.stderr.read()
        assert loser.returncode == 1, err
        assert "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith(
            f"fastattn train: {run}: in use by another fastattn train run (process "
            f"{winner.pid} holds its lock)"), err
        assert winner.poll() is None            # the other one goes on, undisturbed
        os.kill(winner.pid, signal.SIGKILL)
        winner.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
    # SIGKILL released the lock: the run can be locked (and resumed) again
    lock_directory(run).release()


def test_a_held_lock_names_its_holder_and_is_free_once_released(tmp_path):
    (tmp_path / LOCK_FILE).write_text("123456789012\n")     # a longer id from an older run
    with lock_directory(tmp_path, "test run"):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        want = f"{tmp_path}: in use by another test run (process {os.getpid()} holds its lock)"
        with pytest.raises(DirectoryInUse, match="^" + re.escape(want)):
            lock_directory(tmp_path, "test run")
    lock_directory(tmp_path).release()


def test_fit_locks_its_checkpoint_dir(tmp_path):
    from fastattn.train import fit
    from fastattn.train.run import build_model, train_tokenizer

    tok = train_tokenizer("word", [t for p in PAIRS for t in p])
    model = build_model("tiny", tok.vocab_size, tok.vocab_size, pad_id=tok.pad_id)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with lock_directory(ckpt, "test"):
        with pytest.raises(DirectoryInUse, match=f"^{re.escape(str(ckpt))}: in use by another"):
            fit(model, PAIRS, src_tokenizer=tok, tgt_tokenizer=tok, max_steps=2,
                batch_tokens=64, checkpoint_dir=ckpt, progress=False)
    assert list_checkpoints(ckpt) == []
    fit(model, PAIRS, src_tokenizer=tok, tgt_tokenizer=tok, max_steps=2, batch_tokens=64,
        checkpoint_dir=ckpt, progress=False)           # released: free again
    assert len(list_checkpoints(ckpt)) == 1
    lock_directory(ckpt).release()                     # and released at fit's end


# ---- a directory that holds something ------------------------------------------------------

def test_a_rerun_into_a_finished_run_is_refused_and_changes_nothing(data, tmp_path):
    run = tmp_path / "run"
    assert run_cli("train", data, "--out", run, *TRAIN, "--steps", "12").returncode == 0
    before = snapshot(run)
    res = run_cli("train", data, "--out", run, *TRAIN, "--steps", "5")
    one_line_error(res, f"{run}: already holds a run (", "--resume", "--overwrite")
    assert snapshot(run) == before
    with pytest.raises(RunDirError, match="already holds a run"):
        train_run(PAIRS, run, tokenizer="word", steps=2, batch_tokens=64, valid=0,
                  progress=False)
    assert snapshot(run) == before


def test_overwrite_starts_afresh_and_leaves_no_old_checkpoint(data, tmp_path):
    run = tmp_path / "run"
    assert run_cli("train", data, "--out", run, *TRAIN, "--steps", "12",
                   "--checkpoint-every", "4").returncode == 0
    (run / "loss.png").write_bytes(b"old plot")
    (run / "notes.txt").write_text("mine")           # not a run's file: kept
    res = run_cli("train", data, "--out", run, *TRAIN, "--steps", "5", "--overwrite")
    assert res.returncode == 0, res.stderr
    names = [os.path.basename(p) for p in list_checkpoints(run / "checkpoints")]
    assert names == ["step-00000005"]
    assert sorted(os.listdir(run)) == sorted([LOCK_FILE, "checkpoints", "config.json",
                                              "history.jsonl", "model.safetensors",
                                              "notes.txt", "src_tokenizer.json",
                                              "tgt_tokenizer.json"])
    assert (run / "notes.txt").read_text() == "mine"
    records = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "step"]
    assert steps == [1, 2, 3, 4, 5]
    assert json.loads((run / "config.json").read_text())["steps"] == 5
    assert load_checkpoint(run / "checkpoints").step == 5


def test_a_directory_with_other_files_is_refused_unless_overwrite(data, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    res = run_cli("train", data, "--out", run, *TRAIN, "--steps", "2")
    one_line_error(res, f"{run}: is not empty (it holds notes.txt)")
    assert sorted(os.listdir(run)) == [LOCK_FILE, "notes.txt"]


def test_resume_and_overwrite_together_are_a_usage_error(data, tmp_path):
    res = run_cli("train", data, "--out", tmp_path / "run", *TRAIN, "--resume",
                  "--overwrite")
    assert res.returncode == 2 and "not allowed with argument" in res.stderr
    with pytest.raises(ValueError, match="resume or overwrite, not both"):
        train_run(PAIRS, tmp_path / "run", resume=True, overwrite=True, progress=False)


def test_an_out_that_is_a_file_is_one_line_and_the_file_stays(data, tmp_path):
    out = tmp_path / "afile"
    out.write_bytes(b"precious")
    res = run_cli("train", data, "--out", out, *TRAIN, "--steps", "2")
    one_line_error(res, f"{out}: not a directory")
    assert out.read_bytes() == b"precious"


# ---- OS errors: one line, the state kept ------------------------------------------------------

def test_no_permission_on_out_is_one_line(data, tmp_path, monkeypatch, capsys):
    parent = tmp_path / "locked"
    parent.mkdir()
    real = os.makedirs

    def refused(path, *a, **k):        # as a directory the user may not write answers
        if os.fspath(path).startswith(os.fspath(parent)):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "makedirs", refused)
    rc = cli.main(["train", str(data), "--out", str(parent / "run"), *TRAIN, "--steps", "2"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.strip() == (f"fastattn train: cannot write the run in {parent / 'run'}: "
                           f"Permission denied ({parent / 'run'})")
    assert os.listdir(parent) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes into a read-only directory")
def test_a_read_only_parent_is_one_line(data, tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        res = run_cli("train", data, "--out", parent / "run", *TRAIN, "--steps", "2")
    finally:
        parent.chmod(0o755)
    one_line_error(res, "cannot write the run in", "Permission denied")


def test_a_full_disk_is_one_line_and_the_run_stays_as_it_was(data, tmp_path, monkeypatch,
                                                             capsys):
    from fastattn import io

    run = tmp_path / "run"
    assert cli.main(["train", str(data), "--out", str(run), *TRAIN, "--steps", "6"]) == 0
    before = snapshot(run)
    capsys.readouterr()

    def full(path, *a, **k):            # the first tensor file written meets a full disk
        raise OSError(errno.ENOSPC, "No space left on device", os.fspath(path))

    monkeypatch.setattr(io, "_write", full)
    rc = cli.main(["train", str(data), "--out", str(run), *TRAIN, "--steps", "9", "--resume"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"fastattn train: cannot write the run in {run}: No space left on "
                           "device (")
    assert "rerun with --resume" in line
    monkeypatch.undo()
    after = snapshot(run)
    config = "config.json"             # the resume wrote its longer run's steps: 9
    assert {k: v for k, v in after.items() if k != config} == \
        {k: v for k, v in before.items() if k != config}
    assert json.loads(after[config])["steps"] == 9
    assert os.path.basename(latest_checkpoint(run / "checkpoints")) == "step-00000006"
    load_run(run)
    assert cli.main(["train", str(data), "--out", str(run), *TRAIN, "--steps", "9",
                     "--resume"]) == 0     # space again: the run goes on from step 6
    assert load_checkpoint(run / "checkpoints").step == 9


def test_a_diverging_run_stops_at_the_step_its_loss_is_not_finite(data, tmp_path):
    run = tmp_path / "run"
    res = run_cli("train", data, "--out", run, "--model", "tiny", "--tokenizer", "word",
                  "--batch-tokens", "64", "--valid", "0.25", "--eval-every", "4", "--steps",
                  "12", "--lr", "1e30", "--quiet")
    line = one_line_error(res, "the training loss is ", " at step ", "lower learning rate",
                          "--lr")
    assert "generate" not in res.stderr
    step = int(line.split(" at step ")[1].split()[0])
    records = [json.loads(x) for x in res.stderr.splitlines() if x.startswith("{")]
    finite = [r["step"] for r in records if r.get("kind") == "step"]
    assert all(s < step for s in finite)
    assert list_checkpoints(run / "checkpoints") == []      # nothing of the diverged weights


# ---- JSON a run reads: a key given twice is refused, naming the file and the key -------------

def test_a_key_given_twice_in_a_checkpoints_state_is_refused(tmp_path):
    run = tmp_path / "run"
    train_run(PAIRS, run, tokenizer="word", steps=2, batch_tokens=64, valid=0, progress=False)
    state = run / "checkpoints" / "step-00000002" / "state.json"
    text = state.read_text()
    state.write_text(text.replace('"step": 2,', '"step": 2, "step": 0,', 1))
    with pytest.raises(ValueError, match=f"^{re.escape(str(state))}: .*'step' is given twice"):
        load_checkpoint(run / "checkpoints")


def test_a_key_given_twice_in_a_history_line_is_refused(tmp_path):
    from fastattn.train import History

    path = tmp_path / "history.jsonl"
    path.write_text('{"kind": "step", "step": 1, "step": 2, "epoch": 0, "loss": 1.0}\n')
    with pytest.raises(ValueError,
                       match=f"^{re.escape(str(path))}: line 1: .*'step' is given twice"):
        History.read_jsonl(path)


def test_a_key_given_twice_in_a_jsonl_pair_is_one_line(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"source": "one", "target": "two"}\n'
                    '{"source": "a", "source": "b", "target": "c"}\n')
    res = run_cli("train", data, "--out", tmp_path / "run", *TRAIN, "--steps", "2")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip() == (f"fastattn train: {data}: line 2: not valid JSON: the key "
                                  "'source' is given twice in one object")
    assert not (tmp_path / "run").exists()


# ---- every fastattn error a command can meet is one line ----------------------------------

def _public_errors():
    """The exception classes fastattn's modules export (their __all__)."""
    import importlib
    import inspect
    import pkgutil

    import fastattn

    found = set()
    for info in pkgutil.walk_packages(fastattn.__path__, "fastattn."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:                  # an optional dependency's module
            continue
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and issubclass(obj, Exception):
                found.add(obj)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__name__}")


@pytest.mark.parametrize("error", _public_errors(), ids=lambda c: c.__name__)
def test_every_exported_fastattn_error_is_one_line_in_a_command(error, capsys):
    def command(args):
        raise error("what went wrong")

    assert cli._errors(command)(argparse.Namespace(command="plot")) == 1
    assert capsys.readouterr().err == "fastattn plot: what went wrong\n"


def test_a_demo_into_a_directory_in_use_is_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    with lock_directory(tmp_path / "run", "fastattn train run"):
        status = cli.main(["demo", "--quick", "--quiet", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 1, err
    assert err.strip().splitlines()[-1] == (
        f"fastattn demo: {tmp_path / 'run'}: in use by another fastattn train run (process "
        f"{os.getpid()} holds its lock); wait for it to end, or use another directory")


# ---- fit's checkpoint_dir: one run's checkpoints --------------------------------------------

def _fit_args():
    from fastattn.train.run import build_model, train_tokenizer

    tok = train_tokenizer("word", [t for p in PAIRS for t in p])
    model = build_model("tiny", tok.vocab_size, tok.vocab_size, pad_id=tok.pad_id)
    return model, dict(src_tokenizer=tok, tgt_tokenizer=tok, batch_tokens=64, progress=False)


def test_fit_refuses_a_checkpoint_dir_holding_another_runs_checkpoints(tmp_path):
    from fastattn.train import fit

    model, kw = _fit_args()
    ckpt = tmp_path / "ckpt"
    fit(model, PAIRS, max_steps=3, checkpoint_dir=ckpt, **kw)
    before = snapshot(ckpt)
    want = (f"fit: checkpoint_dir {ckpt} already holds the checkpoints of a run "
            "(step-00000003); resume=True continues it")
    with pytest.raises(ValueError, match="^" + re.escape(want)):
        fit(model, PAIRS[:2], max_steps=2, checkpoint_dir=ckpt, **kw)
    assert snapshot(ckpt) == before                 # nothing mixed in
    lock_directory(ckpt).release()                  # and the lock let go
    fit(model, PAIRS, max_steps=5, checkpoint_dir=ckpt, resume=True, **kw)
    assert [os.path.basename(p) for p in list_checkpoints(ckpt)] == ["step-00000003",
                                                                      "step-00000005"]


def test_fit_takes_a_checkpoint_dir_with_files_that_are_no_checkpoint(tmp_path):
    from fastattn.train import fit

    model, kw = _fit_args()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "notes.txt").write_text("mine\n")
    fit(model, PAIRS, max_steps=2, checkpoint_dir=ckpt, **kw)
    assert len(list_checkpoints(ckpt)) == 1 and (ckpt / "notes.txt").read_text() == "mine\n"


def test_an_os_error_writing_a_commands_output_is_one_line(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "history.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (tmp_path / "a-file").write_text("")
    status = cli.main(["plot", str(tmp_path), "--out", str(tmp_path / "a-file" / "loss.png")])
    err = capsys.readouterr().err
    assert status == 1, err
    assert re.fullmatch(rf"fastattn plot: {re.escape(str(tmp_path / 'a-file'))}\S*: "
                        r"(File exists|Not a directory)\n", err), err
