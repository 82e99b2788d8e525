"""Dask: a bag of sources (or a dataframe's column) translated partition by partition, the model
built once per worker process.

```python
from dask.distributed import Client
import dask.bag as db
from fastattn.runners.dask import translate_bag

client = Client()                   # on a cluster: Client("tcp://scheduler:8786")
lines = db.read_text("corpus-*.txt").map(lambda line: line.rstrip("\\r\\n"))
records = translate_bag(lines, "run")           # {"source", "output"} per line, in order
records.map(json.dumps).to_textfiles("translated-*.jsonl")
```

Needs Dask (``pip install "fastattn[dask]"``), imported only by these functions.

What runs where:

- the client (the caller's process) loads the run once, checks every option (a bad one is a
  ValueError here, before any task runs), and ships the run (weights, tokenizers, configs) to
  the workers once: with a distributed Client, ``client.scatter(..., broadcast=True)`` (each
  worker holds one copy; a restarted or new worker fetches it from a peer); without one (the
  local schedulers), as one task of the graph;
- a task is one partition: the first one a worker process runs builds the model around the
  shipped arrays (no copy) and keeps it in a per-process cache keyed by the run's hash, so
  every later partition, of this job or the next one with the same run, reuses it; the
  partition is translated by fastattn.runners.core.Translator (sorted by length, batches of
  ``batch_tokens`` padded ids) and comes back in order;
- threads: fastattn's thread count is per process, OMP_NUM_THREADS at import, which Dask's
  nanny sets to 1 for its workers; ``threads=k`` sets it in each task's process instead. A
  worker running several tasks at once (threads_per_worker > 1) shares its model between
  them. One process per core with one thread each (``LocalCluster(n_workers=cores,
  threads_per_worker=1)``, ``dask worker --nworkers N --nthreads 1``) is the layout to start
  from; fewer processes with threads=k each suit bigger models (one copy of the weights per
  process).

Records (translate_bag): ``{"source": ..., "output": ...}``, plus ``"truncated": true`` or
``"error"`` as in translate_file's lines (without their "id"); a source that is not a str is
an error record. translate_dataframe adds ``output_column`` and ``error_column`` to each
partition (object columns: str, or None).

Greedy and beam search give each source the output ``translate_file`` and
``model.translate`` give it, whatever its partition (sampling: see fastattn.runners.core).

Faults: the scheduler runs again the tasks of a worker that died or was restarted, on
another worker; results are per partition, so every source comes back exactly once.

Memory per worker process: one copy of the weights (the shipped one is the model's), the
decode step's packed copy of the decoder and generator weights, a partition's activations,
and the process itself.
"""
from __future__ import annotations

import numbers
import threading

from .core import (DEFAULT_BATCH_TOKENS, PretrainedRun, Translator, load_any, record,
                   run_from_state, run_hash, run_state)

__all__ = ["translate_bag", "translate_dataframe", "translate_partition"]

EXTRA = "fastattn.runners.dask needs Dask: pip install 'fastattn[dask]'"
CACHED_RUNS = 2                 # models a worker process keeps (the latest runs used)

_RUNS = {}                      # run hash -> Run, in this (worker) process
_LOCK = threading.Lock()


def _dask():
    try:
        import dask
        import dask.bag  # noqa: F401
    except ImportError as exc:
        raise ImportError(EXTRA) from exc
    return dask


def _translator(key, state, options, threads):
    """The Translator of this process for the run `key` (built from `state` the first time)."""
    import fastattn

    if threads is not None and fastattn.get_num_threads() != threads:
        fastattn.set_num_threads(threads)
    with _LOCK:
        run = _RUNS.pop(key, None)
        if run is None:
            run = run_from_state(state)
        _RUNS[key] = run                                     # the latest last
        while len(_RUNS) > CACHED_RUNS:
            del _RUNS[next(iter(_RUNS))]
    return Translator.from_run(run, **options)


def translate_partition(texts, state, key, options, threads=None):
    """Translate one partition: what translate_bag's tasks run.

    Args:
        texts: the partition, an iterable of sources.
        state: the shipped run (`fastattn.runners.core.run_state`'s).
        key: the run's hash, the per-process model cache's key.
        options: the Translator's options.
        threads: fastattn threads in this process; None (the default) leaves them.

    Returns:
        The partition's records, in order.
    """
    texts = list(texts)
    results = _translator(key, state, options, threads).translate(texts)
    return [record(t, r) for t, r in zip(texts, results)]


def _translate_frame(df, state, key, options, threads, columns):
    column, output_column, error_column = columns
    if column not in df.columns:
        raise ValueError(f"translate_dataframe: the dataframe has no column {column!r}")
    results = _translator(key, state, options, threads).translate(df[column].tolist())
    df = df.copy()
    df[output_column] = [r.output for r in results]
    df[error_column] = [r.error for r in results]
    df[output_column] = df[output_column].astype(object)
    df[error_column] = df[error_column].astype(object)
    return df


def _ship(run_dir, client, options, threads):
    """(shipped state, run key, checked options, threads): the run loaded and checked on the
    client, then scattered to every worker (a distributed client) or wrapped in a graph task."""
    dask = _dask()
    from ..train.run import Run

    if threads is not None and (not isinstance(threads, numbers.Integral) or
                                isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads must be an int >= 1 or None, got {threads!r}")
    run = run_dir if isinstance(run_dir, (Run, PretrainedRun)) else load_any(run_dir)
    options = Translator.from_run(run, **options).options()      # every option checked here
    state = run_state(run)
    if client is None:
        try:
            from distributed import default_client
            client = default_client()
        except (ImportError, ValueError):                        # no distributed, no client
            client = None
    if client is not None:
        shipped = client.scatter([state], broadcast=True)[0]
    else:
        shipped = dask.delayed(state, pure=True, traverse=False)
    return shipped, run_hash(run), options, threads


def translate_bag(bag, run_dir, *, client=None, threads=None,
                  batch_tokens=DEFAULT_BATCH_TOKENS, too_long="truncate",
                  max_source_tokens=None, **generate_kwargs):
    """Translate a Dask Bag of sources, partition by partition (see the module docstring).

    Args:
        bag: a dask.bag.Bag of sources (str).
        run_dir: a run directory or a loaded Run.
        client: the distributed Client to ship the model with; None (the default): the
            default client, if any.
        threads: fastattn threads in each worker process; None (the default): as the worker
            set them.
        batch_tokens: as for translate_file (default 4096).
        too_long: as for translate_file (default "truncate").
        max_source_tokens: as for translate_file (default None).
        **generate_kwargs: as for translate_file (method, max_new_tokens, beam_size, ...).

    Returns:
        A Bag of records, the partitions and their order kept.

    Raises:
        ValueError: a bad option (before any task runs).
    """
    _dask()
    import dask.bag as db

    if not isinstance(bag, db.Bag):
        raise TypeError(f"bag must be a dask.bag.Bag, got {type(bag).__name__}")
    state, key, options, threads = _ship(
        run_dir, client, dict(batch_tokens=batch_tokens, too_long=too_long,
                              max_source_tokens=max_source_tokens, **generate_kwargs), threads)
    return bag.map_partitions(translate_partition, state, key, options, threads)


def translate_dataframe(df, run_dir, *, column="source", output_column="output",
                        error_column="error", client=None, threads=None,
                        batch_tokens=DEFAULT_BATCH_TOKENS, too_long="truncate",
                        max_source_tokens=None, **generate_kwargs):
    """Translate a Dask DataFrame's column of sources, partition by partition.

    Args:
        df: a dask DataFrame with a str column `column`.
        run_dir: a run directory or a loaded Run.
        column: the sources' column (default "source").
        output_column: the column added for the outputs (default "output").
        error_column: the column added for the errors (default "error").
        client: as for translate_bag.
        threads: as for translate_bag.
        batch_tokens: as for translate_file (default 4096).
        too_long: as for translate_file (default "truncate").
        max_source_tokens: as for translate_file (default None).
        **generate_kwargs: as for translate_file.

    Returns:
        The DataFrame with `output_column` and `error_column` added (object columns).
    """
    _dask()
    try:
        import dask.dataframe as dd
    except ImportError as exc:
        raise ImportError("translate_dataframe needs dask.dataframe: pip install "
                          "'dask[dataframe]'") from exc
    if not isinstance(df, dd.DataFrame):
        raise TypeError(f"df must be a dask DataFrame, got {type(df).__name__}")
    names = (column, output_column, error_column)
    if len(set(names)) < 3 or not all(isinstance(n, str) and n for n in names):
        raise ValueError("column, output_column and error_column must be three column names")
    if column not in df.columns:
        raise ValueError(f"the dataframe has no column {column!r} (columns: "
                         f"{', '.join(map(str, df.columns))})")
    state, key, options, threads = _ship(
        run_dir, client, dict(batch_tokens=batch_tokens, too_long=too_long,
                              max_source_tokens=max_source_tokens, **generate_kwargs), threads)
    meta = df._meta.copy()
    meta[output_column] = meta[column].astype(object)
    meta[error_column] = meta[column].astype(object)
    return df.map_partitions(_translate_frame, state, key, options, threads, names, meta=meta)
