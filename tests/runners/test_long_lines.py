"""A source line of tens of megabytes costs ``fastattn complete`` / ``translate`` what its
first max_source_tokens cost, not a token object per word of it: the line is cut before it
is split (Tokenizer.encode_head). Peak memory is measured in a child process (its
ru_maxrss) against the same command on a short line; the outputs are those of the whole
line's tokens cut to the model's limit."""
import json
import subprocess
import sys

import pytest

from conftest import child_env
from runner_util import run, run_dir  # noqa: F401 (fixtures)
from runner_util import sentences

pytestmark = pytest.mark.usefixtures("single_thread")

LINE_BYTES = 40 << 20            # one source line of 40 MiB of words
# extra peak memory allowed for the long line, in line sizes: the line as read (bytes and
# str, a copy or two of it); one token object per word would take ~30 line sizes
ALLOWED_LINE_COPIES = 8


def peak_rss(args, stdin=None):
    """(peak resident bytes of `fastattn ARGS` in a child, its CompletedProcess)."""
    code = ("import resource, subprocess, sys\n"
            "p = subprocess.run([sys.executable, '-m', 'fastattn.cli', *sys.argv[1:]],"
            " stdin=sys.stdin, capture_output=True, text=True)\n"
            "sys.stderr.write(p.stderr); sys.stdout.write(p.stdout)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(p.returncode)\n")
    with open(stdin, "rb") if stdin else open("/dev/null", "rb") as f:
        proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], stdin=f,
                              capture_output=True, text=True, env=child_env({
                                  "OMP_NUM_THREADS": "1"}), timeout=300)
    assert proc.returncode == 0, proc.stderr
    *out, kib = proc.stdout.splitlines()
    return int(kib) * 1024, "\n".join(out)


@pytest.fixture(scope="module")
def long_line(tmp_path_factory):
    words = " ".join(sentences(2000, seed=3, lo=5, hi=12)) + " "
    text = (words * (LINE_BYTES // len(words) + 1))[:LINE_BYTES].rstrip()
    path = tmp_path_factory.mktemp("long") / "long.txt"
    path.write_text(text + "\n")
    return path, text


def test_complete_cuts_a_long_line_before_splitting_it(run, run_dir, long_line, tmp_path):
    path, text = long_line
    short = tmp_path / "short.txt"
    short.write_text("one two three\n")
    base, _ = peak_rss(["complete", run_dir], stdin=short)
    peak, out = peak_rss(["complete", run_dir], stdin=path)
    assert peak - base < ALLOWED_LINE_COPIES * LINE_BYTES, (peak >> 20, base >> 20)
    cut = " ".join(text[:100_000].split()[:254])                   # <start> 254 words <end>
    assert out == run.complete([cut])[0]


def test_translate_cuts_a_long_line_before_splitting_it(run, run_dir, long_line, tmp_path):
    path, text = long_line
    short = tmp_path / "short.txt"
    short.write_text("one two three\n")
    args = ["--quiet", "--window", "4"]
    base, _ = peak_rss(["translate", run_dir, "--input", short, "--output",
                        tmp_path / "short.jsonl", *args])
    peak, _ = peak_rss(["translate", run_dir, "--input", path, "--output",
                        tmp_path / "long.jsonl", *args])
    assert peak - base < ALLOWED_LINE_COPIES * LINE_BYTES, (peak >> 20, base >> 20)
    rec = json.loads((tmp_path / "long.jsonl").read_text())
    cut = " ".join(text[:100_000].split()[:254])
    assert rec["truncated"] and rec["output"] == run.complete([cut])[0]
