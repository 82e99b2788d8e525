"""The pretrained-model bench cases (fastattn.bench.pretrained_cases) on a tiny Marian directory:
CTranslate2's own conversion of it generates fastattn's greedy tokens, the vocabulary read back
maps ids to the converter's strings, each side's tokens are counted up to and including eos,
the runner's rows carry those counts, the tokens/s ratio and the agreement, the targets read
them, the step breakdown fills its row, and the cases are listed by ``fastattn bench --list``.
The model needs torch and transformers, the CTranslate2 side ctranslate2: skipped without
them (the row bookkeeping and the listing run everywhere)."""
import contextlib
import io
import sys

import numpy as np
import pytest

from fastattn import bench, cli
from fastattn.bench import ct2_models, pretrained_cases as pc, runner
from fastattn.bench.torch_models import Unavailable

# the OPUS-MT ids and options, a tiny shape
TINY = dict(pc.MARIAN, vocab_size=120, decoder_vocab_size=120, d_model=32, encoder_layers=2,
            decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
            pad_token_id=119, decoder_start_token_id=119)
SMALL_GEN = dict(B=6, src_len=10, new_tokens=12)
NAMES = ("marian_greedy_b8", "marian_beam_b8", "marian_greedy_b8_int8", "marian_beam_b8_int8",
         "marian_step_breakdown")


def _needs(*modules):
    for m in modules:
        pytest.importorskip(m)


def _case(method, compute_type="float32", name="tiny"):
    return pc.marian_generate_case(name, method, compute_type, config=TINY,
                                   repeats={"fastattn": 1, "ctranslate2": 1}, **SMALL_GEN)


# ---- bookkeeping (no model) ---------------------------------------------------------------------

def test_padded_rows_and_their_token_count():
    out = pc.padded([[5, 6, 0], [0], [7] * 4], 4)
    assert out.dtype == np.int64 and out.shape == (3, 4)
    np.testing.assert_array_equal(out[1], [0, -1, -1, -1])
    assert pc.count_tokens(out) == 3 + 1 + 4          # eos counted, padding not
    with pytest.raises(ValueError, match="5 tokens, more than 4"):
        pc.padded([[1] * 5], 4)


def test_rows_count_each_sides_tokens():
    """finish_row's tokens/s use each side's own count, and the ratio is of the rates."""
    case = bench.CASES["marian_greedy_b8"]
    row = runner.empty_row(case, 2)
    row.update(fastattn_times_ms=[100.0], ctranslate2_times_ms=[100.0], fastattn_tokens=150,
               ctranslate2_tokens=200)
    row = runner.finish_row(case, row)
    assert row["fastattn_tokens_per_s"] == pytest.approx(1500)   # 150 tokens / 0.1 s
    assert row["ctranslate2_tokens_per_s"] == pytest.approx(2000)
    assert row["speedup_vs_ctranslate2"] == pytest.approx(1.0)     # the times' ratio
    assert row["tokens_per_s_ratio_vs_ctranslate2"] == pytest.approx(0.75)
    assert any("fastattn / ctranslate2 0.75x" in n for n in row["notes"])
    status = {r["case"]: r["status"] for r in bench.check_targets([row])}
    assert status["marian_greedy_b8"] == "MISS" and status["marian_beam_b8"] == "SKIP"
    row["fastattn_times_ms"] = [50.0]
    row = runner.finish_row(case, dict(row, notes=[]))
    assert row["tokens_per_s_ratio_vs_ctranslate2"] == pytest.approx(1.5)
    status = {r["case"]: r["status"] for r in bench.check_targets([row])}
    assert status["marian_greedy_b8"] == "PASS"


def test_agreement_is_noted_not_flagged():
    row = runner.empty_row(bench.CASES["marian_greedy_b8"], 2)
    a = pc.padded([[5, 0], [6, 7, 0], [0]], 4)
    b = a.copy()
    b[1, 1] = 9
    runner._compare_tokens(row, {"fastattn": a, "ctranslate2": b}, ("fastattn",), True)
    assert row["agreement"] == {"ctranslate2": pytest.approx(2 / 3)}
    assert not any("MISMATCH" in n for n in row["notes"])
    assert any("ctranslate2 2 of 3" in n for n in row["notes"])


def test_the_cases_are_listed_not_default():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["bench", "--list"]) == 0
    lines = {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip()}
    for name in NAMES:
        assert name in bench.CASES and name in lines
        assert name not in bench.DEFAULT_CASES and "not run by default" in lines[name]
    assert {t[0] for t in bench.TARGETS} >= set(NAMES[:4])


def test_missing_ctranslate2_is_unavailable(monkeypatch):
    monkeypatch.setattr(ct2_models, "_ct2_cache", [None])
    with pytest.raises(Unavailable, match="pip install ctranslate2"):
        _case("greedy").callable("ctranslate2")


def test_missing_transformers_is_unavailable(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "transformers", None)    # import raises ImportError
    with pytest.raises(Unavailable, match="transformers is not installed"):
        pc.marian_dir(TINY, seed=12345)


# ---- the tiny model ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dir():
    _needs("torch", "transformers")
    return pc.marian_dir(TINY)


def test_directory_is_made_once_with_the_sharpened_weights(tiny_dir):
    from safetensors.numpy import load_file
    assert pc.marian_dir(TINY) == tiny_dir
    w = load_file(f"{tiny_dir}/model.safetensors")
    assert w["final_logits_bias"][0, 0] == pc.SHARPEN["eos_bias"]
    for table in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        np.testing.assert_array_equal(w[table], w["model.shared.weight"])
    assert not np.array_equal(w["lm_head.weight"], w["model.shared.weight"])


def test_converted_vocabulary_maps_the_ids(tiny_dir):
    _needs("ctranslate2")
    out = pc.ct2_convert(tiny_dir)
    assert pc.ct2_convert(tiny_dir) == out                       # once per run
    vocab = pc.ct2_vocabulary(out)
    assert len(vocab) == TINY["vocab_size"] - 1                  # the pad token dropped
    assert vocab[TINY["eos_token_id"]] == "</s>" and vocab[1] == "<unk>"
    assert vocab[2:5] == ("t2", "t3", "t4")


def test_ct2_greedy_tokens_equal_fastattns(tiny_dir):
    _needs("ctranslate2")
    case = _case("greedy")
    fast, ct2 = case.callable("fastattn")(), case.callable("ctranslate2")()
    n = SMALL_GEN["new_tokens"]
    assert fast.shape == ct2.shape == (SMALL_GEN["B"], n)
    np.testing.assert_array_equal(ct2, fast)
    # every row ends with eos (its own, or forced at the last position), then padding
    for row in fast:
        ids = row[row >= 0]
        assert ids[-1] == TINY["eos_token_id"] and (row[len(ids):] == -1).all()
    assert pc.count_tokens(fast) == (fast >= 0).sum()


def test_rows_of_a_run(tiny_dir):
    """The runner on the tiny cases: tokens per side, rates, the ratio, the agreement."""
    _needs("ctranslate2")
    for case in (_case("greedy"), _case("beam", "int8", "tiny_beam_int8")):
        row = runner._run_time_case(case, 2, 1, 1)
        for impl in ("fastattn", "ctranslate2"):
            assert 0 < row[f"{impl}_tokens"] <= case.tokens
            assert row[f"{impl}_tokens_per_s"] == pytest.approx(
                row[f"{impl}_tokens"] / (row[f"{impl}_ms"] / 1e3))
        assert row["tokens_per_s_ratio_vs_ctranslate2"] == pytest.approx(
            row["fastattn_tokens_per_s"] / row["ctranslate2_tokens_per_s"])
        assert 0 <= row["agreement"]["ctranslate2"] <= 1
        if case.name == "tiny":
            assert row["agreement"]["ctranslate2"] == 1
        assert not any("MISMATCH" in n for n in row["notes"])
    ct2_models.release_translators()


def test_step_breakdown_row(tiny_dir):
    case = pc.StepBreakdownCase("tiny_breakdown", config=TINY, rows=(2, 8), at=3, rounds=1)
    row = runner.finish_row(case, pc.run_step_breakdown(case, runner.empty_row(case, 2)))
    assert set(row["breakdown"]) == {"float32 R=2", "float32 R=8", "int8 R=2", "int8 R=8"}
    for parts in row["breakdown"].values():
        assert parts["step_ms"] > 0 and parts["projection_ms"] > 0 and parts["search_ms"] > 0
        assert parts["projection_share"] == pytest.approx(parts["projection_ms"] /
                                                          parts["step_ms"])
    assert row["fastattn_ms"] == row["breakdown"]["float32 R=2"]["step_ms"]
    assert row["copy_gbps"] > 0 and len(row["notes"]) == 5
