"""pytest-benchmark: fastattn.ops vs the NumPy twin (fastattn.reference) vs torch.

The op cases of ``fastattn bench`` (``fastattn.bench.OP_CASES``: attention causal and full, the
attention memory case, layer norm, FFN, the sgemm roofline) with their inputs; each (case,
implementation) pair is one benchmark, grouped by case so that pytest-benchmark prints the
implementations of a case side by side. Not part of the normal test run; run with

    pytest benchmarks/ --benchmark-only

(``--benchmark-group-by=group`` is the default; add ``--benchmark-columns=median,mean,rounds``
for a shorter table.) torch benchmarks are skipped when torch is not installed. The float64 NumPy
twin is slow and gets a few pedantic rounds; the attention memory case records the peak RSS
growth of its call in ``extra_info`` (see ``--benchmark-json``).
"""
import pytest

from fastattn import bench

PAIRS = [(name, impl) for name in bench.OP_CASES for impl in bench.CASES[name].implementations]


@pytest.mark.parametrize("case_name, impl", PAIRS, ids=[f"{c}-{i}" for c, i in PAIRS])
def test_op(run_case, case_name, impl):
    run_case(case_name, impl)
