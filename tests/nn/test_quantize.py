"""model.quantize("int8" | "bf16" | "float32"): which weights are converted, the same quantized
math on both backends and in every pass (forward, decode steps, generation), the errors of
misuse, and accuracy on a model trained here (a reverse task) and on random weights.

The kernels themselves are tested against their twin in tests/test_ops_quant.py; here the
question is whether the model layer routes every product through them and nothing else.
"""

import numpy as np
import pytest

import fastattn
from fastattn import nn as fnn
from fastattn import ops
from conftest import assert_close, run_in_threads
from nn_util import C, F, H, features
from tolerances import TOL, max_rel

TYPES = ("int8", "bf16", "bfloat16")
# relative errors (max_rel: max|diff| <= rel x max|ref|): against the float32 original, and the
# same quantized math computed two ways; the reasons for their sizes are in tolerances.py
REL_ERROR = TOL["quantized_vs_float32"]
SAME_MATH = TOL["quantized_same_math"]


def transformer(seed=0, **kw):
    cfg = dict(d_model=C, nhead=H, num_encoder_layers=2, num_decoder_layers=2,
               dim_feedforward=F)
    cfg.update(kw)
    m = fnn.Transformer(**cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for _, p in m.named_parameters():             # biases and norms off their init
        p[...] += 0.1 * rng.standard_normal(p.shape).astype(np.float32)
    return m


def seq2seq(seed=0, V=23, **kw):
    m = fnn.Seq2SeqTransformer(2, 2, C, H, V, V, F, pad_id=0, max_len=64, seed=seed, **kw)
    rng = np.random.default_rng(seed + 1)
    for _, p in m.named_parameters():
        p[...] += 0.05 * rng.standard_normal(p.shape).astype(np.float32)
    return m


# ---- what is converted -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", TYPES)
def test_quantize_converts_the_linear_weights_and_nothing_else(kind):
    m = seq2seq()
    floats = {k: v.copy() for k, v in m.named_parameters()}
    assert m.quantize(kind) is m
    assert m.compute_type == kind
    converted = {k for k, v in m.named_parameters() if isinstance(v, ops.QuantizedWeight)}
    expect = {k for k in floats if k.endswith(("in_proj_weight", "out_proj.weight",
                                               "linear1.weight", "linear2.weight"))}
    assert converted == expect | {"generator.weight"}
    for k, v in m.named_parameters():
        if k in converted:
            assert v.dtype == kind and v.shape == floats[k].shape
            assert_close(v.dequantize(), floats[k],
                         **max_rel(floats[k], TOL["quantized_weight"][kind]), name=k)
        else:                                     # embeddings, norms, biases: untouched
            assert v.dtype == np.float32 and np.array_equal(v, floats[k])
    nbytes = sum(floats[k].nbytes for k in converted)
    quantized = sum(v.nbytes for k, v in m.named_parameters() if k in converted)
    assert quantized < nbytes * (0.3 if kind == "int8" else 0.51)   # int8: + a scale per row


@pytest.mark.parametrize("kind", TYPES)
def test_quantize_float32_converts_back_to_the_dequantized_values(kind):
    m = transformer().quantize(kind)
    q = {k: v.dequantize() for k, v in m.named_parameters() if isinstance(v, ops.QuantizedWeight)}
    m.quantize("float32")
    assert m.compute_type == "float32"
    params = dict(m.named_parameters())
    assert all(np.array_equal(params[k], v) and params[k].dtype == np.float32
               for k, v in q.items())
    m.train()                                     # a float32 model trains again
    m.eval()


def test_state_dict_of_a_quantized_model_is_float32_and_what_it_multiplies_by():
    m = seq2seq().quantize("int8")
    sd = m.state_dict()
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in sd.values())
    w = dict(m.named_parameters())["generator.weight"]
    assert np.array_equal(sd["generator.weight"], w.dequantize())


def test_compute_type_is_mixed_when_parts_were_quantized_apart():
    m = transformer()
    m.encoder.quantize("int8")
    assert m.encoder.compute_type == "int8" and m.decoder.compute_type == "float32"
    assert m.compute_type == "mixed"
    m.decoder.quantize("bf16")
    assert m.compute_type == "mixed"
    with pytest.raises(ValueError, match="quantize twice"):
        m.quantize("int8")                        # the decoder is bf16
    m.quantize("float32")
    assert m.compute_type == "float32"


# ---- misuse ------------------------------------------------------------------------------------

def test_misuse_is_a_clear_error():
    m = transformer()
    with pytest.raises(ValueError, match="compute_type must be one of"):
        m.quantize("int4")
    with pytest.raises(ValueError, match="compute_type must be one of"):
        m.quantize(np.int8)
    m.train()
    with pytest.raises(RuntimeError, match="training mode"):
        m.quantize("int8")
    m.eval().quantize("int8")
    with pytest.raises(RuntimeError, match="quantized .*inference only"):
        m.train()
    assert not m.training
    with pytest.raises(ValueError, match="quantize twice"):
        m.quantize("bf16")
    with pytest.raises(RuntimeError, match="quantized"):
        m.load_state_dict(transformer().state_dict())
    with pytest.raises(ValueError, match="AdamW: the model is quantized"):
        fastattn.optim.AdamW(m)
    assert m.quantize("int8") is m                # the same type again: nothing to do


# ---- the same math everywhere ---------------------------------------------------------------

@pytest.mark.parametrize("kind", TYPES)
def test_quantized_transformer_fast_and_reference_backends_agree(kind):
    rng = np.random.default_rng(0)
    src, tgt = features(rng, 2, 9), features(rng, 2, 6)
    mask = fnn.generate_square_subsequent_mask(6)
    fast = transformer().quantize(kind)
    ref = transformer().quantize(kind).to_backend("reference")
    out = fast(src, tgt, tgt_mask=mask)
    want = ref(src, tgt, tgt_mask=mask)
    assert_close(out, want, **max_rel(want, SAME_MATH[kind]))
    f32 = transformer()(src, tgt, tgt_mask=mask)
    assert_close(out, f32, **max_rel(f32, REL_ERROR[kind]), name="against float32")
    assert not np.array_equal(out, f32)                # quantized: close, and not the same


@pytest.mark.parametrize("kind", TYPES)
def test_quantized_decode_steps_equal_the_full_forward(kind):
    """The KV-cache decode step (few rows: the kernels' decode path) computes what the full
    forward (many rows) does on the same quantized weights."""
    m = seq2seq().quantize(kind)
    rng = np.random.default_rng(1)
    src = rng.integers(1, 23, size=(3, 8))
    tgt = rng.integers(1, 23, size=(3, 5))
    full = m(src, tgt, tgt_mask=fnn.generate_square_subsequent_mask(5))
    cache = m.init_cache(src, max_len=5)
    steps = np.stack([m.step(tgt[:, t], cache) for t in range(5)], axis=1)
    assert_close(steps, full, **max_rel(full, SAME_MATH[kind]), name="steps vs forward")


@pytest.mark.parametrize("kind", TYPES)
def test_quantized_generation_fast_equals_reference(kind):
    rng = np.random.default_rng(2)
    src = rng.integers(1, 23, size=(4, 10))
    kw = dict(max_new_tokens=8, start_id=1)
    fast = seq2seq().quantize(kind)
    ref = seq2seq().quantize(kind).to_backend("reference")
    assert np.array_equal(fast.generate(src, **kw), ref.generate(src, **kw))
    beam = dict(kw, method="beam", beam_size=3)
    assert np.array_equal(fast.generate(src, **beam), ref.generate(src, **beam))


def test_quantized_outputs_do_not_depend_on_the_thread_count(restore_threads):
    m = seq2seq().quantize("int8")
    rng = np.random.default_rng(3)
    src = rng.integers(1, 23, size=(4, 40))
    tgt = rng.integers(1, 23, size=(4, 30))
    outs = []
    for n in (1, 2):
        fastattn.set_num_threads(n)
        outs.append(m(src, tgt))
    assert np.array_equal(outs[0], outs[1])


def test_eight_python_threads_share_one_quantized_model():
    """The kernels' layouts are built lazily on first use: threads racing to build them must
    still all get the single-thread answer."""
    m = seq2seq(seed=4).quantize("int8")
    rng = np.random.default_rng(4)
    srcs = [rng.integers(1, 23, size=(2, 6 + i)) for i in range(8)]
    want = [seq2seq(seed=4).quantize("int8").generate(s, max_new_tokens=6, start_id=1)
            for s in srcs]
    got = [None] * 8

    def run(i):
        got[i] = m.generate(srcs[i], max_new_tokens=6, start_id=1)
    run_in_threads(run, 8)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


# ---- accuracy ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", TYPES)
def test_random_model_logits_error_is_bounded(kind):
    """The error stated in the README for random weights (here d_model 32, for speed)."""
    m = seq2seq(seed=5)
    rng = np.random.default_rng(5)
    src = rng.integers(1, 23, size=(4, 12))
    tgt = rng.integers(1, 23, size=(4, 9))
    f32 = m(src, tgt)
    q = m.quantize(kind)(src, tgt)
    assert_close(q, f32, **max_rel(f32, REL_ERROR[kind]))


@pytest.fixture(scope="module")
def reverse_model():
    """A model trained here, with fastattn, to reverse words of letters (about 10 s)."""
    from fastattn.tokenizers import CharTokenizer
    from fastattn.train import fit

    letters = "abcdefghij"
    rng = np.random.default_rng(0)

    def words(n):
        return ["".join(rng.choice(list(letters), int(rng.integers(3, 9)))) for _ in range(n)]
    tok = CharTokenizer().train([letters])
    m = fnn.Seq2SeqTransformer(2, 2, 64, 4, tok.vocab_size, tok.vocab_size, 128, 0.0,
                               pad_id=tok.pad_id, max_len=16, seed=0)
    before = fastattn.get_num_threads()
    fastattn.set_num_threads(1)
    try:
        fit(m, [(w, w[::-1]) for w in words(2000)], src_tokenizer=tok, tgt_tokenizer=tok,
            max_steps=700, batch_tokens=1024, schedule="cosine", lr=3e-3, warmup=50,
            label_smoothing=0.0, progress=False, seed=0)
    finally:
        fastattn.set_num_threads(before)
    m.eval()
    held_out = words(1000)
    return m, tok, held_out


def _teacher_forced(m, tok, texts):
    """The mean cross-entropy of the held-out reversals, sources and targets encoded as fit
    encodes them (<start> ... <end>)."""
    from fastattn.train.batching import collate

    src = [np.array(tok.encode(w, add_start_end=True)) for w in texts]
    tgt = [np.array(tok.encode(w[::-1], add_start_end=True)) for w in texts]
    rows = range(len(texts))
    return float(m.loss(collate(src, rows, tok.pad_id), collate(tgt, rows, tok.pad_id)))


@pytest.mark.long
# The loss bounds are the issue's: int8 at most +2%, bf16 +0.5%. Measured on 1000 held-out
# words over seeds 0-5 (README): int8 -0.2% to +1.2% trained on the AVX-512 kernels, -0.2%
# to +2.0% on the AVX2 ones; bf16 -0.3% to +0.2%. The tokens are compared on the first 200
# words.
@pytest.mark.parametrize("kind, loss_rise, tokens", [("int8", 0.02, 0.95), ("bf16", 0.005, 0.95),
                                                     ("bfloat16", 0.005, 0.98)])
def test_trained_model_keeps_its_tokens_and_its_loss(restore_threads, reverse_model, kind,
                                                    loss_rise, tokens):
    m, tok, held_out = reverse_model
    words = held_out[:200]
    fastattn.set_num_threads(1)
    want = m.translate(words, tok, tok, max_new_tokens=10)
    loss = _teacher_forced(m, tok, held_out)
    assert sum(o == w[::-1] for o, w in zip(want, words)) >= 0.6 * len(words)  # learned
    q = fnn.Seq2SeqTransformer(**m.config)
    q.load_state_dict(m.state_dict())
    q.eval().quantize(kind)
    got = q.translate(words, tok, tok, max_new_tokens=10)
    q_loss = _teacher_forced(q, tok, held_out)
    pairs = [(a, b) for g, w in zip(got, want) for a, b in zip(g.ljust(10), w.ljust(10))]
    same = sum(a == b for a, b in pairs) / len(pairs)
    assert same >= tokens, f"{kind}: {same:.1%} of positions equal the float32 tokens"
    # relative to the loss, but not below a floor: a model this well trained has a loss near
    # zero, where any rounding is a large share of it
    assert q_loss - loss <= loss_rise * max(loss, 0.05), \
        f"{kind}: loss {loss:.4f} -> {q_loss:.4f}"


@pytest.mark.parametrize("kind", TYPES)
def test_multihead_attention_with_separate_projections_quantizes_them(kind):
    """kdim / vdim: q_proj_weight, k_proj_weight and v_proj_weight are linear weights too."""
    def mha():
        m = fnn.MultiheadAttention(C, H, kdim=12, vdim=20, add_bias_kv=True, seed=7)
        rng = np.random.default_rng(7)
        for _, p in m.named_parameters():
            p[...] += 0.1 * rng.standard_normal(p.shape).astype(np.float32)
        return m
    rng = np.random.default_rng(8)
    q, k, v = features(rng, 2, 5), features(rng, 2, 7, 12), features(rng, 2, 7, 20)
    f32 = mha()(q, k, v, need_weights=False)[0]
    m = mha().quantize(kind)
    assert {k for k, w in m.named_parameters() if isinstance(w, ops.QuantizedWeight)} == {
        "q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight"}
    out = m(q, k, v, need_weights=False)[0]
    ref = mha().quantize(kind).to_backend("reference")(q, k, v, need_weights=False)[0]
    assert_close(out, ref, **max_rel(ref, SAME_MATH[kind]))
    assert_close(out, f32, **max_rel(f32, REL_ERROR[kind]), name="against float32")
    assert not np.array_equal(out, f32)
