"""Decoding through the model's step: against the full forward's greedy loop, fast vs
reference backend, against torch's tutorial loop, and after the weights change.
"""
import math

import numpy as np
import pytest

from conftest import requires_torch
from fastattn import nn as fnn
from fastattn.nn.backends import TwinWeight
from gen_util import *  # noqa: F401,F403  (models, batches, oracles)
from gen_util import TORCH_WARNINGS

pytestmark = TORCH_WARNINGS


# ----------------------------------------------------------------------------------------------
# the cached step against the full forward (the prototype's greedy loop), on both backends


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu"),
                                                   (False, "gelu"), (True, "relu")])
@pytest.mark.parametrize("padding", ["none", "mask", "pad_id"])
@pytest.mark.parametrize("with_end", [False, True], ids=["end_none", "end_set"])
def test_greedy_equals_the_forward_loop(norm_first, activation, padding, with_end):
    cfg = dict(norm_first=norm_first, activation=activation)
    if padding == "pad_id":
        cfg["pad_id"] = PAD            # source padding derived from the ids
    fast, ref = twins(seed=21, **cfg)
    src, kpm = source_batch(seed=3, lengths=(S,) * 4 if padding == "none" else LENGTHS)
    kpm = kpm if padding == "mask" else None
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    end = ending_token(fast.generate(src, **kw)) if with_end else None
    out_f = fast.generate(src, end_id=end, **kw)
    assert_tokens(out_f, forward_greedy(fast, src, STEPS, START, end, kpm), name="fast")
    assert_tokens(ref.generate(src, end_id=end, **kw),
                  forward_greedy(ref, src, STEPS, START, end, kpm), name="reference")
    assert_tokens(out_f, ref.generate(src, end_id=end, **kw), name="fast vs reference")
    assert out_f.shape[0] == 4 and (out_f[:, 0] == START).all()
    if with_end:
        stops = {int(np.argmax(r == end)) if (r == end).any() else -1 for r in out_f[:, 1:]}
        assert len(stops) > 1                                   # rows end at different steps
    else:
        assert out_f.shape == (4, 1 + STEPS)


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_float_padding_mask_is_added_as_in_the_forward(backend):
    """An additive float src_key_padding_mask is added to the cross-attention scores in the
    decode steps exactly as in model(src, tgt) (it was once turned into a hard block)."""
    m = model(backend, seed=23)
    src, _ = source_batch(seed=5)
    rng = np.random.default_rng(5)
    kpm = rng.uniform(-3.0, 3.0, size=src.shape).astype(np.float32)   # soft, not a block
    kpm[:, -2:] = -np.inf
    out = m.generate(src, src_key_padding_mask=kpm, max_new_tokens=STEPS, start_id=START)
    assert_tokens(out, forward_greedy(m, src, STEPS, START, None, kpm))
    hard = m.generate(src, src_key_padding_mask=np.isneginf(kpm), max_new_tokens=STEPS,
                      start_id=START)
    assert not np.array_equal(out, hard)                 # the soft biases do change the tokens


@pytest.mark.parametrize("norm_first", [False, True])
def test_beam_and_sample_fast_equal_reference(norm_first):
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


def test_generated_pad_tokens_are_attended():
    """A generated token equal to the model's pad_id is a real token of the prefix: the steps
    attend to it, as the forward loop (with no target padding mask) and the tutorial do."""
    m = fnn.Seq2SeqTransformer(2, 2, 32, 4, 11, 13, 64, pad_id=0, seed=1)
    src = np.array([[5, 6, 7, 8, 9]])
    out = m.generate(src, max_new_tokens=6, start_id=2)
    assert (out[0, 1:] == 0).any()                     # the model does emit its pad id
    assert_tokens(out, forward_greedy(m, src, 6, 2))


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


# ----------------------------------------------------------------------------------------------
# weights changed after decoding once: the packed decode weights follow


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
    m.invalidate_caches()                               # the documented rule for hand edits
    assert_tokens(m.generate(src, **kw), before, name="after an in-place overwrite")


def test_editing_one_sublayer_changes_generate_as_it_changes_the_forward():
    """One decoder sublayer edited through load_state_dict: generate's tokens follow, and they
    are the forward's argmax loop on the new weights; nothing rebuilt by hand."""
    m = model(seed=36)
    src, kpm = source_batch(seed=14)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    before = m.generate(src, **kw)
    key = "transformer.decoder.layers.1.linear2.weight"
    w = m.state_dict()[key]
    m.load_state_dict({key: 4.0 * w[::-1]}, strict=False)
    after = m.generate(src, **kw)
    assert not np.array_equal(after, before)
    assert_tokens(after, forward_greedy(m, src, STEPS, START, None, kpm))


@pytest.mark.parametrize("edit", ["swap_rows_in_place", "rebind"])
def test_generator_edits_reach_generate(edit):
    """Swapping two rows of generator.weight (the swap makes greedy pick the other token):
    in place plus invalidate_caches(), or by rebinding the attribute (noticed by identity)."""
    m = model(seed=37)
    src, kpm = source_batch(seed=15)
    kw = dict(max_new_tokens=STEPS, start_id=START, src_key_padding_mask=kpm)
    before = m.generate(src, **kw)
    a, b = int(before[0, 1]), (int(before[0, 1]) + 1) % V_TGT
    g = m.generator
    if edit == "rebind":
        w = g.weight.copy()
        w[[a, b]] = w[[b, a]]
        g.weight = w
        bias = g.bias.copy()
        bias[[a, b]] = bias[[b, a]]
        g.bias = bias
    else:
        g.weight[[a, b]] = g.weight[[b, a]]
        g.bias[[a, b]] = g.bias[[b, a]]
        m.invalidate_caches()
    after = m.generate(src, **kw)
    assert after[0, 1] == b
    assert_tokens(after, forward_greedy(m, src, STEPS, START, None, kpm))


def test_invalidate_caches_on_a_submodule_and_its_return_value():
    m = model(seed=38)
    src, kpm = source_batch(seed=16)
    kw = dict(max_new_tokens=4, start_id=START, src_key_padding_mask=kpm)
    m.generate(src, **kw)
    layer = m.transformer.decoder.layers[0]
    layer.self_attn.in_proj_weight[:] *= np.float32(-1.0)
    assert layer.invalidate_caches() is layer
    assert_tokens(m.generate(src, **kw), forward_greedy(m, src, 4, START, None, kpm))


def test_switching_backends_rebuilds_the_packed_decode_weights():
    """Decoding on the reference backend (which packs nothing) and then on the fast one: the
    fast backend packs its own decode weights, and both give the forward's tokens."""
    m = model(seed=39).to_backend("reference")
    src, kpm = source_batch(seed=17)
    kw = dict(max_new_tokens=4, start_id=START, src_key_padding_mask=kpm)
    want = forward_greedy(m, src, 4, START, None, kpm)
    assert_tokens(m.generate(src, **kw), want, name="reference")
    gen = m.generator
    assert not hasattr(gen._decode_weight("weight"), "panels")    # the reference packs nothing
    m.to_backend("fast")
    assert not any(isinstance(k[2], TwinWeight)        # what the old backend derived is gone
                   for k in gen._kinds.values())
    assert_tokens(m.generate(src, **kw), want, name="fast after reference")
    assert gen._decode_weight("weight").panels is not None        # packed by the fast backend
