"""The bf16 mixed-precision training cases of ``fastattn bench`` (train_small_bf16,
train_base_bf16, train_memory_base_bf16): registered and run by default, their targets on
made-up rows, and one tiny run of each through the runner (the model and data swapped for tiny
ones, so each takes seconds), with torch and without it.

Timings are never asserted: speed lives in ``fastattn bench``.
"""
import functools

import pytest

from fastattn import bench
from fastattn import nn as fnn
from fastattn.bench import runner, torch_models, train_cases
from fastattn.bench.cases import TRAIN_CASE_NAMES
from conftest import assert_close
from tolerances import TOL

BF16_CASES = ("train_small_bf16", "train_base_bf16", "train_memory_base_bf16")
TINY = dict(num_encoder_layers=1, num_decoder_layers=1, emb_size=32, nhead=2, vocab=40,
            dim_feedforward=64, B=2, S=6, T=6)


def test_bf16_training_cases_are_registered_and_run_by_default():
    for name in BF16_CASES:
        case = bench.CASES[name]
        assert name in TRAIN_CASE_NAMES and name in bench.DEFAULT_CASES
        assert case.implementations == ("fastattn", "torch")
        assert "bf16" in case.title and "autocast" in case.title
    for name in ("train_small_bf16", "train_base_bf16"):       # float32 of both interleaved
        case = bench.CASES[name]
        assert case.kind == "time" and case.tokens
        assert case.float32_impl is not None and case.float32_torch_impl is not None
    memory = bench.CASES["train_memory_base_bf16"]
    assert memory.kind == "memory" and memory.float32_torch_impl is None
    for name in ("train_small", "train_base", "train_memory_base"):   # unchanged: fp32 only
        assert bench.CASES[name].float32_torch_impl is None
        assert bench.CASES[name].float32_impl is None


def _row(case, fast=None, torch=None, **extra):
    row = runner.empty_row(bench.CASES[case], 2)
    for impl, ms in (("fastattn", fast), ("torch", torch)):
        if ms is not None:
            row[f"{impl}_times_ms"] = [ms]
    row.update(extra)
    return runner.finish_row(bench.CASES[case], row)


def test_bf16_training_targets_compare_with_torch_autocast():
    rows = [_row("train_small_bf16", fast=1000.0, torch=1400.0),            # 1.4x: PASS
            _row("train_base_bf16", fast=1000.0, torch=1200.0),             # 1.2x: MISS
            _row("train_memory_base_bf16", fast=1.0, torch=1.0, fastattn_peak_mib=300.0,
                 torch_peak_mib=400.0)]
    got = {r["case"]: r for r in bench.check_targets(rows)}
    assert got["train_small_bf16"]["status"] == "PASS"
    assert got["train_small_bf16"]["target"] == "tokens/s >= 1.3x torch autocast bf16"
    assert got["train_base_bf16"]["status"] == "MISS"
    assert "1.20x torch autocast bf16" in got["train_base_bf16"]["detail"]
    assert got["train_memory_base_bf16"]["status"] == "PASS"
    assert got["train_memory_base_bf16"]["detail"] == \
        "fastattn 300 MiB, torch autocast bf16 400 MiB"
    skipped = {r["case"]: r["status"] for r in bench.check_targets([])}
    assert all(skipped[name] == "SKIP" for name in BF16_CASES)


def test_float32_runs_of_a_mixed_precision_row_give_tokens_and_speedup():
    row = _row("train_base_bf16", fast=1000.0, torch=1500.0, float32_fastattn_ms=1250.0,
               float32_torch_ms=2000.0)
    tokens = bench.CASES["train_base_bf16"].tokens
    assert_close(row["float32_torch_tokens_per_s"], tokens / 2.0, **TOL["float64_figure"],
                 name="float32 torch tokens/s", dtype=None)
    assert_close(row["speedup_vs_float32_torch"], 2.0, **TOL["float64_figure"], name="speedup",
                 dtype=None)
    assert row["notes"][0].startswith("tokens/s: fastattn 1024, torch 683, float32 fastattn "
                                      "819, float32 torch 512")


@pytest.fixture
def tiny(monkeypatch):
    """train_cases on a tiny preset: one model per precision (the seeded weights), the fit
    data of TINY, two fit steps a call."""
    @functools.lru_cache(maxsize=None)
    def model(name, precision="fp32"):
        c = TINY
        return fnn.Seq2SeqTransformer(c["num_encoder_layers"], c["num_decoder_layers"],
                                      c["emb_size"], c["nhead"], c["vocab"], c["vocab"],
                                      c["dim_feedforward"], train_cases.DROPOUT,
                                      pad_id=train_cases.PAD, seed=0).set_precision(precision)
    monkeypatch.setattr(train_cases, "_model", model)
    monkeypatch.setattr(train_cases, "SMALL", TINY)
    monkeypatch.setattr(train_cases, "FIT_STEPS", 2)
    monkeypatch.setattr(train_cases, "FIT_WORDS", 4)
    monkeypatch.setattr(train_cases, "_fit_data",
                        functools.lru_cache(maxsize=None)(train_cases._fit_data.__wrapped__))
    return train_cases


def _tiny_cases(tc):
    return (tc._fit_case("bf16"), tc._train_case("base", TINY, "tiny", precision="bf16"),
            tc._train_case("base", TINY, "tiny", kind="memory", precision="bf16"))


def _run(case):
    if case.kind == "memory":
        return runner._run_memory_case(case, 2)
    return runner._run_time_case(case, 2, repeat=1, numpy_repeat=1)


def test_bf16_training_cases_run_all_four_on_a_tiny_model(tiny):
    pytest.importorskip("torch")
    fit_case, step_case, memory_case = _tiny_cases(tiny)
    for case in (fit_case, step_case):
        row = _run(case)
        assert row["fastattn_status"] == row["torch_status"] == "ok"
        for key in ("fastattn_ms", "torch_ms", "float32_fastattn_ms", "float32_torch_ms",
                    "speedup_vs_torch", "speedup_vs_float32_torch"):
            assert row[key] > 0, key
        assert "float32 fastattn" in row["notes"][0] and "float32 torch" in row["notes"][0]
    row = _run(memory_case)
    assert row["fastattn_peak_mib"] is not None and row["torch_peak_mib"] is not None
    assert tiny._model("base", "bf16").precision == "bf16"
    assert tiny._model("base").precision == "fp32"


def test_bf16_training_cases_without_torch_show_it_unavailable(tiny, monkeypatch):
    monkeypatch.setattr(torch_models, "_torch_cache", [None])      # as if not installed
    for case in _tiny_cases(tiny):
        row = _run(case)
        assert row["torch_status"] == "n/a: torch is not installed"
        assert row["fastattn_status"] == "ok" and row.get("float32_torch_ms") is None
        if case.kind == "time":
            assert row["float32_fastattn_ms"] > 0
        cells = [c.strip() for c in bench.format_table([row]).splitlines()[2].split("|")]
        assert cells[3] == "n/a"                                   # the torch ms column
