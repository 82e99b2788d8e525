"""The bench's cached torch decoder (fastattn.bench.torch_models.TorchCachedDecoder): the same
tokens as the tutorial's uncached loop (TorchDecoder) in float32 on a small model, greedy and
beam, padded sources, post-norm and norm_first; its logits step by step within float32
rounding, the caches grown and reordered on the way; the bfloat16 model runs and gives
float32 logits (those skipped where torch is not installed). The bfloat16 greedy generation
cases use it as their torch column, with a target against it, and show that column
unavailable without torch."""
import numpy as np
import pytest

from fastattn import bench
from fastattn import nn as fnn
from fastattn.bench import runner, torch_models
from conftest import assert_close
from tolerances import TOL

pytestmark = [pytest.mark.filterwarnings("ignore:.*nested tensor.*:UserWarning"),
              pytest.mark.filterwarnings("ignore:enable_nested_tensor is True.*:UserWarning")]

PAD, START, V_SRC, V_TGT = 0, 1, 23, 29


def _torch_model(seed=7, **kw):
    pytest.importorskip("torch")
    """A small tutorial model holding a fastattn Seq2SeqTransformer's weights, every parameter
    moved off its initialisation (norms off (1, 0), biases nonzero, weights drawn again with
    standard deviation 1 / sqrt(fan_in)) so each one changes the logits and the greedy tokens
    vary from step to step."""
    rng = np.random.default_rng(seed)
    m = fnn.Seq2SeqTransformer(2, 2, 32, 4, V_SRC, V_TGT, 64, seed=seed, **kw)

    def moved(k, v):
        if ".norm" in k:
            return v + rng.standard_normal(v.shape, dtype=np.float32) * np.float32(0.2)
        if k.endswith("bias"):
            return v + rng.standard_normal(v.shape, dtype=np.float32) * np.float32(0.1)
        return rng.standard_normal(v.shape, dtype=np.float32) / np.float32(np.sqrt(v.shape[-1]))
    m.load_state_dict({k: moved(k, v) for k, v in m.state_dict().items()})
    return torch_models.torch_seq2seq(m)


def _sources(B=2, S=7):
    src = np.random.default_rng(0).integers(2, V_SRC, size=(B, S))
    src[0, 4:] = PAD                                      # row 0: three padded positions
    return src


@pytest.mark.parametrize("kw", [dict(norm_first=False), dict(norm_first=True),
                                dict(activation="gelu")])
def test_cached_greedy_gives_the_uncached_loops_tokens(kw):
    tm, src = _torch_model(**kw), _sources()
    args = dict(max_new_tokens=6, start_id=START, src_pad_id=PAD)
    want = torch_models.torch_generate(tm, src, **args)
    assert want.shape == (2, 7) and len(np.unique(want[:, 1:])) > 2     # not one token
    got = torch_models.torch_generate(tm, src, kv_cache=True, **args)
    assert got.dtype == want.dtype and np.array_equal(got, want), (got, want)
    end = int(want[0, 3])                                 # row 0 ends by step 3: reordered
    got = torch_models.torch_generate(tm, src, kv_cache=True, end_id=end, pad_id=5, **args)
    assert np.array_equal(got, torch_models.torch_generate(tm, src, end_id=end, pad_id=5,
                                                           **args))


def test_cached_beam_gives_the_uncached_loops_tokens():
    tm, src = _torch_model(), _sources(3)
    args = dict(max_new_tokens=5, start_id=START, src_pad_id=PAD, method="beam",
                beam_size=3)
    want = torch_models.torch_generate(tm, src, **args)
    end = int(want[1, 2])                                 # sources finish: some dropped
    for extra in ({}, dict(end_id=end)):
        got = torch_models.torch_generate(tm, src, kv_cache=True, **args, **extra)
        assert np.array_equal(got, torch_models.torch_generate(tm, src, **args, **extra))


def test_cached_step_logits_match_the_uncached_decoder_through_growth_and_reorder():
    torch = pytest.importorskip("torch")
    tm, src = _torch_model(norm_first=True), _sources(3)
    tokens = np.array([[START] * 6, [4, 5, 6, 7, 8, 9], [3, 3, 2, 5, 2, 3]])   # (3 steps, 6 rows)
    with torch.inference_mode():
        ref = torch_models.TorchDecoder(tm, src, beams=2, src_pad_id=PAD)
        got = torch_models.TorchCachedDecoder(tm, src, beams=2, src_pad_id=PAD, max_len=1)
        for t, tok in enumerate(tokens):                  # capacity 1: grown at steps 1, 2
            assert_close(got.step(tok), ref.step(tok), **TOL["torch_decoder_steps"],
                         name=f"step {t}", dtype=None)
        for d in (ref, got):
            d.reorder([5, 4], sources=[2])                # source 2 alone, its beams swapped
        a, b = got.step(np.array([7, 8])), ref.step(np.array([7, 8]))
    assert a.shape == (2, V_TGT) and a.dtype == np.float32
    assert_close(a, b, **TOL["torch_decoder_steps"], name="after the reorder")


def test_bfloat16_model_runs_with_float32_logits():
    torch = pytest.importorskip("torch")
    tm, src = _torch_model().to(torch.bfloat16), _sources()
    with torch.inference_mode():
        d = torch_models.TorchCachedDecoder(tm, src, src_pad_id=PAD)
        assert d.k[0].dtype == torch.bfloat16 and d.cross[0][0].dtype == torch.bfloat16
        logits = d.step(np.full(2, START))
    assert logits.shape == (2, V_TGT) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    out = torch_models.torch_generate(tm, src, max_new_tokens=4, start_id=START,
                                      src_pad_id=PAD, kv_cache=True)
    assert out.shape == (2, 5) and (out[:, 0] == START).all()


# ---- the bfloat16 greedy generation cases ------------------------------------------------------

BF16_GREEDY = ("generate_greedy_b8_bfloat16", "generate_greedy_b1_bfloat16")


@pytest.mark.parametrize("name", BF16_GREEDY)
def test_bfloat16_greedy_cases_have_a_torch_column_not_required_to_match(name):
    case = bench.CASES[name]
    assert case.implementations == ("fastattn", "torch")
    assert case.exact == ("fastattn", "numpy")          # torch bf16 rounds otherwise
    assert case.repeats["torch"] == case.repeats["fastattn"] and "torch" not in case.timed_first


@pytest.mark.parametrize("name", BF16_GREEDY)
def test_bfloat16_greedy_cases_without_torch_show_it_unavailable(name, monkeypatch):
    monkeypatch.setattr(torch_models, "_torch_cache", [None])      # as if not installed
    case = bench.CASES[name]
    row = runner.empty_row(case, 2)
    fns = runner._callables(case, row)
    assert list(fns) == ["fastattn"] and row["torch_status"] == "n/a: torch is not installed"
    row["fastattn_times_ms"] = [1000.0]
    row = runner.finish_row(case, row)
    cells = [c.strip() for c in bench.format_table([row]).splitlines()[2].split("|")]
    assert cells[3] == "n/a"                                       # the torch ms column
    assert all(t["status"] == "SKIP" and "torch bf16 not measured" in t["detail"]
               for t in bench.check_targets([row]) if t["case"] == name)


def test_bfloat16_greedy_b8_target_is_1_3x_torch_bf16_tokens_per_s():
    case = bench.CASES["generate_greedy_b8_bfloat16"]

    def row(fast, torch):
        r = runner.empty_row(case, 2)
        r["fastattn_times_ms"], r["torch_times_ms"] = [fast], [torch]
        return runner.finish_row(case, r)

    def result(r):
        (t,) = [t for t in bench.check_targets([r])
                if t["case"] == "generate_greedy_b8_bfloat16"]
        return t
    t = result(row(1000.0, 1400.0))                               # 1.4x
    assert t["target"] == "tokens/s >= 1.3x torch bf16" and t["status"] == "PASS"
    assert "1.40x torch bf16" in t["detail"] and "512 tokens/s" in t["detail"]
    assert result(row(1000.0, 1200.0))["status"] == "MISS"       # 1.2x
