"""fastattn.generate: greedy, beam search and sampling (see that module's docstring for the rules).

Oracles, layered as everywhere else:
- the fast backend (KV cache, one position per step) against the reference backend (re-runs the
  whole decoder on the prefix at every step), token for token;
- greedy against torch when installed: the translation tutorial's loop (encode once, re-run
  nn.Transformer's decoder on the whole prefix each step, argmax of the last position) on a
  torch model holding the same weights;
- beam search against hand-computed results on models whose next-token distribution is fixed
  by construction, and against a plain one-source beam search written out from the docstring.

Models are small (2 + 2 layers, d_model 32, 4 heads, d_ff 64) and random, so their outputs are
arbitrary but deterministic; where an end token is needed, one is picked from the generated
tokens so that rows end at different steps.
"""
import math

import numpy as np
import pytest

from conftest import requires_torch
from fastattn import generate as fgen
from fastattn import nn as fnn
from fastattn.tokenizers import WordTokenizer

C, H, F = 32, 4, 64                # d_model, heads, d_ff
V_SRC, V_TGT = 23, 29              # vocabularies
PAD, START = 0, 1                  # target specials of the random models (end: picked per test)
S = 7                              # source length
LENGTHS = (7, 4, 2, 6)             # source lengths of the padded batch
STEPS = 10                         # max_new_tokens

pytestmark = [   # torch's encoder on a padded batch (nested tensors; see test_nn.py)
    pytest.mark.filterwarnings("ignore:.*nested tensor.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True.*:UserWarning"),
]


def model(backend="fast", *, seed=0, **cfg):
    """A random model whose target embeddings are scaled down (x 0.1): at random init the
    scaled embedding of the last token dominates the decoder's stream and the model mostly
    echoes it; smaller, the source matters and the rows of a batch differ."""
    m = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, backend=backend, seed=seed, **cfg)
    m.tgt_tok_emb.embedding.weight *= np.float32(0.1)
    return m


def twins(seed=0, **cfg):
    """The same random model on the fast and on the reference backend."""
    return model("fast", seed=seed, **cfg), model("reference", seed=seed, **cfg)


def source_batch(seed=0, lengths=LENGTHS, length=S):
    """(ids (B, length) with ids in [1, V_SRC) and PAD after each row's length, padding mask)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, V_SRC, size=(len(lengths), length))
    kpm = np.arange(length)[None, :] >= np.asarray(lengths)[:, None]
    ids[kpm] = PAD
    return ids, kpm


def ending_token(out):
    """A generated token of `out` (B, T), not the start token, whose first occurrences fall at
    the most different steps (ties: the lower id): as end_id, rows end at different steps."""
    gen = out[:, 1:]
    best, key = None, None
    for w in np.unique(gen[gen != out[0, 0]]):
        firsts = {int(np.argmax(r == w)) if (r == w).any() else -1 for r in gen}
        if key is None or len(firsts) > key:
            best, key = int(w), len(firsts)
    return best


def cut_at_end(rows, end, pad):
    """Rows that ran every step -> generate's layout: each row cut after its first end token
    (the start token excluded), padded with pad, the width that of the longest row."""
    rows = [list(map(int, r)) for r in rows]
    if end is not None:
        rows = [r[:r.index(end, 1) + 1] if end in r[1:] else r for r in rows]
    out = np.full((len(rows), max(map(len, rows))), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def assert_tokens(actual, expected, name="tokens"):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == np.int64, f"{name}: dtype {actual.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    bad = np.argwhere(actual != expected)
    assert not bad.size, (f"{name}: {len(bad)} tokens differ, first at {tuple(bad[0])}\n"
                          f"actual\n{actual}\nexpected\n{expected}")


# ----------------------------------------------------------------------------------------------
# the KV cache against re-running the decoder


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu"),
                                                   (False, "gelu"), (True, "relu")])
@pytest.mark.parametrize("padding", ["none", "mask", "pad_id"])
@pytest.mark.parametrize("with_end", [False, True], ids=["end_none", "end_set"])
def test_greedy_cache_equals_recompute(norm_first, activation, padding, with_end):
    cfg = dict(norm_first=norm_first, activation=activation)
    if padding == "pad_id":
        cfg["pad_id"] = PAD            # source padding derived from the ids
    fast, ref = twins(seed=21, **cfg)
    src, kpm = source_batch(seed=3, lengths=(S,) * 4 if padding == "none" else LENGTHS)
    kw = dict(max_new_tokens=STEPS, start_id=START,
              src_key_padding_mask=kpm if padding == "mask" else None)
    end = ending_token(fast.generate(src, **kw)) if with_end else None
    out_f = fast.generate(src, end_id=end, **kw)
    out_r = ref.generate(src, end_id=end, **kw)
    assert_tokens(out_f, out_r)
    assert out_f.shape[0] == 4 and (out_f[:, 0] == START).all()
    if with_end:
        stops = {int(np.argmax(r == end)) if (r == end).any() else -1 for r in out_f[:, 1:]}
        assert len(stops) > 1                                   # rows end at different steps
    else:
        assert out_f.shape == (4, 1 + STEPS)


@pytest.mark.parametrize("norm_first", [False, True])
def test_beam_and_sample_cache_equal_recompute(norm_first):
    """Beam search reorders and drops cache rows; sampling draws from the same logits."""
    fast, ref = twins(seed=22, norm_first=norm_first)
    src, kpm = source_batch(seed=4)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    end = ending_token(fast.generate(src, **kw))
    for extra in (dict(method="beam", beam_size=3, length_penalty=0.7, end_id=end),
                  dict(method="beam", beam_size=4, length_penalty=1.0, end_id=None),
                  dict(method="sample", seed=5, temperature=0.8, top_k=6, end_id=end),
                  dict(method="sample", seed=6, top_p=0.9, end_id=end)):
        assert_tokens(fast.generate(src, **kw, **extra), ref.generate(src, **kw, **extra),
                      name=str(extra))


def test_recompute_does_not_mask_generated_pad_tokens():
    """A generated token equal to the model's pad_id is a real token of the prefix: the cached
    decoder attends to it (as the tutorial's greedy loop does), and the re-run decoder must too
    (it once derived a target padding mask from pad_id: reference 2 0 7 4 ... against fast
    2 0 0 0 ... on this model)."""
    kw = dict(pad_id=0, seed=1)
    fast = fnn.Seq2SeqTransformer(2, 2, 32, 4, 11, 13, 64, **kw)
    ref = fnn.Seq2SeqTransformer(2, 2, 32, 4, 11, 13, 64, backend="reference", **kw)
    src = np.array([[5, 6, 7, 8, 9]])
    out_f = fast.generate(src, max_new_tokens=6, start_id=2)
    assert (out_f[0, 1:] == 0).any()                   # the model does emit its pad id
    assert_tokens(ref.generate(src, max_new_tokens=6, start_id=2), out_f)


# ----------------------------------------------------------------------------------------------
# against torch: the translation tutorial's greedy loop


def torch_tutorial_model(torch, fm):
    """torch.nn.Transformer(batch_first=True) + token embeddings (scaled by sqrt(d_model)) +
    the sinusoidal table + the generator Linear, keyed as the tutorial, holding fm's weights.
    Returns (model, positional table (max_len, C))."""
    cfg = fm.config
    nn = torch.nn

    class TokenEmbedding(nn.Module):
        def __init__(self, vocab, emb):
            super().__init__()
            self.embedding = nn.Embedding(vocab, emb)

    class Tutorial(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.Transformer(
                cfg["emb_size"], cfg["nhead"], cfg["num_encoder_layers"],
                cfg["num_decoder_layers"], cfg["dim_feedforward"], dropout=0.0,
                activation=cfg["activation"], norm_first=cfg["norm_first"], batch_first=True)
            self.generator = nn.Linear(cfg["emb_size"], cfg["tgt_vocab_size"])
            self.src_tok_emb = TokenEmbedding(cfg["src_vocab_size"], cfg["emb_size"])
            self.tgt_tok_emb = TokenEmbedding(cfg["tgt_vocab_size"], cfg["emb_size"])

    tm = Tutorial().eval()
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in fm.state_dict().items()})
    emb = cfg["emb_size"]
    den = torch.exp(-torch.arange(0, emb, 2) * math.log(10000) / emb)
    pos = torch.arange(0, 64).reshape(64, 1)
    pe = torch.zeros((64, emb))
    pe[:, 0::2] = torch.sin(pos * den)
    pe[:, 1::2] = torch.cos(pos * den)
    return tm, pe


def torch_greedy(torch, tm, pe, src, kpm, start, steps):
    """The tutorial's greedy_decode, batched: encode once, then per step the decoder on the
    whole prefix with the square subsequent mask and the argmax of the last position."""
    C_ = pe.shape[1]

    def embed(e, ids):
        return e.embedding(ids) * math.sqrt(C_) + pe[:ids.shape[1]]

    with torch.inference_mode():
        s = torch.from_numpy(src)
        mask = None if kpm is None else torch.from_numpy(kpm)
        memory = tm.transformer.encoder(embed(tm.src_tok_emb, s), src_key_padding_mask=mask)
        ys = torch.full((src.shape[0], 1), start, dtype=torch.long)
        for _ in range(steps):
            tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(ys.shape[1])
            out = tm.transformer.decoder(embed(tm.tgt_tok_emb, ys), memory, tgt_mask=tgt_mask,
                                         memory_key_padding_mask=mask)
            nxt = tm.generator(out[:, -1]).argmax(dim=-1)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
    return ys.numpy()


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_greedy_matches_torch_tutorial_loop(norm_first, activation):
    torch = requires_torch()
    fm = model(seed=23, norm_first=norm_first, activation=activation)
    tm, pe = torch_tutorial_model(torch, fm)
    src, kpm = source_batch(seed=5)
    ys = torch_greedy(torch, tm, pe, src, kpm, START, STEPS)
    out = fm.generate(src, max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    assert_tokens(out, ys, name="end_id=None")
    end = ending_token(out)
    out = fm.generate(src, max_new_tokens=STEPS, start_id=START, end_id=end, pad_id=PAD,
                      src_key_padding_mask=kpm)
    assert_tokens(out, cut_at_end(ys, end, PAD), name=f"end_id={end}")


def test_generated_pad_token_is_attended_as_in_torch():
    """The model of test_recompute_does_not_mask_generated_pad_tokens: the tutorial's loop
    (no target padding mask) agrees with the cached decoder, which attends to the generated
    pad token."""
    torch = requires_torch()
    fm = fnn.Seq2SeqTransformer(2, 2, 32, 4, 11, 13, 64, pad_id=0, seed=1)
    tm, pe = torch_tutorial_model(torch, fm)
    src = np.array([[5, 6, 7, 8, 9]])
    out = fm.generate(src, max_new_tokens=6, start_id=2)
    assert (out[0, 1:] == 0).any()
    assert_tokens(out, torch_greedy(torch, tm, pe, src, None, 2, 6))


# ----------------------------------------------------------------------------------------------
# beam_size=1 and sampling against greedy


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.5])
def test_beam_size_1_is_greedy(backend, length_penalty):
    m = model(backend, seed=24)
    src, kpm = source_batch(seed=6)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    end = ending_token(m.generate(src, **kw))
    for e in (None, end):
        greedy = m.generate(src, end_id=e, **kw)
        beam = m.generate(src, end_id=e, method="beam", beam_size=1,
                          length_penalty=length_penalty, **kw)
        assert_tokens(beam, greedy, name=f"end_id={e}")


def flat_model(seed=25):
    """Next-token distributions close to uniform (generator scaled down): samples vary."""
    m = model(seed=seed)
    m.generator.weight *= 0.02
    m.generator.bias *= 0.02
    return m


def test_sampling_is_reproducible_per_seed():
    m = flat_model()
    src, kpm = source_batch(seed=7)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm, method="sample")
    a = m.generate(src, seed=11, **kw)
    assert_tokens(m.generate(src, seed=11, **kw), a)
    assert_tokens(m.generate(src, seed=np.int64(11), **kw), a)
    others = [m.generate(src, seed=s, **kw) for s in (12, 13)]
    assert all(not np.array_equal(o, a) for o in others)
    assert len({tuple(r) for r in a}) > 1                   # rows draw different tokens
    assert np.unique(a[:, 1:]).size > 10                    # flat: many tokens appear
    unseeded = m.generate(src, **kw)                        # seed=None: fresh entropy
    assert unseeded.shape == a.shape and (unseeded[:, 0] == START).all()


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("options", [dict(top_k=1), dict(temperature=1e-4), dict(top_p=1e-6),
                                     dict(top_k=1, temperature=3.0, top_p=0.5)],
                         ids=["top_k=1", "temperature=1e-4", "top_p=1e-6", "combined"])
def test_sampling_that_keeps_one_token_is_greedy(backend, options):
    m = model(backend, seed=26)
    src, kpm = source_batch(seed=8)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    end = ending_token(m.generate(src, **kw))
    greedy = m.generate(src, end_id=end, **kw)
    for seed in (0, 1):
        assert_tokens(m.generate(src, end_id=end, method="sample", seed=seed, **options, **kw),
                      greedy)


def test_sampling_top_k_and_top_p_restrict_the_tokens():
    """With a fixed distribution (generator weight 0, chosen bias), only the kept tokens are
    ever drawn: top_k=2 -> the two likeliest; top_p=0.5 -> the smallest set reaching 0.5."""
    p = np.array([0.0, 0.0, 0.05, 0.4, 0.3, 0.2, 0.05])      # tokens 3 > 4 > 5 > 2 = 6
    m = constant_model(p)
    src = np.array([[1, 2, 3]] * 16)
    kw = dict(max_new_tokens=12, start_id=1, method="sample", seed=3)
    assert set(np.unique(m.generate(src, **kw)[:, 1:])) == {2, 3, 4, 5, 6}
    assert set(np.unique(m.generate(src, top_k=2, **kw)[:, 1:])) == {3, 4}
    assert set(np.unique(m.generate(src, top_p=0.5, **kw)[:, 1:])) == {3, 4}   # 0.4 < 0.5
    assert set(np.unique(m.generate(src, top_p=0.39, **kw)[:, 1:])) == {3}     # 0.4 >= 0.39
    draws = m.generate(src, temperature=1e-3, **kw)[:, 1:]
    assert (draws == 3).all()


# ----------------------------------------------------------------------------------------------
# beam search, hand-checked on models whose next-token distribution is fixed by construction

TOKENS = dict(pad=0, start=1, end=2, a=3, b=4, c=5, d=6)
V7 = len(TOKENS)


def table(rows):
    """{previous token name: {next token name: probability}} -> (V7, V7) probabilities; rows
    not given (pad, end: never extended by a live hypothesis) are uniform."""
    p = np.full((V7, V7), 1.0 / V7)
    for prev, nxt in rows.items():
        p[TOKENS[prev]] = 0.0
        for name, q in nxt.items():
            p[TOKENS[prev], TOKENS[name]] = q
    assert np.allclose(p.sum(1), 1)
    return p


def ids(*names):
    return [TOKENS[n] for n in names]


def constant_model(p, backend="fast"):
    """Every step's logits are exactly log p (generator weight 0, bias log p)."""
    m = fnn.Seq2SeqTransformer(1, 1, C, H, 5, len(p), F, backend=backend, seed=30)
    m.generator.weight[...] = 0
    m.generator.bias[...] = np.log(np.maximum(p, 1e-12))
    return m


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
    (dict(max_new_tokens=16), ValueError, r"max_new_tokens=16.*max_len=16"),
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


# ----------------------------------------------------------------------------------------------
# reloading weights


def test_reloading_weights_invalidates_packed_decode_weights():
    m, other = model(seed=34), model(seed=35)
    src, kpm = source_batch(seed=13)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    before = m.generate(src, **kw)
    want = other.generate(src, **kw)
    assert not np.array_equal(before, want)
    m.load_state_dict(other.state_dict())
    assert_tokens(m.generate(src, **kw), want, name="after load_state_dict")
    assert_tokens(m.generate(src, method="beam", beam_size=2, **kw),
                  other.generate(src, method="beam", beam_size=2, **kw), name="beam")
    fresh = model(seed=34)                              # in-place overwrite of every parameter
    for (_, p), (_, q) in zip(m.named_parameters(), fresh.named_parameters()):
        p[...] = q
    assert_tokens(m.generate(src, **kw), before, name="after an in-place overwrite")
