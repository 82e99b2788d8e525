"""pytest-benchmark: fastattn.ops vs the NumPy twin (fastattn.reference) vs torch.

The cases and their inputs are those of ``fastattn bench`` (``fastattn.bench.CASES``); here each
(case, implementation) pair is one benchmark, grouped by case so that pytest-benchmark prints
the implementations of a case side by side. Not part of the normal test run; run with

    pytest benchmarks/ --benchmark-only

(``--benchmark-group-by=group`` is the default; add ``--benchmark-columns=median,mean,rounds``
for a shorter table.) torch benchmarks are skipped when torch is not installed. The float64 NumPy
twin is slow and gets a few pedantic rounds; the attention memory case records the peak RSS
growth of its call in ``extra_info`` (see ``--benchmark-json``). Generation cases take seconds
a call (torch and the reference backend re-run the decoder on the prefix: tens of seconds), so
they get the rounds of ``Case.repeats`` and record tokens/s; the decode-step case records the
time per step and the weight bandwidth against a memory copy in ``extra_info``.
"""
import pytest

from fastattn import bench

NUMPY_ROUNDS = 3   # the float64 twin: rounds of one call each
MEMORY_ROUNDS = 1  # attention_memory: one call is seconds long

PAIRS = [(name, impl) for name in bench.DEFAULT_CASES
         for impl in bench.CASES[name].implementations]


@pytest.fixture(scope="module", autouse=True)
def _same_threads():
    """fastattn, NumPy's BLAS and torch at the same thread count, as in ``fastattn bench``."""
    with bench._threads(None):
        yield


@pytest.mark.parametrize("case_name, impl", PAIRS, ids=[f"{c}-{i}" for c, i in PAIRS])
def test_op(benchmark, case_name, impl):
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
        result = benchmark.pedantic(lambda: bench.peak_memory_growth(fn),
                                    rounds=MEMORY_ROUNDS, iterations=1)
        _, mib, _, method = result
        benchmark.extra_info.update(peak_rss_growth_mib=mib, method=method,
                                    matrix_mib=case.matrix_mib)
    elif case.kind == "decode":
        rounds = case.repeats.get(impl, NUMPY_ROUNDS)
        benchmark.pedantic(fn, setup=bench.settle, rounds=rounds, iterations=1,
                           warmup_rounds=1)
        prefill_ms, copy_ms, copy_bytes = bench.decode_probes(case, rounds=rounds)
        benchmark.extra_info.update(bench.decode_metrics(
            benchmark.stats.stats.median * 1e3, prefill_ms, copy_ms,
            bench._decoder_weight_bytes(bench._seq2seq_model("fast")), copy_bytes,
            bench.GEN["new_tokens"]), prefill_ms=prefill_ms, copy_ms=copy_ms)
    elif impl in case.repeats:
        benchmark.pedantic(fn, setup=bench.settle, rounds=case.repeats[impl], iterations=1,
                           warmup_rounds=0 if impl in case.timed_first else 1)
        if case.tokens:
            benchmark.extra_info["tokens_per_s"] = case.tokens / benchmark.stats.stats.median
    elif impl in case.slow:
        benchmark.pedantic(fn, setup=bench.settle, rounds=NUMPY_ROUNDS, iterations=1,
                           warmup_rounds=1)
    else:
        benchmark(fn)
