"""The CTranslate2 twin (fastattn.bench.ct2_models) computes the function of a Seq2SeqTransformer:
teacher-forced log-probabilities within 1e-3 (float32), greedy and beam tokens equal to
fastattn.generate's; int8 runs. Skipped where ctranslate2 is not installed."""
import os
import time

import numpy as np
import pytest

from conftest import assert_close
from fastattn import nn as fnn
from fastattn.bench import ct2_models
from fastattn.bench.torch_models import Unavailable
from tolerances import TOL

V, S, N_NEW, START = 100, 13, 24, 2


def _model(seed=0, **kw):
    """A small Seq2SeqTransformer with every parameter moved off its initialisation: norm
    weights and biases off (1, 0), biases nonzero, weights doubled (so outputs depend on
    them strongly)."""
    rng = np.random.default_rng(seed)
    m = fnn.Seq2SeqTransformer(2, 2, 64, 4, V, V, 128, seed=seed, **kw)

    def moved(k, v):
        if ".norm" in k:
            return v + rng.standard_normal(v.shape, dtype=np.float32) * np.float32(0.2)
        if k.endswith("bias"):
            return v + rng.standard_normal(v.shape, dtype=np.float32) * np.float32(0.1)
        return v * np.float32(2.0)
    m.load_state_dict({k: moved(k, v) for k, v in m.state_dict().items()})
    return m


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("ctranslate2")
    return _model()


@pytest.fixture(scope="module")
def src():
    return np.random.default_rng(1).integers(4, V, size=(6, S))


def _log_probs(model, src, tgt):
    """fastattn's teacher-forced log p(tgt[:, 1:]) -> float64 (B, T - 1)."""
    z = model(src, tgt[:, :-1]).astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return np.take_along_axis(lp, tgt[:, 1:, None], axis=-1)[..., 0]


def _random_targets(rng, B, T):
    tgt = rng.integers(0, V, size=(B, T))
    tgt[:, 0] = START
    return tgt


def test_missing_ctranslate2_is_unavailable(monkeypatch):
    monkeypatch.setattr(ct2_models, "_ct2_cache", [None])
    with pytest.raises(Unavailable, match="pip install ctranslate2"):
        ct2_models.ct2_translator(object(), "float32")
    assert ct2_models.ctranslate2_version() is None


def test_scores_match_float32(model, src):
    tr = ct2_models.ct2_translator(model, "float32")
    tgt = _random_targets(np.random.default_rng(2), len(src), 20)
    got = ct2_models.ct2_score(tr, src, tgt)
    assert got.shape == (len(src), 19) and got.dtype == np.float32
    assert_close(got, _log_probs(model, src, tgt), **TOL["ct2_scores"], name="scores")


@pytest.mark.parametrize("kw", [dict(norm_first=True), dict(activation="gelu")])
def test_scores_match_other_layouts(kw, src):
    pytest.importorskip("ctranslate2")
    m = _model(seed=3, **kw)
    tr = ct2_models.ct2_translator(m, "float32")
    tgt = _random_targets(np.random.default_rng(4), len(src), 12)
    assert_close(ct2_models.ct2_score(tr, src, tgt), _log_probs(m, src, tgt), **TOL["ct2_scores"],
                 name="scores", dtype=None)


def test_greedy_tokens_match_float32(model, src):
    tr = ct2_models.ct2_translator(model, "float32")
    want = model.generate(src, max_new_tokens=N_NEW, start_id=START)
    got = ct2_models.ct2_generate(tr, src, max_new_tokens=N_NEW, start_id=START)
    assert got.shape == want.shape == (len(src), 1 + N_NEW) and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    # the tokens are scored alike too (the generated positions, not only random targets)
    assert_close(ct2_models.ct2_score(tr, src, got), _log_probs(model, src, got),
                 **TOL["ct2_scores"], name="scores of the greedy tokens", dtype=None)


def test_beam_tokens_match_float32(model, src):
    tr = ct2_models.ct2_translator(model, "float32")
    kw = dict(max_new_tokens=N_NEW, start_id=START, method="beam", beam_size=4)
    want = model.generate(src, **kw)
    assert (want != model.generate(src, max_new_tokens=N_NEW, start_id=START)).any()
    np.testing.assert_array_equal(ct2_models.ct2_generate(tr, src, **kw), want)


def test_int8_runs(model, src):
    tr = ct2_models.ct2_translator(model, "int8")
    for method in ("greedy", "beam"):
        got = ct2_models.ct2_generate(tr, src, max_new_tokens=N_NEW, start_id=START,
                                      method=method)
        assert got.shape == (len(src), 1 + N_NEW) and got.dtype == np.int64
        assert (got[:, 0] == START).all() and got.min() >= 0 and got.max() < V


def test_translators_cached_and_directory(model, src, tmp_path):
    tr = ct2_models.ct2_translator(model, "float32")
    assert ct2_models.ct2_translator(model, "float32") is tr
    assert ct2_models.ct2_translator(model, "int8") is not tr
    own = ct2_models.ct2_translator(model, "float32", directory=tmp_path)
    assert (tmp_path / "model.bin").is_file() and own is not tr
    assert ct2_models.ct2_generate(own, src, max_new_tokens=0, start_id=START).shape == \
        (len(src), 1)


def test_released_translators_end_and_are_rebuilt(model, src):
    """release_translators (the runner calls it after each case) drops the cache, so the
    translator's threads, which hold OpenMP teams of fastattn's own runtime when torch is
    imported, end; the next call builds a new translator giving the same tokens."""
    threads = lambda: set(os.listdir("/proc/self/task"))  # noqa: E731  (thread ids)
    ct2_models.release_translators()
    before = threads()
    tr = ct2_models.ct2_translator(model, "float32")
    want = ct2_models.ct2_generate(tr, src, max_new_tokens=4, start_id=START)
    started = threads() - before                     # its workers (and their OpenMP teams)
    assert started
    ct2_models.release_translators()
    del tr
    # ended with the translator: its own threads, not a count (another library may start a
    # thread of its own meanwhile); a thread's exit is seen a moment after its join
    deadline = time.monotonic() + 10
    while started & threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not started & threads()
    again = ct2_models.ct2_translator(model, "float32")
    np.testing.assert_array_equal(
        ct2_models.ct2_generate(again, src, max_new_tokens=4, start_id=START), want)


def test_the_runner_releases_translators_after_every_case(monkeypatch):
    from fastattn import bench
    calls = []
    monkeypatch.setattr(ct2_models, "release_translators", lambda: calls.append(1))
    bench.run(["layer_norm"], repeat=1, numpy_repeat=1)
    assert calls == [1]
