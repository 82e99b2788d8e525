"""Seq2SeqTransformer against the translation tutorial's model, fast vs reference, loading.
"""

import re

import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import nn as fnn
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel, scaled

pytestmark = TORCH_WARNINGS


# ----------------------------------------------------------------------------------------------
# Seq2SeqTransformer against the translation tutorial's model (batch-first)


def test_seq2seq_keys_match_tutorial():
    torch = requires_torch()
    tm, fm = seq2seq_pair(torch)
    tkeys = [k for k in tm.state_dict() if k != "positional_encoding.pos_embedding"]
    assert list(fm.state_dict()) == tkeys
    for k, v in tm.state_dict().items():
        if k in fm.state_dict():
            assert fm.state_dict()[k].shape == tuple(v.shape), k
            assert np.array_equal(fm.state_dict()[k], v.numpy()), k
    assert {"src_tok_emb.embedding.weight", "tgt_tok_emb.embedding.weight",
            "generator.weight", "generator.bias"} <= set(fm.state_dict())


def test_seq2seq_vs_tutorial(rng):
    torch = requires_torch()
    tm, fm = seq2seq_pair(torch)
    batch = tutorial_batch(rng)
    src, tgt, src_mask, tgt_mask, src_pad, tgt_pad = batch
    with torch.inference_mode():
        ref = tm(*tutorial_args(torch, *batch)).numpy()
        ref_mem = tm.encode(t(torch, src), t(torch, src_mask), t(torch, src_pad))
    keep_t, keep_s = ~tgt_pad, ~src_pad

    logits = fm(src, tgt)                          # masks from pad_id, causal target
    assert logits.shape == (B, T, V_TGT) and logits.dtype == np.float32
    assert_close(logits[keep_t], ref[keep_t], **max_rel(ref[keep_t]), name="logits (pad_id masks)")
    explicit = fm(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask, src_key_padding_mask=src_pad,
                  tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
    assert_close(explicit[keep_t], ref[keep_t], **max_rel(ref[keep_t]),
                 name="logits (explicit masks)")

    mem = fm.encode(src)
    assert_close(mem[keep_s], ref_mem.numpy()[keep_s], **max_rel(ref_mem.numpy()[keep_s]),
                 name="encode memory")
    with torch.inference_mode():                   # the same memory into both decoders
        ref_hid = tm.decode(t(torch, tgt), t(torch, mem), t(torch, tgt_mask), t(torch, tgt_pad),
                            t(torch, src_pad)).numpy()
    hid = fm.decode(tgt, mem, memory_key_padding_mask=src_pad)
    assert_close(hid[keep_t], ref_hid[keep_t], **max_rel(ref_hid[keep_t]), name="decode hidden")
    assert_close(fm.generator(hid)[keep_t], logits[keep_t],
                 **max_rel(logits[keep_t], TOL["nn_split_forward"]["atol"]),
                 name="generator(decode)")


def test_seq2seq_vs_tutorial_no_padding(rng):
    torch = requires_torch()
    tm, fm = seq2seq_pair(torch, seed=1)
    fm.pad_id = None
    src = rng.integers(0, V_SRC, size=(2, S))
    tgt = rng.integers(0, V_TGT, size=(2, T))
    src_mask = np.zeros((S, S), dtype=bool)
    tgt_mask = fnn.generate_square_subsequent_mask(T)
    with torch.inference_mode():
        ref = tm(t(torch, src), t(torch, tgt), t(torch, src_mask), t(torch, tgt_mask),
                 None, None, None).numpy()
    assert_close(fm(src, tgt), ref, **max_rel(ref))


@pytest.mark.parametrize("norm_first", [False, True])
def test_seq2seq_fast_vs_reference(rng, norm_first):
    kw = dict(dropout=0.0, pad_id=PAD, norm_first=norm_first, seed=13)
    fast = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, **kw)
    ref = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, backend="reference", **kw)
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 1, 4], T)
    got, want = fast(src, tgt), ref(src, tgt)
    assert_close(got, want, **scaled(TOL["nn_backends"], want), name="logits")
    mem = fast.encode(src)
    want = ref.encode(src)
    assert_close(mem, want, **scaled(TOL["nn_backends"], want), name="memory")
    got, want = (m.decode(tgt, mem, memory_key_padding_mask=src == PAD) for m in (fast, ref))
    assert_close(got, want, **scaled(TOL["nn_backends"], want), name="hidden")


def test_seq2seq_load_ignores_pos_embedding_and_recomputes_table(rng):
    m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, pad_id=PAD, max_len=64, seed=3)
    pe_before = m.positional_encoding.pe.copy()
    sd = dict(m.state_dict())
    sd["positional_encoding.pos_embedding"] = np.full((64, 1, C), 7.0, np.float32)
    assert m.load_state_dict(sd) == ([], [])
    assert np.array_equal(m.positional_encoding.pe, pe_before)
    assert "positional_encoding.pos_embedding" not in m.state_dict()
    sd["positional_encoding.other"] = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match=r"positional_encoding\.other"):
        m.load_state_dict(sd)


# ----------------------------------------------------------------------------------------------
# pad_id: an id of both vocabularies, checked at construction (as fastattn.io.load checks it)


@pytest.mark.parametrize("pad_id", [10, 12, 10**6, -1])
def test_a_pad_id_outside_the_vocabulary_is_refused_at_construction(pad_id):
    want = (f"Seq2SeqTransformer: pad_id {pad_id} is outside the vocabulary (ids 0..9: "
            "src_vocab_size 10, tgt_vocab_size 12)")
    with pytest.raises(ValueError, match="^" + re.escape(want)):
        fnn.Seq2SeqTransformer(1, 1, 8, 2, 10, 12, pad_id=pad_id)
    with pytest.raises(ValueError, match=r"pad_id \S+ is outside .*src_vocab_size 12, "
                                         r"tgt_vocab_size 10\)"):
        fnn.Seq2SeqTransformer(1, 1, 8, 2, 12, 10, pad_id=pad_id, padding_idx=True)


@pytest.mark.parametrize("pad_id", [True, "0", 1.0, [0]])
def test_a_pad_id_that_is_no_int_is_refused_at_construction(pad_id):
    with pytest.raises(TypeError, match=r"^Seq2SeqTransformer: pad_id must be None or an int, "
                                        rf"got {re.escape(repr(pad_id))}"):
        fnn.Seq2SeqTransformer(1, 1, 8, 2, 10, 12, pad_id=pad_id)


def test_a_numpy_int_pad_id_is_taken_as_an_int_and_saves(tmp_path):
    from fastattn import io

    m = fnn.Seq2SeqTransformer(1, 1, 8, 2, 10, 12, pad_id=np.int64(9), seed=0)
    assert type(m.pad_id) is int and type(m.config["pad_id"]) is int and m.pad_id == 9
    io.save(m, tmp_path / "m.safetensors")
    assert io.load(tmp_path / "m.safetensors").pad_id == 9


def test_translate_splits_only_the_head_of_a_text_too_long_for_the_model():
    """A text longer than max_len is refused after splitting its head only: a 20-million-
    character text costs translate what a short one does (peak memory of a child process,
    against the same child translating short texts), and short texts translate as before."""
    import subprocess
    import sys
    code = (
        "import resource, sys\n"
        "from fastattn.tokenizers import CharTokenizer\n"
        "from fastattn.nn import Seq2SeqTransformer\n"
        "tok = CharTokenizer().train(['abcdef ghij'])\n"
        "m = Seq2SeqTransformer(1, 1, 16, 2, tok.vocab_size, tok.vocab_size, 32, max_len=20,"
        " pad_id=tok.pad_id).eval()\n"
        "texts = ['abc', 'abc ' * int(sys.argv[1])]\n"
        "try:\n"
        "    print(m.translate(texts, tok, tok, max_new_tokens=3))\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    runs = {}
    for n in (2, 5_000_000):
        p = subprocess.run([sys.executable, "-c", code, str(n)], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        *lines, rss = p.stdout.strip().splitlines()
        runs[n] = (lines, int(rss))
    assert runs[2][0][0].startswith("["), runs[2]                   # short texts translate
    message = runs[5_000_000][0][0]
    assert message.startswith("ValueError: translate: texts [1] have more than max_len=20"), \
        message
    # the 20 MB text's own bytes plus a little: splitting it whole took a token object per char
    assert runs[5_000_000][1] - runs[2][1] < 100 * 1024, (runs[2][1], runs[5_000_000][1])
