"""Ray Data: a Dataset's column of sources translated by a pool of actors, each holding the model.

```python
import ray
from fastattn.runners.ray import translate_dataset

ray.init()                          # on a cluster: ray.init(address="HEAD:6379")
ds = ray.data.read_text("corpus.txt")                       # a "text" column
out = translate_dataset(ds, "run", column="text", concurrency=4, num_cpus_per_worker=2)
out.write_json("translated/")
```

Needs Ray (``pip install "fastattn[ray]"``), imported only by these functions.

What runs where:

- the driver (the caller's process) loads the run once, checks every option (a bad one is a
  ValueError here, before any actor starts), and puts the model's weights, both tokenizers and
  the configs into Ray's object store once (``ray.put``);
- ``map_batches`` runs a pool of ``concurrency`` actors (a callable class), each reserving
  ``num_cpus_per_worker`` CPUs. An actor sets fastattn's threads to its CPUs, gets the run
  from the object store (the weights arrive as read-only NumPy arrays over the node's shared
  memory, so all the actors of a node read one copy), builds the model around those arrays
  (no copy: inference never writes its weights) and keeps it for every batch it is given;
- a batch of ``batch_size`` rows is translated by fastattn.runners.core.Translator: encoded,
  sorted by length, cut into batches of ``batch_tokens`` padded ids, generated, decoded; the
  rows come back in their order, with two columns added: ``output_column`` (str; null where a
  source was not translated) and ``error_column`` (null, or why not: not a str, too long with
  too_long="skip"). Other columns are kept, so an id column can join outputs to inputs (Ray
  Data does not keep the order of batches unless ``DataContext.execution_options.
  preserve_order`` is set).

Greedy and beam search give each source the output ``translate_file`` and
``model.translate`` give it, whatever its batch (sampling: see fastattn.runners.core).

Faults: Ray Data restarts an actor that dies (its process killed, its node lost) and retries
the batches it held (its defaults for actor pools: max_restarts=-1, max_task_retries=-1), so
every row comes back once.

Memory per node: one copy of the weights in the object store, plus per actor the decode
step's packed copy of the decoder and generator weights, a batch's activations and a Python
process (Ray's worker, fastattn, NumPy: about 240 MB resident with the tiny preset).
"""
from __future__ import annotations

import numbers
import os

from .core import (DEFAULT_BATCH_TOKENS, PretrainedRun, Translator, load_any, run_from_state,
                   run_state)

__all__ = ["translate_dataset", "DEFAULT_BATCH_SIZE"]

EXTRA = "fastattn.runners.ray needs Ray: pip install 'fastattn[ray]'"
DEFAULT_BATCH_SIZE = 1024       # rows per map_batches call (sorted by length together)


def _ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError(EXTRA) from exc
    return ray


class _Translate:
    """The callable class of map_batches: one model per actor, a pyarrow Table per call."""

    def __init__(self, boxed_state, threads, columns, options):
        import ray

        import fastattn

        fastattn.set_num_threads(threads)
        run = run_from_state(ray.get(boxed_state[0]))   # boxed: not resolved by Ray itself
        self.translator = Translator.from_run(run, **options)
        self.column, self.output_column, self.error_column = columns

    def __call__(self, batch):
        import pyarrow as pa

        if self.column not in batch.column_names:
            raise ValueError(f"translate_dataset: the dataset has no column {self.column!r} "
                             f"(columns: {', '.join(batch.column_names)})")
        results = self.translator.translate(batch.column(self.column).to_pylist())
        for name, values in ((self.output_column, [r.output for r in results]),
                             (self.error_column, [r.error for r in results])):
            arr = pa.array(values, type=pa.string())
            if name in batch.column_names:
                batch = batch.set_column(batch.column_names.index(name), name, arr)
            else:
                batch = batch.append_column(name, arr)
        return batch


def _count(name, value):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def translate_dataset(ds, run_dir, *, column="source", output_column="output",
                      error_column="error", concurrency=None, num_cpus_per_worker=1,
                      batch_size=DEFAULT_BATCH_SIZE, batch_tokens=DEFAULT_BATCH_TOKENS,
                      too_long="truncate", max_source_tokens=None, **generate_kwargs):
    """Translate a Ray Dataset's column of sources with a pool of actors (see the module docstring).

    Args:
        ds: a ray.data.Dataset with a str column `column`.
        run_dir: a run directory or a loaded Run.
        column: the sources' column (default "source").
        output_column: the column added for the outputs (default "output").
        error_column: the column added for the errors (default "error").
        concurrency: actors, an int or (min, max) to autoscale; None (the default): as many
            as the cluster's CPUs hold, num_cpus_per_worker each.
        num_cpus_per_worker: CPUs each actor reserves; it runs fastattn on
            max(1, int(num_cpus_per_worker)) threads (default 1).
        batch_size: rows per map_batches call (default 1024).
        batch_tokens: as for translate_file (default 4096).
        too_long: as for translate_file (default "truncate").
        max_source_tokens: as for translate_file (default None).
        **generate_kwargs: as for translate_file (method, max_new_tokens, beam_size, ...).

    Returns:
        A Dataset (lazy, as map_batches) with the two columns added.

    Raises:
        ValueError: a bad option (before any actor starts).
    """
    from ..train.run import Run

    ray = _ray()
    if not isinstance(ds, ray.data.Dataset):
        raise TypeError(f"ds must be a ray.data.Dataset, got {type(ds).__name__}")
    for name, value in (("column", column), ("output_column", output_column),
                        ("error_column", error_column)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a column name (a non-empty str), got {value!r}")
    if len({column, output_column, error_column}) < 3:
        raise ValueError("column, output_column and error_column must be three names")
    if not isinstance(num_cpus_per_worker, numbers.Real) or isinstance(num_cpus_per_worker,
                                                                        bool) \
            or not num_cpus_per_worker > 0:
        raise ValueError(f"num_cpus_per_worker must be a number > 0, got "
                         f"{num_cpus_per_worker!r}")
    batch_size = _count("batch_size", batch_size)
    if concurrency is None:
        # Ray Data starts a local Ray with every CPU when none is running
        cpus = ray.cluster_resources().get("CPU", 1) if ray.is_initialized() else \
            os.cpu_count() or 1
        concurrency = max(1, int(cpus // num_cpus_per_worker))
    if isinstance(concurrency, tuple):
        lo, hi = (_count("concurrency", c) for c in concurrency)
        pool = ray.data.ActorPoolStrategy(min_size=lo, max_size=max(lo, hi))
    else:
        pool = ray.data.ActorPoolStrategy(size=_count("concurrency", concurrency))
    run = run_dir if isinstance(run_dir, (Run, PretrainedRun)) else load_any(run_dir)
    options = dict(batch_tokens=batch_tokens, too_long=too_long,
                   max_source_tokens=max_source_tokens, **generate_kwargs)
    options = Translator.from_run(run, **options).options()   # every option checked here
    state = ray.put(run_state(run))
    return ds.map_batches(
        _Translate, fn_constructor_args=([state], max(1, int(num_cpus_per_worker)),
                                         (column, output_column, error_column), options),
        batch_size=batch_size, batch_format="pyarrow", compute=pool,
        num_cpus=num_cpus_per_worker)
