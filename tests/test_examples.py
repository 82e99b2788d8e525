"""examples/: the seed walkthrough runs, prints every step and finds no mismatch; its step
functions still give the seeds' numbers (so a library change that breaks the walkthrough fails
here, not only when someone reads its output)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_close
from tolerances import TOL

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "seed_walkthrough.py"
HEADINGS = [f"Step {i} - " for i in range(1, 8)] + ["Summary"]


@pytest.fixture(scope="module")
def walk():
    spec = importlib.util.spec_from_file_location("seed_walkthrough", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def checks(walk):
    """The walkthrough's CHECKS, emptied before a test; every compare it records must pass."""
    walk.CHECKS.clear()
    yield walk.CHECKS
    assert walk.CHECKS, "the step ran no compare"
    assert [name for name, ok in walk.CHECKS if not ok] == []


def test_script_runs_clean():
    env = {**os.environ, "PYTHONIOENCODING": "utf-8",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, env=env, check=False,
                         capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    for heading in HEADINGS:
        assert heading in res.stdout, heading
    assert "✗" not in res.stdout and "MISMATCH" not in res.stdout
    assert "all " in res.stdout and "checks hold" in res.stdout


def test_vocabulary_is_the_seeds(walk, checks, capsys):
    tok, ids = walk.step1_vocabulary()
    tokens = [tok.vocab.id_to_token(i) for i in range(len(tok.vocab))]
    assert tokens == [w.lower() for w in walk.VOCAB_000]               # 23, in the seed's order
    assert ids.tolist() == [5, 6, 7, 8, 9, 10, 11]


def test_positional_encoding_row0(walk, checks, capsys):
    tok, ids = walk.step1_vocabulary()
    pe, x_pe = walk.step3_positional_encoding(walk.step2_embeddings(tok, ids))
    assert pe.shape == (7, 6)
    np.testing.assert_array_equal(pe[0], [0, 1, 0, 1, 0, 1])
    assert_close(x_pe[0], np.add(walk.WHEN_E1_000, [0, 1, 0, 1, 0, 1]),
                 **TOL["walkthrough_float32"], name="x + pe, row 0", dtype=None)
    assert_close(pe[1], [np.sin(1), np.cos(1), np.sin(1 / 10000 ** (2 / 6)),
                         np.cos(1 / 10000 ** (2 / 6)), np.sin(1 / 10000 ** (4 / 6)),
                         np.cos(1 / 10000 ** (4 / 6))], **TOL["walkthrough_float32"],
                 name="pe, row 1", dtype=None)


def test_causal_mask_and_masked_softmax(walk, checks, capsys):
    r = walk.step7_masked_decoder()
    upper = np.triu(np.ones((6, 6), bool), k=1)
    assert np.all(r["mask"][upper] == -np.inf) and np.all(r["mask"][~upper] == 0)
    np.testing.assert_array_equal(r["masked_scores"], np.asarray(walk.MASKED_SCORES_002,
                                                                 np.float32))
    w = r["weights"]
    assert np.all(w[upper] == 0)                                       # exactly, no leakage
    assert_close(w.sum(axis=1), np.ones(len(w)), **TOL["walkthrough_float32"], name="row sums",
                 dtype=None)
    assert_close(r["attention"][0, 0], w, **TOL["walkthrough_attention"], name="out = weights",
                 dtype=None)
    # The seed's table is illustrative: row "I" is softmax(7.6, 34.0) = (3.4e-12, 1), not 0.01/0.99.
    assert w[1, 0] < 1e-10 and walk.MASKED_SOFTMAX_002[1][0] == 0.01


def test_layer_norm_ddof1_vs_population(walk):
    t = walk.layer_norm_table_002()
    seed = np.asarray(walk.LN_Y_002)
    diff = np.abs(t["ddof1"] - seed)
    quirk = np.zeros(seed.shape, bool)
    quirk[0, 4] = True                                                 # the seed's -0.58
    assert diff[~quirk].max() <= 0.005 + 1e-6                          # ddof=1 rounds to the seed
    assert diff[0, 4] <= 0.015 + 1e-6
    assert_close(t["mean"], walk.LN_MEAN_002, **TOL["walkthrough_seed_table"], name="mean",
                 dtype=None)
    assert_close(t["std_ddof1"], walk.LN_STD_002, **TOL["walkthrough_seed_table"], name="std",
                 dtype=None)
    # fastattn (and torch) use the population variance: larger by about sqrt(5/4), not the seed.
    assert np.abs(t["pop"] - seed).max() > 0.15
    assert_close(t["pop"], t["ddof1"] * np.sqrt(5 / 4), **TOL["walkthrough_population"],
                 name="population vs ddof=1", dtype=None)
    x = t["x"].astype(np.float64)
    ref = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + walk.LN_EPS_002)
    assert_close(t["pop"], ref, **TOL["walkthrough_layer_norm"], name="layer norm", dtype=None)


def test_walkthrough_steps_agree(walk, checks, capsys):
    tok, ids = walk.step1_vocabulary()
    x = walk.step2_embeddings(tok, ids)
    _, x_pe = walk.step3_positional_encoding(x)
    attn = walk.step4_attention(x_pe)
    attn["x"] = x_pe
    y1 = walk.step5_add_norm(x_pe, attn["out"])["y"]
    y2 = walk.step6_ffn(y1, attn)["y2"]
    assert_close(y2.mean(axis=1), np.zeros(len(y2)), **TOL["walkthrough_layer_norm"],
                 name="row means of LN output, weight 1", dtype=None)
