"""The torch twins of the model cases. torch is optional: it is imported here, lazily, on first
use, and a missing torch raises Unavailable (the table shows "n/a").

- ``torch_transformer(model)``: torch.nn.Transformer holding a fastattn Transformer's weights;
- ``tutorial_seq2seq(cfg)``: the model of PyTorch's translation tutorial, initialised as the
  tutorial does; ``torch_seq2seq(model)``: the same holding a fastattn Seq2SeqTransformer's
  weights;
- ``TorchDecoder``: the tutorial's way of decoding with it (encode once, then each step re-run
  the decoder on every row's whole prefix) as a decoder for ``fastattn.generate.search``;
- ``torch_generate(tm, src, ...)``: greedy or beam search over a TorchDecoder with
  fastattn.generate's own search loops, so torch's tokens are chosen by exactly fastattn's
  rules (and its timings include that search bookkeeping, which is cheap next to re-running
  the decoder).
"""
import math

import numpy as np

from ..generate import sampling, search

__all__ = ["Unavailable", "optional_torch", "require_torch", "torch_version",
           "torch_transformer", "tutorial_seq2seq", "torch_seq2seq", "TorchDecoder", "torch_generate"]


class Unavailable(RuntimeError):
    """An implementation that cannot run here (torch not installed)."""


_torch_cache = []


def optional_torch():
    """The torch module, or None when it is not installed (imported once, on first use)."""
    if not _torch_cache:
        try:
            import torch
        except ImportError:
            torch = None
        _torch_cache.append(torch)
    return _torch_cache[0]


def require_torch():
    """The torch module; Unavailable when it is not installed."""
    torch = optional_torch()
    if torch is None:
        raise Unavailable("torch is not installed")
    return torch


def torch_version():
    torch = optional_torch()
    return None if torch is None else torch.__version__


def _weights(torch, model):
    return {k: torch.from_numpy(v) for k, v in model.state_dict().items()}


def torch_transformer(model):
    """torch.nn.Transformer (batch_first, dropout 0, eval) holding the weights of `model`, a
    fastattn nn.Transformer."""
    torch = require_torch()
    tm = torch.nn.Transformer(**{**model.config, "dropout": 0.0}, batch_first=True).eval()
    tm.load_state_dict(_weights(torch, model))
    return tm


def tutorial_seq2seq(cfg, *, dropout=0.0, xavier=True):
    """The model of PyTorch's translation tutorial (batch-first nn.Transformer, token
    embeddings scaled by sqrt(d_model), the sinusoidal table with dropout, the generator
    Linear) for a fastattn Seq2SeqTransformer config `cfg`, initialised as the tutorial does
    (torch's construction, then xavier_uniform_ on every parameter with two or more axes, from
    torch's global generator), in eval mode. Its positional table is computed here, the
    tutorial's way, not taken from fastattn. ``forward(src, tgt_in)`` is the tutorial's
    training forward (causal target, padding masks from cfg["pad_id"]); call ``.train()`` for
    dropout. xavier=False leaves torch's construction defaults (no tutorial loop)."""
    torch = require_torch()
    nn_ = torch.nn
    C, V = cfg["emb_size"], cfg["tgt_vocab_size"]

    class TokenEmbedding(nn_.Module):
        def __init__(self, vocab):
            super().__init__()
            self.embedding = nn_.Embedding(vocab, C)

    class Seq2Seq(nn_.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn_.Transformer(
                C, cfg["nhead"], cfg["num_encoder_layers"], cfg["num_decoder_layers"],
                cfg["dim_feedforward"], dropout=dropout, activation=cfg["activation"],
                layer_norm_eps=cfg["layer_norm_eps"], norm_first=cfg["norm_first"],
                batch_first=True)
            self.dropout = nn_.Dropout(dropout)
            self.generator = nn_.Linear(C, V)
            self.src_tok_emb = TokenEmbedding(cfg["src_vocab_size"])
            self.tgt_tok_emb = TokenEmbedding(V)
            den = torch.exp(-torch.arange(0, C, 2) * math.log(10000) / C)
            pos = torch.arange(0, cfg["max_len"]).reshape(-1, 1)
            table = torch.zeros((cfg["max_len"], C))
            table[:, 0::2] = torch.sin(pos * den)
            table[:, 1::2] = torch.cos(pos * den)
            self.register_buffer("pos_embedding", table, persistent=False)

        def embed(self, emb, ids):                              # (B, L) -> (B, L, C)
            x = emb.embedding(ids) * math.sqrt(C) + self.pos_embedding[:ids.shape[1]]
            return self.dropout(x)

        def forward(self, src, tgt_in):                         # -> logits (B, T, V)
            T, pad = tgt_in.shape[1], cfg["pad_id"]
            mask = torch.triu(torch.ones((T, T), dtype=torch.bool), 1)  # bool, as the padding
            out = self.transformer(self.embed(self.src_tok_emb, src),
                                   self.embed(self.tgt_tok_emb, tgt_in), tgt_mask=mask,
                                   src_key_padding_mask=src == pad,
                                   tgt_key_padding_mask=tgt_in == pad,
                                   memory_key_padding_mask=src == pad)
            return self.generator(out)

    tm = Seq2Seq()
    for p in tm.parameters() if xavier else ():     # the tutorial's loop
        if p.dim() > 1:
            nn_.init.xavier_uniform_(p)
    return tm.eval()


def torch_seq2seq(model, *, dropout=0.0):
    """tutorial_seq2seq for the config of `model`, a fastattn Seq2SeqTransformer, holding its
    weights (eval mode)."""
    torch = require_torch()
    tm = tutorial_seq2seq(model.config, dropout=dropout)
    tm.load_state_dict(_weights(torch, model))
    return tm


def _ids(torch, ids):
    """int64 token ids (NumPy or torch) -> a torch tensor (NumPy: zero-copy when it can)."""
    if isinstance(ids, torch.Tensor):
        return ids
    return torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))


class TorchDecoder:
    """A torch_seq2seq model decoding the tutorial's way, as fastattn.generate.search sees a
    decoder (``step`` and ``reorder``); call it under torch.inference_mode().

    The sources (B, S) are encoded once; memory (R, S, C) holds each source's row repeated for
    its `beams` rows (R = live sources x beams). With src_pad_id, source positions holding it
    are masked (src_key_padding_mask and memory_key_padding_mask), as the tutorial's training
    forward masks them; without it the sources are taken as unpadded. ``step(tokens)`` appends the rows' tokens to
    their prefixes (R, t + 1), re-runs tm.transformer.decoder on the whole prefixes under the
    square subsequent mask and returns the generator's logits of the last position, (R, V)
    float32 NumPy. ``reorder(rows, sources)`` gathers the prefixes; with `sources` (whole
    sources dropped) it keeps those sources' memory rows. No key/value cache: that is the
    tutorial's loop fastattn is compared with.
    """

    def __init__(self, tm, src_ids, beams=1, src_pad_id=None):
        torch = require_torch()
        self._torch, self.tm, self.beams = torch, tm, beams
        src = _ids(torch, src_ids)
        pad = None if src_pad_id is None else src == src_pad_id          # (B, S) bool
        memory = tm.transformer.encoder(tm.embed(tm.src_tok_emb, src),
                                        src_key_padding_mask=pad)
        self.memory = memory.repeat_interleave(beams, dim=0) if beams > 1 else memory
        self.pad = pad if pad is None or beams == 1 else pad.repeat_interleave(beams, dim=0)
        self.prefix = torch.empty((self.memory.shape[0], 0), dtype=torch.long)   # (R, t)

    def step(self, tokens):
        torch, tm = self._torch, self.tm
        self.prefix = torch.cat([self.prefix, _ids(torch, tokens)[:, None]], dim=1)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(self.prefix.shape[1])
        out = tm.transformer.decoder(tm.embed(tm.tgt_tok_emb, self.prefix), self.memory,
                                     tgt_mask=mask,
                                     memory_key_padding_mask=self.pad)   # (R, t + 1, C)
        return tm.generator(out[:, -1]).numpy()                         # (R, V)

    def reorder(self, rows, sources=None):
        torch = self._torch
        self.prefix = self.prefix[_ids(torch, rows)]
        if sources is not None:
            keep = _ids(torch, sources)
            per_source = self.memory.unflatten(0, (-1, self.beams))     # (B_live, k, S, C)
            self.memory = per_source[keep].flatten(0, 1)
            if self.pad is not None:
                self.pad = self.pad.unflatten(0, (-1, self.beams))[keep].flatten(0, 1)


def torch_generate(tm, src_ids, *, max_new_tokens, start_id, end_id=None, pad_id=0,
                   method="greedy", beam_size=4, length_penalty=1.0, src_pad_id=None):
    """Generate with a torch_seq2seq model through a TorchDecoder and fastattn.generate's
    search loops (greedy: argmax, ties to the lowest id; beam: fastattn.generate's rules) ->
    int64 (B, T) laid out as Seq2SeqTransformer.generate's output."""
    if method not in ("greedy", "beam"):
        raise ValueError(f"torch_generate: method must be 'greedy' or 'beam', got {method!r}")
    torch = require_torch()
    kw = dict(max_new_tokens=max_new_tokens, start_id=start_id, end_id=end_id, pad_id=pad_id)
    B = len(src_ids)
    with torch.inference_mode():
        if method == "greedy":
            return search.single(TorchDecoder(tm, src_ids, src_pad_id=src_pad_id), B,
                                 sampling.greedy, **kw)
        return search.beam(TorchDecoder(tm, src_ids, beams=beam_size, src_pad_id=src_pad_id),
                           B, beam_size,
                           length_penalty=length_penalty, **kw)
