"""translate_file: outputs equal model.translate line for line; input order kept through length
sorting; empty, too long and invalid lines as documented; resuming from any cut of the output
gives the uninterrupted file byte for byte; refusals; argument errors; progress; the shared
Translator and a run carried as plain data."""
import io
import json
import os
import re

import numpy as np
import pytest

from fastattn.runners import Translator, run_from_state, run_state, translate_file
from fastattn.runners import progress as progress_mod
from fastattn.runners.files import STATE_SUFFIX
from runner_util import read_records, sentences, write_lines
from runner_util import run, run_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("single_thread")

STATS = {"lines", "skipped", "errors", "truncated", "batches", "source_tokens", "tokens",
         "padding", "seconds", "generate_seconds", "tokens_per_s", "lines_per_s"}


def translate(run, src, out, **kw):
    kw.setdefault("progress", False)
    return translate_file(run, src, out, **kw)


def test_outputs_equal_model_translate_line_for_line(run, tmp_path):
    texts = sentences(150, seed=2)
    src = write_lines(tmp_path / "in.txt", texts)
    stats = translate(run, src, tmp_path / "out.jsonl", batch_tokens=256, window=64)
    recs = read_records(tmp_path / "out.jsonl")
    assert [r["id"] for r in recs] == list(range(1, 151))
    assert [r["source"] for r in recs] == texts
    one_by_one = [run.complete([t])[0] for t in texts]
    assert [r["output"] for r in recs] == one_by_one == run.complete(texts)
    assert all(set(r) == {"id", "source", "output"} for r in recs)
    assert set(stats) == STATS
    assert stats["lines"] == 150 and stats["skipped"] == stats["errors"] == 0
    assert stats["source_tokens"] == sum(len(t.split()) + 2 for t in texts)
    assert stats["tokens"] > 0 and stats["batches"] > 1 and 0 <= stats["padding"] < 1
    assert 0 < stats["generate_seconds"] <= stats["seconds"]


def test_beam_search_outputs_equal_model_translate(run, tmp_path):
    texts = sentences(40, seed=3)
    src = write_lines(tmp_path / "in.txt", texts)
    translate(run, src, tmp_path / "out.jsonl", batch_tokens=128, method="beam", beam_size=3,
              max_new_tokens=20)
    assert [r["output"] for r in read_records(tmp_path / "out.jsonl")] == \
        [run.complete([t], method="beam", beam_size=3, max_new_tokens=20)[0] for t in texts]


def test_length_sorting_keeps_input_order_and_cuts_padding(run, tmp_path):
    # short (3 words: 5 ids) and long (8 words: 10 ids) lines interleaved; a 50-id budget
    # sorted by length gives batches of one length only: no padding at all
    texts = [" ".join(["one"] * 3) if i % 2 else " ".join(["two"] * 8) for i in range(40)]
    texts = [t.replace("one", w, 1) for t, w in zip(texts, sentences(40, seed=4, lo=1, hi=1))]
    src = write_lines(tmp_path / "in.txt", texts)
    stats = translate(run, src, tmp_path / "out.jsonl", batch_tokens=50, window=40)
    recs = read_records(tmp_path / "out.jsonl")
    assert [r["id"] for r in recs] == list(range(1, 41))
    assert [r["source"] for r in recs] == texts
    assert [r["output"] for r in recs] == run.complete(texts)
    assert stats["padding"] == 0.0 and stats["batches"] == 2 + 4       # 20 x 5 ids, 20 x 10
    # one line per batch, in input order: the same outputs, the same file
    translate(run, src, tmp_path / "one.jsonl", batch_tokens=1, window=1)
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "out.jsonl").read_bytes()


def test_empty_long_and_invalid_lines(run, tmp_path):
    long_line = " ".join(sentences(1, seed=5, lo=300, hi=300))     # 302 ids > max_len 256
    lines = [b"one two", b"", b"caf\xe9 three", long_line.encode(), b"three four\r",
             b"\xef\xbb\xbf", b"   "]
    src = write_lines(tmp_path / "in.txt", lines)
    stats = translate(run, src, tmp_path / "out.jsonl")
    recs = read_records(tmp_path / "out.jsonl")
    assert [r["id"] for r in recs] == list(range(1, 8))
    ok, empty, bad, long_, crlf, bom_mid, spaces = recs
    assert ok["output"] == run.complete(["one two"])[0]
    assert empty == {"id": 2, "source": "", "output": ""}
    assert bad["output"] is None and bad["source"] == "caf\ufffd three"
    assert bad["error"].startswith("not UTF-8") and "column 4" in bad["error"]
    assert long_["truncated"] is True and long_["source"] == long_line
    cut = " ".join(long_line.split()[:254])                         # <start> 254 words <end>
    assert long_["output"] == run.complete([cut])[0]
    assert crlf["source"] == "three four" and crlf["output"] == run.complete(["three four"])[0]
    assert bom_mid["source"] == "\ufeff"            # a byte order mark only counts at the start
    assert spaces["output"] == run.complete(["   "])[0]    # no word, but <start> <end> is read
    assert stats["errors"] == 1 and stats["truncated"] == 1
    # skip instead of truncate; a lower limit of our own
    translate(run, src, tmp_path / "skip.jsonl", too_long="skip", max_source_tokens=4)
    recs = read_records(tmp_path / "skip.jsonl")
    assert recs[0]["output"] == run.complete(["one two"])[0]          # 4 ids: fits
    assert recs[3]["output"] is None and "302 source tokens, at most 4" in recs[3]["error"]
    assert recs[4]["output"] == run.complete(["three four"])[0]
    translate(run, src, tmp_path / "skip3.jsonl", too_long="skip", max_source_tokens=3)
    assert read_records(tmp_path / "skip3.jsonl")[4]["error"] == \
        "too long: 4 source tokens, at most 3 (too_long='skip')"


def test_jsonl_input(run, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + "\n".join([
        json.dumps({"source": "one two", "other": 1}), "", "not json", json.dumps([1, 2]),
        json.dumps({"target": "x"}), json.dumps({"source": 3}), json.dumps({"source": "\ud800"}),
        json.dumps({"source": "three"})]).encode())                  # no final line end
    stats = translate(run, src, tmp_path / "out.jsonl")
    recs = read_records(tmp_path / "out.jsonl")
    assert [r["id"] for r in recs] == list(range(1, 9))
    assert recs[0] == {"id": 1, "source": "one two", "output": run.complete(["one two"])[0]}
    assert recs[1] == {"id": 2, "source": "", "output": ""}
    assert recs[2]["error"].startswith("not valid JSON") and recs[2]["source"] == "not json"
    for r in recs[3:6]:
        assert r["output"] is None and r["error"] == 'not a JSON object with a str "source" field'
    assert recs[6]["source"] == "\ud800" and recs[6]["output"] == run.complete(["\ud800"])[0]
    assert recs[7]["output"] == run.complete(["three"])[0]
    assert stats["errors"] == 4
    # the same file read as text: one source per line, as written
    translate(run, src, tmp_path / "text.jsonl", input_format="text")
    assert read_records(tmp_path / "text.jsonl")[2]["source"] == "not json"


@pytest.fixture
def corpus(run, tmp_path):
    """An input over several windows and batches, and its uninterrupted output."""
    texts = sentences(90, seed=6)
    texts[10] = ""
    src = write_lines(tmp_path / "in.txt", texts)
    full = tmp_path / "full.jsonl"
    translate(run, src, full, batch_tokens=64, window=32)
    return src, full


@pytest.mark.parametrize("cut", ["nothing", "mid_line", "line_end", "window_end", "empty",
                                 "garbage_line"])
def test_resume_after_any_cut_gives_the_uninterrupted_file(run, tmp_path, corpus, cut):
    src, full = corpus
    data = full.read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    out = tmp_path / "out.jsonl"
    translate(run, src, out, batch_tokens=64, window=32)            # the same options
    part = {"nothing": data, "mid_line": data[:ends[40] + 7], "line_end": data[:ends[40]],
            "window_end": data[:ends[31]], "empty": b"",
            "garbage_line": data[:ends[40]] + b'{"id": 42, "sou\n'}[cut]
    out.write_bytes(part)
    stats = translate(run, src, out, batch_tokens=64, window=32)
    assert out.read_bytes() == data
    kept = {"nothing": 90, "mid_line": 41, "line_end": 41, "window_end": 32, "empty": 0,
            "garbage_line": 41}[cut]
    assert stats["skipped"] == kept and stats["lines"] == 90 - kept
    assert json.loads((tmp_path / ("out.jsonl" + STATE_SUFFIX)).read_text())["complete"]


def test_resume_with_sampling_repeats_the_draws(run, tmp_path):
    src = write_lines(tmp_path / "in.txt", sentences(60, seed=7))
    kw = dict(batch_tokens=64, window=16, method="sample", seed=5, top_k=4, temperature=2.0)
    full, out = tmp_path / "full.jsonl", tmp_path / "out.jsonl"
    translate(run, src, full, **kw)
    data = full.read_bytes()
    out.write_bytes(data[:data.index(b'{"id": 30,') + 5])
    os.replace(tmp_path / ("full.jsonl" + STATE_SUFFIX), tmp_path / ("out.jsonl" + STATE_SUFFIX))
    translate(run, src, out, **kw)
    assert out.read_bytes() == data
    translate(run, src, tmp_path / "other.jsonl", **dict(kw, seed=6))
    assert (tmp_path / "other.jsonl").read_bytes() != data


def test_resume_refuses_another_model_input_or_options(run, tmp_path, corpus):
    src, full = corpus
    with pytest.raises(ValueError, match="exists: resume it"):
        translate(run, src, full, resume=False, batch_tokens=64, window=32)
    with pytest.raises(ValueError, match=r"batch_tokens 64 -> 4096; window 32 -> 2048"):
        translate(run, src, full)
    with pytest.raises(ValueError, match="max_new_tokens 64 -> 10"):
        translate(run, src, full, batch_tokens=64, window=32, max_new_tokens=10)
    other = write_lines(tmp_path / "other.txt", sentences(90, seed=6) + ["more"])
    with pytest.raises(ValueError, match="another input"):
        translate(run, other, full, batch_tokens=64, window=32)
    run.model.generator.bias[0] += 1.0
    try:
        with pytest.raises(ValueError, match="another model"):
            translate(run, src, full, batch_tokens=64, window=32)
    finally:
        run.model.generator.bias[0] -= 1.0
    mine = write_lines(tmp_path / "mine.jsonl", ["keep me"])
    with pytest.raises(ValueError, match="not started by translate_file"):
        translate(run, src, mine)
    assert mine.read_text() == "keep me\n"
    stats = translate(run, src, mine, overwrite=True, batch_tokens=64, window=32)
    assert stats["lines"] == 90 and mine.read_bytes() == full.read_bytes()


def test_argument_errors_name_the_argument(run, run_dir, tmp_path):
    src = write_lines(tmp_path / "in.txt", ["one"])
    out = tmp_path / "out.jsonl"
    with pytest.raises(FileNotFoundError, match="no such run directory"):
        translate(tmp_path / "nope", src, out)
    with pytest.raises(FileNotFoundError, match="input_path .*no such file"):
        translate(run, tmp_path / "missing.txt", out)
    with pytest.raises(ValueError, match="input_path .* is a directory"):
        translate(run, tmp_path, out)
    with pytest.raises(ValueError, match="output_path .* is a directory"):
        translate(run, src, tmp_path)
    with pytest.raises(FileNotFoundError, match="output_path .*no such directory"):
        translate(run, src, tmp_path / "a" / "out.jsonl")
    with pytest.raises(ValueError, match="output_path .* is the input file"):
        translate(run, src, src)
    with pytest.raises(TypeError, match="input_path must be a path"):
        translate(run, 3, out)
    for kw, match in [(dict(batch_tokens=0), "batch_tokens must be an int >= 1"),
                      (dict(window=0), "window must be an int >= 1"),
                      (dict(method="top"), "method must be one of"),
                      (dict(too_long="cut"), "too_long must be one of"),
                      (dict(input_format="csv"), "input_format must be one of"),
                      (dict(max_source_tokens=1000), "max_source_tokens must be an int in"),
                      (dict(max_new_tokens=0), None), (dict(beam_size=0), "beam_size"),
                      (dict(seed=-1), "seed must be an int >= 0"),
                      (dict(progress="yes"), "progress must be")]:
        if match is None:
            translate(run, src, tmp_path / "zero.jsonl", **kw)     # max_new_tokens=0 is fine
            continue
        with pytest.raises(ValueError, match=match):
            translate(run_dir, src, out, **kw)
        assert not out.exists()                       # nothing written before the check


def test_progress_json_lines_and_bar(run, tmp_path, monkeypatch):
    src = write_lines(tmp_path / "in.txt", sentences(30, seed=8))
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    stats = translate(run, src, tmp_path / "out.jsonl", batch_tokens=32, progress=1)
    lines = [json.loads(line) for line in err.getvalue().splitlines()]
    progress = [r for r in lines if r["kind"] == "progress"]
    assert len(progress) == stats["batches"] > 1
    assert progress[-1]["lines"] == progress[-1]["total"] == 30 and progress[-1]["eta_s"] == 0
    assert {"lines_per_s", "tokens_per_s", "padding"} <= set(progress[0])
    assert [r["lines"] for r in progress] == sorted(r["lines"] for r in progress)
    assert lines[-1]["kind"] == "done" and set(lines[-1]) == STATS | {"kind"}
    # a resumed job says so first
    err.truncate(0)
    err.seek(0)
    translate(run, src, tmp_path / "out.jsonl", batch_tokens=32, progress=True)
    first = json.loads(err.getvalue().splitlines()[0])
    assert first == {"kind": "info", "message": f"resuming {tmp_path / 'out.jsonl'} after "
                                                f"line 30"}
    # a terminal gets a bar of lines
    pytest.importorskip("tqdm")

    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty = Tty()
    bar = progress_mod.make_progress(True, 30, 0, stream=tty)
    bar.batch({"lines": 12, "total": 30, "tokens_per_s": 99.0, "padding": 0.25,
               "lines_per_s": 1.0, "eta_s": 1.0})
    bar.close()
    assert "12/30" in tty.getvalue() and "lines" in tty.getvalue()


def test_translator_lists_and_a_run_as_plain_data(run):
    texts = sentences(25, seed=9) + ["", 7, None]
    tr = Translator.from_run(run, batch_tokens=40)
    res = tr.translate(texts)
    assert [r.output for r in res[:25]] == run.complete(texts[:25])
    assert res[25].output == "" and res[25].error is None
    assert res[26].output is None and "must be a str, got int" in res[26].error
    assert all(r.tokens >= 1 and r.source_tokens >= 3 for r in res[:25])
    # weights carried as read-only arrays: the rebuilt model uses them as they are
    state = run_state(run)
    frozen = {k: v.copy() for k, v in state["weights"].items()}
    for v in frozen.values():
        v.flags.writeable = False
    clone = run_from_state(dict(state, weights=frozen))
    assert all(np.shares_memory(a, frozen[k]) for k, a in clone.model.state_dict().items())
    assert Translator.from_run(clone).translate(texts[:25]) == \
        Translator.from_run(run).translate(texts[:25])


def test_compute_type_quantizes_the_run_and_a_resume_must_keep_it(run_dir, tmp_path):
    from fastattn.train.run import load_run

    src = write_lines(tmp_path / "in.txt", sentences(30, seed=5))
    out = tmp_path / "out.jsonl"
    translate_file(run_dir, src, out, compute_type="int8", progress=False)
    want = load_run(run_dir, compute_type="int8").complete(sentences(30, seed=5))
    assert [r["output"] for r in read_records(out)] == want
    with pytest.raises(ValueError, match="run"):       # the int8 run is not the float32 one
        translate_file(run_dir, src, out, resume=True, progress=False)
    with pytest.raises(ValueError, match="loaded already"):
        translate_file(load_run(run_dir), src, tmp_path / "o2.jsonl", compute_type="bf16",
                       progress=False)


@pytest.mark.parametrize("kind", ["int8", "bf16", "bfloat16"])
def test_a_quantized_run_reaches_the_workers_as_it_is(run_dir, kind):
    """run_state / run_from_state (what Ray and Dask ship) keep quantized weights as stored:
    the worker's model computes exactly what the driver's does, not a float32 rebuild."""
    from fastattn.runners.core import run_from_state, run_hash, run_state
    from fastattn.train.run import load_run

    run = load_run(run_dir, compute_type=kind)
    state = run_state(run)
    for arr in state["weights"].values():
        arr.setflags(write=False)                 # as from Ray's object store
    worker = run_from_state(state)
    assert worker.model.compute_type == kind
    assert run_hash(worker) == run_hash(run)
    texts = sentences(20, seed=9)
    assert worker.complete(texts) == run.complete(texts)


def test_a_key_given_twice_in_the_resume_state_is_refused(run, tmp_path, corpus):
    src, full = corpus
    state = tmp_path / ("full.jsonl" + STATE_SUFFIX)
    text = state.read_text()
    state.write_text(text.replace('"run":', '"run": "another", "run":', 1))
    before = full.read_bytes()
    with pytest.raises(ValueError, match=rf"^{re.escape(str(state))}: cannot read the resume "
                                         r"state \(the key 'run' is given twice in one object\)"):
        translate(run, src, full, batch_tokens=64, window=32)
    assert full.read_bytes() == before


def test_an_output_line_with_a_key_given_twice_is_cut_off_on_resume(run, tmp_path, corpus):
    src, full = corpus
    data = full.read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    line = data[ends[40]:ends[41]]
    assert line.startswith(b'{"id": 42,')
    out = tmp_path / "out.jsonl"
    translate(run, src, out, batch_tokens=64, window=32)
    out.write_bytes(data[:ends[40]] + line.replace(b'{"id": 42,', b'{"id": 7, "id": 42,', 1))
    stats = translate(run, src, out, batch_tokens=64, window=32)
    assert out.read_bytes() == data
    assert stats["skipped"] == 41 and stats["lines"] == 49


def test_a_jsonl_input_line_with_a_key_given_twice_is_an_error_record(run, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"source": "you win or you die"}\n'
                   '{"source": "ignored", "source": "you win or you die"}\n')
    translate(run, src, tmp_path / "out.jsonl")
    first, second = read_records(tmp_path / "out.jsonl")
    assert "error" not in first
    assert second["error"] == "not valid JSON: the key 'source' is given twice in one object"
