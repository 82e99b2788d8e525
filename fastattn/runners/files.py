"""translate_file: a corpus through a trained run, streamed, batched by a token budget, resumable.

```python
stats = translate_file("run", "corpus.txt", "out.jsonl", batch_tokens=4096)
```

```text
fastattn translate run --input corpus.txt --output out.jsonl [--resume]
```

Input (``input_format``; "auto": ``.jsonl`` and ``.ndjson`` files are JSON lines, anything
else text), read as a stream, a window of lines at a time, never whole:

- text: one source per line (the line end, \\n or \\r\\n, removed; a UTF-8 byte order mark at
  the start of the file dropped);
- JSON lines: one object per line whose "source" field (a str) is the source; other fields
  are ignored; a blank line is an empty source.

Output: JSON lines, exactly one per input line, in input order:
``{"id": <line number, from 1>, "source": ..., "output": ...}``. Lines are never dropped and
never stop the job:

- an empty line: ``"output": ""`` (the model is not run, as ``fastattn complete`` does);
- a line whose source is longer than the model allows (``max_source_tokens``, default the
  model's max_len positions): with ``too_long="truncate"`` (the default) the source is cut to
  <start>, its first ids, <end> and translated, and the record says ``"truncated": true``;
  with ``too_long="skip"`` it is not translated: ``"output": null`` and an ``"error"``;
- bytes that are not UTF-8, and (JSON lines) a line that is not a JSON object with a str
  "source": ``"output": null``, an ``"error"`` saying what is wrong, and the line as
  ``"source"`` (undecodable bytes replaced by U+FFFD).

Batching (fastattn.runners.core): the input is cut into windows of ``window`` lines at fixed
line numbers (lines 1..window, window+1..2*window, ...); within a window the sources are
sorted by length and cut into batches of at most ``batch_tokens`` padded source ids, run in
the order of their first line. A batch's outputs are written as soon as every line before
them is written, so the output always holds a prefix of the input, in order.

Resuming (``resume=True``; ``--resume``). The output file is the record of what is done:
after each batch the new lines are written whole (fsync at most every SYNC_SECONDS and at
the end). Killed at any point (kill -9 included), a rerun with resume=True:

1. checks the sidecar file ``OUTPUT.state.json`` (written before the first line): the run
   (a SHA-256 of the model's weights and config and of both tokenizers), the input (its size
   and a hash of its first MiB) and every option that decides the outputs must be the ones
   the output was started with, else a ValueError says which differs;
2. reads the output's lines while each is a whole line, valid JSON, with id = its line
   number; the first one that is not (a partial last line) and everything after it are cut
   off (a message says how many bytes);
3. skips the input's lines, counting, to the start of the window holding the first missing
   line, rebuilds that window's batches (the same lines, so the same batches) and runs only
   those holding a missing line.

So every line is in the output exactly once, and each line's output comes from the same
batch as in an uninterrupted run: the files are equal byte for byte (sampling included, with
a seed). Without resume, an existing output is an error, unless ``overwrite=True``
(``--overwrite``), which starts over. A finished output (the sidecar says "complete") resumes
to itself. The sidecar stays next to the output.

Progress (fastattn.runners.progress): a bar of lines with tokens/s and the ETA on a terminal,
JSON lines on stderr otherwise. The stats returned: lines (written by this call), skipped
(already in the output), errors, truncated, batches, source_tokens, tokens (generated, <end>
included), padding (padded source positions / all source positions of the batches run),
seconds, generate_seconds (inside model.generate), tokens_per_s, lines_per_s.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import time

from ..tokenizers.files import unique_keys
from ..train.batching import check_budget
from ..train.run import write_json_atomic
from .core import (DEFAULT_BATCH_TOKENS, PretrainedRun, Result, Translator, load_any, record,
                   run_hash)
from .progress import check_progress, make_progress, progress_enabled

__all__ = ["translate_file", "DEFAULT_WINDOW", "INPUT_FORMATS", "STATE_SUFFIX", "FORMAT"]

DEFAULT_WINDOW = 2048          # lines sorted together (and read into memory at once)
INPUT_FORMATS = ("auto", "text", "jsonl")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
STATE_SUFFIX = ".state.json"
FORMAT = "fastattn-translate/1"
SYNC_SECONDS = 1.0             # fsync the output at most this often (and at the end)
HEAD_BYTES = 1 << 20           # the input's first bytes hashed into the sidecar


def translate_file(run_dir, input_path, output_path, *, batch_tokens=DEFAULT_BATCH_TOKENS,
                   window=DEFAULT_WINDOW, input_format="auto", too_long="truncate",
                   max_source_tokens=None, method="greedy", resume=True, overwrite=False,
                   compute_type=None, progress=True, **generate_kwargs):
    """Translate every line of `input_path` into `output_path` (JSON lines) with the run in
    `run_dir`; see the module docstring for the formats, the error lines, resuming and the
    stats returned.

    Args:
        run_dir: a run directory, a pretrained model directory, or a loaded
            fastattn.train.run.Run.
        input_path: the corpus (text or JSON lines).
        output_path: the JSON-lines output.
        batch_tokens: the most padded source ids per batch (default 4096).
        window: input lines sorted and batched together (default 2048).
        input_format: "auto" (the default: by extension), "text" or "jsonl".
        too_long: "truncate" (the default) or "skip".
        max_source_tokens: the longest source; None (the default) for the model's max_len.
        method: "greedy" (the default), "beam" or "sample".
        resume: continue an output that was cut short (default True).
        overwrite: start over on an existing output (default False).
        compute_type: "float32", "int8", "bf16" or "bfloat16" converts the model's weights
            while the run is loaded (fastattn.io.load); a resume must use the same (the run's
            hash covers it). None (the default) keeps the stored one.
        progress: True (the default), False, or as fastattn.runners.progress takes it.
        **generate_kwargs: passed to model.generate (max_new_tokens (default 64), beam_size,
            temperature, top_k, top_p, seed, ...).

    Returns:
        The stats, a dict (see the module docstring).

    Raises:
        ValueError: a bad option, an existing output without resume or overwrite, or a
            resume whose run, input or options differ (which is said).
    """
    from ..train.run import Run

    input_path, output_path = _check_paths(input_path, output_path)
    window = check_budget(window, "window")
    fmt = _input_format(input_format, input_path)
    check_progress(progress)
    if isinstance(run_dir, (Run, PretrainedRun)):
        run = run_dir
        if compute_type not in (None, run.model.compute_type):
            raise ValueError(f"translate_file: compute_type={compute_type!r} applies while a "
                             f"run is loaded; the run given is loaded already "
                             f"({run.model.compute_type}): pass its directory, or quantize "
                             "run.model yourself")
    else:
        run = load_any(run_dir, compute_type=compute_type)
    tr = Translator.from_run(run, batch_tokens=batch_tokens, too_long=too_long,
                             max_source_tokens=max_source_tokens, method=method,
                             **generate_kwargs)
    state = json.loads(json.dumps({
        "format": FORMAT, "run": run_hash(run), "input": _input_print(input_path),
        "options": dict(tr.options(), window=window, input_format=fmt)}))
    done, cut = _prepare(output_path, state, resume, overwrite)
    total = _count_lines(input_path) if progress_enabled(progress) else None
    reporter = make_progress(progress, total, done)
    if done or cut:
        reporter.info(f"resuming {output_path} after line {done}"
                      + (f" ({cut} bytes after its last whole line cut off)" if cut else ""))
    job, stats = _Job(tr, fmt, window, done, total, reporter), None
    try:
        job.run(input_path, output_path)
        stats = job.stats()
    finally:
        reporter.close(stats)
    state["complete"] = True
    write_json_atomic(output_path + STATE_SUFFIX, state)
    return stats


# ---- arguments --------------------------------------------------------------------------------

def _check_paths(input_path, output_path):
    for name, p in (("input_path", input_path), ("output_path", output_path)):
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path, got {type(p).__name__}")
    inp, out = os.fspath(input_path), os.fspath(output_path)
    if not os.path.exists(inp):
        raise FileNotFoundError(f"input_path {inp}: no such file")
    if os.path.isdir(inp):
        raise ValueError(f"input_path {inp} is a directory, not a file of lines")
    if not os.path.isfile(inp):
        raise ValueError(f"input_path {inp} is not a regular file (a resumable job needs one)")
    if os.path.isdir(out):
        raise ValueError(f"output_path {out} is a directory; name the output file")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"output_path {out}: no such directory {parent}")
    if os.path.exists(out) and os.path.samefile(inp, out):
        raise ValueError(f"output_path {out} is the input file")
    return inp, out


def _input_format(input_format, path):
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {', '.join(map(repr, INPUT_FORMATS))}, "
                         f"got {input_format!r}")
    if input_format == "auto":
        return "jsonl" if path.lower().endswith(JSONL_SUFFIXES) else "text"
    return input_format


# ---- the sidecar and the output's state ---------------------------------------------------------

def _input_print(path):
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    return {"size": os.path.getsize(path), "head_sha256": hashlib.sha256(head).hexdigest()}


def _read_state(path):
    try:
        with open(path, "rb") as f:
            state = json.loads(f.read(), object_pairs_hook=unique_keys)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the resume state ({exc}); remove the output and "
                         f"its state file, or pass overwrite=True") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path}: not a translate_file state file")
    return state


def _differences(saved, state):
    """What differs between a saved sidecar and this job's, in words."""
    out = []
    if saved.get("run") != state["run"]:
        out.append("another model or tokenizer")
    if saved.get("input") != state["input"]:
        out.append("another input (size or first bytes differ)")
    old, new = saved.get("options") or {}, state["options"]
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            out.append(f"{key} {old.get(key)!r} -> {new.get(key)!r}")
    return out


def _prepare(output_path, state, resume, overwrite):
    """Start a fresh output, or check and repair one to resume -> (lines done, bytes cut)."""
    state_path = output_path + STATE_SUFFIX
    if os.path.exists(output_path) and not overwrite:
        if not resume:
            raise ValueError(f"output_path {output_path} exists: resume it (resume=True, "
                             f"--resume) or start over (overwrite=True, --overwrite)")
        saved = _read_state(state_path)
        if saved is None:
            raise ValueError(f"output_path {output_path} exists but was not started by "
                             f"translate_file (no {state_path}); pass overwrite=True "
                             f"(--overwrite) to replace it")
        diff = _differences(saved, state)
        if diff:
            raise ValueError(f"cannot resume {output_path}: it was started with "
                             f"{'; '.join(diff)}; rerun with its settings, or pass "
                             f"overwrite=True (--overwrite) to start over")
        return _repair(output_path)
    write_json_atomic(state_path, state)
    with open(output_path, "wb") as f:
        os.fsync(f.fileno())
    return 0, 0


def _repair(path):
    """Keep the output's leading whole, valid lines with ids 1, 2, ...; cut off the rest (an
    unfinished last line) -> (lines kept, bytes cut)."""
    count = good = 0
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                rec = json.loads(line, object_pairs_hook=unique_keys)
            except (ValueError, RecursionError):     # a key given twice included
                break
            if not isinstance(rec, dict) or rec.get("id") != count + 1:
                break
            count, good = count + 1, good + len(line)
    cut = os.path.getsize(path) - good
    if cut:
        with open(path, "r+b") as f:
            f.truncate(good)
            os.fsync(f.fileno())
    return count, cut


# ---- input lines --------------------------------------------------------------------------------

def _count_lines(path):
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def _source(line, fmt):
    """(source text, error or None) of one input line (bytes, its line end included)."""
    if line.endswith(b"\n"):
        line = line[:-1]
    if line.endswith(b"\r"):
        line = line[:-1]
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (line.decode("utf-8", "replace"),
                f"not UTF-8: byte {line[exc.start:exc.start + 1]!r} at column {exc.start + 1}")
    if fmt == "text" or not text.strip():
        return (text if fmt == "text" else ""), None
    try:
        obj = json.loads(text, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError) as exc:
        return text, f"not valid JSON: {exc}"
    if not isinstance(obj, dict) or not isinstance(obj.get("source"), str):
        return text, 'not a JSON object with a str "source" field'
    return obj["source"], None


def _dump(rec):
    """One output line (bytes): UTF-8 JSON, escaped to ASCII only when a str holds a lone
    surrogate (which UTF-8 cannot encode; JSON input can give one)."""
    try:
        return (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(rec) + "\n").encode("ascii")


# ---- the job ------------------------------------------------------------------------------------

class _Job:
    """One pass over the input: windows of lines, their batches, the output written in order."""

    def __init__(self, translator, fmt, window, done, total, reporter):
        self.tr, self.fmt, self.window, self.done = translator, fmt, window, done
        self.total, self.reporter = total, reporter
        self.written = self.errors = self.truncated = self.batches = 0
        self.source_tokens = self.tokens = self.padded = self.positions = 0
        self.generate_seconds = 0.0
        self.started = time.perf_counter()

    def run(self, input_path, output_path):
        first = self.done // self.window * self.window       # lines before this window
        with open(input_path, "rb") as src, open(output_path, "ab") as out:
            self.out, self.synced = out, time.monotonic()
            skipped = sum(1 for _ in itertools.islice(src, first))
            lines = skipped
            while True:
                raw = list(itertools.islice(src, self.window))
                if not raw:
                    break
                if lines == 0 and raw[0].startswith(b"\xef\xbb\xbf"):
                    raw[0] = raw[0][3:]                          # a UTF-8 byte order mark
                self._window(raw, lines)
                lines += len(raw)
            if lines < self.done:
                raise ValueError(f"cannot resume {output_path}: it holds {self.done} lines but "
                                 f"the input has {lines}")
            out.flush()
            os.fsync(out.fileno())

    def _window(self, raw, first):
        """Translate the lines first+1 .. first+len(raw) not yet in the output, write them."""
        tr, n = self.tr, len(raw)
        keep = max(0, self.done - first)                 # lines of the window already written
        sources, results, encoded = [None] * n, [None] * n, {}
        for j, line in enumerate(raw):
            sources[j], error = _source(line, self.fmt)
            if error is not None:
                results[j] = Result(None, error)
                continue
            ids, truncated, error = tr.encode(sources[j])
            if ids is None:
                results[j] = Result(None if error else "", error)
            else:
                encoded[j] = (ids, truncated)
        self._next = keep
        self._flush(first, sources, results)
        todo = list(encoded)
        for batch in tr.plan([len(encoded[j][0]) for j in todo]):
            rows = [todo[b] for b in batch]
            if max(rows) < keep:
                continue                                 # written before the job stopped
            ids = [encoded[j][0] for j in rows]
            t0 = time.perf_counter()
            outputs, counts = tr.generate(ids)
            self.generate_seconds += time.perf_counter() - t0
            for j, output, count in zip(rows, outputs, counts):
                results[j] = Result(output, None, encoded[j][1], len(encoded[j][0]), count)
            lens = [len(r) for r in ids]
            self.batches += 1
            self.source_tokens += sum(lens)
            self.tokens += sum(counts)
            self.positions += len(lens) * max(lens)
            self.padded += len(lens) * max(lens) - sum(lens)
            self._flush(first, sources, results)
            self.reporter.batch(self._progress())

    def _flush(self, first, sources, results):
        """Write the window's lines from self._next on while their results are there."""
        j, blob = self._next, []
        while j < len(results) and results[j] is not None:
            r = results[j]
            blob.append(_dump(record(sources[j], r, first + j + 1)))
            self.errors += r.error is not None
            self.truncated += r.truncated
            j += 1
        if not blob:
            return
        self.out.write(b"".join(blob))
        self.out.flush()
        if time.monotonic() - self.synced >= SYNC_SECONDS:
            os.fsync(self.out.fileno())
            self.synced = time.monotonic()
        self.written += j - self._next
        self._next = j

    def _progress(self):
        s = self.stats()
        lines = self.done + self.written
        left = None if self.total is None else max(self.total - lines, 0)
        eta = None if left is None or not s["lines_per_s"] else left / s["lines_per_s"]
        return {"lines": lines, "total": self.total, "lines_per_s": s["lines_per_s"],
                "tokens_per_s": s["tokens_per_s"], "padding": s["padding"], "eta_s": eta}

    def stats(self):
        seconds = time.perf_counter() - self.started
        return {"lines": self.written, "skipped": self.done, "errors": self.errors,
                "truncated": self.truncated, "batches": self.batches,
                "source_tokens": self.source_tokens, "tokens": self.tokens,
                "padding": self.padded / self.positions if self.positions else 0.0,
                "seconds": seconds, "generate_seconds": self.generate_seconds,
                "tokens_per_s": self.tokens / seconds if seconds > 0 else 0.0,
                "lines_per_s": self.written / seconds if seconds > 0 else 0.0}
