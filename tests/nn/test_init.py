"""Initialisation: every module's parameters are drawn as torch draws them (the same
distribution per parameter, checked by statistics: the weights themselves come from another
generator), and Seq2SeqTransformer's default is the translation tutorial's xavier_uniform_
loop, which is what lets a small model learn where word order matters (test_learning.py).

Per parameter: equal constants where torch's are constant (layer norms, zero biases); else the
mean and standard deviation within 6 standard errors of torch's, and, for the uniform draws, the
largest |value| within 5% of torch's (the bound a of U(-a, a) is what each init chooses)."""
import math

import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import nn as fnn
from tolerances import TOL

CFG = dict(num_encoder_layers=2, num_decoder_layers=2, emb_size=256, nhead=4,
           src_vocab_size=300, tgt_vocab_size=280, dim_feedforward=512)


def _tutorial_config(**extra):
    return dict(CFG, activation="relu", layer_norm_eps=1e-5, norm_first=False, pad_id=0,
                max_len=64, **extra)


def assert_same_init(ours, theirs):
    """ours: {key: array} of a fastattn module; theirs: torch's state_dict of the same module
    built by torch."""
    assert list(ours) == [k for k in theirs if k in ours], "keys or their order differ"
    assert set(ours) == set(theirs) - {"positional_encoding.pos_embedding"}
    for key, a in ours.items():
        b = theirs[key].detach().numpy().astype(np.float64)
        a = np.asarray(a, np.float64)
        assert a.shape == b.shape, key
        if b.std() == 0:
            assert np.all(a == b), f"{key}: torch's is constant {b.flat[0]}, ours is not"
            continue
        n = a.size
        se = math.sqrt(a.var() / n + b.var() / n)
        assert abs(a.mean() - b.mean()) <= 6 * se, \
            f"{key}: mean {a.mean():.4g}, torch's {b.mean():.4g}"
        assert abs(a.std() / b.std() - 1) <= 6 / math.sqrt(n), \
            f"{key}: std {a.std():.4g}, torch's {b.std():.4g}"
        # a uniform draw of n >= 256 values reaches within 5% of its bound (p > 1 - 1e-5)
        if n >= 256 and np.abs(b).max() < 2 * b.std():       # uniform: max = sqrt(3) std
            ratio = np.abs(a).max() / np.abs(b).max()
            assert abs(ratio - 1) <= 0.05, \
                f"{key}: max |w| {np.abs(a).max():.4g}, torch's {np.abs(b).max():.4g}"


def test_seq2seq_default_is_the_tutorials_xavier():
    torch = requires_torch()
    from fastattn.bench.torch_models import tutorial_seq2seq
    torch.manual_seed(0)
    theirs = tutorial_seq2seq(_tutorial_config()).state_dict()
    ours = fnn.Seq2SeqTransformer(**CFG, pad_id=0, max_len=64, seed=0).state_dict()
    assert_same_init(ours, theirs)
    # the point of it: a scaled token embedding is about as large as a positional encoding
    emb = ours["src_tok_emb.embedding.weight"] * math.sqrt(CFG["emb_size"])
    assert np.abs(emb).max() < 2.0


def test_seq2seq_torch_init_is_torchs_construction():
    torch = requires_torch()
    from fastattn.bench.torch_models import tutorial_seq2seq
    torch.manual_seed(0)
    theirs = tutorial_seq2seq(_tutorial_config(), xavier=False).state_dict()
    ours = fnn.Seq2SeqTransformer(**CFG, pad_id=0, max_len=64, seed=0,
                                  init="torch").state_dict()
    assert_same_init(ours, theirs)
    assert_close(np.std(ours["src_tok_emb.embedding.weight"]), 1.0, **TOL["nn_init_std"],
                 name="embedding std", dtype=None)


def test_seq2seq_init_is_checked():
    with pytest.raises(ValueError, match="init must be one of 'xavier', 'torch', got 'normal'"):
        fnn.Seq2SeqTransformer(1, 1, 8, 2, 10, 10, init="normal")


def test_seq2seq_inits_are_seeded():
    a = fnn.Seq2SeqTransformer(1, 1, 8, 2, 10, 10, seed=3).state_dict()
    b = fnn.Seq2SeqTransformer(1, 1, 8, 2, 10, 10, seed=3).state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)


# torch's own modules: its construction is the reference (its _reset_parameters included)
C, H, F = 256, 4, 512


def _pairs(torch):
    tnn = torch.nn
    return {
        "Transformer": (lambda: fnn.Transformer(C, H, 2, 2, F, seed=0),
                        lambda: tnn.Transformer(C, H, 2, 2, F, batch_first=True)),
        "TransformerEncoderLayer": (
            lambda: fnn.TransformerEncoderLayer(C, H, F, seed=0),
            lambda: tnn.TransformerEncoderLayer(C, H, F, batch_first=True)),
        "TransformerDecoderLayer": (
            lambda: fnn.TransformerDecoderLayer(C, H, F, seed=0),
            lambda: tnn.TransformerDecoderLayer(C, H, F, batch_first=True)),
        "TransformerEncoder": (
            lambda: fnn.TransformerEncoder(fnn.TransformerEncoderLayer(C, H, F, seed=0), 3),
            lambda: tnn.TransformerEncoder(tnn.TransformerEncoderLayer(C, H, F,
                                                                       batch_first=True), 3,
                                           enable_nested_tensor=False)),
        "TransformerDecoder": (
            lambda: fnn.TransformerDecoder(fnn.TransformerDecoderLayer(C, H, F, seed=0), 3),
            lambda: tnn.TransformerDecoder(tnn.TransformerDecoderLayer(C, H, F,
                                                                       batch_first=True), 3)),
        "MultiheadAttention": (lambda: fnn.MultiheadAttention(C, H, seed=0),
                               lambda: tnn.MultiheadAttention(C, H, batch_first=True)),
        "MultiheadAttention(kdim, vdim, add_bias_kv)": (
            lambda: fnn.MultiheadAttention(C, H, kdim=128, vdim=96, add_bias_kv=True, seed=0),
            lambda: tnn.MultiheadAttention(C, H, kdim=128, vdim=96, add_bias_kv=True,
                                           batch_first=True)),
        "Linear": (lambda: fnn.Linear(C, F, seed=0), lambda: tnn.Linear(C, F)),
        "Embedding": (lambda: fnn.Embedding(300, C, seed=0), lambda: tnn.Embedding(300, C)),
        "LayerNorm": (lambda: fnn.LayerNorm(C), lambda: tnn.LayerNorm(C)),
    }


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True.*:UserWarning")
@pytest.mark.parametrize("name", ["Transformer", "TransformerEncoderLayer",
                                  "TransformerDecoderLayer", "TransformerEncoder",
                                  "TransformerDecoder", "MultiheadAttention",
                                  "MultiheadAttention(kdim, vdim, add_bias_kv)", "Linear",
                                  "Embedding", "LayerNorm"])
def test_modules_initialise_as_torch(name):
    torch = requires_torch()
    ours, theirs = _pairs(torch)[name]
    torch.manual_seed(0)
    assert_same_init(ours().state_dict(), theirs().state_dict())


def test_stacks_copy_their_layer_as_torch_does():
    """torch's TransformerEncoder/Decoder deep-copy the layer given: every layer starts equal
    (nn.Transformer then redraws the matrices of each layer)."""
    enc = fnn.TransformerEncoder(fnn.TransformerEncoderLayer(C, H, F, seed=0), 3)
    sd = enc.state_dict()
    for i in (1, 2):
        assert np.array_equal(sd["layers.0.linear1.weight"], sd[f"layers.{i}.linear1.weight"])
    tr = fnn.Transformer(C, H, 2, 2, F, seed=0).state_dict()
    assert not np.array_equal(tr["encoder.layers.0.linear1.weight"],
                              tr["encoder.layers.1.linear1.weight"])
    assert np.array_equal(tr["encoder.layers.0.linear1.bias"],
                          tr["encoder.layers.1.linear1.bias"])
