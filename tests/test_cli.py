"""The ``fastattn`` command (run as ``python -m fastattn.cli``) and the bench report helpers.

Fast checks only: timings are never asserted (speed lives in benchmarks/ and ``fastattn bench``).
"""
import json
import subprocess
import sys

import pytest

from fastattn import bench


def fastattn_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "fastattn.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_info_prints_build_facts():
    res = fastattn_cli("info")
    assert res.returncode == 0, res.stderr
    lines = dict(line.split(":", 1) for line in res.stdout.splitlines())
    assert {"simd", "openmp", "blas", "threads", "compiler"} <= set(lines)
    assert lines["simd"].strip() in ("generic", "avx2", "avx512")
    assert lines["openmp"].strip() in ("yes", "no")
    # aligned: every value starts in the same column
    assert len({len(line) - len(line.split(":", 1)[1].lstrip())
                for line in res.stdout.splitlines()}) == 1


def test_demo_runs():
    res = fastattn_cli("demo")
    assert res.returncode == 0, res.stderr
    assert "max |ops - reference|" in res.stdout
    diff = float(res.stdout.split("max |ops - reference|")[1].split()[0])
    assert diff < 1e-4


def test_bench_quick_smoke_prints_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    res = fastattn_cli("bench", "--quick", "--case", "smoke", "--threads", "1", "--json",
                       str(out), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "| case" in res.stdout and "| smoke: attention causal" in res.stdout
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["case"] == "smoke" and row["threads"] == 1
    assert row["fastattn_runs"] == 5 and row["numpy_runs"] == 1
    assert row["fastattn_ms"] > 0
    assert row["max_abs_diff_vs_numpy"]["fastattn"] < 1e-4
    assert all(t["status"] == "SKIP" for t in data["targets"])  # no target case was run


@pytest.mark.parametrize("args", [["bogus"], [], ["bench", "--case", "nope"],
                                  ["bench", "--repeat", "0"], ["info", "--nope"],
                                  ["bench", "--json", "no-such-dir/out.json"]])
def test_usage_errors_exit_2(args):
    res = fastattn_cli(*args)
    assert res.returncode == 2
    assert "usage:" in res.stderr


def test_bench_list():
    res = fastattn_cli("bench", "--list")
    assert res.returncode == 0
    for name in bench.CASES:
        assert name in res.stdout


# ---- report helpers, on made-up rows -----------------------------------------------------------

def _row(case, fast=None, torch=None, numpy=None, **extra):
    row = bench._empty_row(bench.CASES[case], 2)
    for impl, ms in (("fastattn", fast), ("torch", torch), ("numpy", numpy)):
        if ms is not None:
            row[f"{impl}_times_ms"] = [ms]
    row = bench._finish_row(bench.CASES[case], row)
    row.update(extra)
    return row


def test_targets_pass_miss_skip():
    rows = [
        _row("attention_causal", fast=10.0, torch=20.0, numpy=90.0),  # 2x torch, 9x numpy
        _row("attention_full", fast=10.0, torch=11.0),                 # 1.1x torch
        _row("ffn", fast=10.0),
        _row("sgemm", numpy=10.0 * 2 * 2048 ** 3 / (4 * 2048 * 512 * 2048) / 0.95),
        _row("attention_memory", fast=1000.0, fastattn_peak_mib=16.0, matrix_mib=1024.0),
    ]
    status = {(r["case"], r["target"]): r["status"] for r in bench.check_targets(rows)}
    assert status[("attention_causal", "speedup vs torch >= 1.8x")] == "PASS"
    assert status[("attention_causal", "speedup vs numpy >= 10x")] == "MISS"
    assert status[("attention_full", "speedup vs torch >= 1.2x")] == "MISS"
    assert status[("ffn", "GFLOP/s >= 90% of sgemm GFLOP/s")] == "PASS"      # 95 %
    assert status[("attention_memory", "peak memory growth < 64 MiB")] == "PASS"
    assert status[("layer_norm", "speedup vs torch >= 1.5x")] == "SKIP"     # not run
    text = bench.format_targets(bench.check_targets(rows))
    assert "layer_norm" not in text and text.count("\n") == 4


def test_ffn_target_needs_sgemm_in_the_same_run():
    (ffn,) = [t for t in bench.check_targets([_row("ffn", fast=10.0)]) if t["case"] == "ffn"]
    assert ffn["status"] == "SKIP" and "sgemm" in ffn["detail"]


def test_format_table_is_markdown_with_na_for_missing_torch():
    row = _row("attention_causal", fast=10.0, numpy=500.0)
    row["torch_status"] = "n/a: torch is not installed"
    lines = bench.format_table([row]).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("| case") and "| GFLOP/s fastattn |" in lines[0]
    assert set(lines[1]) <= set("|-:")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[1:6] == ["10.0", "n/a", "500", "-", "50.00x"]
    assert float(cells[6]) == pytest.approx(4 * 4 * 8 * 512 * 512 * 64 / 2 / 10e6, rel=1e-2)


def test_interleaving_spreads_the_slow_runs():
    calls = []
    fns = {name: (lambda n=name: calls.append(n)) for name in ("fast", "slow")}
    times = bench._time_interleaved(fns, {"fast": 6, "slow": 2})
    assert len(times["fast"]) == 6 and len(times["slow"]) == 2
    assert calls == ["fast"] * 2 + ["fast", "slow"] + ["fast"] * 2 + ["fast", "slow"]
