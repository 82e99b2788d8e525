"""One rank of the data-parallel tests (test_distributed.py), started by mpiexec:

    mpiexec -n 2 python tests/train/mpi_worker.py SCENARIO OUT_DIR [OPTIONS_JSON]

Every rank builds the tiny model and task of train_util, runs fit(comm=COMM_WORLD) with
``run_kwargs(OPTIONS)`` and writes OUT_DIR/rank<r>.npz (its weights, the losses of its
History) and OUT_DIR/rank<r>.json (its step records). Scenarios:

    fit      the run above
    raise    rank 1's loss raises at its second call (the job must end with that error)
    hang     rank 1's loss sleeps at its second call (rank 0's deadline must end the job)
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import char_tokenizer, tiny_model, words  # noqa: E402

INJECTED = "injected failure on rank 1"


def task(n=96, seed=0):
    """Reversal pairs of 2-9 letters: batches of different lengths and paddings."""
    return [(w, w[::-1]) for w in words(n, seed=seed, lo=2, hi=9)]


def run_kwargs(options):
    """fit's arguments of a run (everything but the model and comm)."""
    tok = char_tokenizer()
    kw = dict(src_tokenizer=tok, tgt_tokenizer=tok, max_steps=6, batch_tokens=160,
              schedule="constant", lr=3e-3, label_smoothing=0.1, clip_norm=0.5, seed=0,
              progress=False)
    kw.update(options)
    return kw


def model_for(kw, dropout=0.0):
    return tiny_model(kw["src_tokenizer"], dropout=dropout)


def main(scenario, out, options):
    from mpi4py import MPI

    from fastattn.train import fit

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    dropout = options.pop("dropout", 0.0)
    kw = run_kwargs(options)
    model = model_for(kw, dropout)
    if scenario in ("raise", "hang") and rank == 1:
        loss, calls = model.loss, []

        def failing(*args, **kwargs):
            calls.append(None)
            if len(calls) == 2:
                if scenario == "raise":
                    raise RuntimeError(INJECTED)
                time.sleep(600)
            return loss(*args, **kwargs)
        model.loss = failing
    history = fit(model, task(), comm=comm, **kw)
    np.savez(os.path.join(out, f"rank{rank}.npz"), losses=np.array(history.losses),
             **{f"w.{k}": v for k, v in model.state_dict().items()})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(history.steps, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3
                  else {}))
