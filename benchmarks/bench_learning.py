"""pytest-benchmark: the ``learning`` case of ``fastattn bench``: ``fastattn train --model
tiny`` (its default budget) and the translation tutorial's torch loop on the same pairs,
batches and schedule, for each task of ``LEARNING_TASKS``; the held-out exact match of each
is kept in ``extra_info``. Minutes per implementation; run with

    pytest benchmarks/bench_learning.py --benchmark-only
"""
import pytest

from fastattn import bench


@pytest.mark.parametrize("impl", bench.CASES["learning"].implementations)
def test_learning(run_case, impl):
    run_case("learning", impl)
