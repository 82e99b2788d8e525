"""pytest-benchmark: the Transformer-base model cases of ``fastattn bench``
(``fastattn.bench.MODEL_CASES``): encoder and encoder-decoder forwards (fast backend vs the
reference backend vs torch's nn.Transformer), generation (greedy and beam search, B = 1 and 8;
torch runs the translation tutorial's loop through fastattn.generate's search) and the decode
step. Run with

    pytest benchmarks/bench_model.py --benchmark-only

Calls here take from a fraction of a second to tens of seconds, so every implementation gets a
few pedantic rounds: those of ``fastattn bench --quick`` for the forwards, ``Case.repeats`` for
generation (torch re-runs the decoder on the whole prefix each step: one round, no warm-up;
the reference backend likewise one round). Generation records tokens/s in ``extra_info``; the
decode step records the time per step and the weight bandwidth against a memory copy.
"""
import pytest

from fastattn import bench

PAIRS = [(name, impl) for name in bench.MODEL_CASES for impl in bench.CASES[name].implementations]


@pytest.mark.parametrize("case_name, impl", PAIRS, ids=[f"{c}-{i}" for c, i in PAIRS])
def test_model(run_case, case_name, impl):
    run_case(case_name, impl, quick=True)
