"""pytest-benchmark: the corpus-runner cases of ``fastattn bench`` (``RUNNER_CASE_NAMES``):
translate_file against model.generate on the same batches, and 2 Ray actors x 1 thread
against 1 process x 2 threads. Run with

    pytest benchmarks/bench_runners.py --benchmark-only

Each call is seconds long, so every implementation gets ``Case.repeats`` pedantic rounds; the
"numpy" implementation of these cases is the baseline named in the case's title.
"""
import pytest

from fastattn import bench
from fastattn.bench.cases import RUNNER_CASE_NAMES

PAIRS = [(name, impl) for name in RUNNER_CASE_NAMES
         for impl in bench.CASES[name].implementations]


@pytest.mark.parametrize("case_name, impl", PAIRS, ids=[f"{c}-{i}" for c, i in PAIRS])
def test_runner(run_case, case_name, impl):
    run_case(case_name, impl, quick=True)
