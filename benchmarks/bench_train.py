"""pytest-benchmark: the training cases of ``fastattn bench`` (``TRAIN_CASE_NAMES``): fit() on
the small preset against the equivalent PyTorch loop, a Transformer-base training step, and the
working memory of that step, fastattn against torch; each in float32 and in bf16 mixed
precision (the ``_bf16`` cases: torch under autocast bf16). Run with

    pytest benchmarks/bench_train.py --benchmark-only

Each call is seconds long, so every implementation gets ``Case.repeats`` pedantic rounds; the
training cases record tokens/s in ``extra_info`` as ``fastattn bench`` reports them.
"""
import pytest

from fastattn import bench
from fastattn.bench.cases import TRAIN_CASE_NAMES

PAIRS = [(name, impl) for name in TRAIN_CASE_NAMES
         for impl in bench.CASES[name].implementations]


@pytest.mark.parametrize("case_name, impl", PAIRS, ids=[f"{c}-{i}" for c, i in PAIRS])
def test_train(run_case, case_name, impl):
    run_case(case_name, impl, quick=True)
