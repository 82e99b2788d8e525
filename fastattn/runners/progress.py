"""The file runner's progress on stderr: a tqdm bar on a terminal, JSON lines otherwise.

``make_progress(progress, total, initial)`` picks the reporter once, at the start of a job:

- ``progress=False`` (or 0): nothing is written.
- stderr is a terminal and tqdm is importable: a bar of lines (of the input's total), with
  tokens/s, the padding fraction and tqdm's ETA; messages are written above it. tqdm is
  optional: ``pip install "fastattn[demo]"`` gives the bar.
- otherwise: one JSON object per line. ``{"kind": "progress", "lines": ..., "total": ...,
  "lines_per_s": ..., "tokens_per_s": ..., "padding": ..., "eta_s": ...}`` after every
  `every` batches (``progress=True``: every 10th; an int k >= 1: every k-th), ``{"kind":
  "info", "message": ...}`` for what a job has to say (where a resume starts), and ``{"kind":
  "done", ...}`` with the final stats.

``lines`` counts the output's lines (those of an earlier, resumed run included); the rates
are this job's.
"""
from __future__ import annotations

import json
import numbers
import sys

from ..train.progress import terminal_tqdm

__all__ = ["make_progress", "progress_enabled", "check_progress", "DEFAULT_EVERY"]

DEFAULT_EVERY = 10


def _off(progress):
    return progress is False or progress is None or (
        isinstance(progress, numbers.Integral) and not isinstance(progress, bool)
        and progress == 0)


def check_progress(progress):
    """Check a progress argument.

    Args:
        progress: the value to check.

    Returns:
        progress as given.

    Raises:
        ValueError: not True, False, None or an int >= 0.
    """
    if _off(progress) or progress is True or (
            isinstance(progress, numbers.Integral) and not isinstance(progress, bool)
            and progress >= 1):
        return progress
    raise ValueError(f"progress must be True, False or an int >= 1 (JSON lines every that "
                     f"many batches), got {progress!r}")


def progress_enabled(progress):
    """Whether `progress` asks for any report (checked first).

    Args:
        progress: as `make_progress` takes it.

    Returns:
        True or False.
    """
    return not _off(check_progress(progress))


def make_progress(progress, total, initial=0, stream=None):
    """The progress reporter `progress` asks for (see the module docstring).

    Args:
        progress: True, False, None or an int >= 0, as the module docstring says.
        total: the input's lines, or None if unknown.
        initial: lines already in the output, a resumed job's (default 0).
        stream: where the reports go; None (the default) for stderr.

    Returns:
        The reporter.
    """
    check_progress(progress)
    if _off(progress):
        return Silent()
    stream = sys.stderr if stream is None else stream
    bar = terminal_tqdm(stream)
    if bar is not None:
        return Bar(bar, total, initial, stream)
    return JsonLines(stream, DEFAULT_EVERY if progress is True else int(progress), total)


class Silent:
    """progress=False: every report is dropped."""

    def batch(self, record):
        pass

    def info(self, message):
        pass

    def close(self, stats=None):
        pass


class JsonLines:
    """One JSON object per line on `stream`: progress every `every` batches, messages, the
    final stats."""

    def __init__(self, stream, every, total):
        self.stream, self.every, self.total, self.batches = stream, every, total, 0

    def _write(self, obj):
        self.stream.write(json.dumps(obj) + "\n")
        self.stream.flush()

    def batch(self, record):
        self.batches += 1
        if self.batches % self.every == 0:
            self._write({"kind": "progress", **record})

    def info(self, message):
        self._write({"kind": "info", "message": str(message)})

    def close(self, stats=None):
        if stats is not None:
            self._write({"kind": "done", **stats})


class Bar:
    """A tqdm bar on a terminal: lines (of total), tokens/s, padding, ETA."""

    def __init__(self, tqdm_class, total, initial, stream):
        self.bar = tqdm_class(total=total, initial=initial, file=stream, unit=" lines",
                              dynamic_ncols=True, leave=True, smoothing=0.1)

    def batch(self, record):
        self.bar.set_postfix({"tok/s": f"{record['tokens_per_s']:.0f}",
                              "padding": f"{record['padding']:.1%}"}, refresh=False)
        self.bar.update(record["lines"] - self.bar.n)

    def info(self, message):
        self.bar.write(str(message))

    def close(self, stats=None):
        self.bar.close()
