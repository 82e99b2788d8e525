"""Whole corpora through a trained run: a file on one machine, or a Ray Data / Dask collection
over a cluster. The engines do the scheduling; fastattn gives them a model that loads once per
worker and kernels that release the GIL.

    from fastattn.runners import translate_file
    stats = translate_file("run", "corpus.txt", "out.jsonl")     # streamed, resumable

    from fastattn.runners.ray import translate_dataset           # pip install "fastattn[ray]"
    ds = translate_dataset(ray.data.read_text("corpus.txt"), "run", column="text")

    from fastattn.runners.dask import translate_bag              # pip install "fastattn[dask]"
    records = translate_bag(dask.bag.from_sequence(lines, npartitions=8), "run").compute()

Modules: ``core`` (the Translator they all share: encoding, too-long sources, length-sorted
token-budget batches, generation, decoding; a run as plain data for other processes),
``files`` (translate_file, the ``fastattn translate`` command), ``progress`` (a bar or JSON
lines), ``ray`` and ``dask`` (imported only when used: the core install never imports Ray or
Dask).
"""
from .core import (DEFAULT_BATCH_TOKENS, TOO_LONG, Result, Translator, record, run_from_state,
                   run_state)
from .files import DEFAULT_WINDOW, INPUT_FORMATS, translate_file

__all__ = ["translate_file", "Translator", "Result", "record", "run_state", "run_from_state",
           "DEFAULT_BATCH_TOKENS", "DEFAULT_WINDOW", "INPUT_FORMATS", "TOO_LONG"]
