"""pytest configuration for the benchmarks: collect ``bench_*.py`` files, hold fastattn, NumPy's
BLAS and torch at one thread count, and drive one (case, implementation) pair of the harness
(``fastattn.bench.CASES``, the cases ``fastattn bench`` runs) under pytest-benchmark.

The project's pytest settings collect only ``test_*.py`` under ``tests/``; the collection hook
lets ``pytest benchmarks/ --benchmark-only`` pick up the ``bench_*.py`` modules here as well.
"""
import pytest

from fastattn import bench

SLOW_ROUNDS = 3    # the float64 twin (op cases): rounds of one call each
MEMORY_ROUNDS = 1  # attention_memory: one call is seconds long


def pytest_collect_file(file_path, parent):
    if file_path.suffix != ".py" or not file_path.name.startswith("bench_"):
        return None
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's own collector already takes it
    return pytest.Module.from_parent(parent, path=file_path)


@pytest.fixture(scope="session", autouse=True)
def _same_threads():
    """fastattn, NumPy's BLAS and torch at the same thread count, as in ``fastattn bench``."""
    with bench.same_threads(None):
        yield


def _rounds(case, impl, quick):
    """Pedantic rounds of one call for a case's implementation, or None (pytest-benchmark's
    own calibration): Case.repeats for calls of seconds; with `quick` (the model cases) the
    counts of ``fastattn bench --quick``; else a few for the slow twin."""
    if impl in case.repeats:
        return case.repeats[impl]
    if quick:
        return bench.QUICK_NUMPY_REPEAT if impl in case.slow else bench.QUICK_REPEAT
    return SLOW_ROUNDS if impl in case.slow else None


@pytest.fixture
def run_case(benchmark):
    """run_case(name, impl, quick=False): benchmark one implementation of a harness case."""
    def run(case_name, impl, quick=False):
        case = bench.CASES[case_name]
        try:
            fn = case.callable(impl)
        except bench.Unavailable as exc:
            pytest.skip(str(exc))
        benchmark.group = case_name
        benchmark.extra_info["title"] = case.title
        if case.flops:
            benchmark.extra_info["flops"] = case.flops
        bench.settle()  # let the previous test's BLAS threads stop spinning
        if case.kind == "memory":
            _, mib, _, method = benchmark.pedantic(lambda: bench.peak_memory_growth(fn),
                                                   rounds=MEMORY_ROUNDS, iterations=1)
            benchmark.extra_info.update(peak_rss_growth_mib=mib, method=method,
                                        matrix_mib=getattr(case, "matrix_mib", None))
            return
        if case.kind == "learning":        # minutes a call: one round, exact match kept
            results = benchmark.pedantic(fn, rounds=1, iterations=1, warmup_rounds=0)
            benchmark.extra_info["held_out_exact"] = {
                f"{s.task} (seed {s.seed})": r["exact"]
                for s, r in zip(case.inputs()["setups"], results)}
            return
        rounds = _rounds(case, impl, quick)
        if rounds is None:
            benchmark(fn)
            return
        benchmark.pedantic(fn, setup=bench.settle, rounds=rounds, iterations=1,
                           warmup_rounds=0 if impl in case.timed_first else 1)
        if case.tokens:
            benchmark.extra_info["tokens_per_s"] = case.tokens / benchmark.stats.stats.median
        if case.kind == "decode":
            prefill_ms, copy_ms, copy_bytes = bench.decode_probes(case, rounds=rounds)
            benchmark.extra_info.update(bench.decode_metrics(
                benchmark.stats.stats.median * 1e3, prefill_ms, copy_ms, case.weight_bytes(),
                copy_bytes, case.steps), prefill_ms=prefill_ms, copy_ms=copy_ms)
    return run
