"""The torch twins of the model cases. torch is optional: it is imported here, lazily, on first
use, and a missing torch raises Unavailable (the table shows "n/a").

- ``torch_transformer(model)``: torch.nn.Transformer holding a fastattn Transformer's weights;
- ``tutorial_seq2seq(cfg)``: the model of PyTorch's translation tutorial, initialised as the
  tutorial does; ``torch_seq2seq(model)``: the same holding a fastattn Seq2SeqTransformer's
  weights;
- ``TorchDecoder``: the tutorial's way of decoding with it (encode once, then each step re-run
  the decoder on every row's whole prefix) as a decoder for ``fastattn.generate.search``;
- ``TorchCachedDecoder``: the same model decoding with a key/value cache of its own (encode
  once, each decoder layer's cross-attention keys and values once, then each step runs only
  the new token through the decoder layers): the peer of fastattn's own cached decoding, run
  on the model converted with ``.to(torch.bfloat16)`` for the bfloat16 generation cases;
- ``torch_generate(tm, src, ...)``: greedy or beam search over a TorchDecoder (kv_cache=True:
  a TorchCachedDecoder) with fastattn.generate's own search loops, so torch's tokens are
  chosen by exactly fastattn's rules (and its timings include that search bookkeeping, which
  is cheap next to re-running the decoder).
"""
import math

import numpy as np

from ..generate import sampling, search

__all__ = ["Unavailable", "optional_torch", "require_torch", "torch_version",
           "torch_transformer", "tutorial_seq2seq", "torch_seq2seq", "TorchDecoder",
           "TorchCachedDecoder", "torch_generate"]


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
    """The installed torch's version, or None without torch."""
    torch = optional_torch()
    return None if torch is None else torch.__version__


def _weights(torch, model):
    return {k: torch.from_numpy(v) for k, v in model.state_dict().items()}


def torch_transformer(model):
    """torch.nn.Transformer (batch_first, dropout 0, eval) holding a fastattn Transformer's weights.

    Args:
        model: a fastattn nn.Transformer.

    Returns:
        The torch module.
    """
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
    dropout.

    Args:
        cfg: a fastattn Seq2SeqTransformer config.
        dropout: the model's dropout (default 0).
        xavier: the tutorial's xavier_uniform_ loop (default True; False leaves torch's
            construction defaults).

    Returns:
        The torch module, in eval mode.
    """
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
    """tutorial_seq2seq for a fastattn Seq2SeqTransformer's config, holding its weights (eval mode).

    Args:
        model: a fastattn Seq2SeqTransformer.
        dropout: the torch model's dropout (default 0).

    Returns:
        The torch module.
    """
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
    forward masks them; without it the sources are taken as unpadded. ``step(tokens)`` appends
    the rows' tokens to their prefixes (R, t + 1), re-runs tm.transformer.decoder on the whole
    prefixes under the square subsequent mask and returns the generator's logits of the last
    position, (R, V) float32 NumPy. ``reorder(rows, sources)`` gathers the prefixes; with
    `sources` (whole sources dropped) it keeps those sources' memory rows. No key/value cache:
    that is the tutorial's loop fastattn is compared with.

    Args:
        tm: a torch_seq2seq model.
        src_ids: (B, S) source ids.
        beams: rows per source (default 1).
        src_pad_id: the source padding id, or None (the default): unpadded.
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
        """One decode step: append the rows' tokens and return the next position's logits.

        Args:
            tokens: (R,) token ids, one per row.

        Returns:
            (R, V) float32 NumPy logits.
        """
        torch, tm = self._torch, self.tm
        self.prefix = torch.cat([self.prefix, _ids(torch, tokens)[:, None]], dim=1)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(self.prefix.shape[1])
        out = tm.transformer.decoder(tm.embed(tm.tgt_tok_emb, self.prefix), self.memory,
                                     tgt_mask=mask,
                                     memory_key_padding_mask=self.pad)   # (R, t + 1, C)
        return tm.generator(out[:, -1]).numpy()                         # (R, V)

    def reorder(self, rows, sources=None):
        """Continue with some rows, in a new order (beams moved, rows dropped).

        Args:
            rows: new row i is old row rows[i].
            sources: the kept sources when whole sources were dropped, or None (the default).
        """
        torch = self._torch
        self.prefix = self.prefix[_ids(torch, rows)]
        if sources is not None:
            keep = _ids(torch, sources)
            per_source = self.memory.unflatten(0, (-1, self.beams))     # (B_live, k, S, C)
            self.memory = per_source[keep].flatten(0, 1)
            if self.pad is not None:
                self.pad = self.pad.unflatten(0, (-1, self.beams))[keep].flatten(0, 1)


class TorchCachedDecoder:
    """A torch_seq2seq model decoding with a key/value cache of its own, as
    fastattn.generate.search sees a decoder (``step`` and ``reorder``); call it under
    torch.inference_mode(). The model's parameter dtype is the compute dtype (float32, or
    bfloat16 after ``tm.to(torch.bfloat16)``); logits come back as float32 NumPy.

    Built once: the sources (B, S) encoded (src_pad_id masks as in TorchDecoder), then each
    decoder layer's cross-attention keys and values projected from the memory, (R, H, S, D)
    for R = B x beams rows. ``step(tokens)`` embeds the rows' tokens at position t (the
    tutorial's scaled embedding plus the sinusoidal row t) and runs that one position through
    each decoder layer, written out with the layer's own modules and weights as
    torch.nn.TransformerDecoderLayer's forward (norm_first or post-norm, the layer's
    activation; eval, so no dropout), appending the self-attention's keys and values to the
    layer's cache (R, H, t + 1, D); then the decoder's final norm and the generator. The new
    position attends to every cached one, which is its row of the square subsequent mask, so
    the logits are TorchDecoder's up to rounding. ``reorder(rows, sources)`` gathers the
    self-attention caches; with `sources` (whole sources dropped) it keeps those sources'
    cross-attention keys, values and padding mask.

    Legend: R rows, S source positions, C d_model, H heads, D = C / H, t positions decoded.

    Args:
        tm: a torch_seq2seq model.
        src_ids: (B, S) source ids.
        beams: rows per source (default 1).
        src_pad_id: the source padding id, or None (the default): unpadded.
        max_len: the cache's first length in positions, grown as needed (default 16).
    """

    def __init__(self, tm, src_ids, beams=1, src_pad_id=None, max_len=16):
        torch = require_torch()
        F = torch.nn.functional
        self._torch, self.tm, self.beams = torch, tm, beams
        self.layers, self.norm = list(tm.transformer.decoder.layers), tm.transformer.decoder.norm
        C = tm.transformer.d_model
        self.H = tm.transformer.nhead
        src = _ids(torch, src_ids)
        pad = None if src_pad_id is None else src == src_pad_id          # (B, S) bool
        memory = tm.transformer.encoder(tm.embed(tm.src_tok_emb, src),
                                        src_key_padding_mask=pad)       # (B, S, C)
        # scaled_dot_product_attention's boolean mask: True where a key takes part
        self.keep = None if pad is None else ~pad[:, None, None, :]      # (B, 1, 1, S)
        self.cross = []                                   # per layer: K, V (R, H, S, D)
        for layer in self.layers:
            a = layer.multihead_attn
            b = None if a.in_proj_bias is None else a.in_proj_bias[C:]
            kv = F.linear(memory, a.in_proj_weight[C:], b)                # (B, S, 2C)
            self.cross.append(tuple(self._beams(self._heads(y)) for y in kv.chunk(2, dim=-1)))
        if self.keep is not None:
            self.keep = self._beams(self.keep)                           # (R, 1, 1, S)
        shape = (memory.shape[0] * beams, self.H, max(1, max_len), C // self.H)
        self.k = [memory.new_empty(shape) for _ in self.layers]          # (R, H, cap, D)
        self.v = [memory.new_empty(shape) for _ in self.layers]
        self.t = 0

    def _beams(self, a):                                  # (B, ...) -> (B * beams, ...)
        return a.repeat_interleave(self.beams, dim=0) if self.beams > 1 else a

    def _heads(self, x):                                  # (R, L, C) -> (R, H, L, D)
        return x.unflatten(-1, (self.H, -1)).transpose(1, 2)

    @staticmethod
    def _merge(o):                                        # (R, H, L, D) -> (R, L, C)
        return o.transpose(1, 2).flatten(2)

    def _self_attn(self, layer, x, i):                    # x (R, 1, C) -> (R, 1, C)
        F, a, t = self._torch.nn.functional, layer.self_attn, self.t
        qkv = F.linear(x, a.in_proj_weight, a.in_proj_bias)              # (R, 1, 3C)
        q, k, v = (self._heads(y) for y in qkv.chunk(3, dim=-1))         # (R, H, 1, D)
        self.k[i][:, :, t:t + 1] = k
        self.v[i][:, :, t:t + 1] = v
        o = F.scaled_dot_product_attention(q, self.k[i][:, :, :t + 1],
                                           self.v[i][:, :, :t + 1])     # (R, H, 1, D)
        return a.out_proj(self._merge(o))

    def _cross_attn(self, layer, x, i):                   # x (R, 1, C) -> (R, 1, C)
        F, a = self._torch.nn.functional, layer.multihead_attn
        C = x.shape[-1]
        b = None if a.in_proj_bias is None else a.in_proj_bias[:C]
        q = self._heads(F.linear(x, a.in_proj_weight[:C], b))            # (R, H, 1, D)
        k, v = self.cross[i]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.keep)  # (R, H, 1, D)
        return a.out_proj(self._merge(o))

    @staticmethod
    def _ff(layer, x):                                    # (R, 1, C) -> (R, 1, C)
        return layer.linear2(layer.activation(layer.linear1(x)))

    def _grow(self):
        """Double the self-attention caches' capacity (positions), keeping what they hold."""
        torch = self._torch
        self.k = [torch.cat([k, torch.empty_like(k)], dim=2) for k in self.k]
        self.v = [torch.cat([v, torch.empty_like(v)], dim=2) for v in self.v]

    def step(self, tokens):
        """One decode step: append the rows' tokens and return the next position's logits.

        Args:
            tokens: (R,) token ids, one per row.

        Returns:
            (R, V) float32 NumPy logits.
        """
        tm = self.tm
        if self.layers and self.t == self.k[0].shape[2]:
            self._grow()
        ids = _ids(self._torch, tokens)[:, None]                         # (R, 1)
        emb = tm.tgt_tok_emb.embedding
        x = emb(ids) * math.sqrt(emb.embedding_dim) + tm.pos_embedding[self.t:self.t + 1]
        for i, layer in enumerate(self.layers):                          # x (R, 1, C)
            if layer.norm_first:
                x = x + self._self_attn(layer, layer.norm1(x), i)
                x = x + self._cross_attn(layer, layer.norm2(x), i)
                x = x + self._ff(layer, layer.norm3(x))
            else:
                x = layer.norm1(x + self._self_attn(layer, x, i))
                x = layer.norm2(x + self._cross_attn(layer, x, i))
                x = layer.norm3(x + self._ff(layer, x))
        if self.norm is not None:
            x = self.norm(x)
        self.t += 1
        return tm.generator(x[:, 0]).float().numpy()                    # (R, V)

    def reorder(self, rows, sources=None):
        """Continue with some rows, in a new order (beams moved, rows dropped).

        Args:
            rows: new row i is old row rows[i].
            sources: the kept sources when whole sources were dropped, or None (the default).
        """
        torch = self._torch
        idx = _ids(torch, rows)
        self.k = [k[idx] for k in self.k]
        self.v = [v[idx] for v in self.v]
        if sources is not None:
            keep = _ids(torch, sources)

            def regroup(a):                               # the kept sources' rows
                return a.unflatten(0, (-1, self.beams))[keep].flatten(0, 1)
            self.cross = [(regroup(k), regroup(v)) for k, v in self.cross]
            if self.keep is not None:
                self.keep = regroup(self.keep)


def torch_generate(tm, src_ids, *, max_new_tokens, start_id, end_id=None, pad_id=0,
                   method="greedy", beam_size=4, length_penalty=1.0, src_pad_id=None,
                   kv_cache=False):
    """Generate with a torch_seq2seq model through a TorchDecoder (kv_cache=True: a
    TorchCachedDecoder, which also runs a model converted with .to(torch.bfloat16)) and
    fastattn.generate's search loops (greedy: argmax, ties to the lowest id; beam:
    fastattn.generate's rules).

    Args:
        tm: a torch_seq2seq model.
        src_ids: (B, S) source ids.
        max_new_tokens: as Seq2SeqTransformer.generate's.
        start_id: as Seq2SeqTransformer.generate's.
        end_id: as Seq2SeqTransformer.generate's (default None).
        pad_id: as Seq2SeqTransformer.generate's (default 0).
        method: "greedy" (the default) or "beam".
        beam_size: as Seq2SeqTransformer.generate's (default 4).
        length_penalty: as Seq2SeqTransformer.generate's (default 1.0).
        src_pad_id: the source padding id, or None (the default).
        kv_cache: decode with TorchCachedDecoder (default False: TorchDecoder).

    Returns:
        int64 (B, T), laid out as Seq2SeqTransformer.generate's output.
    """
    if method not in ("greedy", "beam"):
        raise ValueError(f"torch_generate: method must be 'greedy' or 'beam', got {method!r}")
    torch = require_torch()
    kw = dict(max_new_tokens=max_new_tokens, start_id=start_id, end_id=end_id, pad_id=pad_id)
    B, beams = len(src_ids), 1 if method == "greedy" else beam_size
    with torch.inference_mode():
        if kv_cache:
            decoder = TorchCachedDecoder(tm, src_ids, beams=beams, src_pad_id=src_pad_id,
                                         max_len=max_new_tokens)
        else:
            decoder = TorchDecoder(tm, src_ids, beams=beams, src_pad_id=src_pad_id)
        if method == "greedy":
            return search.single(decoder, B, sampling.greedy, **kw)
        return search.beam(decoder, B, beam_size, length_penalty=length_penalty, **kw)
