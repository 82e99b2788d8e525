"""History: what a training run recorded, step by step, in order.

Each record is a dict with a ``"kind"``:

- ``"step"``, one per optimiser update: ``step`` (1-based update count), ``epoch`` (0-based),
  ``loss`` (the batch's training loss, label smoothing included), ``lr`` (the rate of this
  update), ``tokens`` (target tokens of the batch, padding excluded), ``tokens_per_s``,
  ``seconds`` (the step's wall time: forward, backward, clipping, update), ``padding`` (padded
  positions / all positions of the batch);
- ``"eval"``, one per evaluation: ``step``, ``valid_loss`` (mean cross-entropy over every
  target token of the validation pairs, no label smoothing), ``valid_ppl`` = exp(valid_loss)
  and, from fit(), ``valid_exact``: the greedy exact match on a fixed sample of the
  validation pairs (a fraction in [0, 1]; null when nothing was decoded; absent in files
  written before it was recorded).

``history.records`` keeps both kinds in the order they happened; ``history.steps`` and
``history.evals`` are lists of each. ``to_jsonl(path)`` writes one record per line and
``History.read_jsonl(path)`` reads it back (floats exactly: JSON writes their repr; NaN and
infinities as Python's json writes them). ``skipped`` says how many pairs a run left out
(``{"train": n, "valid": m}``: too long for the model, or empty); it is not part of the file.
"""
from __future__ import annotations

import json
import os

from ..tokenizers.files import unique_keys

__all__ = ["History"]

KINDS = ("step", "eval")
STEP_FIELDS = ("step", "epoch", "loss", "lr", "tokens", "tokens_per_s", "seconds", "padding")
EVAL_FIELDS = ("step", "valid_loss", "valid_ppl")


class History:
    """The records of a run (see the module docstring).

    Args:
        records: records to start with, in order (default none).
        skipped: `{"train": n, "valid": m}`, the pairs a run left out, or None (the default).
    """

    def __init__(self, records=(), skipped=None):
        self.records = []
        for r in records:
            self._append(dict(r))
        self.skipped = dict(skipped or {})

    def _append(self, record, where="History"):
        kind = record.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{where}: a record's kind must be one of {KINDS}, got {kind!r}")
        fields = STEP_FIELDS if kind == "step" else EVAL_FIELDS
        missing = [f for f in fields if f not in record]
        if missing:
            raise ValueError(f"{where}: a {kind} record needs {', '.join(missing)}")
        self.records.append(record)

    def add_step(self, **fields):
        """Append a step record.

        Args:
            **fields: the record's fields (`step`, `epoch`, `loss`, ...; see the module
                docstring).

        Returns:
            The record (a dict with kind "step").
        """
        record = {"kind": "step", **fields}
        self._append(record)
        return record

    def add_eval(self, **fields):
        """Append an eval record.

        Args:
            **fields: the record's fields (`step`, `valid_loss`, ...; see the module
                docstring).

        Returns:
            The record (a dict with kind "eval").
        """
        record = {"kind": "eval", **fields}
        self._append(record)
        return record

    @property
    def steps(self):
        """The step records, in order."""
        return [r for r in self.records if r["kind"] == "step"]

    @property
    def evals(self):
        """The eval records, in order."""
        return [r for r in self.records if r["kind"] == "eval"]

    @property
    def losses(self):
        """The training loss of every step, in order."""
        return [r["loss"] for r in self.records if r["kind"] == "step"]

    @property
    def last_step(self):
        """The step count of the latest step record (0 when there is none)."""
        for r in reversed(self.records):
            if r["kind"] == "step":
                return r["step"]
        return 0

    def __len__(self):
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __eq__(self, other):
        return isinstance(other, History) and self.records == other.records

    def __repr__(self):
        return f"History({len(self.steps)} steps, {len(self.evals)} evals)"

    def to_jsonl(self, path):
        """Write one JSON record per line.

        Args:
            path: the file to write (str or path-like).
        """
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            self.write(f)

    def write(self, f):
        """Write one JSON record per line to an open text file.

        Args:
            f: a file object open for writing text.
        """
        for r in self.records:
            f.write(json.dumps(r) + "\n")

    @classmethod
    def read_jsonl(cls, path):
        """Read the History that `to_jsonl` wrote.

        Args:
            path: the file (str or path-like).

        Returns:
            The `History`.

        Raises:
            ValueError: a line that is not a record (the file and the line named).
        """
        path = os.fspath(path)
        history = cls()
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except IsADirectoryError:
            raise ValueError(f"{path}: not a history file (a directory)") from None
        for number, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            where = f"{path}: line {number}"
            try:
                record = json.loads(line.decode("utf-8"), object_pairs_hook=unique_keys)
            except UnicodeDecodeError:
                raise ValueError(f"{where}: not UTF-8 text") from None
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"{where}: not valid JSON: {exc}") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got "
                                 f"{type(record).__name__}")
            history._append(record, where)
        return history
