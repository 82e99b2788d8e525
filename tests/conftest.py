"""Shared test configuration: hypothesis profiles, the torch helper, assert_close (the one
comparison; the tolerances are in tolerances.py) and the child processes that run checks under
a forced SIMD level or OpenMP setting.

The thread count is left as the process resolved it at import (OMP_NUM_THREADS or all CPUs);
tests that change it restore it (see test_threads.py).

Hypothesis profiles, chosen with the HYPOTHESIS_PROFILE environment variable:
  ci   (default) few examples, derandomized, no deadline: fast and reproducible
  dev  many more examples, randomized: for a local hunt after touching a kernel
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastattn


@pytest.hookimpl(tryfirst=True)   # before hypothesis' own, which loads --hypothesis-profile
def pytest_configure(config):
    """The hypothesis profiles, registered when pytest starts: the child processes below import
    this file for its helpers and run no hypothesis test, so they are spared its import."""
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci", max_examples=30, deadline=None, derandomize=True, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    # CI's sanitizer pass: fewer derandomized examples (every example runs
    # several times slower under ASan; the plain pass has run all 30)
    settings.register_profile(
        "sanitize", max_examples=12, deadline=None, derandomize=True, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.register_profile(
        "dev", max_examples=300, deadline=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The kernels' tile sizes and few-row thresholds at the SIMD level in use (csrc/fa_tiles.h):
# tests aim at their edges through these names, never through copied numbers.
TILES = fastattn.build_info()["tiles"]


def run_in_threads(work, n):
    """work(i) for i < n, each in its own Python thread at once; raises the first exception a
    thread saw (assertion failures included), after all have finished."""
    import threading

    errors = []

    def run(i):
        try:
            work(i)
        except Exception as exc:  # reported below, with the thread that saw it
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def requires_torch():
    """The torch module, or skip the calling test (torch is optional)."""
    return pytest.importorskip("torch")


def to_torch(x):
    torch = requires_torch()
    return torch.from_numpy(np.ascontiguousarray(x))


def torch_activation(activation):
    """torch's function for one of fastattn's activation names (None: identity)."""
    torch = requires_torch()
    gelu = torch.nn.functional.gelu
    return {None: lambda t: t, "relu": torch.relu, "gelu": gelu,
            "gelu_tanh": lambda t: gelu(t, approximate="tanh"),
            "silu": torch.nn.functional.silu}[activation]


# seed 002's 6x6 score table ("<start> I am no man <end>") and its additive causal mask
SEED002_SCORES = np.array([
    # <start>  I     am    no    man   <end>
    [33.6,  7.6, 15.5,  3.8, 20.8, 22.3],   # <start>
    [ 7.6, 34.0, 30.6,  8.3, 26.5, 27.2],   # I
    [15.5, 30.6, 35.9,  3.8, 34.0, 34.8],   # am
    [ 3.8,  8.3,  3.8, 34.8, 33.3, 33.6],   # no
    [20.8, 26.5, 34.0, 33.3, 37.0, 35.9],   # man
    [ 3.8,  5.7, 11.3, 15.1, 16.6, 37.4],   # <end>
])
SEED002_MASK = np.triu(np.full((6, 6), -np.inf), k=1)   # 0 on and below the diagonal


def sdpa_masks(rng, masking, B, Lq, Lk):
    """(fastattn kwargs, torch scaled_dot_product_attention kwargs) for one masking kind:
    "none", "bool", "float", "padding" or "causal"; no row is fully masked (torch gives NaN
    there). torch's bool masks mean True = ALLOWED, the opposite of ours; its is_causal is
    top-left aligned, so causal is only comparable when Lq == Lk (skips otherwise)."""
    kwargs, tkwargs = {}, {}
    if masking == "bool":
        mask = rng.random((B, 1, Lq, Lk)) < 0.3
        mask[..., 0] = False
        kwargs["mask"], tkwargs["attn_mask"] = mask, to_torch(~mask)
    elif masking == "float":
        mask = rng.standard_normal((Lq, Lk)).astype(np.float32)
        mask[rng.random((Lq, Lk)) < 0.3] = -np.inf
        mask[:, -1] = 0.0
        kwargs["mask"], tkwargs["attn_mask"] = mask, to_torch(mask)
    elif masking == "padding":
        kpm = rng.random((B, Lk)) < 0.3
        kpm[:, 0] = False
        kwargs["key_padding_mask"], tkwargs["attn_mask"] = kpm, to_torch(~kpm[:, None, None, :])
    elif masking == "causal":
        if Lq != Lk:
            pytest.skip("torch's is_causal is top-left aligned; ours equals it only for Lq == Lk")
        kwargs["causal"], tkwargs["is_causal"] = True, True
    return kwargs, tkwargs


def _describe_mismatch(actual, expected, bad, rtol, atol, name, limit=8):
    a64 = actual.astype(np.float64)
    e64 = expected.astype(np.float64)
    finite = np.isfinite(a64) & np.isfinite(e64)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.where(finite, np.abs(a64 - e64), 0.0)
        rel = np.where(finite & (e64 != 0), diff / np.abs(e64), 0.0)
    idx = np.argwhere(bad)
    special = int((bad & ~finite).sum())
    lines = [f"{name}: {len(idx)} of {actual.size} elements differ "
             f"(rtol={rtol:g}, atol={atol:g}), {special} of them NaN/inf mismatches; "
             f"max abs diff {diff.max(initial=0.0):.6g}, max rel diff {rel.max(initial=0.0):.6g}"
             " (over entries finite in both)"]
    if diff.size and diff.max() > 0:
        worst = np.unravel_index(np.argmax(diff), diff.shape)
        lines.append(f"  worst at {tuple(int(i) for i in worst)}: actual {a64[worst]!r} "
                     f"expected {e64[worst]!r}")
    for i in idx[:limit]:
        i = tuple(int(t) for t in i)
        lines.append(f"  at {i}: actual {a64[i]!r} expected {e64[i]!r}")
    if len(idx) > limit:
        lines.append(f"  ... and {len(idx) - limit} more")
    return "\n".join(lines)


def assert_close(actual, expected, rtol, atol, name="tensor", dtype=np.float32, *,
                 equal_nan=True):
    """Shape, then dtype, then values: |actual - expected| <= atol + rtol * |expected|.

    NaN must sit where NaN is expected (equal_nan=False: no NaN on either side, as np.allclose
    has it) and +-inf where the same inf is expected. On failure the message shows the first
    mismatches and the max abs/rel diff (llm.c's check_tensor). `expected` may have any float
    dtype; `actual` must have `dtype` (None: skip that check: float64 arrays, Python numbers).
    The one comparison of the suite: rtol and atol come from tolerances.TOL (TOL["exact"] for
    bit-equal values).
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (
        f"{name}: shape {actual.shape} != expected {expected.shape}")
    if dtype is not None:
        assert actual.dtype == dtype, f"{name}: dtype {actual.dtype} != expected {dtype}"
    a64 = actual.astype(np.float64)
    e64 = expected.astype(np.float64)
    nan_a, nan_e = np.isnan(a64), np.isnan(e64)
    inf_a, inf_e = np.isinf(a64), np.isinf(e64)
    with np.errstate(invalid="ignore", over="ignore"):
        special_bad = (nan_a != nan_e) | (inf_a != inf_e) | (inf_e & (a64 != e64))
        if not equal_nan:
            special_bad |= nan_a | nan_e
        both_finite = ~(nan_a | nan_e | inf_a | inf_e)
        value_bad = both_finite & ~(np.abs(a64 - e64) <= atol + rtol * np.abs(e64))
    bad = special_bad | value_bad
    if bad.any():
        raise AssertionError(_describe_mismatch(actual, expected, bad, rtol, atol, name))


# ----------------------------------------------------------------------------------------------
# child processes: the SIMD level is chosen once, at import (FASTATTN_CPU_ISA), and OpenMP reads
# its settings at start-up, so a check under another level or OpenMP setting runs in a fresh
# interpreter. One way for every test: run_child (a python -c script) and, on top of it,
# run_checks (a function of a test module, with that module's helpers and assert_close).

TESTS = os.path.dirname(os.path.abspath(__file__))
SIMD_LEVELS = ("generic", "avx2", "avx512")


def child_env(env=None, unset=()):
    """This process's environment less `unset`, with `env` over it, for a child that imports the
    same fastattn as this process (its folder first on PYTHONPATH: a child started elsewhere
    would otherwise import whatever the installed one is). A child forced to another SIMD level
    does not inherit a forced int8 path (FASTATTN_INT8_PATH=amx pytest ... would ask the generic
    child for amx)."""
    env = dict(env or {})
    base = {k: v for k, v in os.environ.items() if k not in unset}
    if "FASTATTN_CPU_ISA" in env and "FASTATTN_INT8_PATH" not in env:
        base.pop("FASTATTN_INT8_PATH", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    base["PYTHONPATH"] = os.pathsep.join(p for p in (root, base.get("PYTHONPATH")) if p)
    return {**base, **env}


def run_child(code, *args, env=None, unset=(), timeout=600):
    """Run `code` with python -c (sys.argv[1:] = args) in a fresh interpreter started in tests/,
    under child_env(env, unset); -> the CompletedProcess, output captured as text. A test that
    expects success reads it with child_report, one that expects a refusal checks returncode and
    stderr itself."""
    return subprocess.run([sys.executable, "-c", code, *map(str, args)],
                          env=child_env(env, unset), capture_output=True, text=True,
                          timeout=timeout, cwd=TESTS)


def child_report(proc):
    """A child's last line of output, parsed as JSON, after asserting that it exited cleanly (the
    failure shows the exit status, its output and its standard error)."""
    assert proc.returncode == 0, (
        f"child failed (exit status {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


_LIST_MODULES = """
import sys
print(" ".join(sorted(m for m in sys.modules if m.startswith(tuple(sys.argv[1:])))))
"""


def modules_loaded_by(code, *prefixes):
    """Run `code` (dedented) in a fresh interpreter, asserted to succeed -> the names of the
    modules it left loaded that start with one of `prefixes`, sorted (what an import or a call
    pulls in: optional packages, the benchmark harness)."""
    proc = run_child(textwrap.dedent(code) + _LIST_MODULES, *prefixes, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[-1].split()


_CHECKS = textwrap.dedent(f"""
    import json, sys
    sys.path.insert(0, {TESTS!r})
    import fastattn
    module, function = sys.argv[1:3]
    getattr(__import__(module), function)()
    info = fastattn.build_info()
    print(json.dumps({{"simd": info["simd"], "threads": info["threads"]}}))
""")


def run_checks(module, function="isa_checks", env=None):
    """tests/<module>.py's `function()` in a fresh interpreter with extra environment `env`
    (FASTATTN_CPU_ISA, FASTATTN_INT8_PATH, OMP_THREAD_LIMIT, ...), asserted to succeed (its
    assertion failures come back as its standard error); -> the SIMD level and thread count
    the child ran with."""
    return child_report(run_child(_CHECKS, module, function, env=env))


def run_isa_checks(isa, module, function="isa_checks"):
    """run_checks under FASTATTN_CPU_ISA=isa, asserting that the child ran at that level; skips
    where this CPU or build lacks the level."""
    available = fastattn.build_info()["simd_available"]
    if isa not in available:
        pytest.skip(f"{isa} is not available on this CPU/build (available: {available})")
    report = run_checks(module, function, {"FASTATTN_CPU_ISA": isa})
    assert report["simd"] == isa, report
    return report


def fewer_threads(num_threads=None):
    """parametrize("env", ...) over the two ways OpenMP starts a smaller team than asked for:
    OMP_THREAD_LIMIT=1 caps it, OMP_DYNAMIC lets the runtime choose. With num_threads, the child
    asks for that many through OMP_NUM_THREADS; without, its checks call set_num_threads."""
    extra = {} if num_threads is None else {"OMP_NUM_THREADS": str(num_threads)}
    return pytest.mark.parametrize("env", [{"OMP_THREAD_LIMIT": "1", **extra},
                                           {"OMP_DYNAMIC": "true", **extra}],
                                   ids=["thread_limit_1", "dynamic"])


def child_isa_tests(module, function="isa_checks", num_threads=2):
    """The two child-process tests of a test file whose `function()` runs its checks: every SIMD
    level the build has, forced in turn, and an OpenMP that starts fewer threads than asked
    (OMP_NUM_THREADS=num_threads, or None when `function` sets the count itself). Bind them
    at module level, under the names the file's tests have:

        test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
            child_isa_tests("test_ops_dropout")
    """
    @pytest.mark.parametrize("isa", SIMD_LEVELS)
    def test_every_simd_level(isa):
        run_isa_checks(isa, module, function)

    @fewer_threads(num_threads)
    def test_correct_when_openmp_starts_fewer_threads(env):
        run_checks(module, function, env)

    return test_every_simd_level, test_correct_when_openmp_starts_fewer_threads


@pytest.fixture
def single_thread():
    """fastattn on one OpenMP thread for the test (tiny models: a team costs more than it
    brings, and the machine's other threads stay out of the timings)."""
    before = fastattn.get_num_threads()
    fastattn.set_num_threads(1)
    yield
    fastattn.set_num_threads(before)


@pytest.fixture
def restore_threads():
    """fastattn's thread count put back after the test (which sets its own counts)."""
    saved = fastattn.get_num_threads()
    yield
    fastattn.set_num_threads(saved)


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)
