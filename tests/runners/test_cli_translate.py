"""``fastattn translate`` end to end: killed with SIGKILL mid-run (twice), then resumed, the output
is the uninterrupted run's byte for byte; one-line errors; the defaults are the library's; the
core install imports neither Ray nor Dask, and without them the runners name the extra."""
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import modules_loaded_by, run_child
from fastattn import cli
from fastattn.runners import DEFAULT_BATCH_TOKENS, DEFAULT_WINDOW, translate_file
from runner_util import read_records, sentences, write_lines
from runner_util import run, run_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("single_thread")

OPTIONS = ("--batch-tokens", "128", "--window", "64", "--threads", "1", "--quiet")


def fastattn_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "fastattn.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "fastattn.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def kill_once_lines_grow(proc, out, more_than, timeout=60):
    """SIGKILL `proc` as soon as `out` holds more than `more_than` whole lines; the lines then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") > more_than:
            break
        assert proc.poll() is None, proc.communicate()[1].decode()
        time.sleep(0.005)
    assert proc.poll() is None, "the job ended before it could be killed: give it more lines"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return out.read_bytes().count(b"\n")


def test_sigkill_mid_run_then_resume_gives_every_line_once_with_the_same_outputs(run, run_dir,
                                                                                  tmp_path):
    texts = sentences(2000, seed=11)
    src = write_lines(tmp_path / "in.txt", texts)
    out = tmp_path / "out.jsonl"
    args = ("translate", run_dir, "--input", src, "--output", out, *OPTIONS)
    first = kill_once_lines_grow(start(*args), out, 0)
    second = kill_once_lines_grow(start(*args, "--resume"), out, first + 64)
    assert 0 < first < second < len(texts)
    res = fastattn_cli(*args, "--resume")
    assert res.returncode == 0, res.stderr
    assert f"into {out} after the {second} already there" in res.stdout
    recs = read_records(out)
    assert [r["id"] for r in recs] == list(range(1, len(texts) + 1))
    translate_file(run, src, tmp_path / "whole.jsonl", batch_tokens=128, window=64,
                   progress=False)
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


def test_summary_and_one_line_errors(run_dir, tmp_path):
    src = write_lines(tmp_path / "in.txt", ["one two", "", "three"])
    out = tmp_path / "out.jsonl"
    res = fastattn_cli("translate", run_dir, "--input", src, "--output", out, *OPTIONS)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"3 lines translated into {out} (0 errors, 0 truncated): ")
    assert res.stderr == ""                                   # --quiet
    assert len(read_records(out)) == 3
    for args, message in [
            ((), "exists: resume it"),
            (("--input", tmp_path / "missing.txt"), "no such file"),
            (("--batch-tokens", "8", "--resume"), "batch_tokens 128 -> 8")]:
        argv = ["translate", run_dir, "--input", src, "--output", out, *OPTIONS, *args]
        if "--input" in args:
            argv = ["translate", run_dir, *args, "--output", tmp_path / "o.jsonl"]
        res = fastattn_cli(*argv)
        assert res.returncode == 1, res.stdout
        assert res.stderr.startswith("fastattn translate: ") and message in res.stderr
        assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.stderr
    res = fastattn_cli("translate", tmp_path / "nope", "--input", src, "--output", out)
    assert res.returncode == 1 and "fastattn train" in res.stderr
    res = fastattn_cli("translate", run_dir, "--input", src, "--output", out, "--resume",
                       "--overwrite")
    assert res.returncode == 2 and "not allowed with" in res.stderr


def test_cli_defaults_are_the_library_defaults():
    args = cli._parser().parse_args(["translate", "run", "--input", "i", "--output", "o"])
    assert args.batch_tokens == DEFAULT_BATCH_TOKENS and args.window == DEFAULT_WINDOW
    assert args.max_new_tokens == 64 and args.too_long == "truncate" and not args.resume


def modules_after(code):
    """The ray and dask modules `code` leaves loaded in a fresh interpreter."""
    return modules_loaded_by(code, "ray", "dask", "distributed")


def test_the_core_install_imports_neither_ray_nor_dask():
    assert modules_after("import fastattn.runners, fastattn.cli") == []
    assert modules_after("import fastattn.runners.ray, fastattn.runners.dask") == []


@pytest.mark.parametrize("module, call, extra", [
    ("ray", "translate_dataset(None, 'run')", "fastattn[ray]"),
    ("dask", "translate_bag(None, 'run')", "fastattn[dask]"),
    ("dask", "translate_dataframe(None, 'run')", "fastattn[dask]")])
def test_without_the_engine_an_import_error_names_the_extra(module, call, extra):
    code = f"""
        import sys
        sys.modules[{module!r}] = None                      # as if it were not installed
        from fastattn.runners.{module} import *
        try:
            {call}
        except ImportError as exc:
            assert {extra!r} in str(exc), exc
            print("named")
        """
    res = run_child(textwrap.dedent(code), timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "named"
