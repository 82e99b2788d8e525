"""Held-out evaluation in fit(): the exact-match score in the history, the best model by
validation loss (kept in memory and beside the checkpoints, put back at the end, resumed),
early stopping; and the Evaluator itself on hand-made outputs."""
import json
import os

import numpy as np
import pytest

from fastattn.train import fit, latest_checkpoint, load_checkpoint
from fastattn.train.evaluate import Evaluator
from conftest import assert_close
from tolerances import TOL
from train_util import char_tokenizer, tiny_model, untimed, words  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

STEPS = 30


@pytest.fixture
def tok():
    return char_tokenizer()


@pytest.fixture
def pairs():
    return [(w, w[::-1]) for w in words(120)]


def blow_up_after(k, lr=5e-3, big=3.0):
    """A schedule that learns for k steps, then takes steps large enough to undo it: the
    validation loss is lowest before the end."""
    return lambda step: lr if step <= k else big


def run(tok, pairs, ckpt=None, **kw):
    args = dict(src_tokenizer=tok, tgt_tokenizer=tok, valid_pairs=pairs[:16], max_steps=STEPS,
                batch_tokens=96, schedule=blow_up_after(20), eval_every=5, seed=3,
                progress=False, checkpoint_dir=ckpt, label_smoothing=0.0)
    args.update(kw)
    model = tiny_model(tok, dropout=0.1, seed=1)
    return model, fit(model, pairs, **args)


def evaluator(tok, pairs, **kw):
    return Evaluator(pairs[:16], src_tokenizer=tok, tgt_tokenizer=tok, max_len=16,
                     batch_tokens=96, **kw)


def test_evaluations_record_the_exact_match_and_the_model_ends_as_the_best(tok, pairs):
    model, h = run(tok, pairs)
    evals = h.evals
    assert [e["step"] for e in evals] == [5, 10, 15, 20, 25, 30]
    assert all(0.0 <= e["valid_exact"] <= 1.0 for e in evals)
    best = min(evals, key=lambda e: e["valid_loss"])
    assert best["step"] < STEPS and evals[-1]["valid_loss"] > best["valid_loss"]
    # the model fit leaves is the best one: evaluating it gives that evaluation's figures
    again = evaluator(tok, pairs)(model)
    assert_close(again["valid_loss"], best["valid_loss"], **TOL["valid_loss_again"],
                 name="valid_loss", dtype=None)
    assert again["valid_exact"] == best["valid_exact"]
    assert model.training


def test_keep_best_false_leaves_the_last_weights(tok, pairs):
    model, h = run(tok, pairs, keep_best=False)
    again = evaluator(tok, pairs)(model)
    assert_close(again["valid_loss"], h.evals[-1]["valid_loss"], **TOL["valid_loss_again"],
                 name="valid_loss", dtype=None)


def test_the_best_is_written_beside_the_checkpoints_and_the_last_stays_latest(tok, pairs,
                                                                             tmp_path):
    model, h = run(tok, pairs, tmp_path, checkpoint_every=10)
    best = min(h.evals, key=lambda e: e["valid_loss"])
    name = f"best-step-{best['step']:08d}"
    assert name in os.listdir(tmp_path)
    assert json.loads((tmp_path / name / "best.json").read_text()) == {
        "step": best["step"], "valid_loss": best["valid_loss"]}
    ck = load_checkpoint(tmp_path)
    assert ck.step == STEPS and ck.state["best"] == {"step": best["step"],
                                                      "valid_loss": best["valid_loss"]}
    last = evaluator(tok, pairs)(ck.model.train())
    assert_close(last["valid_loss"], h.evals[-1]["valid_loss"], **TOL["valid_loss_again"],
                 name="valid_loss", dtype=None)
    # only the best dirs a kept checkpoint names (and the newest) remain: a resume from any
    # kept checkpoint finds the best it knew
    named = {json.loads((tmp_path / c / "state.json").read_text())["best"]["step"]
             for c in os.listdir(tmp_path) if c.startswith("step-")}
    bests = sorted(n for n in os.listdir(tmp_path) if n.startswith("best-"))
    assert bests == [f"best-step-{s:08d}" for s in sorted(named)] and bests[-1] == name
    assert len(named) > 1


@pytest.mark.parametrize("stop", [7, 12, 23])
def test_resume_keeps_the_best_and_ends_as_an_uninterrupted_run(tok, pairs, tmp_path, stop):
    ref_model, ref = run(tok, pairs)

    def stopper(record, model):          # Ctrl-C: a checkpoint of the step, no evaluation
        if record["step"] == stop:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run(tok, pairs, tmp_path, callbacks=[stopper], checkpoint_every=5)
    model, h = run(tok, pairs, tmp_path, resume=True, checkpoint_every=5)
    assert untimed(h) == untimed(ref)
    ours, theirs = model.state_dict(), ref_model.state_dict()
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_patience_stops_after_evaluations_without_improvement(tok, pairs):
    _, full = run(tok, pairs, schedule=blow_up_after(10))
    losses = [e["valid_loss"] for e in full.evals]
    best_i = int(np.argmin(losses))
    model, h = run(tok, pairs, schedule=blow_up_after(10), patience=2)
    stopped = full.evals[min(best_i + 2, len(losses) - 1)]["step"]
    assert h.last_step == stopped < STEPS
    assert untimed(h)[:len(h.records)] == untimed(full)[:len(h.records)]


def test_exact_sample_sizes(tok, pairs):
    _, h = run(tok, pairs, exact_sample=0, max_steps=5)
    assert h.evals[-1]["valid_exact"] is None
    ev = evaluator(tok, pairs, exact_sample=None)
    assert len(ev.exact_idx) == 16
    ev = evaluator(tok, pairs, exact_sample=5)
    assert len(ev.exact_idx) == 5 and len(set(ev.exact_idx.tolist())) == 5
    assert sorted(ev.exact_idx.tolist()) == sorted(evaluator(tok, pairs,
                                                             exact_sample=5).exact_idx.tolist())
    with pytest.raises(ValueError, match="exact_sample must be an int >= 0 or None"):
        evaluator(tok, pairs, exact_sample=-1)


def test_fit_argument_errors(tok, pairs):
    with pytest.raises(ValueError, match="patience .* needs valid_pairs"):
        fit(tiny_model(tok), pairs, src_tokenizer=tok, tgt_tokenizer=tok, max_steps=2,
            patience=3, progress=False)
    with pytest.raises(ValueError, match="patience must be an int >= 1"):
        run(tok, pairs, patience=0)


class FakeModel:
    """generate returns fixed rows; loss returns a fixed value; tracks the mode."""

    def __init__(self, rows, loss=0.5):
        self.rows, self.value, self.training = rows, loss, True
        self.modes = []

    def eval(self):
        self.training = False
        self.modes.append("eval")
        return self

    def train(self):
        self.training = True
        self.modes.append("train")
        return self

    def loss(self, src, tgt):
        assert not self.training
        return self.value

    def generate(self, src, **kw):
        assert not self.training
        return np.array([self.rows[tuple(r[r != kw["pad_id"]])] for r in src])


def test_exact_match_compares_whole_outputs_to_the_targets(tok):
    pairs = [("ab", "ba"), ("abc", "cba"), ("abcd", "dcba")]
    S, E, P = tok.start_id, tok.end_id, tok.pad_id
    enc = {s: tuple(tok.encode(s, add_start_end=True)) for s, _ in pairs}
    ids = {t: tok.encode(t) for _, t in pairs}
    rows = {enc["ab"]: [S, *ids["ba"], E, P, P],                 # right
            enc["abc"]: [S, *ids["cba"], P, P],                  # no <end>: wrong
            enc["abcd"]: [S, *ids["dcba"], E]}                   # right
    model = FakeModel(rows)
    out = Evaluator(pairs, src_tokenizer=tok, tgt_tokenizer=tok, max_len=16)(model)
    assert_close(out["valid_exact"], 2 / 3, **TOL["float64_figure"], name="valid_exact", dtype=None)
    assert_close(out["valid_loss"], 0.5, **TOL["float64_figure"], name="valid_loss", dtype=None)
    assert out["exact_pairs"] == 3
    assert model.training and model.modes == ["eval", "train"]
    rows[enc["ab"]] = [S, *ids["ba"], ids["ba"][0], E, P]      # a longer output: wrong
    out = Evaluator(pairs, src_tokenizer=tok, tgt_tokenizer=tok, max_len=16)(model)
    assert_close(out["valid_exact"], 1 / 3, **TOL["float64_figure"], name="valid_exact",
                 dtype=None)
