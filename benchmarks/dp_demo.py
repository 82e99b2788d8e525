"""The demo's run (``fastattn demo``: its pairs, split and settings) trained by train_run in one
process or, under mpiexec, data-parallel; rank 0 prints the validation curve as one JSON line.

    OMP_NUM_THREADS=2 python benchmarks/dp_demo.py OUT_DIR
    OMP_NUM_THREADS=1 mpiexec -n 2 python benchmarks/dp_demo.py OUT_DIR

Run both and compare the curves: the same global batches, so the same validation losses up
to the float32 rounding of the summed gradients and, with the demo's dropout, each rank's own
masks (rank 0's are one process's).
"""
import json
import os
import sys
import time

from fastattn import get_num_threads
from fastattn.train import distributed
from fastattn.train.demo import DEMO, SEED_PAIRS, SEED_REPEATS, VALID, _corpus
from fastattn.train.run import train_run


def main(out):
    comm = distributed.world()
    group = distributed.group(comm)
    lead = group is None or group.lead
    sink = open(os.devnull, "w")
    corpus = _corpus(sink)
    if not corpus:
        raise SystemExit('the demo needs chatterbot-corpus: pip install "fastattn[demo]"')
    distinct = list(dict.fromkeys(SEED_PAIRS + corpus))
    pairs = distinct + SEED_PAIRS * (SEED_REPEATS - 1)
    valid = VALID * len(distinct) / len(pairs)
    t0 = time.perf_counter()
    run, history = train_run(pairs, out, valid=valid, progress=False, keep_in_train=SEED_PAIRS,
                             exact_sample=None, comm=comm, **DEMO)
    seconds = time.perf_counter() - t0
    if lead:
        evals = history.evals
        best = min(evals, key=lambda r: r["valid_loss"])
        print(json.dumps(dict(
            ranks=1 if group is None else group.size, threads=get_num_threads(),
            seconds=seconds, steps=len(history.steps),
            final_train_loss=sum(r["loss"] for r in history.steps[-20:]) / 20,
            best_step=best["step"], best_valid_loss=best["valid_loss"],
            curve=[(r["step"], round(r["valid_loss"], 4)) for r in evals])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
