"""The rows of ``run()`` as text: the Markdown table and the one-line environment; the name
and machine facts of a ``fastattn bench --json`` results file."""
import platform
import re

import numpy as np

from .. import build_info
from .torch_models import torch_version

__all__ = ["fmt_ms", "format_table", "describe_environment", "cpu_model", "result_filename"]


def fmt_ms(v):
    """A number with about three significant digits, never an exponent (also for GFLOP/s).

    Args:
        v: the number (a time in ms), or None.

    Returns:
        The text.
    """
    if v is None:
        return None
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 \
        else f"{v:.3f}"


def _cell(row, impl):
    status = row[f"{impl}_status"]
    if status.startswith("n/a"):
        return "n/a"
    return fmt_ms(row[f"{impl}_ms"]) or "-"


def format_table(rows):
    """The rows as a Markdown table (speedups are the other's time over fastattn's).

    Args:
        rows: `run`'s rows.

    Returns:
        The table, a str.
    """
    head = ["case", "fastattn ms", "torch ms", "numpy ms", "ctranslate2 ms", "speedup vs torch",
            "speedup vs numpy", "speedup vs ctranslate2", "GFLOP/s fastattn", "notes"]
    body = []
    for r in rows:
        body.append([
            r["title"], _cell(r, "fastattn"), _cell(r, "torch"), _cell(r, "numpy"),
            _cell(r, "ctranslate2"),
            *(f"{r[k]:.2f}x" if r.get(k) else "-" for k in ("speedup_vs_torch",
                                                            "speedup_vs_numpy",
                                                            "speedup_vs_ctranslate2")),
            fmt_ms(r["fastattn_gflops"]) if r.get("fastattn_gflops") else "-",
            "; ".join(r["notes"]),
        ])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]
    right = {1, 2, 3, 4, 5, 6, 7, 8}

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in right else "-" * (w + 2)
                          for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *(line(b) for b in body)])


def describe_environment(threads=None):
    """One line: version, SIMD level, threads, the GEMM engine's K block and caches, torch version.

    Args:
        threads: the threads to report (None, the default: fastattn's count).

    Returns:
        The line."""
    info = build_info()
    torch = torch_version()
    g = info["gemm"]
    return (f"fastattn {info['version']}, simd {info['simd']}, "
            f"{threads or info['threads']} threads, gemm K block {g['k_block']} "
            f"(L1 {g['l1'] >> 10} KiB, L2 {g['l2'] >> 10} KiB), "
            f"numpy {np.__version__}, torch {torch or 'n/a'}")


def cpu_model():
    """The CPU's model name (Linux: /proc/cpuinfo's "model name"; elsewhere what the platform
    module says), for the results file's name and its machine stamp."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def result_filename(date, cpu, simd, threads):
    """The name of a results file: date, CPU model, SIMD level and threads, so that the files
    of one machine sort by date, e.g. ``2026-11-26_intel-xeon-processor_avx512_2t.json``
    (``fastattn bench --json DIR`` adds -2, -3, ... to the stem of a name already taken).

    Args:
        date: the run's date (YYYY-MM-DD).
        cpu: the CPU model (`cpu_model()`).
        simd: the SIMD level.
        threads: the threads.

    Returns:
        The file name."""
    slug = re.sub(r"\(r\)|\(tm\)|\bcpu\b|@.*$", "", cpu.lower())
    slug = re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "cpu"
    return f"{date[:10]}_{slug}_{simd}_{threads}t.json"
