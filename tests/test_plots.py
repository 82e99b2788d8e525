"""fastattn.plots: PNG files that exist, decode, and hold a picture; clear errors on bad input.
Skipped without matplotlib (the optional ``demo`` extra)."""
import json
import re

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib.image import imread  # noqa: E402

from fastattn import nn as fnn  # noqa: E402
from fastattn import plots  # noqa: E402
from fastattn.tokenizers import WordTokenizer  # noqa: E402
from conftest import modules_loaded_by, run_child, run_in_threads  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SRC = ["when you play the game of thrones", "you win or you die", "there is no middle ground"]
TGT = ["i am no man", "winter is coming", "a lannister always pays his debts"]


def assert_picture(path):
    """A valid PNG with content: not one colour, not nearly blank."""
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE, path
    img = imread(path)                                       # (h, w, 3 or 4) floats in [0, 1]
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50, img.shape
    rgb = img[..., :3].reshape(-1, 3)
    assert float(rgb.std()) > 0.05, f"{path}: nearly blank (std {rgb.std():.4f})"
    assert len(np.unique(rgb, axis=0)) > 16, f"{path}: almost one colour"


def history(evals=True, lr=True):
    recs = [{"step": s, "loss": 5.0 * np.exp(-s / 40) + 0.05 * (s % 3),
             **({"lr": min(1e-3, s * 1e-4)} if lr else {})} for s in range(1, 121)]
    if evals:
        recs += [{"step": s, "valid_loss": 5.0 * np.exp(-s / 40) + 0.3, "valid_ppl": 9.0}
                 for s in range(20, 121, 20)]
    return recs


@pytest.fixture
def pair():
    """(model, src tokenizer, tgt tokenizer): a 2 + 2 layer, 4 head model, untrained."""
    ts, tt = WordTokenizer().train(SRC), WordTokenizer().train(TGT)
    m = fnn.Seq2SeqTransformer(2, 2, 32, 4, ts.vocab_size, tt.vocab_size, 64, dropout=0.0,
                               pad_id=ts.pad_id, seed=0)
    return m, ts, tt


# ---- plot_history ------------------------------------------------------------------------------

def test_history_from_dicts(tmp_path):
    p = plots.plot_history(history(), tmp_path / "loss.png")
    assert p == tmp_path / "loss.png"
    assert_picture(p)


def test_history_from_jsonl_and_into_a_directory(tmp_path):
    src = tmp_path / "history.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in history()) + "\n\n")
    p = plots.plot_history(src, tmp_path)                   # a directory: loss.png in it
    assert p == tmp_path / "loss.png"
    assert_picture(p)
    assert plots.plot_history(str(src), tmp_path / "b.png").exists()


@pytest.mark.parametrize("evals,lr", [(False, True), (True, False), (False, False)])
def test_history_without_evals_or_lr(tmp_path, evals, lr):
    assert_picture(plots.plot_history(iter(history(evals, lr)), tmp_path / "loss.png"))


def test_history_of_evals_only(tmp_path):
    evals = [r for r in history() if "valid_loss" in r]
    assert_picture(plots.plot_history(evals, tmp_path / "loss.png"))


def test_history_errors(tmp_path):
    with pytest.raises(ValueError, match="records hold no 'loss' or 'valid_loss'"):
        plots.plot_history([], tmp_path / "loss.png")
    with pytest.raises(ValueError, match="records hold no"):
        plots.plot_history([{"step": 1, "lr": 0.1}], tmp_path / "loss.png")
    with pytest.raises(ValueError, match=r"records\[1\] has 'loss' but no 'step'"):
        plots.plot_history([{"step": 0, "loss": 1.0}, {"loss": 2.0}], tmp_path / "loss.png")
    with pytest.raises(TypeError, match=r"records\[0\] must be a dict"):
        plots.plot_history([3.0], tmp_path / "loss.png")
    with pytest.raises(TypeError, match="records must be an iterable"):
        plots.plot_history({"step": 1, "loss": 1.0}, tmp_path / "loss.png")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "loss": 1.0}\nnot json\n')
    with pytest.raises(ValueError, match="line 2: not JSON"):
        plots.plot_history(bad, tmp_path / "loss.png")
    assert not (tmp_path / "loss.png").exists()


# ---- plot_attention ----------------------------------------------------------------------------

def causal_weights(H, L, rng):
    w = rng.random((H, L, L)) * np.tril(np.ones((L, L)))
    return w / w.sum(-1, keepdims=True)


def test_attention_heatmap(tmp_path, rng):
    toks = "<start> I am no man <end>".split()
    p = plots.plot_attention(causal_weights(4, 6, rng), toks, toks, tmp_path / "a.png",
                             title="masked-attention filter")
    assert_picture(p)


@pytest.mark.parametrize("H", [1, 3, 8])
def test_attention_any_head_count_and_rectangular(tmp_path, rng, H):
    w = rng.dirichlet(np.ones(7), size=(H, 3)).astype(np.float32)      # (H, 3, 7)
    p = plots.plot_attention(w, list("abc"), [f"k{i}$" for i in range(7)], tmp_path / "a.png")
    assert_picture(p)


def test_attention_errors(tmp_path, rng):
    w = causal_weights(2, 4, rng)
    toks = list("abcd")
    with pytest.raises(ValueError, match=r"weights must be \(H, Lq, Lk\), got shape \(4, 4\)"):
        plots.plot_attention(w[0], toks, toks, tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"weights must be \(H, Lq, Lk\), got shape "
                                         r"\(1, 2, 4, 4\)"):
        plots.plot_attention(w[None], toks, toks, tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"query_tokens has 3 labels but weights \(2, 4, 4\) "
                                         r"need 4"):
        plots.plot_attention(w, toks[:3], toks, tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"key_tokens has 5 labels but weights \(2, 4, 4\) "
                                         r"need 4"):
        plots.plot_attention(w, toks, toks + ["e"], tmp_path / "a.png")
    with pytest.raises(ValueError, match="nothing to draw"):
        plots.plot_attention(np.zeros((0, 4, 4)), toks, toks, tmp_path / "a.png")
    with pytest.raises(ValueError, match="non-finite"):
        plots.plot_attention(np.full((1, 4, 4), np.nan), toks, toks, tmp_path / "a.png")
    assert not (tmp_path / "a.png").exists()


def test_attention_from_threads(tmp_path, rng):
    """No pyplot state: figures drawn at once from several threads all come out whole."""
    w = causal_weights(2, 5, rng)
    toks = list("abcde")
    run_in_threads(lambda i: plots.plot_attention(w, toks, toks, tmp_path / f"{i}.png",
                                                  title=f"t{i}"), 4)
    for i in range(4):
        assert_picture(tmp_path / f"{i}.png")


# ---- plot_model_attention ----------------------------------------------------------------------

def test_model_attention_files(tmp_path, pair):
    m, ts, tt = pair
    paths = plots.plot_model_attention(m, ts, tt, SRC[0], TGT[0], out_dir=tmp_path / "attn")
    names = ["encoder_layer0.png", "encoder_layer1.png", "decoder_self_layer0.png",
             "decoder_self_layer1.png", "cross_layer0.png", "cross_layer1.png"]
    assert [p.name for p in paths] == names
    assert sorted(p.name for p in (tmp_path / "attn").iterdir()) == sorted(names)
    for p in paths:
        assert_picture(p)


def test_model_attention_greedy_target(tmp_path, pair):
    m, ts, tt = pair
    paths = plots.plot_model_attention(m, ts, tt, SRC[1], out_dir=tmp_path,
                                       max_new_tokens=4)
    assert len(paths) == 6
    assert_picture(paths[3])


def test_model_attention_needs_eval(tmp_path, pair):
    m, ts, tt = pair
    m.train()
    with pytest.raises(RuntimeError, match="eval"):
        plots.plot_model_attention(m, ts, tt, SRC[0], TGT[0], out_dir=tmp_path)


# ---- the optional dependency -------------------------------------------------------------------

def test_missing_matplotlib_names_the_extra(tmp_path):
    code = f"""
import sys
sys.modules["matplotlib"] = None                 # import matplotlib -> ImportError
import fastattn.plots as p
try:
    p.plot_history([{{"step": 1, "loss": 1.0}}], {str(tmp_path / "x.png")!r})
except ImportError as e:
    print(e)
"""
    res = run_child(code, timeout=120)
    assert res.returncode == 0, res.stderr
    assert 'pip install "fastattn[demo]"' in res.stdout


def test_import_fastattn_does_not_load_matplotlib():
    assert modules_loaded_by("import fastattn, fastattn.plots", "matplotlib") == []


def test_ema_is_tensorboards_debiased_smoothing():
    v = np.array([4.0, 2.0, np.nan, 6.0, 1.0])
    got = plots.ema(v, 0.5)
    acc, w, want = 0.0, 0.0, []
    for x in v:                                  # by hand: s = .5 s + .5 x, over 1 - .5^t
        if np.isfinite(x):
            acc, w = 0.5 * acc + 0.5 * x, 0.5 * w + 0.5
        want.append(acc / w)
    np.testing.assert_array_equal(got, want)
    assert got[0] == 4.0 and got[2] == got[1]                  # no bias to 0; NaN skipped
    np.testing.assert_array_equal(plots.ema(v[:2], 0.0), v[:2])
    assert plots.smoothing_factor(10) == 0.6 and plots.smoothing_factor(10 ** 5) == 0.98
    assert plots.smoothing_factor(400) == 0.8


def test_history_draws_raw_faint_and_the_ema_on_top(tmp_path, monkeypatch):
    drawn = {}
    real = plots._save

    def keep(fig, path):
        drawn["fig"] = fig
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    recs = history()
    recs[10]["valid_exact"] = 0.5                              # not an eval: ignored
    recs += [{"step": 120, "valid_loss": 1.0, "valid_exact": 0.25}]
    plots.plot_history(recs, tmp_path / "loss.png", smoothing=0.8)
    ax = drawn["fig"].axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    raw, smooth = lines["training loss"], lines["training loss, EMA 0.80"]
    assert raw.get_alpha() < 0.5 and (smooth.get_alpha() or 1.0) == 1.0
    np.testing.assert_allclose(smooth.get_ydata(), plots.ema(raw.get_ydata(), 0.8))
    assert "validation loss" in lines
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "held-out exact match (greedy)" in labels
    with pytest.raises(ValueError, match="smoothing must be a number in"):
        plots.plot_history(recs, tmp_path / "x.png", smoothing=1.0)


def test_a_key_given_twice_in_a_history_line_is_refused(tmp_path):
    bad = tmp_path / "history.jsonl"
    bad.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 9.0, "loss": 0.5}\n')
    with pytest.raises(ValueError, match=rf"^plot_history: {re.escape(str(bad))}, line 2: the "
                                         r"key 'loss' is given twice in one object$"):
        plots.plot_history(bad, tmp_path / "loss.png")
    assert not (tmp_path / "loss.png").exists()


def test_fastattn_plot_of_a_history_with_a_key_given_twice_is_one_line(tmp_path):
    import subprocess
    import sys

    (tmp_path / "history.jsonl").write_text('{"step": 1, "step": 2, "loss": 1.0}\n')
    res = subprocess.run([sys.executable, "-m", "fastattn.cli", "plot", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert res.stderr == (f"fastattn plot: plot_history: {tmp_path / 'history.jsonl'}, line 1: "
                          "the key 'step' is given twice in one object\n")
    assert not (tmp_path / "loss.png").exists()
