"""A run's model and tokenizers must belong together: a tokenizer file swapped in from another
run (another vocabulary size, other special ids, or another vocabulary of the same size) is
refused when the run is loaded -- by load_run, load_any, the runners' Translator and the
evaluate / complete / translate commands (one line on stderr, exit 1) -- instead of a
meaningless loss or garbage outputs with exit 0."""
import json
import shutil

import pytest

from fastattn import cli
from fastattn.runners import Translator, translate_file
from fastattn.runners.core import load_any
from fastattn.tokenizers import WordTokenizer
from fastattn.train.run import load_run, train_run
from runner_util import write_lines

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny_run(out, words):
    """A run trained for one step on pairs of `words` (a word tokenizer of their vocabulary)."""
    pairs = [(f"{a} {b}", f"{b} {a}") for a in words for b in words]
    run, _ = train_run(pairs, out, model="tiny", tokenizer="word", steps=1, batch_tokens=256,
                       valid=0, dropout=0.0, progress=False)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run, another of the same vocabulary size (other words), one of another size."""
    base = tmp_path_factory.mktemp("runs")
    return {"a": tiny_run(base / "a", ["one", "two", "three"]).path,
            "same_size": tiny_run(base / "same", ["red", "green", "blue"]).path,
            "other_size": tiny_run(base / "other", ["one", "two", "three", "four"]).path}


def swapped(runs, tmp_path, donor, side="src"):
    """A copy of run a with the `side` tokenizer file of run `donor`."""
    run_dir = tmp_path / f"a_with_{donor}_{side}"
    shutil.copytree(runs["a"], run_dir)
    shutil.copy(f"{runs[donor]}/{side}_tokenizer.json", run_dir / f"{side}_tokenizer.json")
    return run_dir


def fastattn(*args, capsys):
    status = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    return status, err


def test_the_run_records_what_its_model_was_trained_with(runs):
    config = json.loads(open(f"{runs['a']}/config.json").read())
    record = config["tokenizers"]["src"]
    assert record["vocab_size"] == 7 and record["pad_id"] == 0 and record["end_id"] == 3
    assert len(record["vocab_sha256"]) == 64 and config["tokenizers"]["tgt"] == record
    load_run(runs["a"])                                          # its own files: fine


@pytest.mark.parametrize("donor, side, message", [
    ("other_size", "src", "the tokenizer has 8 tokens, the model's src_vocab_size is 7"),
    ("other_size", "tgt", "the tokenizer has 8 tokens, the model's tgt_vocab_size is 7"),
    ("same_size", "src", "its vocabulary (SHA-256"),
    ("same_size", "tgt", "its vocabulary (SHA-256")])
def test_a_swapped_tokenizer_is_refused_on_load(runs, tmp_path, capsys, donor, side, message):
    run_dir = swapped(runs, tmp_path, donor, side)
    tok_file = f"{run_dir}/{side}_tokenizer.json"
    other = "model.safetensors" if donor == "other_size" else "config.json"
    for load in (load_run, load_any):
        with pytest.raises(ValueError, match="does not match") as info:
            load(run_dir)
        assert str(info.value).startswith(f"{tok_file} does not match {run_dir}/{other}: ")
        assert message in str(info.value)
    data = write_lines(tmp_path / "pairs.tsv", ["one two\ttwo one"])
    for args in (("evaluate", run_dir, data), ("complete", run_dir, "one two"),
                 ("translate", run_dir, "--input", data, "--output", tmp_path / "o.jsonl",
                  "--quiet")):
        status, err = fastattn(*args, capsys=capsys)
        assert status == 1, args
        assert err.startswith(f"fastattn {args[0]}: {tok_file} does not match ") and \
            message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o.jsonl").exists()


def test_special_ids_other_than_the_models_are_refused(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["a"], run_dir)
    words = ["one", "two", "three"]
    # <start> and <end> trade places: the same size, the same <pad>
    WordTokenizer(specials=("<pad>", "<unk>", "<end>", "<start>")).train(words).save(
        run_dir / "src_tokenizer.json")
    with pytest.raises(ValueError, match="the tokenizer's start_id is 3, the run was trained "
                                         "with 2"):
        load_run(run_dir)
    # another <pad>: refused by the model's own pad_id, even without config.json's record
    WordTokenizer(specials=("<unk>", "<pad>", "<start>", "<end>")).train(words).save(
        run_dir / "src_tokenizer.json")
    config = json.loads((run_dir / "config.json").read_text())
    del config["tokenizers"]
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="the tokenizer's <pad> id is 1, the model was trained "
                                         "with pad_id=0"):
        load_run(run_dir)


def test_runs_written_before_the_record_still_load_and_check_sizes(runs, tmp_path):
    run_dir = swapped(runs, tmp_path, "other_size")
    config = json.loads((run_dir / "config.json").read_text())
    del config["tokenizers"]
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="the model's src_vocab_size is 7"):
        load_run(run_dir)
    shutil.copy(f"{runs['a']}/src_tokenizer.json", run_dir / "src_tokenizer.json")
    assert load_run(run_dir).config["tokenizers"] is None


def test_the_translator_refuses_tokenizers_of_another_size(runs, tmp_path):
    run, other = load_run(runs["a"]), load_run(runs["other_size"])
    with pytest.raises(ValueError, match="src_tokenizer does not match the model: it has 8 "
                                         "tokens, the model's src_vocab_size is 7"):
        Translator(run.model, other.src_tokenizer, run.tgt_tokenizer)
    with pytest.raises(ValueError, match="tgt_tokenizer does not match"):
        Translator(run.model, run.src_tokenizer, other.tgt_tokenizer)
    run.tgt_tokenizer = other.tgt_tokenizer
    src = write_lines(tmp_path / "in.txt", ["one two"])
    with pytest.raises(ValueError, match="tgt_tokenizer does not match"):
        translate_file(run, src, tmp_path / "out.jsonl", progress=False)
