"""Training progress on stderr: a tqdm bar on a terminal, JSON lines otherwise.

``make_progress(progress, total, initial)`` picks the reporter once, at the start of a run:

- ``progress=False`` (or 0): nothing is written.
- stderr is a terminal and tqdm is importable: a bar with the step, loss, learning rate,
  tokens/s and tqdm's ETA; an evaluation or a message is written above it. tqdm is optional:
  ``pip install "fastattn[demo]"`` gives the bar.
- otherwise (stderr a file or a pipe, a terminal without tqdm, or ``progress="json"``, what
  ``fastattn train --quiet`` asks for): one JSON object per line,
  the History record as it is plus ``"kind"``: ``{"kind": "step", "step": 10, ...}`` every
  `every` steps (and for the first and the last step), every ``{"kind": "eval", ...}``, and
  ``{"kind": "info", "message": ...}`` for what a run has to say (pairs skipped, a resume,
  a checkpoint written on an interrupt). ``progress=True`` (and "json") writes every 10th
  step; an int k >= 1 every k-th.

tqdm is imported only when a bar is shown, so the package imports without it.
"""
from __future__ import annotations

import json
import math
import numbers
import sys

__all__ = ["make_progress", "JsonLines", "Bar", "Silent", "DEFAULT_EVERY", "JSON",
           "eval_line"]

DEFAULT_EVERY = 10
JSON = "json"                 # progress=JSON: JSON lines even on a terminal


def _every(progress):
    if progress is True or progress == JSON:
        return DEFAULT_EVERY
    if isinstance(progress, numbers.Integral) and not isinstance(progress, bool) \
            and progress >= 1:
        return int(progress)
    raise ValueError(f"progress must be True, False or an int >= 1 (JSON lines every that "
                     f"many steps), or {JSON!r} (JSON lines, never a bar), got {progress!r}")


def make_progress(progress, total, initial=0, stream=None):
    """The reporter `progress` asks for (see the module docstring), picked once.

    Args:
        progress: False (or 0), True, "json" or an int k >= 1.
        total: the run's last step, or None if unknown.
        initial: the step it starts after, a resumed run's (default 0).
        stream: where the reports go; None (the default) for stderr.

    Returns:
        A `Silent`, `Bar` or `JsonLines` reporter.
    """
    if progress is False or progress is None or (
            isinstance(progress, numbers.Integral) and not isinstance(progress, bool)
            and progress == 0):
        return Silent()
    every = _every(progress)
    stream = sys.stderr if stream is None else stream
    bar = None if isinstance(progress, str) else terminal_tqdm(stream)
    if bar is not None:
        return Bar(bar, total, initial, stream)
    return JsonLines(stream, every, total)


def terminal_tqdm(stream):
    """tqdm.tqdm when `stream` is a terminal and tqdm (the demo extra) is installed, else
    None: the reporters then write JSON lines."""
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return None
    try:
        import tqdm
    except ImportError:
        return None
    return tqdm.tqdm


def eval_line(record):
    """An eval record as one line of text: step, validation loss, perplexity, exact match.

    Args:
        record: the History's eval record.

    Returns:
        The line (a str).
    """
    text = (f"step {record['step']}: valid_loss {record['valid_loss']:.4f}, "
            f"valid_ppl {record['valid_ppl']:.3f}")
    if record.get("valid_exact") is not None:
        text += f", valid_exact {record['valid_exact']:.1%}"
    return text


class Silent:
    """progress=False: every report is dropped."""

    def step(self, record):
        """Report one step.

        Args:
            record: the History's step record.
        """
        pass

    def eval(self, record):
        """Report one evaluation.

        Args:
            record: the History's eval record.
        """
        pass

    def info(self, message):
        """Report a message (pairs skipped, a resume, a checkpoint written on an interrupt).

        Args:
            message: the text.
        """
        pass

    def close(self):
        """End the report (a bar is closed)."""
        pass


def _finite(value):
    """JSON has no NaN or inf: write them as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonLines:
    """One JSON object per line on `stream`: steps every `every`, evals, messages.

    Args:
        stream: a text stream.
        every: write every this many steps (default 10; the first and last step always).
        total: the run's last step, or None (the default) if unknown.
    """

    def __init__(self, stream, every=DEFAULT_EVERY, total=None):
        self.stream, self.every, self.total = stream, every, total
        self._last = None           # the latest step record not written yet

    def _write(self, obj):
        if obj.get("kind") != "step" and self._last is not None:
            last, self._last = self._last, None       # the step it follows comes first
            self._write({"kind": "step", **last})
        self.stream.write(json.dumps({k: _finite(v) for k, v in obj.items()}) + "\n")
        self.stream.flush()

    def step(self, record):
        """Report one step.

        Args:
            record: the History's step record.
        """
        step = record["step"]
        if step == 1 or step % self.every == 0 or step == self.total:
            self._write({"kind": "step", **record})
            self._last = None
        else:
            self._last = record

    def eval(self, record):
        """Report one evaluation.

        Args:
            record: the History's eval record.
        """
        self._write({"kind": "eval", **record})

    def info(self, message):
        """Report a message (pairs skipped, a resume, a checkpoint written on an interrupt).

        Args:
            message: the text.
        """
        self._write({"kind": "info", "message": str(message)})

    def close(self):
        """End the report (a bar is closed)."""
        if self._last is not None:                  # a run that stopped between reports
            self._write({"kind": "step", **self._last})
            self._last = None


class Bar:
    """A tqdm bar on a terminal: step (of total), loss, lr, tokens/s, ETA.

    Args:
        tqdm_class: tqdm's bar class.
        total: the run's last step, or None if unknown.
        initial: the step it starts after.
        stream: the terminal's stream.
    """

    def __init__(self, tqdm_class, total, initial, stream):
        self.bar = tqdm_class(total=total, initial=initial, file=stream, unit="step",
                              dynamic_ncols=True, leave=True)

    def step(self, record):
        """Report one step.

        Args:
            record: the History's step record.
        """
        self.bar.set_postfix({"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.3g}",
                              "tok/s": f"{record['tokens_per_s']:.0f}"}, refresh=False)
        self.bar.update(1)

    def eval(self, record):
        """Report one evaluation.

        Args:
            record: the History's eval record.
        """
        self.bar.write(eval_line(record))

    def info(self, message):
        """Report a message (pairs skipped, a resume, a checkpoint written on an interrupt).

        Args:
            message: the text.
        """
        self.bar.write(str(message))

    def close(self):
        """End the report (a bar is closed)."""
        self.bar.close()
