"""The runners' and the CLI's beam: --beam-size / beam_size above the target vocabulary (or
MAX_BEAM_SIZE) is refused before a line is read (one line on stderr, exit 1), and a source
counts beam_size times against batch_tokens, so a wide beam does not multiply a batch's
decoder state (the outputs stay model.translate's)."""
import pytest

from fastattn import cli
from fastattn.runners import Translator
from runner_util import run, run_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("single_thread")


def test_runners_and_cli_refuse_the_beam(run, run_dir, tmp_path, capsys):
    V = run.model.tgt_vocab_size
    with pytest.raises(ValueError, match=f"beam_size must be an int >= 1 and <= {V} "):
        Translator.from_run(run, method="beam", beam_size=10 ** 6)
    src = tmp_path / "in.txt"
    src.write_text("one two\n")
    for args in (["complete", run_dir, "one two"],
                 ["translate", run_dir, "--input", src, "--output", tmp_path / "o.jsonl"]):
        status = cli.main([str(a) for a in args] + ["--method", "beam", "--beam-size",
                                                     "1000000"])
        err = capsys.readouterr().err
        assert status == 1 and err.count("\n") == 1 and f"<= {V} (the target" in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_runner_batches_count_each_source_beam_size_times(run):
    lengths = [5] * 40
    greedy = Translator.from_run(run, batch_tokens=100)
    beam = Translator.from_run(run, batch_tokens=100, method="beam", beam_size=4)
    assert max(map(len, greedy.plan(lengths))) == 20                 # 20 x 5 ids
    assert max(map(len, beam.plan(lengths))) == 5                    # 5 x 4 beams x 5 ids
    texts = ["one two three", "four", "five six seven eight nine"] * 4
    assert [r.output for r in beam.translate(texts)] == \
        run.complete(texts, method="beam", beam_size=4)
