"""fit(): a tiny copy task learned to exact greedy outputs; one seed, one history; every
schedule; skipped pairs; evaluation; callbacks; argument errors; progress output."""
import json
import math

import numpy as np
import pytest

from fastattn import optim
from fastattn.train import History, fit
from conftest import assert_close
from tolerances import TOL
from train_util import char_tokenizer, tiny_model, untimed, words  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")


def short_run(tok, pairs, **kw):
    args = dict(src_tokenizer=tok, tgt_tokenizer=tok, max_steps=6, batch_tokens=128,
                lr=1e-2, warmup=3, progress=False)
    args.update(kw)
    return fit(tiny_model(tok, dropout=args.pop("dropout", 0.0)), pairs, **args)


@pytest.fixture
def tok():
    return char_tokenizer()


@pytest.fixture
def pairs():
    return [(w, w) for w in words(64)]


@pytest.mark.long
def test_copy_task_reaches_near_zero_loss_and_exact_greedy_outputs(tok):
    train = words(1000)
    model = tiny_model(tok)
    history = fit(model, [(w, w) for w in train], src_tokenizer=tok, tgt_tokenizer=tok,
                  valid_pairs=[(w, w) for w in words(50, seed=1)], max_steps=1000,
                  batch_tokens=1024, schedule="cosine", lr=1e-2, warmup=50,
                  label_smoothing=0.0, eval_every=500, progress=False)
    assert len(history.steps) == 1000
    assert np.mean(history.losses[-20:]) < 0.01
    assert [e["step"] for e in history.evals] == [500, 1000]
    assert history.evals[-1]["valid_loss"] < 0.02
    assert model.training                               # eval() only during evaluation
    model.eval()
    assert model.translate(train[:20], tok, tok, max_new_tokens=10) == train[:20]
    held_out = words(40, seed=2)
    out = model.translate(held_out, tok, tok, max_new_tokens=10)
    assert sum(o == w for o, w in zip(out, held_out)) >= 36


def test_one_seed_gives_one_history_and_another_seed_another(tok, pairs):
    a = short_run(tok, pairs, dropout=0.1, seed=3)
    b = short_run(tok, pairs, dropout=0.1, seed=3)
    c = short_run(tok, pairs, dropout=0.1, seed=4)
    assert untimed(a) == untimed(b)
    assert a.losses != c.losses
    for r in a.steps:
        assert set(r) == {"kind", "step", "epoch", "loss", "lr", "tokens", "tokens_per_s",
                          "seconds", "padding"}
        assert r["tokens"] > 0 and r["seconds"] > 0 and 0.0 <= r["padding"] < 1.0
    assert [r["step"] for r in a.steps] == list(range(1, 7))


def test_step_records_count_target_tokens_and_epochs(tok):
    pairs = [("ab", "abc"), ("abcd", "a")]
    h = short_run(tok, pairs, max_steps=None, epochs=3, batch_tokens=1000)
    assert [r["epoch"] for r in h.steps] == [0, 1, 2]   # one batch per epoch
    assert all(r["tokens"] == 3 + 1 + 1 + 1 for r in h.steps)   # text + <end>, per pair
    # (2, 7) padded sources+targets: 4+6 source ids, 5+3 target ids of 2*6 + 2*5 positions
    assert_close(h.steps[0]["padding"], 1 - (4 + 6 + 5 + 3) / (2 * 6 + 2 * 5),
                 **TOL["float64_figure"], name="padding", dtype=None)


def test_epochs_default_to_one_and_cover_every_pair(tok, pairs):
    h = short_run(tok, pairs, max_steps=None, batch_tokens=64)
    assert h.steps and {r["epoch"] for r in h.steps} == {0}
    assert sum(r["tokens"] for r in h.steps) == sum(len(t) + 1 for _, t in pairs)


@pytest.mark.parametrize("schedule, lr, expect", [
    ("constant", 0.02, lambda s: 0.02),
    ("inverse_sqrt", 0.02, lambda s: 0.02 * min(s / 3, math.sqrt(3 / s))),
    ("inverse_sqrt", None, lambda s: 32 ** -0.5 * min(s ** -0.5, s * 3 ** -1.5)),
    ("cosine", 0.02, lambda s: optim.warmup_cosine(0.02, 3, 6)(s)),
    (lambda s: 0.001 * s, None, lambda s: 0.001 * s),
])
def test_schedules_set_each_steps_lr(tok, pairs, schedule, lr, expect):
    h = short_run(tok, pairs, schedule=schedule, lr=lr)
    assert [r["lr"] for r in h.steps] == pytest.approx([expect(s) for s in range(1, 7)])


def test_inverse_sqrt_with_lr_peaks_at_lr_after_warmup(tok, pairs):
    h = short_run(tok, pairs, schedule="inverse_sqrt", lr=0.5, warmup=4)
    lrs = [r["lr"] for r in h.steps]
    assert_close(max(lrs), 0.5, **TOL["float64_figure"], name="peak lr", dtype=None)
    assert lrs.index(max(lrs)) == 3


@pytest.mark.parametrize("length", [dict(max_steps=40), dict(epochs=6)])
def test_without_warmup_fit_warms_up_as_fastattn_train_does(tok, pairs, length):
    """No warmup= given: a tenth of the run (defaults.default_warmup), the rule fastattn
    train settles its warm-up by, not a fixed 4000 steps that a short run never reaches."""
    from fastattn.train.defaults import default_warmup
    from fastattn.train.run import _new_settings
    h = fit(tiny_model(tok), pairs, src_tokenizer=tok, tgt_tokenizer=tok, batch_tokens=128,
            lr=0.5, progress=False, **length)
    total = len(h.steps)
    warmup = default_warmup(total)
    assert total >= 20 and warmup == round(total / 10)
    assert _new_settings(dict(steps=total))["warmup"] == warmup   # the command's new run
    lrs = [r["lr"] for r in h.steps]
    assert lrs.index(max(lrs)) == warmup - 1
    assert_close(max(lrs), 0.5, **TOL["float64_figure"], name="peak lr", dtype=None)


def test_a_given_optimizer_is_used(tok, pairs):
    model = tiny_model(tok)
    opt = optim.Adam(model, lr=1.0)
    fit(model, pairs, src_tokenizer=tok, tgt_tokenizer=tok, optimizer=opt, max_steps=4,
        schedule="constant", lr=0.003, batch_tokens=128, progress=False)
    assert opt.steps == 4 and opt.lr == 0.003


def test_over_long_and_empty_pairs_are_skipped_and_counted(tok, capfd):
    pairs = [("abc", "abc"), ("a" * 17, "abc"), ("abc", "b" * 16), ("abc", "b" * 14),
             ("a" * 14, ""), ("", "abc")]
    # max_len 16: a source of 17 chars + <start>/<end> is out, of 14 in; the decoder reads a
    # target of 16 + 2 ids as 17 (out), of 14 + 2 as 15 (in); "" is <start> <end>: in
    model = tiny_model(tok, max_len=16)
    h = fit(model, pairs, src_tokenizer=tok, tgt_tokenizer=tok, valid_pairs=pairs,
            max_steps=2, progress=True)
    assert h.skipped == {"train": 2, "valid": 2}
    err = capfd.readouterr().err
    infos = [json.loads(line) for line in err.splitlines() if '"info"' in line]
    assert any("2 training pairs skipped" in i["message"] for i in infos)
    with pytest.raises(ValueError, match="no training pairs"):
        fit(model, pairs[1:3], src_tokenizer=tok, tgt_tokenizer=tok, progress=False)


def test_evaluation_is_the_token_weighted_mean_loss(tok, pairs):
    valid = [("abc", "abc"), ("abcdefgh", "abcdefgh"), ("a", "h")]
    model = tiny_model(tok)
    h = fit(model, pairs, src_tokenizer=tok, tgt_tokenizer=tok, valid_pairs=valid,
            max_steps=4, eval_every=2, batch_tokens=128, lr=1e-2, warmup=2, progress=False)
    assert [e["step"] for e in h.evals] == [2, 4]       # no second eval at the end
    assert [r["kind"] for r in h.records] == ["step", "step", "eval", "step", "step", "eval"]
    model.eval()
    total = count = 0
    for s, t in valid:                                  # one pair at a time, no padding
        src = np.array([tok.encode(s, add_start_end=True)])
        tgt = np.array([tok.encode(t, add_start_end=True)])
        total += model.loss(src, tgt) * (tgt.shape[1] - 1)
        count += tgt.shape[1] - 1
    assert_close(h.evals[-1]["valid_loss"], total / count, **TOL["valid_loss_unbatched"],
                 name="valid_loss", dtype=None)
    assert_close(h.evals[-1]["valid_ppl"], math.exp(total / count), **TOL["valid_ppl"],
                 name="valid_ppl", dtype=None)


def test_a_callback_sees_every_step_and_may_stop_the_run(tok, pairs, tmp_path):
    seen = []

    def stop_at_3(record, model):
        seen.append((record["step"], model.training))
        if record["step"] == 3:
            raise StopIteration

    h = short_run(tok, pairs, max_steps=10, callbacks=[stop_at_3], valid_pairs=pairs[:4],
                  checkpoint_dir=tmp_path)
    assert seen == [(1, True), (2, True), (3, True)]
    assert len(h.steps) == 3 and h.evals[-1]["step"] == 3     # the end of a run: eval
    assert (tmp_path / "step-00000003").is_dir()               # and checkpoint
    assert h.records[2] is h.steps[2]


def test_history_round_trips_through_jsonl(tok, pairs, tmp_path):
    h = short_run(tok, pairs, valid_pairs=pairs[:4], eval_every=3)
    h.to_jsonl(tmp_path / "h.jsonl")
    back = History.read_jsonl(tmp_path / "h.jsonl")
    assert back == h and back.records == h.records     # floats exactly
    assert len(back.steps) == 6 and len(back.evals) == 2
    (tmp_path / "bad.jsonl").write_text(json.dumps(h.records[0]) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2: expected a JSON object"):
        History.read_jsonl(tmp_path / "bad.jsonl")


def test_progress_writes_json_lines_when_stderr_is_not_a_terminal(tok, pairs, capfd):
    short_run(tok, pairs, max_steps=7, progress=3, valid_pairs=pairs[:4], eval_every=6)
    out, err = capfd.readouterr()
    assert out == ""
    lines = [json.loads(line) for line in err.splitlines()]
    assert [(r["kind"], r["step"]) for r in lines] == [
        ("step", 1), ("step", 3), ("step", 6), ("eval", 6), ("step", 7), ("eval", 7)]
    assert {"loss", "lr", "tokens_per_s", "epoch"} <= set(lines[0])


def test_progress_writes_the_last_step_before_the_final_eval(tok, pairs, capfd):
    def stop_at_4(record, model):
        if record["step"] == 4:
            raise StopIteration

    short_run(tok, pairs, max_steps=9, progress=3, valid_pairs=pairs[:4], callbacks=stop_at_4)
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()]
    assert [(r["kind"], r["step"]) for r in lines] == [
        ("step", 1), ("step", 3), ("step", 4), ("eval", 4)]


def test_progress_false_writes_nothing(tok, pairs, capfd):
    short_run(tok, pairs, progress=False, valid_pairs=pairs[:4], eval_every=2)
    assert capfd.readouterr() == ("", "")


def test_progress_on_a_terminal_is_a_bar_or_json_without_tqdm(monkeypatch):
    import io
    import sys

    from fastattn.train.progress import Bar, JsonLines, make_progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    bar = make_progress(True, 5, stream=Tty())
    assert isinstance(bar, Bar)
    bar.step({"step": 1, "loss": 1.0, "lr": 0.1, "tokens_per_s": 10.0})
    bar.close()
    monkeypatch.setitem(sys.modules, "tqdm", None)          # import tqdm -> ImportError
    stream = Tty()
    lines = make_progress(True, 5, stream=stream)
    assert isinstance(lines, JsonLines)
    lines.info("hello")
    assert json.loads(stream.getvalue()) == {"kind": "info", "message": "hello"}
    monkeypatch.delitem(sys.modules, "tqdm")
    assert isinstance(make_progress("json", 5, stream=Tty()), JsonLines)   # never a bar
    with pytest.raises(ValueError, match="or 'json'"):
        make_progress("bar", 5, stream=Tty())


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_steps=3, epochs=2), "not both"),
    (dict(max_steps=0), "max_steps must be an int >= 1"),
    (dict(batch_tokens=0), "batch_tokens must be an int >= 1"),
    (dict(label_smoothing=1.0), r"label_smoothing must be a finite number \[0.0, 1.0\)"),
    (dict(schedule="linear"), "schedule must be one of inverse_sqrt, cosine, constant"),
    (dict(schedule=lambda s: 1.0, lr=0.1), "callable schedule"),
    (dict(eval_every=5), "eval_every needs valid_pairs"),
    (dict(checkpoint_every=5), "need a checkpoint_dir"),
    (dict(resume=True), "need a checkpoint_dir"),
    (dict(progress=-1), "progress must be True, False or an int >= 1"),
])
def test_bad_arguments_are_named(tok, pairs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        short_run(tok, pairs, **kwargs)


def test_tokenizers_must_fit_the_model(tok, pairs):
    from fastattn.nn import Seq2SeqTransformer
    no_pad = Seq2SeqTransformer(1, 1, 32, 2, tok.vocab_size, tok.vocab_size, 64, 0.0, seed=0)
    with pytest.raises(ValueError, match=r"src_tokenizer.pad_id is 0 but the model's pad_id "
                                         r"is None; build the model with pad_id=0"):
        fit(no_pad, pairs, src_tokenizer=tok, tgt_tokenizer=tok)
    small = Seq2SeqTransformer(1, 1, 32, 2, 5, tok.vocab_size, 64, 0.0, pad_id=0, seed=0)
    with pytest.raises(ValueError, match=f"src_tokenizer has {tok.vocab_size} ids, more than "
                                         "the model's vocabulary of 5"):
        fit(small, pairs, src_tokenizer=tok, tgt_tokenizer=tok)
    with pytest.raises(ValueError, match=r"train_pairs\[1\] must be a \(source, target\)"):
        fit(tiny_model(tok), [("a", "b"), ("a",)], src_tokenizer=tok, tgt_tokenizer=tok)
