"""The training product's commands end to end: ``fastattn train`` on each data format, then
``complete`` (arguments and standard input), ``plot``, ``attention``, ``--resume``, and clear
errors for bad data. Small models and few steps: these check the plumbing, not the learning
(tests/train checks that fit() learns)."""
import json
import subprocess
import sys

import pytest

from conftest import assert_close
from tolerances import TOL

PAIRS = [("one two three", "three two one"), ("four five", "five four"),
         ("six seven eight", "eight seven six"), ("two four six", "six four two")]


def cli(*args, stdin=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "fastattn.cli", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def write_data(path, fmt):
    if fmt == "tsv":
        path.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in PAIRS))
    elif fmt == "txt":                       # each line answered by the next
        path.write_text("".join(f"{s}\n{t}\n\n" for s, t in PAIRS))
    else:
        pytest.importorskip("yaml")
        convs = "".join(f"- - {s}\n  - {t}\n" for s, t in PAIRS)
        path.write_text(f"categories:\n- test\nconversations:\n{convs}")
    return path


TRAIN = ("--model", "tiny", "--tokenizer", "word", "--steps", "12", "--batch-tokens", "64",
         "--valid", "0", "--quiet")


@pytest.mark.parametrize("fmt", ["tsv", "jsonl", "txt", "yml"])
def test_train_then_complete_round_trip(tmp_path, fmt):
    data = write_data(tmp_path / f"pairs.{fmt}", fmt)
    run = tmp_path / "run"
    res = cli("train", data, "--out", run, *TRAIN)
    assert res.returncode == 0, res.stderr
    assert "12 steps" in res.stdout
    for name in ("model.safetensors", "src_tokenizer.json", "tgt_tokenizer.json", "config.json",
                 "history.jsonl"):
        assert (run / name).exists(), name
    assert (run / "checkpoints" / "latest").exists()
    records = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 13))
    res = cli("complete", run, "one two three", "four five")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 2
    # standard input: one output line per input line, in order, empty lines kept
    res = cli("complete", run, "--method", "beam", "--beam-size", "2", stdin="one two\n\nsix\n")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    # quantized while loading: the same completions as the run loaded with int8 weights
    res = cli("complete", run, "one two three", "four five", "--compute-type", "int8")
    assert res.returncode == 0, res.stderr
    from fastattn.train.run import load_run
    want = load_run(run, compute_type="int8").complete(["one two three", "four five"])
    assert res.stdout.splitlines() == want


def test_resume_continues_a_finished_run(tmp_path):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    assert cli("train", data, "--out", run, *TRAIN).returncode == 0
    more = [a if a != "12" else "20" for a in TRAIN]
    res = cli("train", data, "--out", run, *more, "--resume")
    assert res.returncode == 0, res.stderr
    steps = [json.loads(line)["step"] for line in (run / "history.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "step"]
    assert steps == list(range(1, 21))


def test_plot_and_attention_pictures(tmp_path):
    pytest.importorskip("matplotlib")
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    assert cli("train", data, "--out", run, *TRAIN).returncode == 0
    res = cli("plot", run)
    assert res.returncode == 0, res.stderr
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = cli("attention", run, "one two three", "--target", "three two one", "--out",
              tmp_path / "attn")
    assert res.returncode == 0, res.stderr
    pngs = sorted(p.name for p in (tmp_path / "attn").glob("*.png"))
    assert pngs == ["cross_layer0.png", "cross_layer1.png", "decoder_self_layer0.png",
                    "decoder_self_layer1.png", "encoder_layer0.png", "encoder_layer1.png"]


@pytest.mark.parametrize("content, expect", [
    (b"one\ttwo\nthree\tfour\tfive\n", "line 2"),               # ragged TSV row
    (b"", "the file is empty"),                                   # empty file
    (b"one\ttwo\n\xff\xfe\tbad\n", "line 2"),                     # not UTF-8
])
def test_bad_data_is_a_one_line_error_naming_the_file(tmp_path, content, expect):
    data = tmp_path / "bad.tsv"
    data.write_bytes(content)
    res = cli("train", data, "--out", tmp_path / "run", *TRAIN)
    assert res.returncode == 1
    assert "bad.tsv" in res.stderr and expect in res.stderr
    assert "Traceback" not in res.stderr


def test_complete_without_a_run_says_what_makes_one(tmp_path):
    res = cli("complete", tmp_path / "nope", "hello")
    assert res.returncode == 1 and "fastattn train" in res.stderr
    assert "Traceback" not in res.stderr


def test_train_options_reach_the_run_and_its_help_says_the_defaults(tmp_path):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    res = cli("train", data, "--out", run, "--model", "tiny", "--tokenizer", "word", "--steps",
              "12", "--batch-tokens", "64", "--valid", "0.25", "--schedule", "cosine",
              "--lr", "0.002", "--warmup", "3", "--clip-norm", "0", "--eval-every", "4",
              "--exact-sample", "1", "--checkpoint-every", "5", "--quiet")
    assert res.returncode == 0, res.stderr
    config = json.loads((run / "config.json").read_text())
    assert (config["schedule"], config["lr"], config["warmup"], config["clip_norm"]) == \
        ("cosine", 0.002, 3, None)
    records = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [4, 8, 12]
    assert all(e["valid_exact"] in (0.0, 1.0) for e in evals)
    lrs = [r["lr"] for r in records if r["kind"] == "step"]
    assert_close(lrs[2], 0.002, **TOL["float64_figure"], name="lr at step 3", dtype=None)
    assert lrs[-1] < lrs[2]                                             # warm-up, then cosine
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == [
        "step-00000005", "step-00000010", "step-00000012"]
    assert "the run's model is step" in res.stdout and "held-out exact match" in res.stdout
    helptext = cli("train", "--help").stdout
    for words in ("--schedule", "default: inverse_sqrt", "--clip-norm", "default: 1.0",
                  "--patience", "default: off", "tiny 2000", "--eval-every", "default: 200",
                  "--checkpoint-every", "--exact-sample"):
        assert words in " ".join(helptext.split()), words


@pytest.mark.parametrize("args, expect", [
    (("--schedule", "linear"), "invalid choice"),
    (("--clip-norm", "-1"), "expected a finite number >= 0"),
    (("--patience", "0"), "expected a positive integer"),
    (("--exact-sample", "x"), "expected an integer >= 0"),
])
def test_train_option_errors(tmp_path, args, expect):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    res = cli("train", data, "--out", tmp_path / "run", *TRAIN, *args)
    assert res.returncode == 2 and expect in res.stderr


def test_evaluate_prints_loss_perplexity_and_exact_match(tmp_path):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    assert cli("train", data, "--out", run, *TRAIN).returncode == 0
    held = write_data(tmp_path / "held.jsonl", "jsonl")
    res = cli("evaluate", run, held)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "4 pairs (0 skipped" in out and "loss " in out and "perplexity " in out
    assert "exact match (greedy)" in out and "of 4 pairs" in out
    res = cli("evaluate", run, held, "--json", "--exact-sample", "2")
    got = json.loads(res.stdout)
    from fastattn.train import read_pairs
    from fastattn.train.evaluate import Evaluator
    from fastattn.train.run import load_run
    r = load_run(run)
    want = Evaluator(read_pairs(held), src_tokenizer=r.src_tokenizer,
                     tgt_tokenizer=r.tgt_tokenizer, max_len=r.model.max_len,
                     exact_sample=2)(r.model)
    assert_close(got["valid_loss"], want["valid_loss"], **TOL["valid_loss_again"],
                 name="valid_loss", dtype=None)
    assert got["valid_exact"] == want["valid_exact"] and got["exact_pairs"] == 2
    assert got["pairs"] == 4 and got["skipped"] == 0
    res = cli("evaluate", run, tmp_path / "missing.tsv")
    assert res.returncode == 1 and "missing.tsv" in res.stderr and "Traceback" not in res.stderr


# ---- command-line edges ------------------------------------------------------------------------

def on_a_terminal(*args):
    """Run fastattn with its standard error on a pseudo-terminal -> (returncode, what the
    terminal got)."""
    import os
    import pty
    import fcntl
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # 100 columns
    proc = subprocess.Popen([sys.executable, "-m", "fastattn.cli", *map(str, args)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    got = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:                       # EIO: the child closed the terminal
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    return proc.wait(timeout=180), got.decode("utf-8", "replace")


def test_quiet_train_writes_json_lines_on_standard_error_even_on_a_terminal(tmp_path):
    pytest.importorskip("tqdm")
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    res = cli("train", data, "--out", tmp_path / "run", *TRAIN)        # TRAIN has --quiet
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in res.stderr.splitlines()]
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 10, 12]
    rc, shown = on_a_terminal("train", data, "--out", tmp_path / "run2", *TRAIN)
    assert rc == 0, shown
    lines = [line for line in shown.replace("\r\n", "\n").split("\n") if line]
    assert lines and all(json.loads(line)["kind"] in ("step", "eval", "info") for line in lines)
    rc, shown = on_a_terminal("train", data, "--out", tmp_path / "run3",
                              *[a for a in TRAIN if a != "--quiet"])
    assert rc == 0 and "12/12" in shown                              # without it: the bar


def test_demo_and_translate_quiet_still_mean_no_progress(tmp_path):
    res = cli("demo", "--quick", "--seconds", "1", "--quiet", "--out", tmp_path / "demo")
    assert res.returncode == 0, res.stderr
    assert '"kind"' not in res.stderr
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    assert cli("train", data, "--out", tmp_path / "run", *TRAIN).returncode == 0
    (tmp_path / "in.txt").write_text("one two\nfour\n")
    res = cli("translate", tmp_path / "run", "--input", tmp_path / "in.txt", "--output",
              tmp_path / "out.jsonl", "--quiet")
    assert res.returncode == 0 and res.stderr == ""


def test_complete_takes_options_after_the_run_dir_and_between_texts(tmp_path):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    assert cli("train", data, "--out", run, *TRAIN).returncode == 0
    want = cli("complete", run, "one two", "four five", "--method", "beam", "--beam-size", "2")
    assert want.returncode == 0 and len(want.stdout.splitlines()) == 2
    for argv in (("--method", "beam", "--beam-size", "2", "one two", "four five"),
                 ("one two", "--method", "beam", "four five", "--beam-size", "2")):
        res = cli("complete", run, *argv)
        assert res.returncode == 0, res.stderr
        assert res.stdout == want.stdout
    res = cli("complete", run, "--method", "beam", stdin="one two\n")      # standard input
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 1
    res = cli("complete")
    assert res.returncode == 2 and "required: RUN_DIR (or --model DIR)\n" in res.stderr


def test_plot_names_a_history_that_is_not_utf8(tmp_path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.jsonl").write_bytes(b'{"kind": "step", "step": 1, "loss": 2.0}\nx\xff\n')
    res = cli("plot", run)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "history.jsonl, line 2: not UTF-8" in res.stderr


def test_run_directory_files_follow_the_umask(tmp_path):
    import os
    import stat
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "fastattn.cli", "train", str(data), "--out",
                          str(run), *TRAIN[:-1], "--valid", "0.25", "--eval-every", "4"],
                         capture_output=True, text=True, timeout=180, umask=0o022)
    assert res.returncode == 0, res.stderr
    paths = [run, *run.rglob("*")]
    assert run / "model.safetensors" in paths and any(p.name.startswith("best-") for p in paths)
    for p in paths:
        assert stat.S_IMODE(os.stat(p).st_mode) == (0o755 if p.is_dir() else 0o644), p


def test_complete_cuts_a_too_long_line_as_translate_does_and_answers_the_others(tmp_path):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    assert cli("train", data, "--out", run, *TRAIN).returncode == 0
    lines = ["one two", " ".join(["one"] * 300), "", "four five"]     # 302 tokens > max_len
    res = cli("complete", run, stdin="".join(line + "\n" for line in lines))
    assert res.returncode == 0, res.stderr
    got = res.stdout.split("\n")[:-1]
    assert len(got) == 4 and got[2] == ""
    alone = cli("complete", run, "one two", "four five").stdout.splitlines()
    assert [got[0], got[3]] == alone
    assert res.stderr.splitlines() == [
        "fastattn complete: line 2: longer than the model's 256 source tokens: cut to them "
        "(as fastattn translate does)"]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    res = cli("translate", run, "--input", tmp_path / "in.txt", "--output",
              tmp_path / "out.jsonl", "--quiet")
    assert res.returncode == 0, res.stderr
    records = [json.loads(r) for r in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["output"] for r in records] == got                       # one rule, one output
    assert [r.get("truncated", False) for r in records] == [False, True, False, False]
    res = cli("complete", run, "four five", lines[1])                  # arguments alike
    assert res.returncode == 0 and res.stdout.splitlines() == [got[3], got[1]]
    assert "TEXT 2: longer than" in res.stderr


# ---- config.json and --resume --------------------------------------------------------------------

@pytest.mark.parametrize("content, expect", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"model": "tiny"}', "tokenizer, vocab_size, dropout"),
    ("[1, 2]", "expected a JSON object"),
    ("", "the file is empty"),
    ('{"model": "t\u00efny"}'.encode("latin-1"), "not UTF-8 text"),
], ids=["deep", "model_only", "list", "empty", "latin1"])
def test_a_bad_config_json_is_one_line_naming_it_in_every_command(tmp_path, content, expect):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    assert cli("train", data, "--out", run, *TRAIN).returncode == 0
    (run / "config.json").write_bytes(content if isinstance(content, bytes) else
                                      content.encode())
    (tmp_path / "in.txt").write_text("one two\n")
    for argv in (("complete", run, "one two"),
                 ("translate", run, "--input", tmp_path / "in.txt", "--output",
                  tmp_path / "out.jsonl", "--quiet"),
                 ("train", data, "--out", run, "--steps", "14", "--resume", "--quiet")):
        res = cli(*argv)
        assert res.returncode == 1, (argv, res.stderr)
        assert "Traceback" not in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
        assert f"{run / 'config.json'}: " in res.stderr and expect in res.stderr, res.stderr


def test_resume_takes_seed_and_settings_from_the_run(tmp_path):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    first = ("--tokenizer", "word", "--batch-tokens", "64", "--valid", "0.25", "--seed", "3",
             "--dropout", "0", "--eval-every", "4", "--quiet")
    assert cli("train", data, "--out", run, "--steps", "8", *first).returncode == 0
    res = cli("train", data, "--out", run, "--steps", "12", "--resume", "--quiet")
    assert res.returncode == 0, res.stderr                     # no --seed: the run's
    assert "12 steps" in res.stdout
    whole = tmp_path / "whole"
    assert cli("train", data, "--out", whole, "--steps", "12", *first).returncode == 0
    assert (run / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    res = cli("train", data, "--out", run, "--steps", "14", "--seed", "4", "--model", "small",
              "--tokenizer", "word", "--resume", "--quiet")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "seed=3, not 4 (--seed)" in res.stderr and "(--model)" in res.stderr
    assert "(--tokenizer)" not in res.stderr                  # the same as the run's: fine
    assert json.loads((run / "config.json").read_text())["steps"] == 12   # nothing changed


def test_complete_flags_input_that_is_not_utf8_as_translate_does(tmp_path):
    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    assert cli("train", data, "--out", run, *TRAIN).returncode == 0
    raw = b"one two\n\xff\xfe bad\nsix\n"
    res = subprocess.run([sys.executable, "-m", "fastattn.cli", "complete", str(run)],
                         input=raw, capture_output=True, timeout=180)
    err = res.stderr.decode()
    assert res.returncode == 1 and "Traceback" not in err, err
    assert res.stdout.decode().split("\n")[1] == ""          # its line: an empty answer
    assert len(res.stdout.decode().splitlines()) == 3
    reason = "not UTF-8: byte b'\\xff' at column 1"
    assert f"fastattn complete: line 2: {reason}" in err
    (tmp_path / "in.txt").write_bytes(raw)
    out = tmp_path / "out.jsonl"
    assert cli("translate", run, "--input", tmp_path / "in.txt", "--output", out,
               "--quiet").returncode == 0
    assert json.loads(out.read_text().splitlines()[1])["error"] == reason
    # the same for a TEXT argument (the OS hands its bytes over as they are)
    res = subprocess.run([sys.executable, "-m", "fastattn.cli", "complete", str(run),
                          "one two", b"\xff\xfe bad", "six"], capture_output=True, timeout=180)
    err = res.stderr.decode()
    assert res.returncode == 1 and f"fastattn complete: TEXT 2: {reason}" in err, err
    assert res.stdout.decode().split("\n")[1] == ""


def test_threads_reach_every_command_that_runs_a_model(tmp_path, monkeypatch, capsys):
    """--threads N on train, complete, translate and evaluate is fastattn.set_num_threads(N)
    before the command's work (in process, the calls recorded); a count fastattn refuses is a
    one-line error."""
    import fastattn
    from fastattn import cli as cli_module

    data = write_data(tmp_path / "pairs.tsv", "tsv")
    run = tmp_path / "run"
    asked = []
    real = fastattn.set_num_threads
    monkeypatch.setattr(fastattn, "set_num_threads", lambda n=None: asked.append(n) or real(n))
    previous = fastattn.get_num_threads()
    try:
        src = tmp_path / "in.txt"
        src.write_text("one two\n")
        for argv in (["train", str(data), "--out", str(run), *TRAIN, "--threads", "1"],
                     ["complete", str(run), "one two", "--threads", "1"],
                     ["translate", str(run), "--input", str(src), "--output",
                      str(tmp_path / "out.jsonl"), "--quiet", "--threads", "1"],
                     ["evaluate", str(run), str(data), "--threads", "1"]):
            asked.clear()
            assert cli_module.main(argv) == 0, (argv, capsys.readouterr().err)
            assert asked == [1], argv
        capsys.readouterr()
        assert cli_module.main(["complete", str(run), "x", "--threads", "100000"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fastattn complete: ") and "100000" in \
            err[0], err
    finally:
        real(previous)
