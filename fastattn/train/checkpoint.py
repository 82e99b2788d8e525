"""Training checkpoints: everything a run needs to continue exactly, written atomically.

Layout of a checkpoint directory (``fit(..., checkpoint_dir=...)``):

```text
checkpoint_dir/
  latest                    "step-00000123\\n": the newest complete checkpoint
  step-00000100/            older ones, up to `keep` in all (default 3)
  step-00000123/
    model.safetensors       fastattn.io.save(model): weights + class and config
    optimizer.safetensors   optimizer.state_dict() (moments, step counts, hyper-parameters)
    src_tokenizer.json      the tokenizers' own files (Tokenizer.save)
    tgt_tokenizer.json
    history.jsonl           the History so far (History.to_jsonl)
    state.json              format, step, data position, RNG and dropout state, schedule
                            step, the fit settings and a fingerprint of the training data
```

``state.json`` holds at least ``format`` ("fastattn-checkpoint/1"), ``step``, ``epoch`` and
``batch`` (the next batch to run: its index within epoch ``epoch``), ``dropout_seed`` and
``dropout_calls`` (the model's dropout base seed and training-forward count: the next masks),
``numpy_rng`` (the bit-generator state, as JSON, of the epoch's shuffling generator
``numpy.random.default_rng((seed, epoch))``, so a resume can check that it recomputes the
same data order) and ``schedule_step`` (the optimiser's step count: what the learning-rate
schedule reads next).

Writing (``save_checkpoint``) never leaves a checkpoint that loads wrong:

1. every file is written into a fresh temporary directory ``.tmp-step-00000123-XXXX``
   inside checkpoint_dir and fsynced, then the directory itself;
2. ``os.replace`` renames it to ``step-00000123`` (a directory of that name only ever exists
   complete), and checkpoint_dir is fsynced;
3. ``latest`` is rewritten atomically: a temporary file, fsynced, ``os.replace``d onto it;
4. checkpoints beyond the newest `keep` are renamed out of the way (``.trash-...``) and
   removed; so are temporary directories left by a save that crashed.

The best model (fit's keep_best) lives beside the checkpoints, in ``best-step-00000100/``
(``model.safetensors`` and ``best.json``: step and validation loss), written the same way (a
``.tmp-best-*`` directory renamed into place). Each checkpoint's state.json names the best
model it had seen (``"best": {"step", "valid_loss"}``, or null); the best-step-* directories
that no kept checkpoint names are removed, except the newest, so a resume from any kept
checkpoint finds the best model that checkpoint knew.

A crash before step 2 leaves a ``.tmp-*`` directory that loading ignores and the next run or
save removes (``remove_temporaries``); a crash between 2 and 3 leaves ``latest`` on the
previous checkpoint, which is complete. ``load_checkpoint(checkpoint_dir)`` follows
``latest``; if it is missing or names no checkpoint it takes the newest ``step-*`` directory
instead.

One process at a time: ``lock_directory`` holds an exclusive lock on a directory (an OS lock,
``flock``, on its ``.fastattn.lock`` file) for as long as a run writes it. fit takes it on
checkpoint_dir, ``fastattn train`` on the run directory; a second process that asks for a
directory held by another gets ``DirectoryInUse`` at once, naming the directory and the
process that holds it. The OS releases the lock when the process ends, however it ends (a
SIGKILL included), so a killed run never leaves a directory locked; the file stays (removing
it would let two processes lock two different files of one name).
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time

from .history import History

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "list_checkpoints",
           "save_best", "load_best", "remove_temporaries", "Checkpoint", "FORMAT", "FILES",
           "lock_directory", "DirectoryLock", "DirectoryInUse", "LOCK_FILE"]

FORMAT = "fastattn-checkpoint/1"
FILES = {"model": "model.safetensors", "optimizer": "optimizer.safetensors",
         "src_tokenizer": "src_tokenizer.json", "tgt_tokenizer": "tgt_tokenizer.json",
         "history": "history.jsonl", "state": "state.json"}
LATEST = "latest"
LOCK_FILE = ".fastattn.lock"
"""The file in a locked directory whose flock a run holds (`lock_directory`)."""
_NAME = re.compile(r"step-(\d{8,})\Z")
_BEST = re.compile(r"best-step-(\d{8,})\Z")
_STATE_KEYS = ("format", "step", "epoch", "batch", "dropout_seed", "dropout_calls",
               "numpy_rng", "schedule_step")


def step_name(step):
    """The directory name of the checkpoint after `step` updates: step-00000123."""
    return f"step-{int(step):08d}"


# ---- one writer at a time ----------------------------------------------------------------------

class DirectoryInUse(RuntimeError):
    """Another process holds the lock on the directory (it is writing a run there)."""


class DirectoryLock:
    """The lock `lock_directory` took; `release()` lets it go, as leaving a `with` block does.

    Args:
        path: the locked directory.
        fd: the open lock file whose flock is held, or None when no lock could be taken.
    """

    def __init__(self, path, fd):
        self.path, self._fd = path, fd

    def release(self):
        """Let the lock go (closing its file releases the flock); a second call does nothing."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)                     # closing the file releases its flock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return f"DirectoryLock({self.path!r}, held={self._fd is not None})"


def lock_directory(directory, what="fastattn run"):
    """Lock `directory` for this process, at once (no waiting).

    Where the file system has no flock (Windows, some network file systems) the lock is not
    taken and the returned DirectoryLock holds nothing.

    Args:
        directory: an existing directory.
        what: what holds it, for the message another process gets (default "fastattn run").

    Returns:
        The `DirectoryLock`, held until released or the process ends.

    Raises:
        DirectoryInUse: another process holds it (naming the directory, `what` and that
            process's id).
    """
    directory = os.fspath(directory)
    try:
        import fcntl
    except ImportError:                  # Windows: no flock
        return DirectoryLock(directory, None)
    path = os.path.join(directory, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)                 # flock not supported here: go on without it
            return DirectoryLock(directory, None)
        holder = _holder(fd)
        os.close(fd)
        who = f"process {holder}" if holder.isdigit() else "another process"
        raise DirectoryInUse(f"{directory}: in use by another {what} ({who} holds its lock); "
                             "wait for it to end, or use another directory") from None
    try:                                 # who holds it, for the message above
        pid = f"{os.getpid()}\n".encode("ascii")
        os.pwrite(fd, pid, 0)            # written over, then cut: never empty once written
        os.ftruncate(fd, len(pid))
    except OSError:
        pass
    return DirectoryLock(directory, fd)


def _holder(fd):
    """The process id the lock file names (its first line), "" if none; a holder that has just
    taken the lock is given a moment to write it."""
    for _ in range(10):
        try:
            text = os.pread(fd, 64, 0).decode("ascii", "replace")
        except OSError:
            return ""
        if text.strip():
            return text.split()[0]
        time.sleep(0.02)
    return ""


# ---- writing --------------------------------------------------------------------------------

def _fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path):
    """fsync a directory (its entries: a rename in it is durable); a no-op where directories
    cannot be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _make_temporary_dir(prefix, parent):
    """A new directory named prefix + random in `parent`. Unlike tempfile.mkdtemp (always
    0700) its permissions follow the umask, so a checkpoint renamed into place reads like the
    rest of the run directory."""
    while True:
        path = os.path.join(parent, f"{prefix}{os.urandom(4).hex()}")
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue


def _write_text(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _remove(checkpoint_dir, name):
    """Remove the entry `name`: renamed out of the checkpoint names first (one atomic step),
    so a removal cut short never leaves a step-* directory with files missing."""
    path = os.path.join(checkpoint_dir, name)
    if not name.startswith("."):
        trash = _make_temporary_dir(f".trash-{name}-", checkpoint_dir)
        os.rmdir(trash)
        os.replace(path, trash)
        path = trash
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def remove_temporaries(checkpoint_dir):
    """Remove what a crashed save or removal left (.tmp-*, .trash-*, .latest-*).

    fit calls it when a run starts, save_checkpoint before each save.

    Args:
        checkpoint_dir: the checkpoints' directory; nothing happens when it does not exist.
    """
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith((".tmp-step-", ".tmp-best-", ".trash-", ".latest-")):
            _remove(checkpoint_dir, name)


def save_checkpoint(checkpoint_dir, *, model, optimizer, src_tokenizer, tgt_tokenizer,
                    state, history=None, keep=3):
    """Write a checkpoint of step `state["step"]` atomically, and point `latest` at it.

    See the module docstring for the layout and the atomic write. The model's dropout state
    (`dropout_seed`, `dropout_calls`), `schedule_step` and `format` are added to `state` here.

    Args:
        checkpoint_dir: the checkpoints' directory (created if needed).
        model: the model, saved with `fastattn.io.save`.
        optimizer: its optimiser (its `state_dict()` is saved).
        src_tokenizer: the source tokenizer (saved with its own `save`).
        tgt_tokenizer: the target tokenizer.
        state: the run's position and settings, JSON-ready.
        history: the `History` so far, or None (the default).
        keep: the newest checkpoints kept (default 3; None: all).

    Returns:
        The checkpoint's path.
    """
    from .. import io

    if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 1):
        raise ValueError(f"save_checkpoint: keep must be an int >= 1 or None, got {keep!r}")
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"save_checkpoint: state['step'] must be an int >= 0, got {step!r}")
    checkpoint_dir = os.fspath(checkpoint_dir)
    os.makedirs(checkpoint_dir, exist_ok=True)
    remove_temporaries(checkpoint_dir)
    name = step_name(step)
    state = dict(state, format=FORMAT, dropout_seed=int(model._dropout_seed),
                 dropout_calls=int(model._dropout_calls),
                 schedule_step=int(optimizer.steps))
    tmp = _make_temporary_dir(f".tmp-{name}-", checkpoint_dir)
    try:
        files = {k: os.path.join(tmp, v) for k, v in FILES.items()}
        io.save(model, files["model"])
        io.save_state_dict(optimizer.state_dict(), files["optimizer"])
        src_tokenizer.save(files["src_tokenizer"])
        tgt_tokenizer.save(files["tgt_tokenizer"])
        (history if history is not None else History()).to_jsonl(files["history"])
        _write_text(files["state"], json.dumps(state, indent=1) + "\n")   # the last one
        for k in FILES:
            _fsync_file(files[k])
        _fsync_dir(tmp)
        final = os.path.join(checkpoint_dir, name)
        if os.path.lexists(final):           # the same step saved again: the new one wins
            _remove(checkpoint_dir, name)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(checkpoint_dir)
    fd, pointer = io.create_temporary(checkpoint_dir, ".latest-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer, os.path.join(checkpoint_dir, LATEST))
    except BaseException:
        try:
            os.remove(pointer)
        except OSError:
            pass
        raise
    _fsync_dir(checkpoint_dir)
    if keep is not None:
        for old in list_checkpoints(checkpoint_dir)[:-keep]:
            if os.path.basename(old) != name:
                _remove(checkpoint_dir, os.path.basename(old))
    _prune_best(checkpoint_dir)
    return final


def _best_dirs(checkpoint_dir):
    """{step: name} of the best-step-* directories in checkpoint_dir."""
    return {int(m.group(1)): n for n in os.listdir(checkpoint_dir)
            if (m := _BEST.match(n)) and os.path.isdir(os.path.join(checkpoint_dir, n))}


def _prune_best(checkpoint_dir):
    """Remove the best-step-* directories that no kept checkpoint names, except the newest."""
    found = _best_dirs(checkpoint_dir)
    if len(found) < 2:
        return
    wanted = {max(found)}
    for path in list_checkpoints(checkpoint_dir):
        try:
            with open(os.path.join(path, FILES["state"]), encoding="utf-8") as f:
                best = json.load(f).get("best")
            wanted.add(int(best["step"]))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue                      # no best recorded (or unreadable): nothing to keep
    for step, name in found.items():
        if step not in wanted:
            _remove(checkpoint_dir, name)


def save_best(checkpoint_dir, model, step, valid_loss):
    """Write a model's weights as the best model, into checkpoint_dir/best-step-N/, atomically.

    Args:
        checkpoint_dir: the checkpoints' directory.
        model: the model whose weights are saved.
        step: the step of the evaluation.
        valid_loss: its validation loss.

    Returns:
        The best model's path.
    """
    from .. import io

    checkpoint_dir = os.fspath(checkpoint_dir)
    os.makedirs(checkpoint_dir, exist_ok=True)
    name = "best-" + step_name(step)
    tmp = _make_temporary_dir(f".tmp-{name}-", checkpoint_dir)
    try:
        io.save(model, os.path.join(tmp, FILES["model"]))
        _write_text(os.path.join(tmp, "best.json"),
                    json.dumps({"step": int(step), "valid_loss": float(valid_loss)}) + "\n")
        _fsync_file(os.path.join(tmp, FILES["model"]))
        _fsync_dir(tmp)
        final = os.path.join(checkpoint_dir, name)
        if os.path.lexists(final):
            _remove(checkpoint_dir, name)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(checkpoint_dir)
    _prune_best(checkpoint_dir)
    return final


def load_best(checkpoint_dir, step):
    """The weights of the best model of a step.

    Args:
        checkpoint_dir: the checkpoints' directory.
        step: the step of the best model.

    Returns:
        {state_dict key: float32 array}, or None when there is none (e.g. a run that kept no
            best).
    """
    from .. import io

    path = os.path.join(os.fspath(checkpoint_dir), "best-" + step_name(step),
                        FILES["model"])
    if not os.path.isfile(path):
        return None
    weights, _ = io.read_state_dict(path)
    return weights


# ---- reading --------------------------------------------------------------------------------

def list_checkpoints(checkpoint_dir):
    """The complete checkpoints (step-* directories) of a checkpoint directory.

    Args:
        checkpoint_dir: the checkpoints' directory.

    Returns:
        Their paths, oldest first; [] when the directory does not exist.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return []
    found = sorted((int(m.group(1)), n) for n in names
                   if (m := _NAME.match(n)) and os.path.isdir(os.path.join(checkpoint_dir, n)))
    return [os.path.join(checkpoint_dir, n) for _, n in found]


def latest_checkpoint(checkpoint_dir):
    """The path of the checkpoint `latest` names in a checkpoint directory.

    Args:
        checkpoint_dir: the checkpoints' directory.

    Returns:
        The path; if the pointer is missing or names no checkpoint, the newest step-*
            directory; None when there is none.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    try:
        with open(os.path.join(checkpoint_dir, LATEST), encoding="utf-8") as f:
            name = f.read().strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    if _NAME.match(name) and os.path.isdir(os.path.join(checkpoint_dir, name)):
        return os.path.join(checkpoint_dir, name)
    found = list_checkpoints(checkpoint_dir)
    return found[-1] if found else None


class Checkpoint:
    """A loaded checkpoint (made by `load_checkpoint`); its arguments are its attributes.

    Args:
        path: the checkpoint's directory.
        model: the model, rebuilt by `fastattn.io.load`.
        optimizer_state: the dict for `optimizer.load_state_dict`.
        src_tokenizer: the source tokenizer.
        tgt_tokenizer: the target tokenizer.
        state: state.json's content.
        history: the `History` so far.
    """

    def __init__(self, path, model, optimizer_state, src_tokenizer, tgt_tokenizer, state,
                 history):
        self.path, self.model, self.optimizer_state = path, model, optimizer_state
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.state, self.history = state, history

    @property
    def step(self):
        """The step the checkpoint was written after."""
        return self.state["step"]

    def restore(self, model, optimizer):
        """Put the weights, dropout state and optimiser state into a model and its optimiser.

        Args:
            model: a model of the same architecture.
            optimizer: its optimiser.

        Raises:
            ValueError: a model of another configuration (the differences named).
        """
        if model.config != self.model.config:
            diff = sorted(k for k in set(model.config) | set(self.model.config)
                          if model.config.get(k) != self.model.config.get(k))
            raise ValueError(f"{self.path}: the checkpoint's model config differs from the "
                             f"model's in {', '.join(diff)}: "
                             + "; ".join(f"{k}: {self.model.config.get(k)!r} in the "
                                         f"checkpoint, {model.config.get(k)!r} given"
                                         for k in diff[:4]))
        model.load_state_dict(self.model.state_dict())
        optimizer.load_state_dict(self.optimizer_state)
        model._dropout_seed = int(self.state["dropout_seed"])
        model._dropout_calls = int(self.state["dropout_calls"])

    def __repr__(self):
        return f"Checkpoint({self.path!r}, step={self.step})"


def load_checkpoint(path, *, backend="fast"):
    """Load a checkpoint, or a checkpoint directory's latest.

    Args:
        path: a checkpoint (a step-* directory) or a checkpoint_dir.
        backend: the model's backend, "fast" (the default) or "reference".

    Returns:
        The `Checkpoint`.

    Raises:
        FileNotFoundError: no checkpoint at all.
        ValueError: a missing file, a state.json that does not hold a checkpoint's fields,
            or a file that does not load (the file named).
    """
    from .. import io, tokenizers

    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, FILES["state"])) and \
            not _NAME.match(os.path.basename(os.path.normpath(path))):
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"load_checkpoint: no checkpoint in {path}")
        path = found
    files = {k: os.path.join(path, v) for k, v in FILES.items()}
    missing = [v for k, v in FILES.items() if not os.path.isfile(files[k])]
    if missing:
        raise ValueError(f"{path}: not a complete checkpoint: missing {', '.join(missing)}")
    from ..tokenizers.files import unique_keys

    try:
        with open(files["state"], encoding="utf-8") as f:
            state = json.load(f, object_pairs_hook=unique_keys)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{files['state']}: not valid JSON: {exc}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{files['state']}: expected a JSON object")
    absent = [k for k in _STATE_KEYS if k not in state]
    if absent:
        raise ValueError(f"{files['state']}: missing {', '.join(absent)}")
    if state["format"] != FORMAT:
        raise ValueError(f"{files['state']}: format {state['format']!r}, expected {FORMAT!r}")
    for k in ("step", "epoch", "batch", "dropout_seed", "dropout_calls", "schedule_step"):
        if not isinstance(state[k], int) or isinstance(state[k], bool) or state[k] < 0:
            raise ValueError(f"{files['state']}: {k} must be an int >= 0, got {state[k]!r}")
    model = io.load(files["model"], backend=backend)
    optimizer_state, _ = io.read_state_dict(files["optimizer"])
    src_tok = tokenizers.load(files["src_tokenizer"])
    tgt_tok = tokenizers.load(files["tgt_tokenizer"])
    history = History.read_jsonl(files["history"])
    return Checkpoint(path, model, optimizer_state, src_tok, tgt_tok, state, history)
