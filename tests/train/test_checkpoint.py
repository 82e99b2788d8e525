"""Checkpoints: the layout, exact resume (per-step losses bit for bit, dropout on), Ctrl-C,
atomic writes (a crash mid-write leaves the previous checkpoint loadable), keep-N, refusals."""
import json
import os
import stat

import numpy as np
import pytest

from fastattn.train import fit, latest_checkpoint, list_checkpoints, load_checkpoint
from fastattn.train.checkpoint import FILES, LOCK_FILE
from train_util import char_tokenizer, tiny_model, untimed, words  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

DROPOUT = 0.1
STEPS = 24


@pytest.fixture
def tok():
    return char_tokenizer()


@pytest.fixture
def pairs():
    return [(w, w[::-1]) for w in words(80)]


def run(tok, pairs, ckpt=None, **kw):
    """A run with dropout, a few epochs of small batches, evaluation and checkpoints."""
    args = dict(src_tokenizer=tok, tgt_tokenizer=tok, valid_pairs=pairs[:8], max_steps=STEPS,
                batch_tokens=96, lr=1e-2, warmup=5, eval_every=10, seed=7, progress=False,
                checkpoint_dir=ckpt)
    args.update(kw)
    return fit(tiny_model(tok, dropout=DROPOUT, seed=1), pairs, **args)


def checkpoint_entries(path):
    """The entries of a checkpoint directory, the best models (best-step-*) and fit's lock
    file left out."""
    return sorted(n for n in os.listdir(path) if not n.startswith("best-") and n != LOCK_FILE)


def stop_after(k, exc=StopIteration):
    def callback(record, model):
        if record["step"] == k:
            raise exc
    return callback


@pytest.fixture
def reference(tok, pairs):
    """The uninterrupted run."""
    return run(tok, pairs)


def test_layout_of_a_checkpoint(tok, pairs, tmp_path):
    h = run(tok, pairs, tmp_path, max_steps=6, checkpoint_every=4)
    assert checkpoint_entries(tmp_path) == ["latest", "step-00000004", "step-00000006"]
    assert (tmp_path / "latest").read_text() == "step-00000006\n"
    assert sorted(os.listdir(tmp_path / "step-00000006")) == sorted(FILES.values())
    state = json.loads((tmp_path / "step-00000006" / "state.json").read_text())
    assert state["format"] == "fastattn-checkpoint/1"
    assert (state["step"], state["schedule_step"], state["seed"]) == (6, 6, 7)
    assert state["dropout_seed"] == 7 and state["dropout_calls"] == 6
    assert state["numpy_rng"] == np.random.default_rng(
        (7, state["epoch"])).bit_generator.state
    ck = load_checkpoint(tmp_path)
    assert ck.step == 6 and ck.path == str(tmp_path / "step-00000006")
    assert ck.history == h and ck.src_tokenizer == tok and ck.tgt_tokenizer == tok
    assert ck.model.config["dropout"] == DROPOUT
    assert int(ck.optimizer_state["step"]) == 6


@pytest.mark.parametrize("stop", [5, 10, 13])
def test_resume_continues_the_loss_curve_bit_for_bit(tok, pairs, tmp_path, reference, stop):
    first = run(tok, pairs, tmp_path, callbacks=[stop_after(stop)])
    assert len(first.steps) == stop
    resumed = run(tok, pairs, tmp_path, resume=True)
    assert resumed.losses == reference.losses          # exact float equality, every step
    assert [r["lr"] for r in resumed.steps] == [r["lr"] for r in reference.steps]
    assert untimed(resumed)[-1] == untimed(reference)[-1]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_checkpoints_follow_the_umask(tok, pairs, tmp_path, umask):
    """Directories and files as mkdir() and open() make them, like the rest of a run
    directory (a temporary directory or file would be 0700 / 0600)."""
    old = os.umask(umask)
    try:
        run(tok, pairs, tmp_path / "ck", max_steps=4, checkpoint_every=2)
    finally:
        os.umask(old)
    entries = [p for p in (tmp_path / "ck").rglob("*")]
    assert any(p.name.startswith("best-") for p in entries)
    assert any(p.name == "optimizer.safetensors" for p in entries)
    for p in entries:
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert stat.S_IMODE(p.stat().st_mode) == want, p


def test_resume_from_max_steps_and_a_periodic_checkpoint(tok, pairs, tmp_path, reference):
    run(tok, pairs, tmp_path, max_steps=11, checkpoint_every=4)
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path)] == [
        "step-00000004", "step-00000008", "step-00000011"]
    assert run(tok, pairs, tmp_path, resume=True).losses == reference.losses
    # the latest removed: resume from step 8 after a wiped step-11
    import shutil
    shutil.rmtree(tmp_path / "step-00000011")
    assert latest_checkpoint(tmp_path) == str(tmp_path / "step-00000024")
    shutil.rmtree(tmp_path / "step-00000024")
    assert latest_checkpoint(tmp_path) == str(tmp_path / "step-00000008")   # the fallback
    assert run(tok, pairs, tmp_path, resume=True).losses == reference.losses


def test_keyboard_interrupt_writes_a_checkpoint_and_is_reraised(tok, pairs, tmp_path,
                                                                reference):
    with pytest.raises(KeyboardInterrupt):
        run(tok, pairs, tmp_path, callbacks=[stop_after(9, KeyboardInterrupt)])
    assert latest_checkpoint(tmp_path) == str(tmp_path / "step-00000009")
    assert run(tok, pairs, tmp_path, resume=True).losses == reference.losses


def test_resume_without_a_checkpoint_starts_a_new_run(tok, pairs, tmp_path, reference):
    assert run(tok, pairs, tmp_path / "new", resume=True).losses == reference.losses


def test_a_crash_renaming_the_checkpoint_leaves_the_previous_one(tok, pairs, tmp_path,
                                                                 monkeypatch):
    run(tok, pairs, tmp_path, max_steps=4)
    real = os.replace

    def failing(src, dst):
        if os.path.basename(dst).startswith("step-"):
            raise OSError("disk on fire")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="disk on fire"):
        run(tok, pairs, tmp_path, max_steps=8, resume=True)
    monkeypatch.setattr(os, "replace", real)
    assert checkpoint_entries(tmp_path) == ["latest", "step-00000004"]   # temp dir removed
    assert (tmp_path / "latest").read_text() == "step-00000004\n"
    assert load_checkpoint(tmp_path).step == 4


def test_a_crash_before_the_pointer_moves_keeps_latest_on_a_complete_one(tok, pairs,
                                                                          tmp_path,
                                                                          monkeypatch):
    run(tok, pairs, tmp_path, max_steps=4)
    real = os.replace

    def failing(src, dst):
        if os.path.basename(dst) == "latest":
            raise KeyboardInterrupt                     # killed between the two renames
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(KeyboardInterrupt):
        run(tok, pairs, tmp_path, max_steps=8, resume=True)
    monkeypatch.setattr(os, "replace", real)
    assert (tmp_path / "latest").read_text() == "step-00000004\n"
    assert load_checkpoint(tmp_path).step == 4
    assert load_checkpoint(tmp_path / "step-00000008").step == 8     # complete as well


def test_a_partial_temporary_directory_is_ignored_and_cleaned_up(tok, pairs, tmp_path):
    run(tok, pairs, tmp_path, max_steps=4)
    partial = tmp_path / ".tmp-step-00000006-abcd"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\x00" * 10)     # a crash mid-write
    assert load_checkpoint(tmp_path).step == 4
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path)] == ["step-00000004"]
    run(tok, pairs, tmp_path, max_steps=6, resume=True)
    assert not partial.exists()
    assert load_checkpoint(tmp_path).step == 6


def test_a_run_starts_by_removing_what_a_killed_save_left(tok, pairs, tmp_path):
    """A resume that writes no checkpoint (the run had finished) still cleans up."""
    run(tok, pairs, tmp_path, max_steps=4)
    (tmp_path / ".tmp-step-00000006-abcd").mkdir()
    (tmp_path / ".tmp-best-step-00000006-abcd").mkdir()
    (tmp_path / ".trash-step-00000002-efgh").mkdir()
    (tmp_path / ".trash-step-00000002-efgh" / "history.jsonl").write_text("")
    (tmp_path / ".latest-1234").write_text("step-00000006\n")
    run(tok, pairs, tmp_path, max_steps=4, resume=True)
    assert checkpoint_entries(tmp_path) == ["latest", "step-00000004"]


def test_checkpoint_minutes_writes_one_when_that_long_has_passed(tok, pairs, tmp_path,
                                                                 monkeypatch):
    import importlib
    import time
    import types

    fit_module = importlib.import_module("fastattn.train.fit")   # the package's fit is the function
    now = [0.0]                         # the clock fit reads: 25 s a step, set by a callback
    monkeypatch.setattr(fit_module, "time", types.SimpleNamespace(
        perf_counter=time.perf_counter, monotonic=lambda: now[0]))

    def tick(record, model):
        now[0] = 25.0 * record["step"]

    h = run(tok, pairs, tmp_path, max_steps=10, checkpoint_minutes=1, keep_checkpoints=None,
            callbacks=[tick])
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path)] == [
        "step-00000003", "step-00000006", "step-00000009", "step-00000010"]
    monkeypatch.undo()
    plain = run(tok, pairs, tmp_path / "plain", max_steps=10)
    assert untimed(h) == untimed(plain)                   # the checkpoints changed nothing
    with pytest.raises(ValueError, match="checkpoint_minutes must be > 0"):
        run(tok, pairs, tmp_path / "zero", checkpoint_minutes=0)
    with pytest.raises(ValueError, match="checkpoint_minutes need a checkpoint_dir"):
        run(tok, pairs, None, checkpoint_minutes=1)


def test_only_the_newest_checkpoints_are_kept(tok, pairs, tmp_path):
    run(tok, pairs, tmp_path, max_steps=10, checkpoint_every=2)
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path)] == [
        "step-00000006", "step-00000008", "step-00000010"]
    run(tok, pairs, tmp_path / "one", max_steps=4, checkpoint_every=1, keep_checkpoints=1)
    assert checkpoint_entries(tmp_path / "one") == ["latest", "step-00000004"]


def test_resume_refuses_other_data_seed_budget_tokenizer_or_model(tok, pairs, tmp_path):
    run(tok, pairs, tmp_path, max_steps=3)
    with pytest.raises(ValueError, match="trained on other data"):
        run(tok, pairs[1:], tmp_path, resume=True)
    with pytest.raises(ValueError, match=r"seed=7 in the checkpoint, 8 now"):
        run(tok, pairs, tmp_path, resume=True, seed=8)
    with pytest.raises(ValueError, match=r"batch_tokens=96 in the checkpoint, 97 now"):
        run(tok, pairs, tmp_path, resume=True, batch_tokens=97)
    other = char_tokenizer("abcdefghz")
    with pytest.raises(ValueError, match="(other data|tokenizers differ)"):
        run(other, pairs, tmp_path, resume=True)
    wide = tiny_model(tok, dropout=DROPOUT, max_len=20)
    with pytest.raises(ValueError, match="model config differs from the model's in max_len"):
        fit(wide, pairs, src_tokenizer=tok, tgt_tokenizer=tok, batch_tokens=96, seed=7,
            checkpoint_dir=tmp_path, resume=True, progress=False)


def test_load_checkpoint_names_what_is_wrong(tok, pairs, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        load_checkpoint(tmp_path)
    run(tok, pairs, tmp_path, max_steps=2)
    step = tmp_path / "step-00000002"
    (step / "state.json").write_text('{"format": "fastattn-checkpoint/1", "step": -1}')
    with pytest.raises(ValueError, match=r"state.json: missing epoch, batch"):
        load_checkpoint(step)
    os.remove(step / "optimizer.safetensors")
    with pytest.raises(ValueError, match="not a complete checkpoint: missing "
                                         "optimizer.safetensors"):
        load_checkpoint(tmp_path)


def test_ctrl_c_inside_a_step_takes_effect_after_it(tok, pairs, tmp_path, reference):
    """SIGINT arriving mid-step (here: inside model.loss) lets the step finish, then the
    run writes a checkpoint of it and re-raises; the resume is exact."""
    import signal

    model = tiny_model(tok, dropout=DROPOUT, seed=1)
    loss = model.loss
    calls = []

    def loss_then_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:
            os.kill(os.getpid(), signal.SIGINT)        # delivered before loss returns
        return loss(*args, **kwargs)

    model.loss = loss_then_ctrl_c
    # fit defers Ctrl-C only from Python's default handler (its documented condition): set it
    # here, whatever the process's earlier tests or libraries left (twice in full-suite runs the
    # interrupt was not deferred, never with this test alone)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            fit(model, pairs, src_tokenizer=tok, tgt_tokenizer=tok, max_steps=STEPS,
                batch_tokens=96, lr=1e-2, warmup=5, seed=7, progress=False,
                checkpoint_dir=tmp_path)
        restored = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert restored is signal.default_int_handler   # restored
    assert load_checkpoint(tmp_path).step == 6                  # the step finished
    assert run(tok, pairs, tmp_path, resume=True).losses == reference.losses
