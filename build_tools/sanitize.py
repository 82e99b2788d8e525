"""FASTATTN_SANITIZE=1: build with AddressSanitizer + UndefinedBehaviorSanitizer (gcc or clang).

For CI and bug hunts, never for a release. The flags go to every compile and link: the
extension's and the build probes' alike (a probe compiled with -fsanitize but linked without it
fails, and the build would wrongly conclude that OpenMP or an ISA level is missing). UBSan is
built non-recovering, so its first report ends the process with an error. The build also turns
on Cython's bounds checks, as FASTATTN_DEBUG=1 does.

Running Python on a sanitized extension (Python itself is not instrumented, so the ASan runtime
must be loaded first, and CPython's deliberate leaks at exit are not reports):

    LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \\
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 python -m pytest tests
"""
import os

COMPILE_ARGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                "-fno-omit-frame-pointer", "-g"]
LINK_ARGS = ["-fsanitize=address,undefined"]
# the probes are run as programs: leak reports from the OpenMP runtime at exit are not ours
PROBE_ENV = {"ASAN_OPTIONS": "detect_leaks=0"}


def enabled():
    return os.environ.get("FASTATTN_SANITIZE", "") == "1"


def compile_args():
    return list(COMPILE_ARGS) if enabled() else []


def link_args():
    return list(LINK_ARGS) if enabled() else []


def probe_env():
    """Environment for running a probe program (None: inherit ours unchanged)."""
    return {**os.environ, **PROBE_ENV} if enabled() else None
