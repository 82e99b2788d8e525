"""Shared helpers of the fastattn.nn tests: small models, inputs, masks and the torch twins.

Torch comparisons use small models (d_model 32, 4 heads, 2 + 2 layers, d_ff 64), eval(),
inference_mode and dropout 0, and check the relative error max|diff| / max|ref| <= 1e-4
(assert_close(..., **max_rel(ref)): rtol 0 and atol 1e-4 * max|ref|).

Three torch behaviours shape what is compared:
- torch's encoder fast path (nested tensors: inference, post-LN, src_key_padding_mask given)
  returns 0 at padded positions before the final norm, so encoder outputs are compared at
  non-padded positions only, and final outputs at non-padded target positions (the decoder
  never reads padded memory rows: the memory padding mask is the source padding mask).
- torch gives NaN for a query row with no allowed key (fastattn gives zeros), and a NaN memory
  row poisons every decoder row through 0 * NaN; so the masks in torch comparisons always let
  every query see key 0 (never padded). Fully masked rows are tested apart, without torch.
- torch's fast path (inference, eval) reads a float attention mask as bool, nonzero = masked
  (pytorch/pytorch#118628, #107084), so a float mask with finite nonzero values gives wrong
  results or NaN there; torch runs its math path (fast path off) whenever a float mask holds
  values other than 0 and -inf (see torch_fastpath).
"""
import contextlib
import math

import numpy as np
import pytest

from conftest import assert_close
from fastattn import nn as fnn
from tolerances import TOL, max_rel

TORCH_WARNINGS = [
    pytest.mark.filterwarnings("ignore:.*nested tensor.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:Support for mismatched .*:UserWarning"),
]

B, S, T = 3, 7, 5                  # batch, source length, target length
C, H, F = 32, 4, 64                # d_model, heads, d_ff


# ----------------------------------------------------------------------------------------------
# helpers


def perturb(torch, module, seed=0):
    """Move every parameter of a torch module off its initial value (in place): biases off
    0, norm weights off 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def assert_grads(fm, tm, rel=TOL["nn_torch"]["atol"]):
    """named_grads() == torch's .grad for every parameter, keys and order included."""
    ours = dict(fm.named_grads())
    theirs = {k: p.grad for k, p in tm.named_parameters() if p.grad is not None}
    assert list(ours) == [k for k, _ in fm.named_parameters() if k in ours]
    assert set(ours) == set(theirs), (set(ours) ^ set(theirs))
    for k, g in ours.items():
        assert_close(g, theirs[k].numpy(), **max_rel(theirs[k].numpy(), rel), name=k)


def features(rng, batch, length, d=C):
    return rng.standard_normal((batch, length, d)).astype(np.float32)


def padding(batch, length, lengths):
    """(batch, length) bool, True = padding at the end of each row (key 0 never padded)."""
    kpm = np.zeros((batch, length), dtype=bool)
    for b, n in enumerate(lengths):
        kpm[b, n:] = True
    return kpm


def float_mask(rng, Lq, Lk, p_inf=0.3):
    """(Lq, Lk) additive mask: N(0, 1) values with some -inf, key 0 always finite."""
    m = rng.standard_normal((Lq, Lk)).astype(np.float32)
    m[rng.random((Lq, Lk)) < p_inf] = -np.inf
    m[:, 0] = rng.standard_normal(Lq).astype(np.float32)
    return m


def bool_mask(rng, shape, p=0.3):
    """bool mask (True = not allowed) with key 0 always allowed."""
    m = rng.random(shape) < p
    m[..., 0] = False
    return m


def t(torch, x):
    return None if x is None else torch.from_numpy(np.ascontiguousarray(x))


@contextlib.contextmanager
def torch_fastpath(torch, masks):
    """inference_mode, with torch's MHA / encoder-layer fast path off when a float mask among
    `masks` holds values other than 0 and -inf (the fast path reads float masks as bool)."""
    floats = any(m is not None and np.asarray(m).dtype.kind == "f"
                 and not np.all((np.asarray(m) == 0) | (np.asarray(m) == -np.inf))
                 for m in masks)
    old = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(old and not floats)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(old)


def torch_transformer(torch, *, norm_first=False, activation="relu", bias=True, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Transformer(C, H, 2, 2, F, dropout=0.0, activation=activation,
                                batch_first=True, norm_first=norm_first, bias=bias).eval()


def fast_transformer(torch_model=None, *, backend="fast", **cfg):
    seed = cfg.pop("seed", 0)
    cfg = {**dict(d_model=C, nhead=H, num_encoder_layers=2, num_decoder_layers=2,
                  dim_feedforward=F, dropout=0.0), **cfg}
    m = fnn.Transformer(**cfg, backend=backend, seed=seed)
    if torch_model is not None:
        m.load_state_dict(torch_model.state_dict())
    return m


def mha_pair(torch, seed=0):
    torch.manual_seed(seed)
    tm = torch.nn.MultiheadAttention(C, H, batch_first=True).eval()
    with torch.no_grad():                          # torch zero-initialises the biases
        tm.in_proj_bias.normal_()
        tm.out_proj.bias.normal_()
    fm = fnn.MultiheadAttention(C, H)
    fm.load_state_dict(tm.state_dict())
    return tm, fm


def mha_masks(rng, masking, Lq, Lk):
    """MultiheadAttention keyword masks for one case; every query row keeps key 0."""
    kw = {}
    if masking == "kpm_float":                    # additive, as torch allows
        kpm = rng.standard_normal((B, Lk)).astype(np.float32)
        kpm[:, 1::3] = -np.inf
        kw["key_padding_mask"] = kpm
    elif masking.startswith("kpm"):
        kw["key_padding_mask"] = padding(B, Lk, [Lk, 3, 2])
    return add_attn_mask(kw, rng, masking, Lq, Lk, B * H)


def add_attn_mask(kw, rng, masking, Lq, Lk, BH):
    """kw with the attn_mask of a masking case, if it has one: bool or float, (Lq, Lk) or
    (BH, Lq, Lk) for BH = batch * heads ("kpm_2d" / "kpm_3d": bool, beside a padding mask)."""
    if masking in ("2d_bool", "kpm_2d"):
        kw["attn_mask"] = bool_mask(rng, (Lq, Lk))
    if masking == "2d_float":
        kw["attn_mask"] = float_mask(rng, Lq, Lk)
    if masking in ("3d_bool", "kpm_3d"):
        kw["attn_mask"] = bool_mask(rng, (BH, Lq, Lk))
    if masking == "3d_float":
        m = rng.standard_normal((BH, Lq, Lk)).astype(np.float32)
        m[rng.random(m.shape) < 0.3] = -np.inf
        m[..., 0] = 0.0
        kw["attn_mask"] = m
    return kw


MHA_MASKS = ["none", "kpm", "kpm_float", "2d_bool", "2d_float", "3d_bool", "3d_float", "kpm_2d",
             "kpm_3d"]


V_SRC, V_TGT, PAD = 17, 19, 1


def tutorial_model_class(torch):
    """The model of PyTorch's "Language Translation with nn.Transformer" tutorial, written
    batch-first: nn.Transformer(batch_first=True) and the positional table added along the
    sequence axis of (B, L, C). Keys and layouts are the tutorial's."""
    nn = torch.nn

    class PositionalEncoding(nn.Module):
        def __init__(self, emb_size, dropout, maxlen=5000):
            super().__init__()
            den = torch.exp(-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
            pos = torch.arange(0, maxlen).reshape(maxlen, 1)
            pos_embedding = torch.zeros((maxlen, emb_size))
            pos_embedding[:, 0::2] = torch.sin(pos * den)
            pos_embedding[:, 1::2] = torch.cos(pos * den)
            pos_embedding = pos_embedding.unsqueeze(-2)             # (maxlen, 1, C)
            self.dropout = nn.Dropout(dropout)
            self.register_buffer("pos_embedding", pos_embedding)

        def forward(self, token_embedding):                         # (B, L, C)
            L = token_embedding.size(1)
            return self.dropout(token_embedding + self.pos_embedding[:L, 0][None])

    class TokenEmbedding(nn.Module):
        def __init__(self, vocab_size, emb_size):
            super().__init__()
            self.embedding = nn.Embedding(vocab_size, emb_size)
            self.emb_size = emb_size

        def forward(self, tokens):
            return self.embedding(tokens.long()) * math.sqrt(self.emb_size)

    class Seq2SeqTransformer(nn.Module):
        def __init__(self, num_encoder_layers, num_decoder_layers, emb_size, nhead,
                     src_vocab_size, tgt_vocab_size, dim_feedforward=512, dropout=0.1):
            super().__init__()
            self.transformer = nn.Transformer(d_model=emb_size, nhead=nhead,
                                              num_encoder_layers=num_encoder_layers,
                                              num_decoder_layers=num_decoder_layers,
                                              dim_feedforward=dim_feedforward,
                                              dropout=dropout, batch_first=True)
            self.generator = nn.Linear(emb_size, tgt_vocab_size)
            self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size)
            self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size)
            self.positional_encoding = PositionalEncoding(emb_size, dropout=dropout)

        def forward(self, src, trg, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask,
                    memory_key_padding_mask):
            src_emb = self.positional_encoding(self.src_tok_emb(src))
            tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
            outs = self.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None,
                                    src_padding_mask, tgt_padding_mask,
                                    memory_key_padding_mask)
            return self.generator(outs)

        def encode(self, src, src_mask, src_padding_mask=None):
            return self.transformer.encoder(self.positional_encoding(self.src_tok_emb(src)),
                                            src_mask, src_padding_mask)

        def decode(self, tgt, memory, tgt_mask, tgt_padding_mask=None,
                   memory_key_padding_mask=None):
            return self.transformer.decoder(self.positional_encoding(self.tgt_tok_emb(tgt)),
                                            memory, tgt_mask,
                                            tgt_key_padding_mask=tgt_padding_mask,
                                            memory_key_padding_mask=memory_key_padding_mask)

    return Seq2SeqTransformer


def tutorial_masks(torch, src, tgt_in):
    """The tutorial's masks for a batch: (src_mask, tgt_mask, src and tgt padding masks)."""
    T = tgt_in.shape[1]
    return (torch.zeros((src.shape[1], src.shape[1])).bool(),
            torch.nn.Transformer.generate_square_subsequent_mask(T),
            torch.tensor(src == PAD), torch.tensor(tgt_in == PAD))


def token_batch(rng, vocab, lengths, length):
    """(B, length) ids in [2, vocab) with PAD after each row's length."""
    ids = rng.integers(2, vocab, size=(len(lengths), length))
    for b, n in enumerate(lengths):
        ids[b, n:] = PAD
    return ids


def seq2seq_pair(torch, seed=0):
    torch.manual_seed(seed)
    tm = tutorial_model_class(torch)(2, 2, C, H, V_SRC, V_TGT, F, dropout=0.0).eval()
    fm = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD)
    fm.load_state_dict(tm.state_dict())            # torch tensors, pos_embedding buffer too
    return tm, fm


def tutorial_batch(rng):
    """A padded batch for seq2seq_pair and the tutorial's masks for it: (src, tgt, src_mask,
    tgt_mask, src_pad, tgt_pad)."""
    src = token_batch(rng, V_SRC, [S, 4, 6], S)
    tgt = token_batch(rng, V_TGT, [T, 2, 4], T)
    src_mask = np.zeros((S, S), dtype=bool)                     # as the tutorial's create_mask
    tgt_mask = fnn.generate_square_subsequent_mask(T)
    return src, tgt, src_mask, tgt_mask, src == PAD, tgt == PAD


def tutorial_args(torch, src, tgt, src_mask, tgt_mask, src_pad, tgt_pad):
    """The tutorial model's forward arguments for a tutorial_batch, as torch tensors (the
    source padding serves as the memory padding)."""
    return tuple(t(torch, a) for a in (src, tgt, src_mask, tgt_mask, src_pad, tgt_pad, src_pad))
