"""Beam search (hand-checked and against a plain oracle), batch invariance, output layout,
bad arguments, translate().
"""

import numpy as np
import pytest

from fastattn import generate as fgen
from fastattn import nn as fnn
from fastattn.tokenizers import WordTokenizer
from gen_util import *  # noqa: F401,F403  (models, batches, oracles)
from gen_util import TORCH_WARNINGS

pytestmark = TORCH_WARNINGS


# beam search, hand-checked on models whose next-token distribution is fixed by construction



def markov_model(probs, backend="fast", scale=1000.0):
    """A model whose next-token distribution is probs[last token], whatever the source and the
    position (to ~1e-3 in log-probability).

    Pre-LN decoder layers whose output projections (self-attention, cross-attention, linear2)
    are zero leave the stream x = sqrt(C) * E[token] + pe[t] unchanged; the decoder's final
    LayerNorm maps it to LN(E[token]) up to |pe| / (sqrt(C) * scale). E[token] = scale * u,
    u the token's one-hot row made zero-mean and unit-variance (so LN(u) = u), and the
    generator solves u @ W.T = log probs for W."""
    V = len(probs)
    m = fnn.Seq2SeqTransformer(1, 2, C, H, 5, V, F, norm_first=True, backend=backend, seed=31)
    for layer in m.transformer.decoder.layers:
        for lin in (layer.self_attn.out_proj, layer.multihead_attn.out_proj, layer.linear2):
            lin.weight[...] = 0
            lin.bias[...] = 0
    onehot = np.eye(V, C)
    u = (onehot - onehot.mean(1, keepdims=True)) / onehot.std(1, keepdims=True)   # (V, C)
    m.tgt_tok_emb.embedding.weight[...] = scale * u
    w = np.linalg.lstsq(u, np.log(np.maximum(probs, 1e-12)), rcond=None)[0]       # (C, V)
    m.generator.weight[...] = w.T
    m.generator.bias[...] = 0
    return m


def check_markov(m, probs):
    """The construction holds: log-softmax of the logits at every position of a prefix is
    log probs[token there], within 2e-3 where the probability is not 0."""
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, len(probs), size=(3, 9))
    logits = m(rng.integers(0, 5, size=(3, 4)), prefix).astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    want = np.log(np.maximum(probs[prefix], 1e-300))
    keep = probs[prefix] > 0
    assert np.abs(logp - want)[keep].max() < 2e-3


# start -> a .5 (greedy) -> c .4 -> end .6: greedy's sequence has log-probability -2.120;
# beam search (2 slots) keeps b (.4) too and finds b -> end .9: -1.022.
#   step 1: a -0.693, b -0.916 (c -2.303 dropped)
#   step 2: b end -1.022 (finished), a c -1.609, a end -1.743 (dropped), ...
#   step 3: a c end -2.120 (finished), a c a -2.526 (live), ... every later one is worse.
BETTER_THAN_GREEDY = table({
    "start": dict(a=0.5, b=0.4, c=0.1),
    "a": dict(c=0.4, end=0.35, b=0.25),
    "b": dict(end=0.9, c=0.1),
    "c": dict(end=0.6, a=0.4),
    "d": dict(end=1.0),
})

# start -> a .6 -> end .55 (greedy: sum -1.109, mean -0.554) against
# start -> b .4 -> c .9 -> d .9 -> end .9 (sum -1.233, mean -0.308): summed log-probability
# (length_penalty 0) prefers the first, the per-token mean (length_penalty 1) the second.
#   step 2: b c -1.022, a end -1.109 (finished), a d -1.427 (dropped)
#   step 3: b c d -1.127, b c end -3.324 (finished: -1.108 per token)
#   step 4: b c d end -1.233 (finished), b c d d -3.430
LENGTH_PENALTY_FLIPS = table({
    "start": dict(a=0.6, b=0.4),
    "a": dict(end=0.55, d=0.4, b=0.05),
    "b": dict(c=0.9, end=0.1),
    "c": dict(d=0.9, end=0.1),
    "d": dict(end=0.9, d=0.1),
})

# both slots finish at step 2 (a end -0.799, b end -1.022): no live hypothesis is left, the
# source stops and the best finished one wins.
ALL_FINISH = table({
    "start": dict(a=0.5, b=0.4, c=0.1),
    "a": dict(end=0.9, c=0.1),
    "b": dict(end=0.9, c=0.1),
    "c": dict(a=1.0),
    "d": dict(end=1.0),
})

HAND_CHECKED = [
    # (name, probabilities, method options, expected tokens)
    ("better: greedy", BETTER_THAN_GREEDY, dict(method="greedy"), ids("start", "a", "c", "end")),
    ("better: beam 2 lp 0", BETTER_THAN_GREEDY, dict(beam_size=2, length_penalty=0.0),
     ids("start", "b", "end")),
    ("better: beam 2 lp 1", BETTER_THAN_GREEDY, dict(beam_size=2, length_penalty=1.0),
     ids("start", "b", "end")),
    ("better: beam 3 lp 1", BETTER_THAN_GREEDY, dict(beam_size=3, length_penalty=1.0),
     ids("start", "b", "end")),
    ("flips: greedy", LENGTH_PENALTY_FLIPS, dict(method="greedy"), ids("start", "a", "end")),
    ("flips: beam 2 lp 0", LENGTH_PENALTY_FLIPS, dict(beam_size=2, length_penalty=0.0),
     ids("start", "a", "end")),
    ("flips: beam 2 lp 1", LENGTH_PENALTY_FLIPS, dict(beam_size=2, length_penalty=1.0),
     ids("start", "b", "c", "d", "end")),
    ("all finish: beam 2 lp 1", ALL_FINISH, dict(beam_size=2, length_penalty=1.0),
     ids("start", "a", "end")),
]


@pytest.fixture(scope="module")
def markov_models():
    cache = {}

    def get(probs, backend):
        key = (id(probs), backend)
        if key not in cache:
            cache[key] = markov_model(probs, backend)
            check_markov(cache[key], probs)
        return cache[key]
    return get


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("name,probs,options,expected", HAND_CHECKED,
                         ids=[c[0] for c in HAND_CHECKED])
def test_beam_hand_checked(markov_models, backend, name, probs, options, expected):
    m = markov_models(probs, backend)
    src = np.array([[1, 2, 3, 4], [4, 3, 0, 0]])            # the distribution ignores it
    options = dict(dict(method="beam"), **options)
    out = m.generate(src, max_new_tokens=6, start_id=TOKENS["start"], end_id=TOKENS["end"],
                     **options)
    assert_tokens(out, [expected] * 2)


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_beam_length_penalty_on_a_constant_distribution(backend):
    """Each step: a .5, end .4, b .1. Summed log-probability (length_penalty 0) prefers the
    immediate end (-0.916); the per-token mean (length_penalty 1) the live a a a a (-0.693 per
    token) over every a..a end found on the way (-0.805, -0.768, -0.749)."""
    m = constant_model([0, 0, 0.4, 0.5, 0.1, 0, 0], backend)
    src = np.array([[1, 2, 3]])
    kw = dict(max_new_tokens=4, start_id=1, end_id=2)
    assert_tokens(m.generate(src, **kw), [[1, 3, 3, 3, 3]], name="greedy")
    assert_tokens(m.generate(src, method="beam", beam_size=2, length_penalty=0.0, **kw),
                  [[1, 2]], name="length_penalty 0")
    assert_tokens(m.generate(src, method="beam", beam_size=2, length_penalty=0.5, **kw),
                  [[1, 2]], name="length_penalty 0.5")
    assert_tokens(m.generate(src, method="beam", beam_size=2, length_penalty=1.0, **kw),
                  [[1, 3, 3, 3, 3]], name="length_penalty 1")
    # no end token: every hypothesis has the same length, the summed score decides
    assert_tokens(m.generate(src, method="beam", beam_size=3, max_new_tokens=3, start_id=1),
                  [[1, 3, 3, 3]], name="end_id None")


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_beam_exact_ties_go_to_the_lower_slot_then_token(backend):
    """a and b exactly tied at .45 each step, end .1: the slots hold a, b after step 1, then
    a a, a b (slot 0 first, then the lower token), then a a a, a a b; the tied live
    hypotheses are scored alike and the first (slot 0) wins."""
    m = constant_model([0, 0, 0.1, 0.45, 0.45, 0, 0], backend)
    src = np.array([[1, 2, 3]])
    kw = dict(max_new_tokens=3, start_id=1, end_id=2)
    assert_tokens(m.generate(src, **kw), [[1, 3, 3, 3]], name="greedy")
    for lp in (0.0, 1.0):
        assert_tokens(m.generate(src, method="beam", beam_size=2, length_penalty=lp, **kw),
                      [[1, 3, 3, 3]], name=f"beam, length_penalty {lp}")


def beam_oracle(m, src, *, beam_size, max_new_tokens, start_id, end_id, length_penalty):
    """The docstring's beam search for ONE source, written plainly: no cache, no batching;
    each live hypothesis' log-probabilities come from the full model on its whole prefix.
    Live hypotheses are kept in slot order (an emptied slot just disappears, which keeps the
    order of the others, all the tie rule needs)."""
    live = [(0.0, [start_id])]                                 # (sum log p, tokens)
    finished = []                                              # (normalised score, tokens)
    for _ in range(max_new_tokens):
        prefixes = np.array([seq for _, seq in live])
        logits = m(np.repeat(src[None], len(live), 0), prefixes)[:, -1].astype(np.float64)
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        cands = sorted(((s + logp[j, w], j, w) for j, (s, _) in enumerate(live)
                        for w in range(logp.shape[1])), key=lambda c: (-c[0], c[1], c[2]))
        new = []
        for s, j, w in cands[:beam_size]:
            seq = live[j][1] + [w]
            if w == end_id:
                finished.append((s / (len(seq) - 1) ** length_penalty, seq))
            else:
                new.append((s, seq))
        live = new
        if not live:
            break
    pool = finished + [(s / (len(seq) - 1) ** length_penalty, seq) for s, seq in live]
    best = max(range(len(pool)), key=lambda i: (pool[i][0], -i))
    return pool[best][1]


@pytest.mark.parametrize("seed,beam_size,length_penalty", [(40, 3, 1.0), (41, 2, 0.0),
                                                           (42, 4, 0.6)])
def test_beam_matches_plain_beam_search(seed, beam_size, length_penalty):
    """Random models, a padded batch, an end token that finishes hypotheses at different
    steps: both backends give, for every source, what the plain one-source search gives on
    that source without its padding."""
    fast, ref = twins(seed=seed, norm_first=bool(seed % 2))
    src, kpm = source_batch(seed=seed, lengths=(7, 3, 5))
    kw = dict(max_new_tokens=8, start_id=START, src_key_padding_mask=kpm)
    end = ending_token(fast.generate(src, method="beam", beam_size=beam_size, **kw))
    kw.update(end_id=end, method="beam", beam_size=beam_size, length_penalty=length_penalty)
    want = [beam_oracle(ref, row[~pad], beam_size=beam_size, max_new_tokens=8,
                        start_id=START, end_id=end, length_penalty=length_penalty)
            for row, pad in zip(src, kpm)]
    want = cut_at_end(want, None, PAD)
    assert_tokens(fast.generate(src, **kw), want, name="fast")
    assert_tokens(ref.generate(src, **kw), want, name="reference")


# ----------------------------------------------------------------------------------------------
# batch invariance: a padded batch = each row alone without its padding
#
# Sampling is left out on purpose: one generator draws one number per live row per step, so a
# row's draws depend on which other rows share the batch (and on when they finish). Only a
# single row is reproducible: padded or not, B=1 gives the same tokens (tested below).


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("options", [dict(method="greedy"),
                                     dict(method="beam", beam_size=3, length_penalty=0.8)],
                         ids=["greedy", "beam"])
def test_batch_equals_rows_alone(backend, options):
    m = model(backend, seed=27)
    src, kpm = source_batch(seed=9)
    kw = dict(max_new_tokens=STEPS, start_id=START, **options)
    end = ending_token(m.generate(src, src_key_padding_mask=kpm, **kw))
    for e in (None, end):
        batch = m.generate(src, src_key_padding_mask=kpm, end_id=e, pad_id=PAD, **kw)
        alone = [m.generate(row[~pad][None], end_id=e, **kw)[0] for row, pad in zip(src, kpm)]
        assert_tokens(batch, cut_at_end(alone, None, PAD), name=f"end_id={e}")


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_sampling_one_row_ignores_its_padding(backend):
    m = flat_model()
    if backend == "reference":
        m.to_backend("reference")
    src, kpm = source_batch(seed=10, lengths=(4,))
    kw = dict(max_new_tokens=STEPS, start_id=START, method="sample", seed=8, top_k=10)
    padded = m.generate(src, src_key_padding_mask=kpm, **kw)
    assert_tokens(padded, m.generate(src[:, :4], **kw))


# ----------------------------------------------------------------------------------------------
# output layout


def test_end_stops_rows_and_pads_them():
    m = model(seed=28)
    src, kpm = source_batch(seed=11)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    full = m.generate(src, **kw)
    end = ending_token(full)
    pad = 7 if end != 7 else 8
    out = m.generate(src, end_id=end, pad_id=pad, **kw)
    lengths = []
    for row, f in zip(out, full):
        hits = np.flatnonzero(f[1:] == end)
        n = 1 + (hits[0] + 1 if hits.size else STEPS)            # start + generated tokens
        assert_tokens(row[:n], f[:n])                            # same tokens up to the end
        assert (row[n:] == pad).all()                            # then padding
        lengths.append(n)
    assert out.shape == (len(src), max(lengths)) and len(set(lengths)) > 1
    assert (out[:, 0] == START).all()


@pytest.mark.parametrize("options", [dict(method="greedy"), dict(method="beam", beam_size=2),
                                     dict(method="sample", seed=0)],
                         ids=["greedy", "beam", "sample"])
def test_shapes(options):
    m = model(seed=29, max_len=16)
    src, kpm = source_batch(seed=12)
    out = m.generate(src, max_new_tokens=6, start_id=START, src_key_padding_mask=kpm, **options)
    assert out.shape == (4, 7) and out.dtype == np.int64          # end_id None: every step
    assert ((0 <= out) & (out < V_TGT)).all()
    out = m.generate(src, max_new_tokens=15, start_id=START, **options)      # max_len - 1
    assert out.shape == (4, 16)
    out = m.generate(src, max_new_tokens=0, start_id=5, end_id=2, **options)
    assert out.dtype == np.int64
    assert_tokens(out, np.full((4, 1), 5))
    for S_ in (S, 0):
        empty = m.generate(np.zeros((0, S_), np.int64), max_new_tokens=4, start_id=START,
                           **options)
        assert empty.shape == (0, 1) and empty.dtype == np.int64
    one = m.generate(src[:1].astype(np.int32), max_new_tokens=3, start_id=START, **options)
    assert one.shape == (1, 4) and one.dtype == np.int64


# ----------------------------------------------------------------------------------------------
# bad arguments


@pytest.fixture(scope="module")
def small():
    return model(seed=32, max_len=16)


SRC = np.array([[3, 4, 5], [6, 7, 0]])


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(src_ids=np.array([[3, V_SRC, 5]])), ValueError, rf"{V_SRC}.*vocabulary of {V_SRC}"),
    (dict(src_ids=np.array([[3, -1, 5]])), ValueError, r"-1.*vocabulary"),
    (dict(src_ids=SRC.astype(np.float32)), TypeError, r"src_ids.*integer"),
    (dict(src_ids=SRC.astype(bool)), TypeError, r"src_ids.*integer"),
    (dict(src_ids=np.array([3, 4, 5])), ValueError, r"src_ids.*\(B, S\)"),
    (dict(start_id=V_TGT), ValueError, rf"start_id.*<= {V_TGT - 1}"),
    (dict(start_id=-1), ValueError, r"start_id"),
    (dict(end_id=V_TGT), ValueError, r"end_id"),
    (dict(end_id=-2), ValueError, r"end_id"),
    (dict(pad_id=V_TGT + 5), ValueError, r"pad_id"),
    (dict(pad_id=-1), ValueError, r"pad_id"),
    (dict(start_id=1.0), TypeError, r"start_id.*int"),
    (dict(max_new_tokens=-1), ValueError, r"max_new_tokens.*>= 0"),
    (dict(max_new_tokens=2.5), TypeError, r"max_new_tokens.*int"),
    (dict(max_new_tokens=True), TypeError, r"max_new_tokens.*int"),
    (dict(max_new_tokens=17), ValueError, r"max_new_tokens=17.*max_len=16"),
    (dict(max_new_tokens=1000), ValueError, r"max_len"),
    (dict(method="beam", beam_size=0), ValueError, r"beam_size.*>= 1"),
    (dict(method="sample", temperature=0), ValueError, r"temperature.*> 0"),
    (dict(method="sample", temperature=-1.0), ValueError, r"temperature"),
    (dict(method="sample", temperature=float("nan")), ValueError, r"temperature.*finite"),
    (dict(method="sample", top_p=0), ValueError, r"top_p"),
    (dict(method="sample", top_p=1.5), ValueError, r"top_p.*\(0, 1\]"),
    (dict(method="sample", top_k=0), ValueError, r"top_k.*>= 1"),
    (dict(method="beam", length_penalty=float("inf")), ValueError, r"length_penalty"),
    (dict(method="nucleus"), ValueError, r"method.*greedy.*beam.*sample"),
    (dict(src_key_padding_mask=np.zeros((2, 4), bool)), ValueError,
     r"src_key_padding_mask.*\(2, 3\)"),
    (dict(src_key_padding_mask=np.zeros(3, bool)), ValueError, r"src_key_padding_mask"),
])
def test_bad_arguments(small, kwargs, error, match):
    kw = dict(src_ids=SRC, max_new_tokens=4, start_id=START, end_id=2)
    kw.update(kwargs)
    src = kw.pop("src_ids")
    with pytest.raises(error, match=match):
        small.generate(src, **kw)
    with pytest.raises(error, match=match):                      # the function as well
        fgen.generate(small, src, **kw)


# ----------------------------------------------------------------------------------------------
# translate()

SOURCES = ["the cat sat on the mat", "a dog ran", "the bird sang a song today", "cats run"]
TARGETS = ["le chat est assis", "un chien court", "l'oiseau chante une chanson", "les chats"]


def test_translate_is_generate_then_decode():
    src_tok = WordTokenizer().train(SOURCES)
    tgt_tok = WordTokenizer().train(TARGETS)
    m = fnn.Seq2SeqTransformer(2, 2, C, H, src_tok.vocab_size, tgt_tok.vocab_size, F, seed=33)
    texts = ["the cat ran", "a song", "the dog sat on the mat today"]
    out = m.translate(texts, src_tok, tgt_tok, max_new_tokens=6)
    assert isinstance(out, list) and len(out) == len(texts)
    assert all(isinstance(t, str) for t in out)
    ids, kpm = src_tok.encode_batch(texts, add_start_end=True)
    gen = m.generate(ids, src_key_padding_mask=kpm, max_new_tokens=6,
                     start_id=tgt_tok.start_id, end_id=tgt_tok.end_id, pad_id=tgt_tok.pad_id)
    assert out == [tgt_tok.decode(row) for row in gen]
    assert all(len(t.split()) <= 6 for t in out)
    # generate options pass through
    beam = m.translate(texts, src_tok, tgt_tok, max_new_tokens=4, method="beam", beam_size=2)
    gen = m.generate(ids, src_key_padding_mask=kpm, max_new_tokens=4, method="beam",
                     beam_size=2, start_id=tgt_tok.start_id, end_id=tgt_tok.end_id)
    assert beam == tgt_tok.decode_batch(gen)
    assert m.translate([], src_tok, tgt_tok) == []
    with pytest.raises(TypeError, match="list of strings"):
        m.translate("the cat", src_tok, tgt_tok)
