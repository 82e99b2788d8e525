"""bf16 mixed-precision training (set_precision / fit(precision=) / fastattn train
--precision): the model's gradients against the twin's bf16 emulation and against float32, the
weights' bf16 copies made once per optimizer step, learning level with float32, checkpoints
that record the precision and resume exactly in it (or continue in the other one)."""
import json

import numpy as np
import pytest

import fastattn
from fastattn.cli import main
from fastattn.nn import Seq2SeqTransformer
from fastattn.kinds import Bf16TrainingWeight
from fastattn.tokenizers import WordTokenizer
from fastattn.train import fit
from fastattn.train.evaluate import Evaluator
from conftest import assert_close
from test_learning import reverse_pairs
from tolerances import TOL
from train_util import char_tokenizer, tiny_model, untimed, words

pytestmark = pytest.mark.usefixtures("single_thread")

# Whole-model gradients, all parameters' together (norm of the difference over the norm):
# - bf16 kernels vs the twin's bf16 (MODEL_TWIN): each product rounds at the same points (the
#   op tests hold the kernels to the twin within 1e-4), but an input that differs by a float32
#   ulp between the two, or attention's P rounded at the running maximum of its key blocks
#   (the twin: at the row's maximum; tests/test_ops_bf16_training.py), may round to the
#   neighbouring bf16 (2^-8 apart), and every layer after carries that on. The block sizes
#   depend on the SIMD level, and so does this distance (about 1e-3 to 2.5e-2 on this model).
# - bf16 vs float32 (BF16_FROM_FP32): every product's operands rounded to 8 significant bits.
MODEL_TWIN = TOL["bf16_training_model"]["twin"]
BF16_FROM_FP32 = TOL["bf16_training_model"]["vs_fp32"]


def grads_of(precision, backend="fast", dropout=0.0):
    m = Seq2SeqTransformer(2, 2, 64, 4, 50, 50, dim_feedforward=128, dropout=dropout, seed=0)
    m.to_backend(backend).set_precision(precision).train()
    m.manual_seed(3)
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 50, (4, 9)), rng.integers(1, 50, (4, 8))
    loss = m.loss(src, tgt, label_smoothing=0.1, backward=True)
    return loss, {k: v.copy() for k, v in m.named_grads()}


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def flat(grads):
    return np.concatenate([grads[k].ravel() for k in sorted(grads)])


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_model_gradients_against_the_twin_and_fp32(dropout):
    loss, fast = grads_of("bf16", dropout=dropout)
    twin_loss, twin = grads_of("bf16", "reference", dropout=dropout)
    fp32_loss, fp32 = grads_of("fp32", dropout=dropout)
    _, fp32_twin = grads_of("fp32", "reference", dropout=dropout)
    assert abs(loss - twin_loss) <= 1e-3 * abs(twin_loss)
    assert 1e-6 < abs(loss - fp32_loss) <= 1e-2 * abs(fp32_loss)
    assert rel(flat(fp32), flat(fp32_twin)) <= 1e-5          # float32: the twin to rounding
    assert rel(flat(fast), flat(twin)) <= MODEL_TWIN
    lo, hi = BF16_FROM_FP32
    assert lo <= rel(flat(twin), flat(fp32)) <= hi
    # every GEMM weight's gradient moved from float32's: every product ran in bf16
    for k in twin:
        if k.endswith("weight") and "norm" not in k and "emb" not in k:
            assert rel(fast[k], fp32[k]) > 1e-4, k


def test_precision_is_checked_and_kept():
    tok = char_tokenizer()
    m = tiny_model(tok)
    assert m.precision == "fp32"
    for bad in ("bf8", "float16", None, 16):
        with pytest.raises(ValueError, match="precision must be 'fp32' or 'bf16'"):
            m.set_precision(bad)
    assert m.set_precision("bfloat16") is m
    assert all(sub.precision == "bf16" for sub in m.modules())
    m.to_backend("reference")                      # a backend switch keeps the precision
    assert all(sub.precision == "bf16" for sub in m.modules())
    m.set_precision("float32")
    assert all(sub.precision == "fp32" for sub in m.modules())
    with pytest.raises(ValueError, match="fit: precision must be"):
        fit(m, [("ab", "ba")], src_tokenizer=tok, tgt_tokenizer=tok, max_steps=1,
            precision="half", progress=False)


def test_fit_takes_the_models_precision_and_refuses_a_contradiction():
    """fit() without precision= trains in the precision the model was set to (bit for bit the
    run with that precision given); precision='fp32' for a model set to bf16 is a ValueError
    raised before the model is touched, as is a model whose submodules were set apart."""
    tok = char_tokenizer()
    pairs = [(w, w[::-1]) for w in words(40)]
    args = dict(src_tokenizer=tok, tgt_tokenizer=tok, max_steps=3, batch_tokens=96, lr=1e-2,
                warmup=2, progress=False)
    given = fit(tiny_model(tok), pairs, precision="bf16", **args)
    fp32 = fit(tiny_model(tok), pairs, **args)
    assert given.losses != fp32.losses
    m = tiny_model(tok).set_precision("bf16")
    taken = fit(m, pairs, **args)
    assert taken.losses == given.losses
    assert m.precision == "bf16"
    m = tiny_model(tok).set_precision("bf16")
    before = {k: v.copy() for k, v in m.named_parameters()}
    with pytest.raises(ValueError, match=r"precision='fp32'.*set to 'bf16'"):
        fit(m, pairs, precision="fp32", **args)
    assert m.precision == "bf16" and not m.training
    assert all(np.array_equal(v, before[k]) for k, v in m.named_parameters())
    mixed = tiny_model(tok)
    mixed.transformer.decoder.set_precision("bf16")
    with pytest.raises(ValueError, match=r"submodules.*give precision="):
        fit(mixed, pairs, **args)
    assert fit(mixed, pairs, precision="bf16", **args).losses == given.losses


def test_weight_copies_are_made_once_per_version():
    """bf16 training's copies are kinds the module owns: made at set_precision / train(), the
    same object at every use, rounded again into the same array after a write, and dropped by
    eval() (no bf16 copy outlives training)."""
    tok = char_tokenizer()
    m = tiny_model(tok).train().set_precision("bf16")
    lin = m.transformer.encoder.layers[0].linear1
    kind = lin._kinds["weight"][2]                       # made by set_precision, not on use
    assert isinstance(kind, Bf16TrainingWeight)
    first = kind.data
    assert lin._kind("weight") is kind and kind.data is first   # a second use: the same copy
    assert np.array_equal(first, fastattn.reference.round_bfloat16(lin.weight))
    attn = m.transformer.encoder.layers[0].self_attn
    sliced = attn._kind("in_proj_weight", 32, 64)
    assert attn._kind("in_proj_weight", 32, 64) is sliced     # slices are kept too
    assert np.shares_memory(sliced.data, attn._kind("in_proj_weight").data)
    before = first.copy()
    w = lin.weight
    w *= 2.0                                              # a write: a new version
    second = lin._kind("weight").data                     # rounded again, into the same array
    assert second is first and np.array_equal(second, 2.0 * before)
    m.eval()
    assert not any(isinstance(k[2], Bf16TrainingWeight) for sub in m.modules()
                   for k in sub._kinds.values())


def test_packed_forms_are_made_once_per_version():
    """On the bf16 tiles (real or emulated) each weight's packed forms, like its rounded copy,
    are made once per version: a second use gets the same object, a write a new one."""
    info = fastattn.build_info()
    tiles = info["bf16_path"] in ("amx", "amx-emulated")
    tok = char_tokenizer()
    m = tiny_model(tok).train().set_precision("bf16")
    lin = m.transformer.encoder.layers[0].linear1
    w = lin.weight
    fwd, bwd = lin._kind("weight").train_operand(1)[1], lin._kind("weight").train_operand(0)[1]
    if not tiles:
        assert fwd is None and bwd is None
        return
    assert (fwd.M, fwd.K, fwd.trans) == (*w.shape, 1) and (bwd.trans == 0)
    assert lin._kind("weight").train_operand(1)[1] is fwd
    assert lin._kind("weight").train_operand(0)[1] is bwd
    w += 1.0
    assert lin._kind("weight").train_operand(1)[1] is not fwd


@pytest.mark.parametrize("extra", [{}, {"add_bias_kv": True, "add_zero_attn": True},
                                   {"kdim": 24, "vdim": 40}])
def test_attention_keeps_its_heads_as_bf16_bits(extra):
    """In bf16 training a MultiheadAttention keeps q, k and v for its backward as bf16 bits
    (half the memory; the backward's products read them rounded), with the extra keys of
    add_bias_kv / add_zero_attn and separate key / value projections too; its gradients stay
    the twin's, and the weights a need_weights call returns are those of the rounded heads."""
    from fastattn.nn import MultiheadAttention
    rng = np.random.default_rng(2)
    C, H, B, L, S = 32, 4, 3, 7, 9
    q = rng.standard_normal((B, L, C)).astype(np.float32)
    k = rng.standard_normal((B, S, extra.get("kdim", C))).astype(np.float32)
    v = rng.standard_normal((B, S, extra.get("vdim", C))).astype(np.float32)
    dy = rng.standard_normal((B, L, C)).astype(np.float32)
    got = {}
    for backend in ("fast", "reference"):
        m = MultiheadAttention(C, H, batch_first=True, seed=1, **extra)
        m.to_backend(backend).set_precision("bf16").train()
        out, w = m(q, k, v, need_weights=True)
        kept = m._saved.record.kept
        if backend == "fast":
            assert all(y.dtype == np.uint16 for y, _ in kept)
        grads = m.backward(dy)
        got[backend] = (out, w, grads, {n: g.copy() for n, g in m.named_grads()})
    (out, w, grads, pg), (t_out, t_w, t_grads, t_pg) = got["fast"], got["reference"]
    assert rel(out, t_out) <= 1e-3 and rel(w, t_w) <= 1e-2
    for a, b in zip(grads, t_grads):
        assert rel(a, b) <= MODEL_TWIN
    assert rel(flat(pg), flat(t_pg)) <= MODEL_TWIN


def _learn(precision):
    """The reversal task of test_learning, 400 held-out pairs, a cosine schedule (its rate
    decays to 0, so the run settles instead of stopping at an arbitrary point of its
    oscillations, which would compare noise)."""
    pairs = reverse_pairs(1900, seed=0)
    train, test = pairs[:1500], pairs[1500:]
    tok = WordTokenizer().train([t for p in train for t in p])
    model = Seq2SeqTransformer(2, 2, 64, 4, tok.vocab_size, tok.vocab_size, 128, 0.0,
                               pad_id=tok.pad_id, max_len=16, seed=0)
    history = fit(model, train, src_tokenizer=tok, tgt_tokenizer=tok, max_steps=500,
                  batch_tokens=512, lr=2e-3, warmup=40, schedule="cosine", progress=False,
                  seed=0, precision=precision)
    final = float(np.mean(history.losses[-50:]))
    exact = Evaluator(test, src_tokenizer=tok, tgt_tokenizer=tok, max_len=16,
                      exact_sample=None)(model)["valid_exact"]
    return final, exact


@pytest.mark.long
def test_bf16_learns_as_fp32_does():
    """The same model, data and budget in both precisions: the final loss (mean of the last 50
    steps) within 2% and the held-out exact match within 2 points."""
    loss32, exact32 = _learn("fp32")
    loss16, exact16 = _learn("bf16")
    assert exact32 >= 0.9
    assert abs(loss16 - loss32) <= 0.02 * loss32, (loss16, loss32)
    assert abs(exact16 - exact32) <= 0.02, (exact16, exact32)


def _run(tok, pairs, ckpt, precision, **kw):
    args = dict(src_tokenizer=tok, tgt_tokenizer=tok, valid_pairs=pairs[:8], max_steps=12,
                batch_tokens=96, lr=1e-2, warmup=3, eval_every=6, seed=7, progress=False,
                checkpoint_dir=ckpt, precision=precision)
    args.update(kw)
    return fit(tiny_model(tok, dropout=0.1, seed=1), pairs, **args)


def _stop_after(k):
    def callback(record, model):
        if record["step"] == k:
            raise StopIteration
    return callback


def test_checkpoints_record_the_precision_and_resume_exactly_in_bf16(tmp_path):
    tok = char_tokenizer()
    pairs = [(w, w[::-1]) for w in words(60)]
    whole = _run(tok, pairs, None, "bf16")
    fp32 = _run(tok, pairs, None, "fp32")
    assert whole.losses != fp32.losses
    first = _run(tok, pairs, tmp_path, "bf16", callbacks=[_stop_after(5)])
    assert len(first.steps) == 5
    state = json.loads((tmp_path / "step-00000005" / "state.json").read_text())
    assert state["fit"]["precision"] == "bf16"
    resumed = _run(tok, pairs, tmp_path, "bf16", resume=True)
    assert resumed.losses == whole.losses                  # bit for bit
    assert untimed(resumed)[-1] == untimed(whole)[-1]


def test_a_run_resumes_in_the_other_precision(tmp_path, capsys):
    """fp32 for 5 steps, then bf16: the first 5 losses are the fp32 run's, the steps after
    are computed in bf16 (close to, not equal to, the fp32 run's), and the resume says so."""
    tok = char_tokenizer()
    pairs = [(w, w[::-1]) for w in words(60)]
    fp32 = _run(tok, pairs, None, "fp32")
    _run(tok, pairs, tmp_path, "fp32", callbacks=[_stop_after(5)])
    mixed = _run(tok, pairs, tmp_path, "bf16", resume=True, progress="json")
    assert mixed.losses[:5] == fp32.losses[:5]
    assert mixed.losses[5:] != fp32.losses[5:]
    assert_close(mixed.losses[5:], fp32.losses[5:], **TOL["bf16_vs_fp32_losses"],
                 name="losses after the resume", dtype=None, equal_nan=False)
    assert "settings changed: precision" in capsys.readouterr().err


def test_fastattn_train_precision_flag(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words(60, lo=2, hi=6)))
    out = tmp_path / "run"
    args = ["train", str(data), "--out", str(out), "--model", "tiny", "--tokenizer", "char",
            "--batch-tokens", "128", "--valid", "0.1", "--steps", "3", "--quiet"]
    assert main(args + ["--precision", "bf16"]) == 0
    assert json.loads((out / "config.json").read_text())["precision"] == "bf16"
    assert main(args + ["--steps", "4", "--resume", "--precision", "fp32"]) == 0
    assert json.loads((out / "config.json").read_text())["precision"] == "fp32"
    with pytest.raises(SystemExit):
        main(args + ["--precision", "fp16"])
