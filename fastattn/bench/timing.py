"""Measurement: thread control, idle waits, interleaved timing, peak memory, a memory-copy probe.

- ``same_threads(n)``: fastattn, NumPy's OpenBLAS and torch at the same thread count for a run;
- ``settle()``: wait until this process's thread pools have gone idle before a timed call;
- ``time_interleaved(fns, counts, warm)``: round-robin timing, each call after its own warm-up;
- ``machine_cpu()`` / ``others_share()``: how much of the machine other processes used;
- ``peak_memory_growth(fn)``: growth of the peak resident set during one call (VmHWM reset
  through /proc/self/clear_refs on Linux; elsewhere the ru_maxrss delta, a lower bound);
- ``memory_copy()``: a multi-threaded np.copyto, the bandwidth a decode step is compared with.
"""
import concurrent.futures
import contextlib
import ctypes
import gc
import os
import sys
import time

import numpy as np

from .. import get_num_threads, set_num_threads
from .torch_models import optional_torch

__all__ = ["WARM_SECONDS", "COPY_MIB", "same_threads", "settle", "time_interleaved",
           "timed_call", "machine_cpu", "others_share", "peak_memory_growth", "memory_copy"]

WARM_SECONDS = 0.02   # untimed calls before each timed one (not for the slow twin)
COPY_MIB = 256        # the memory-copy probe: float32 arrays of this size


# ---- thread pools ------------------------------------------------------------------------------

_OPENBLAS_SET = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")


def _loaded_openblas():
    """(set, get) ctypes functions of every OpenBLAS loaded in this process (Linux only)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    found = []
    for path in sorted(p for p in paths if os.path.isfile(p)):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _OPENBLAS_SET:
            setter = getattr(lib, name, None)
            getter = getattr(lib, name.replace("_set_", "_get_"), None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype, getter.restype = [ctypes.c_int], None, ctypes.c_int
                found.append((setter, getter))
                break
    return found


@contextlib.contextmanager
def same_threads(n):
    """fastattn, NumPy's OpenBLAS and torch all at `n` threads (None: fastattn's current
    count). Every count is restored afterwards.

    Args:
        n: the threads; None for fastattn's current count.

    Yields:
        The count.
    """
    saved_fast = get_num_threads()
    count = set_num_threads(n) if n is not None else saved_fast
    blas = [(s, g, g()) for s, g in _loaded_openblas()]
    for setter, _, _ in blas:
        setter(count)
    set_num_threads(count)
    torch = optional_torch()
    saved_torch = torch.get_num_threads() if torch is not None else None
    try:
        yield count
    finally:
        for setter, _, old in blas:
            setter(old)
        set_num_threads(saved_fast)
        if torch is not None:
            torch.set_num_threads(saved_torch)


# ---- idle waits and machine load ---------------------------------------------------------------

def settle(max_wait=0.5, interval=0.01):
    """Wait until this process's threads are idle, at most max_wait seconds.

    A BLAS thread pool keeps spinning after a call (NumPy's OpenBLAS for about 0.1 s), which
    would take cores from whichever implementation is timed next; so each timed call starts
    once the process uses less than a quarter of a core.

    Args:
        max_wait: the longest wait, in seconds (default 0.5).
        interval: the polling interval, in seconds (default 0.01).
    """
    deadline = time.perf_counter() + max_wait
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(interval)
        busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
        if busy < 0.25 or time.perf_counter() > deadline:
            return


def machine_cpu():
    """(CPU seconds used by the whole machine, by this process and the children it has
    waited for (a case's own subprocesses), wall seconds) or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:9]]
        with open("/proc/self/stat") as f:
            mine = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    return busy / hz, sum(int(t) for t in mine[11:15]) / hz, time.perf_counter()


def others_share(before, after):
    """The share of the machine's CPUs that other processes used between two machine_cpu()s.

    Args:
        before: `machine_cpu()` at the start.
        after: `machine_cpu()` at the end.

    Returns:
        A fraction, or None when either is None.
    """
    if before is None or after is None:
        return None
    wall = after[2] - before[2]
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others / (wall * (os.cpu_count() or 1))) if wall > 0 else None


# ---- timing ------------------------------------------------------------------------------------

def _spread(i, n, rounds):
    """True on n of the rounds 0..rounds-1, spread evenly (the last round always included)."""
    return (i + 1) * n // rounds > i * n // rounds


def _warm(fn, seconds):
    """Untimed calls of fn for about `seconds` (at least one): threads awake, allocator reused."""
    end = time.perf_counter() + seconds
    fn()
    while time.perf_counter() < end:
        fn()


def time_interleaved(fns, counts, warm=None):
    """Time each fn counts[name] times, round-robin across fns; returns seconds per call.

    Each turn: settle(), then warm[name] seconds of untimed calls (0 or missing: none), then
    the timed call; so every implementation is timed in its steady state, not just after
    another one's.

    Args:
        fns: {name: zero-argument callable}.
        counts: {name: timed calls}.
        warm: {name: seconds of untimed calls before each timed one}, or None (the default)
            for none.

    Returns:
        {name: [seconds per call]}.
    """
    warm = warm or {}
    rounds = max(counts.values())
    times = {name: [] for name in fns}
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for i in range(rounds):
            for name, fn in fns.items():
                if _spread(i, counts[name], rounds):
                    settle()
                    if warm.get(name):
                        _warm(fn, warm[name])
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
    finally:
        if gc_was_on:
            gc.enable()
    return times


def timed_call(fn):
    """One timed call of fn, after settle(), with the garbage collector off.

    Args:
        fn: a zero-argument callable.

    Returns:
        `(result, seconds)`.
    """
    settle()
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - t0
    finally:
        if gc_was_on:
            gc.enable()


# ---- memory ------------------------------------------------------------------------------------

def _malloc_trim():
    """Give freed heap pages back to the OS (glibc), so reused pages do not hide a peak."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _vmhwm_kib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_memory_growth(fn):
    """The growth of the peak resident set during one call of fn, and the call's duration.

    Args:
        fn: a zero-argument callable.

    Returns:
        `(result, MiB, seconds, method)`.
    """
    gc.collect()
    _malloc_trim()
    settle()
    method = "VmHWM"
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current resident set
        before = _vmhwm_kib()
    except OSError:
        before = None
    if before is None:
        import resource
        unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, else KiB
        method = "ru_maxrss delta (lower bound)"
        peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit / 1024  # noqa
        before = peak()
    else:
        peak = _vmhwm_kib
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    return result, (peak() - before) / 1024, seconds, method


def memory_copy(nbytes=COPY_MIB * 2 ** 20, threads=None):
    """(callable, bytes moved per call): np.copyto of an nbytes float32 array into another,
    split into one slice per thread (NumPy releases the GIL while copying); bytes moved =
    read + write. The caller closes the pool with callable.close().

    Args:
        nbytes: the array's bytes (default 256 MiB).
        threads: the slices, one per thread (None, the default: fastattn's count).

    Returns:
        `(callable, bytes moved per call)`.
    """
    n = threads or get_num_threads()
    src = np.ones(nbytes // 4, np.float32)                    # written: no shared zero pages
    dst = np.zeros_like(src)
    dst[:: 1024] = 1.0                                        # touched
    bounds = np.linspace(0, src.size, n + 1).astype(np.int64)
    slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=n)

    def copy(sl):
        np.copyto(dst[sl], src[sl])

    def run_copy():
        list(pool.map(copy, slices))
    run_copy.close = pool.shutdown
    return run_copy, 2 * src.nbytes
