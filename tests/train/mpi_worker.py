"""One rank of the data-parallel tests (test_distributed.py), started by mpiexec:

    mpiexec -n 2 python tests/train/mpi_worker.py SCENARIO OUT_DIR [OPTIONS_JSON]

Every rank builds the tiny model and task of train_util, runs fit(comm=COMM_WORLD) with
``run_kwargs(OPTIONS)`` and writes OUT_DIR/rank<r>.npz (its weights, the losses of its
History) and OUT_DIR/rank<r>.json (its step records); a rank whose fit raises writes
OUT_DIR/rank<r>.error (the exception's class and message) and raises it. Scenarios:

    fit      the run above
    raise    rank 1's loss raises at its second call (the job must end with that error)
    hang     rank 1's loss sleeps at its second call (rank 0's deadline must end the job)
    stall    rank 1's loss sleeps OPTIONS["stall"] seconds at its last call (a short run
             whose deadline passes while the ranks can still finish)

OPTIONS["rank1"] (a dict) is applied on rank 1 only, after the others: its "model" entry
holds Seq2SeqTransformer arguments for rank 1's model (a rank that differs from rank 0).
OPTIONS["schedule"] = {"ramp": a} gives fit the callable schedule step -> a * step.
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import char_tokenizer, tiny_model, words  # noqa: E402

from fastattn.nn import Seq2SeqTransformer  # noqa: E402

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


def model_of_rank(kw, dropout, model_options):
    """model_for's model, or with model_options (Seq2SeqTransformer arguments) changed."""
    if not model_options:
        return model_for(kw, dropout)
    tok = kw["src_tokenizer"]
    args = dict(num_encoder_layers=1, num_decoder_layers=1, emb_size=32, nhead=2,
                src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size,
                dim_feedforward=64, dropout=dropout, pad_id=tok.pad_id, max_len=16, seed=0)
    args.update(model_options)
    return Seq2SeqTransformer(**args)


def main(scenario, out, options):
    from mpi4py import MPI

    from fastattn.train import fit

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    mine = options.pop("rank1", {}) if rank == 1 else {}
    options.pop("rank1", None)
    stall = options.pop("stall", 0.0)
    options.update((k, v) for k, v in mine.items() if k != "model")
    dropout = options.pop("dropout", 0.0)
    kw = run_kwargs(options)
    if isinstance(kw["schedule"], dict):     # {"ramp": a}: the callable step -> a * step
        a = kw["schedule"]["ramp"]
        kw.update(schedule=lambda step: a * step, lr=None)
    model = model_of_rank(kw, dropout, mine.get("model"))
    if scenario in ("raise", "hang", "stall") and rank == 1:
        loss, calls = model.loss, []

        def failing(*args, **kwargs):
            calls.append(None)
            if scenario == "stall" and len(calls) == kw["max_steps"]:
                time.sleep(stall)
            elif scenario != "stall" and len(calls) == 2:
                if scenario == "raise":
                    raise RuntimeError(INJECTED)
                time.sleep(600)
            return loss(*args, **kwargs)
        model.loss = failing
    try:
        history = fit(model, task(), comm=comm, **kw)
    except Exception as exc:               # what each rank raised, for the test to compare
        with open(os.path.join(out, f"rank{rank}.error"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}")
        raise
    np.savez(os.path.join(out, f"rank{rank}.npz"), losses=np.array(history.losses),
             **{f"w.{k}": v for k, v in model.state_dict().items()})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(history.steps, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3
                  else {}))
