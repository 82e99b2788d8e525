"""The ``fastattn`` command (run as ``python -m fastattn.cli``) and the bench report helpers.

Fast checks only: timings are never asserted (speed lives in benchmarks/ and ``fastattn bench``).
"""
import json
import re
import statistics
import subprocess
import sys

import numpy as np

import pytest

import fastattn
from fastattn import bench
from fastattn.bench import runner, timing
from conftest import assert_close
from tolerances import TOL, max_rel


def fastattn_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "fastattn.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_info_prints_a_summary_and_json_everything():
    res = fastattn_cli("info")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    rows = dict(line.split(":", 1) for line in lines[:-1])
    assert list(rows) == ["fastattn", "CPU", "SIMD level", "float32 GEMM", "int8 path",
                          "bf16 path", "AMX", "threads"]
    assert lines[-1] == "every fact: fastattn info --json"
    # aligned: every value starts in the same column
    assert len({len(line) - len(line.split(":", 1)[1].lstrip()) for line in lines[:-1]}) == 1
    assert all(len(line) < 160 for line in lines)                  # no 1,000-character dicts
    res = fastattn_cli("info", "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)                  # the child's facts (this process's threads
    assert info["simd"] == fastattn.build_info()["simd"]       # may have been set by a test)
    assert rows["SIMD level"].split(";")[0].strip() == info["simd"]
    assert rows["threads"].split()[0] == str(info["threads"])
    assert set(info) == set(fastattn.build_info())


def test_every_command_help_ends_with_examples_that_parse():
    import shlex

    from fastattn import bench, cli
    parser = cli._parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == set(cli.EXAMPLES) | {"info"}
    for name, sub in commands.items():
        text = sub.format_help()
        assert "\nexamples:\n" in text, name
        for line in sub.examples:
            argv = shlex.split(line.split(" < ")[0])
            while "=" in argv[0]:                                # an environment prefix
                argv.pop(0)
            assert argv[0] == "fastattn" and argv[1] == name, line
            args = parser.parse_args(argv[1:])                   # SystemExit if it does not
            assert args.command == name
            for case in getattr(args, "cases", None) or ():
                assert case in bench.CASES, line
    assert "translate" in parser.description and "pretrained" in parser.description


def test_demo_quick_trains_completes_and_draws(tmp_path):
    """The seconds-long demo: the seeds' pairs only, a short budget; its report and files."""
    res = fastattn_cli("demo", "--quick", "--seconds", "3", "--out", str(tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr
    for line in ("pairs: 6 from the seeds", "completions (greedy):",
                 "'Fool! No man can kill me' ->", "exact match (greedy) on the seed pairs:"):
        assert line in res.stdout
    assert (tmp_path / "run" / "model.safetensors").exists()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert len(list((tmp_path / "attention").glob("*.png"))) == 6


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
    assert data["cpu"] == bench.cpu_model() and data["threads"] == 1
    assert data["date"].endswith("Z") and data["environment"]["simd"] in res.stdout


def test_bench_json_into_a_directory_names_the_file_by_date_cpu_simd_threads(tmp_path):
    res = fastattn_cli("bench", "--quick", "--case", "smoke", "--threads", "1", "--json",
                       str(tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    assert path.name == bench.result_filename(data["date"], data["cpu"],
                                              data["environment"]["simd"], 1)
    assert path.name.startswith(data["date"][:10] + "_")
    assert path.name.endswith(f"_{data['environment']['simd']}_1t.json")
    assert f"results written to {path}" in res.stdout
    path.write_text("an earlier run")          # a second run that day keeps the first's file
    res = fastattn_cli("bench", "--quick", "--case", "smoke", "--threads", "1", "--json",
                       str(tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr
    assert path.read_text() == "an earlier run"
    second = path.with_name(path.name[:-len(".json")] + "-2.json")
    assert json.loads(second.read_text())["rows"] and f"results written to {second}" in res.stdout


@pytest.mark.parametrize("cpu, name", [
    ("Intel(R) Xeon(R) Processor", "2026-11-26_intel-xeon-processor_avx512_2t.json"),
    ("AMD EPYC 9R14 96-Core Processor", "2026-11-26_amd-epyc-9r14-96-core-processor_avx512_2t.json"),
    ("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", "2026-11-26_intel-core-i7-8700_avx512_2t.json"),
    ("", "2026-11-26_cpu_avx512_2t.json"),
])
def test_result_filename_slugs_the_cpu_model(cpu, name):
    assert bench.result_filename("2026-11-26T19:00:00Z", cpu, "avx512", 2) == name


@pytest.mark.parametrize("args", [["bogus"], [], ["bench", "--case", "nope"],
                                  ["bench", "--case", "smoke", "nope"],
                                  ["bench", "--repeat", "0"], ["info", "--nope"],
                                  ["bench", "--json", "no-such-dir/out.json"]])
def test_usage_errors_exit_2(args):
    res = fastattn_cli(*args)
    assert res.returncode == 2
    assert "usage:" in res.stderr


def test_unknown_case_is_named_with_the_valid_ones():
    res = fastattn_cli("bench", "--case", "smoke", "nope", "--list")
    assert res.returncode == 2 and res.stdout == ""
    assert "argument --case: invalid choice: 'nope' (choose from " in res.stderr
    for name in bench.CASES:
        assert repr(name) in res.stderr


def test_bench_help_names_the_cases_and_defaults():
    res = fastattn_cli("bench", "--help")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())           # argparse wraps the help
    assert f"default {bench.DEFAULT_REPEAT}, {bench.QUICK_REPEAT} with --quick" in text
    for name in bench.CASES:
        assert name in text


def test_bench_list():
    res = fastattn_cli("bench", "--list")
    assert res.returncode == 0
    for name in bench.CASES:
        assert name in res.stdout


# ---- report helpers, on made-up rows -----------------------------------------------------------

def _row(case, fast=None, torch=None, numpy=None, **extra):
    row = runner.empty_row(bench.CASES[case], 2)
    for impl, ms in (("fastattn", fast), ("torch", torch), ("numpy", numpy)):
        if ms is not None:
            row[f"{impl}_times_ms"] = [ms]
    row = runner.finish_row(bench.CASES[case], row)
    row.update(extra)
    return row


def test_targets_pass_miss_skip():
    rows = [
        _row("attention_causal", fast=10.0, torch=20.0, numpy=90.0),  # 2x torch, 9x numpy
        _row("attention_full", fast=10.0, torch=12.5),                 # 1.25x torch
        _row("ffn", fast=10.0),
        _row("sgemm", numpy=10.0 * 2 * 2048 ** 3 / (4 * 2048 * 512 * 2048) / 0.95),
        _row("attention_memory", fast=1000.0, fastattn_peak_mib=16.0, matrix_mib=1024.0),
    ]
    status = {(r["case"], r["target"]): r["status"] for r in bench.check_targets(rows)}
    assert status[("attention_causal", "speedup vs torch >= 1.8x")] == "PASS"
    assert status[("attention_causal", "speedup vs numpy >= 10x")] == "MISS"
    assert status[("attention_full", "speedup vs torch >= 1.3x")] == "MISS"
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
    assert cells[1:8] == ["10.0", "n/a", "500", "-", "-", "50.00x", "-"]   # - : ctranslate2
    assert_close(float(cells[8]), 4 * 4 * 8 * 512 * 512 * 64 / 2 / 10e6,
                 **TOL["table_three_digits"], name="GFLOP/s cell", dtype=None)


def test_interleaving_spreads_the_slow_runs():
    calls = []
    fns = {name: (lambda n=name: calls.append(n)) for name in ("fast", "slow")}
    times = timing.time_interleaved(fns, {"fast": 6, "slow": 2})
    assert len(times["fast"]) == 6 and len(times["slow"]) == 2
    assert calls == ["fast"] * 2 + ["fast", "slow"] + ["fast"] * 2 + ["fast", "slow"]


# ---- generation cases ----------------------------------------------------------------------------

def test_generation_targets():
    rows = [
        _row("generate_greedy_b8", fast=1000.0, torch=12000.0, numpy=30000.0),   # 12x torch
        _row("decode_step", fast=5.0, share_of_copy=0.8, weight_gbps=16.0, copy_gbps=20.0,
             step_ms=5.0),
    ]
    assert_close(rows[0]["fastattn_tokens_per_s"], 8 * 64 / 1.0, **TOL["float64_figure"],
                 name="fastattn tokens/s", dtype=None)
    assert_close(rows[0]["torch_tokens_per_s"], 8 * 64 / 12.0, **TOL["float64_figure"],
                 name="torch tokens/s", dtype=None)
    assert rows[0]["notes"][0].startswith("tokens/s: fastattn 512, torch 42.7, numpy 17.1")
    results = {r["case"]: r for r in bench.check_targets(rows)}
    assert results["generate_greedy_b8"]["status"] == "PASS"
    assert "512 tokens/s" in results["generate_greedy_b8"]["detail"]
    assert results["decode_step"]["status"] == "MISS"                      # 80% < 85%
    assert "80% of the copy" in results["decode_step"]["detail"]
    slow = [_row("generate_greedy_b8", fast=1000.0, torch=9000.0)]
    (t,) = [r for r in bench.check_targets(slow) if r["case"] == "generate_greedy_b8"]
    assert t["status"] == "MISS"


def test_quantized_decode_target_prefers_its_interleaved_float32_step():
    """decode_step_int8 divides the float32 step timed between its own calls (robust to the
    memory bandwidth changing between cases) when the row has one, else the decode_step row
    of the same run."""
    own = _row("decode_step_int8", fast=1.0, step_ms=1.0, float32_step_ms=3.5)
    base = _row("decode_step", fast=2.5, step_ms=2.5)

    def result(rows):
        (t,) = [r for r in bench.check_targets(rows) if r["case"] == "decode_step_int8"]
        return t
    t = result([base, own])
    assert t["status"] == "PASS"
    assert_close(t["value"], 3.5, **TOL["float64_figure"], name="value", dtype=None)
    assert "interleaved" in t["detail"]
    paired = dict(own, float32_ratio=3.1)              # the median of paired calls' ratios
    t = result([base, paired])
    assert t["status"] == "PASS"
    assert_close(t["value"], 3.1, **TOL["float64_figure"], name="value", dtype=None)
    assert "paired" in t["detail"] and "3.50 ms" in t["detail"]
    alone = _row("decode_step_int8", fast=1.0, step_ms=1.0)
    t = result([base, alone])
    assert t["status"] == "MISS"
    assert_close(t["value"], 2.5, **TOL["float64_figure"], name="value", dtype=None)
    assert result([alone])["status"] == "SKIP"


def test_quantized_model_case_times_float32_interleaved(monkeypatch):
    """A quantized model case (encoder_int8) times the float32 model between its own calls
    (float32_fastattn_ms), and its target divides by that; on a tiny model, so the test is
    quick."""
    from fastattn import nn as fnn
    from fastattn.bench import cases

    small = dict(d_model=32, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                 dim_feedforward=64)
    monkeypatch.setattr(cases, "BASE", small)
    monkeypatch.setattr(cases, "_base_model", lambda backend, ct="float32": fnn.Transformer(
        **small, backend=backend, seed=0).quantize(ct))
    case = cases._model_case("encoder_int8", 2, 8, 0, "int8")
    row = runner._run_time_case(case, 2, repeat=3, numpy_repeat=1)
    assert row["float32_fastattn_ms"] > 0 and row["fastattn_ms"] > 0
    assert any("(interleaved)" in n for n in row["notes"])
    (t,) = [r for r in bench.check_targets([row]) if r["case"] == "encoder_int8"]
    f32 = row["float32_times_ms"]
    own = row["fastattn_times_ms"][-len(f32):]          # each timed right before its pair
    assert len(f32) == 3
    assert_close(t["value"], statistics.median(f / q for f, q in zip(f32, own)),
                 **TOL["float64_figure"], name="median ratio", dtype=None)
    assert "interleaved" in t["detail"] and "paired" in t["detail"]


def test_quantized_decode_case_has_a_float32_twin():
    case = bench.CASES["decode_step_bf16"]
    twin = case.float32_twin()
    assert twin.compute_type == "float32" and twin.B == case.B and twin.steps == case.steps
    assert bench.CASES["decode_step"].float32_twin() is None


def test_decode_metrics_and_weight_bytes():
    from fastattn import nn as fnn

    m = fnn.Seq2SeqTransformer(1, 2, 16, 2, 11, 13, 24, seed=0)
    C, F_, V = 16, 24, 13
    per_layer = 3 * C * C + C * C + C * C + C * C + F_ * C + C * F_
    assert bench.decoder_weight_bytes(m) == 4 * (2 * per_layer + V * C)
    got = bench.decode_metrics(generate_ms=330.0, prefill_ms=10.0, copy_ms=20.0,
                               weight_bytes=100e6, copy_bytes=500e6, steps=64)
    for key, want in (("step_ms", 5.0), ("weight_gbps", 20.0), ("copy_gbps", 25.0),
                      ("share_of_copy", 0.8)):
        assert_close(got[key], want, **TOL["float64_figure"], name=key, dtype=None)


def test_memory_copy_moves_read_plus_write_bytes():
    copy, moved = bench.memory_copy(nbytes=4 << 20, threads=3)
    try:
        copy()
        copy()
    finally:
        copy.close()
    assert moved == 2 * (4 << 20)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True.*:UserWarning")
@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_decoding_gives_generates_tokens(norm_first):
    """The bench's torch implementation (the tutorial's decoding, searched by
    fastattn.generate's loops) on a small model: the tokens of fastattn's generate, greedy and
    beam, with and without an end token (rows and whole sources dropped on the way)."""
    torch = pytest.importorskip("torch")
    from fastattn import nn as fnn

    fm = fnn.Seq2SeqTransformer(2, 2, 32, 4, 23, 29, 64, norm_first=norm_first, seed=7)
    tm = bench.torch_seq2seq(fm)
    src = np.random.default_rng(0).integers(1, 23, size=(3, 6))
    kw = dict(max_new_tokens=8, start_id=1)
    greedy = fm.generate(src, **kw)
    assert np.array_equal(bench.torch_generate(tm, src, **kw), greedy)
    assert np.array_equal(bench.torch_generate(tm, torch.from_numpy(src), **kw), greedy)
    end = int(greedy[0, 3])                                        # row 0 ends at step 3
    assert np.array_equal(bench.torch_generate(tm, src, end_id=end, pad_id=5, **kw),
                          fm.generate(src, end_id=end, pad_id=5, **kw))
    for k, lp, e in ((3, 1.0, None), (2, 0.0, None), (3, 0.7, "row0"), (4, 1.0, "row0")):
        want = fm.generate(src, method="beam", beam_size=k, length_penalty=lp, **kw)
        if e is not None:
            e = int(want[0, 2])
            want = fm.generate(src, method="beam", beam_size=k, length_penalty=lp, end_id=e,
                               **kw)
        got = bench.torch_generate(tm, src, method="beam", beam_size=k, end_id=e,
                                   length_penalty=lp, **kw)
        assert np.array_equal(got, want), (k, lp, e, got, want)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True.*:UserWarning")
def test_torch_decoder_reorder_keeps_the_kept_sources_memory():
    torch = pytest.importorskip("torch")
    from fastattn import nn as fnn

    tm = bench.torch_seq2seq(fnn.Seq2SeqTransformer(1, 2, 16, 2, 11, 13, 24, seed=3))
    src = np.random.default_rng(1).integers(0, 11, size=(3, 5))
    with torch.inference_mode():
        d = bench.TorchDecoder(tm, src, beams=2)                   # rows: 2 per source
        d.step(np.arange(6) + 1)
        d.reorder([5, 4], sources=[2])                             # source 2, beams swapped
        got = d.step(np.array([7, 8]))
        alone = bench.TorchDecoder(tm, src[2:], beams=2)
        alone.step(np.array([5, 6]))
        alone.reorder([1, 0])
        want = alone.step(np.array([7, 8]))
    assert got.shape == (2, 13) and got.dtype == np.float32
    assert_close(got, want, **TOL["torch_decoder_steps"], name="reordered vs alone")


def test_torch_generate_refuses_sampling():
    with pytest.raises(ValueError, match="greedy' or 'beam"):
        bench.torch_generate(None, np.zeros((1, 2), np.int64), max_new_tokens=1, start_id=0,
                             method="sample")


@pytest.mark.filterwarnings("ignore:.*nested tensor.*:UserWarning")
def test_torch_twins_of_the_model_cases_hold_our_weights():
    """The bench's torch models are built from a fastattn model's config (dropout included)
    and give its outputs: nn.Transformer for the forward cases, the tutorial's model (its
    training forward, for the training cases)."""
    torch = pytest.importorskip("torch")
    from fastattn import nn as fnn
    from fastattn.bench.torch_models import torch_seq2seq, torch_transformer

    m = fnn.Transformer(16, 2, 1, 1, 32, dropout=0.1, seed=0)
    rng = np.random.default_rng(0)
    src, tgt = (rng.standard_normal((2, n, 16), dtype=np.float32) for n in (5, 4))
    with torch.inference_mode():
        ref = torch_transformer(m)(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    assert_close(m(src, tgt), ref, **max_rel(ref), name="transformer vs torch", dtype=None)

    s2s = fnn.Seq2SeqTransformer(1, 1, 16, 2, 11, 13, 32, dropout=0.0, pad_id=0, seed=1)
    tm = torch_seq2seq(s2s)
    src_ids, tgt_ids = rng.integers(1, 11, (2, 5)), rng.integers(1, 13, (2, 4))
    with torch.inference_mode():
        ref = tm(torch.from_numpy(src_ids), torch.from_numpy(tgt_ids)).numpy()
    assert_close(s2s(src_ids, tgt_ids), ref, **max_rel(ref), name="seq2seq vs torch", dtype=None)


@pytest.mark.long
def test_demo_learns_what_a_newcomer_can_see(tmp_path):
    """The whole demo (under two minutes on 2 cores): it recalls at least 80% of the corpus's
    training pairs exactly, and its replies to the held-out prompts differ (no reply for more
    than a fifth of them). Skipped without the corpus (the demo extra)."""
    pytest.importorskip("chatterbot_corpus")
    res = fastattn_cli("demo", "--quiet", "--out", str(tmp_path), timeout=600)
    assert res.returncode == 0, res.stderr
    import re
    recall = re.search(r"exact match \(greedy\) on 200 corpus training pairs: (\d+)%", res.stdout)
    assert recall and int(recall.group(1)) >= 80, res.stdout
    held = re.search(r"on the (\d+) held-out pairs: \d+%; their replies: (\d+) different, the "
                     r"most common \(.*\) given to (\d+)\.", res.stdout)
    assert held, res.stdout
    n, distinct, top = map(int, held.groups())
    assert top <= n / 5 and distinct > n / 2
    assert "the run's model: the last step's" in res.stdout


def test_a_typo_gets_the_nearest_name():
    res = fastattn_cli("trian")
    assert res.returncode == 2 and "did you mean 'train'?" in res.stderr
    res = fastattn_cli("info", "--jsn")
    assert res.returncode == 2 and "did you mean --json?" in res.stderr
    res = fastattn_cli("evaluate", "run", "data", "--exact-smple", "3")
    assert res.returncode == 2 and "did you mean --exact-sample?" in res.stderr


# ---- help and version --------------------------------------------------------------------------

def _commands():
    """(name, parser) of the top-level parser and of every command, help finished (bench fills
    its in only when shown)."""
    from fastattn import cli
    parser = cli._parser()
    found = [("fastattn", parser), *parser._subparsers._group_actions[0].choices.items()]
    for _, p in found:
        p.format_help()
    return found


def test_every_argument_of_every_command_has_help_with_its_default():
    import argparse
    missing, no_default = [], []
    for name, p in _commands():
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or \
                    action.help == argparse.SUPPRESS:
                continue
            arg = "/".join(action.option_strings) or action.metavar or action.dest
            if not (action.help or "").strip():
                missing.append(f"{name} {arg}")
                continue
            default = action.default
            if default in (None, False, True, []) or action.nargs == 0:
                continue                        # nothing to state: flags, optional values
            text = " ".join(p._get_formatter()._expand_help(action).split())
            if f"default: {default}" not in text and f"default {default}" not in text:
                no_default.append(f"{name} {arg} (default {default!r})")
    assert not missing, f"arguments without help text: {missing}"
    assert not no_default, f"help that does not state its default: {no_default}"


def _option_help(help_text, option):
    """The help of `option` in a command's --help output, on one line."""
    m = re.search(r"^  " + re.escape(option) + r"\b(.*?)(?=^  -|^\S|\Z)", help_text, re.M | re.S)
    assert m, f"{option} is not in the help"
    return " ".join(m.group(1).split())


@pytest.mark.parametrize("command", ["complete", "translate"])
def test_generation_options_say_what_they_do_and_their_defaults(command):
    res = fastattn_cli(command, "--help")
    assert res.returncode == 0, res.stderr
    for option, says in [("--method", "(default: greedy)"), ("--beam-size", "(default: 4)"),
                         ("--temperature", "(default: 1.0)"), ("--top-k", "(default: all)"),
                         ("--top-p", "(default: 1"), ("--max-new-tokens", "(default: 64)")]:
        text = _option_help(res.stdout, option)
        assert says in text and len(text) > len(says) + 20, (option, text)


def test_version_prints_the_package_version():
    res = fastattn_cli("--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"fastattn {fastattn.__version__}\n"
    assert "--version" in fastattn_cli("--help").stdout


@pytest.mark.parametrize("argv, near", [
    (["demo", "--overwrite"], None),               # an option of train and translate only
    (["demo", "--overwrit"], None),
    (["info", "--resum"], None),
    (["plot", "run", "--exact-sample", "3"], None),    # evaluate's
    (["demo", "--quik"], "--quick"),
    (["demo", "--out", "d", "--quiet", "--secnds", "2"], "--seconds"),
])
def test_a_suggestion_comes_from_the_commands_own_options(argv, near, capsys):
    from fastattn import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert f"fastattn {argv[0]}: error: unrecognized arguments: " in err
    if near is None:
        assert "did you mean" not in err, err
    else:
        assert err.rstrip().endswith(f"; did you mean {near}?"), err
