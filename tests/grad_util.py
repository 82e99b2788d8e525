"""Helpers for the backward tests: central finite differences of the float64 twins, and the child
process that runs a test module's checks under one SIMD level or a
small OpenMP team.

The twins compute in float64 and round their results to float32 at the end (reference._f32).
``float64_twins()`` lifts that rounding for the duration of a with-block, so that finite
differences of a twin's forward can check the same twin's backward to ~1e-7 (the first oracle
of the style guide: the reference against finite differences, on tiny shapes).
"""
import contextlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

import fastattn
from fastattn import reference

TESTS = os.path.dirname(os.path.abspath(__file__))


@contextlib.contextmanager
def float64_twins():
    """Within the block, the twins return float64 (their own precision) instead of float32."""
    saved = reference._f32
    reference._f32 = lambda a: np.asarray(a, dtype=np.float64)
    try:
        yield
    finally:
        reference._f32 = saved


def numeric_grad(loss, x, h=1e-6):
    """d loss / d x by central differences; x is a float64 array perturbed in place (restored)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + h
        up = loss()
        flat[i] = keep - h
        down = loss()
        flat[i] = keep
        gflat[i] = (up - down) / (2 * h)
    return g


def child_env(env):
    """This process's environment with `env` over it, for a child that imports the same
    fastattn as this process (its folder first on PYTHONPATH: a child started elsewhere would
    otherwise import whatever the installed one is). A child forced to another SIMD level does
    not inherit a forced int8 path (FASTATTN_INT8_PATH=amx pytest ... would ask the generic
    child for amx)."""
    base = dict(os.environ)
    if "FASTATTN_CPU_ISA" in env and "FASTATTN_INT8_PATH" not in env:
        base.pop("FASTATTN_INT8_PATH", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    base["PYTHONPATH"] = os.pathsep.join(p for p in (root, base.get("PYTHONPATH")) if p)
    return {**base, **env}


def run_child(module, function, env):
    """Run tests/<module>.py's `function()` in a fresh interpreter with extra environment `env`
    (FASTATTN_CPU_ISA, OMP_THREAD_LIMIT, ...); returns the CompletedProcess. The child prints
    one JSON line: the SIMD level and thread count it ran with."""
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {TESTS!r})
        import fastattn
        import {module} as m
        m.{function}()
        info = fastattn.build_info()
        print(json.dumps({{"simd": info["simd"], "threads": info["threads"]}}))
    """)
    return subprocess.run([sys.executable, "-c", code], env=child_env(env),
                          capture_output=True, text=True, timeout=600, cwd=TESTS)


def child_isa_tests(module):
    """The two child-process tests of an op's test file, whose isa_checks() runs its checks:
    every SIMD level the build has, forced in turn, and an OpenMP that starts fewer threads
    than asked. Bind them at module level:

        test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
            child_isa_tests("test_ops_dropout")
    """
    import fastattn
    import pytest

    available = fastattn.build_info()["simd_available"]

    @pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
    def test_every_simd_level(isa):
        if isa not in available:
            pytest.skip(f"{isa} is not available on this CPU/build (available: {available})")
        report = child_report(run_child(module, "isa_checks", {"FASTATTN_CPU_ISA": isa}))
        assert report["simd"] == isa

    @pytest.mark.parametrize("env", [{"OMP_THREAD_LIMIT": "1", "OMP_NUM_THREADS": "2"},
                                     {"OMP_DYNAMIC": "true", "OMP_NUM_THREADS": "2"}],
                             ids=["thread_limit_1", "dynamic"])
    def test_correct_when_openmp_starts_fewer_threads(env):
        child_report(run_child(module, "isa_checks", env))

    return test_every_simd_level, test_correct_when_openmp_starts_fewer_threads


def script_report(script, env):
    """Run `script` (python -c, argv[1] = the forced SIMD level or "-") in a fresh interpreter
    with extra environment `env`; -> its last stdout line, parsed as JSON (a clean exit asserted)."""
    proc = subprocess.run([sys.executable, "-c", script, env.get("FASTATTN_CPU_ISA", "-")],
                          env=child_env(env), capture_output=True, text=True, timeout=300)
    return child_report(proc)


def child_report(proc):
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
