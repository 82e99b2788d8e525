"""Seq2SeqTransformer: the encoder-decoder of PyTorch's translation tutorial, with token ids in
and logits out, and its decode step for fastattn.generate."""
import numbers

import numpy as np

from .backends import Workspace
from .layers import Embedding, LayerNorm, Linear, PositionalEncoding, TokenEmbedding
from .masks import decoder_masks, prepare_mask
from .module import (Module, check_activation, check_batch, check_dropout, features, rng_from,
                     token_ids, xavier)
from .saved import EmbeddingSaved, PublicSaved, Seq2SeqSaved
from .transformer import Transformer, _stream, collect_weights, recording_workspace

INITS = ("xavier", "torch")
# positions= -> PositionalEncoding's layout (None: learned tables)
POSITIONS = {"sinusoidal": "interleaved", "sinusoidal_halves": "halves",
             "sinusoidal_padding": "padding", "learned": None}
LEARNED_OFFSET = 2              # a learned table's row for position p is p + 2 (BART's layout)


def _check_pad_id(pad_id, src_vocab_size, tgt_vocab_size):
    """pad_id as an int (or None): an id of both vocabularies, as their embeddings and the
    padding masks of both sides use it; a TypeError or ValueError naming it otherwise."""
    if pad_id is None:
        return None
    if isinstance(pad_id, (bool, np.bool_)) or not isinstance(pad_id, numbers.Integral):
        raise TypeError(f"Seq2SeqTransformer: pad_id must be None or an int, got {pad_id!r}")
    pad_id = int(pad_id)
    sizes = (src_vocab_size, tgt_vocab_size)
    if all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1
           for v in sizes):         # other sizes are refused by the layers
        V = min(sizes)
        if not 0 <= pad_id < V:
            raise ValueError(f"Seq2SeqTransformer: pad_id {pad_id} is outside the vocabulary "
                             f"(ids 0..{V - 1}: src_vocab_size {src_vocab_size}, "
                             f"tgt_vocab_size {tgt_vocab_size})")
    return pad_id


class Seq2SeqTransformer(Module):
    """The encoder-decoder of PyTorch's "Language Translation with nn.Transformer" tutorial,
    batch-first: keys transformer.*, src_tok_emb.embedding.weight, tgt_tok_emb.embedding.weight,
    generator.weight / generator.bias. Its positional table is recomputed (the tutorial's
    ``positional_encoding.pos_embedding`` buffer is accepted and ignored when loading).

    Token ids are int arrays (B, L). With ``pad_id`` set, padding masks are derived from the ids
    wherever a mask is not given.

    Initialisation (``init``):

    - ``"xavier"`` (the default): as the tutorial does after building its model, every
      parameter with two or more axes is drawn from xavier_uniform_ (U(-a, a), a =
      sqrt(6 / (fan_in + fan_out))): both token embeddings (so a scaled embedding,
      sqrt(emb_size) * row, is about as large as the positional encodings it is added to,
      and the order of the tokens is not drowned out), the generator's weight, every
      attention projection (in_proj_weight as one (3C, C) matrix, out_proj.weight) and both
      feed-forward weights. One-axis parameters keep their construction values: the
      generator's and the feed-forward's biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (torch's
      Linear), the attention biases (in_proj_bias, out_proj.bias) zeros, layer norms
      weight 1 and bias 0.
    - ``"torch"``: torch's construction defaults without the tutorial's loop: embeddings
      N(0, 1) and the generator's weight U(-1/sqrt(C), 1/sqrt(C)) (nn.Embedding, nn.Linear);
      the nn.Transformer part is xavier as torch's own ``_reset_parameters`` makes it. With
      N(0, 1) embeddings scaled by sqrt(C), the positional encodings (at most 1) are small
      next to the tokens, and small models learn tasks where word order matters poorly.

    Options for the pretrained families (fastattn.pretrained builds them; defaults: the
    tutorial's model):

    - ``embed_scale``: the token embeddings' factor (None: sqrt(emb_size); 1.0: BART's
      unscaled tokens);
    - ``positions``: ``"sinusoidal"`` (the tutorial's interleaved table), ``"sinusoidal_halves"``
      (Marian's: sin then cos halves), ``"sinusoidal_padding"`` (M2M100 / NLLB: rows counted
      over the tokens that are not pad_id, from pad_id + 1; needs pad_id) or ``"learned"``
      (BART / mBART: parameters src_pos_emb.weight / tgt_pos_emb.weight, (max_len + 2, C),
      position p reading row p + 2);
    - ``layernorm_embedding``: a layer norm (src_emb_norm, tgt_emb_norm) right after token +
      position, before dropout (BART, mBART);
    - ``final_norm``: nn.Transformer's final encoder and decoder norms (False: none, as in
      Marian's and BART's post-norm stacks);
    - ``decoder_padding_mask``: derive the target's key padding mask from pad_id (False: the
      decoder sees every target position allowed by the causal mask, as the pretrained
      families' decoders do; their decoder start token may be the pad id);
    - ``padding_idx``: the pad_id row of both token embeddings gets no gradient from the
      tokens that read it (as torch's ``nn.Embedding(padding_idx=pad_id)``).

    Decoding, one position per step (what fastattn.generate drives):

    ```python
    cache = model.init_cache(src_ids, beams=1, max_len=64)   # encoder + cross K/V, once
    logits = model.step(tokens, cache)                       # (R,) ids -> (R, V) logits
    cache.reorder(rows, sources=None)                        # beams moved / rows dropped
    ```

    Args:
        num_encoder_layers: encoder layers.
        num_decoder_layers: decoder layers.
        emb_size: the model width C.
        nhead: attention heads (emb_size must be a multiple).
        src_vocab_size: the source vocabulary size.
        tgt_vocab_size: the target vocabulary size (the generator's outputs).
        dim_feedforward: the feed-forward hidden width (default 512, the tutorial's).
        dropout: the dropout probability in training (default 0.1).
        activation: the feed-forward's activation (default "relu"), as
            `TransformerEncoderLayer`'s.
        norm_first: pre-norm layers (default False: post-norm).
        layer_norm_eps: the layer norms' eps (default 1e-5).
        pad_id: the padding token id, from which masks are derived; None (the default) for
            none.
        max_len: the positions the model can embed (default 5000).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
        seed: the initialisation's seed, or a numpy Generator; None (the default) draws a
            fresh one.
        init: "xavier" (the default) or "torch", as above.
        embed_scale: the token embeddings' factor; None (the default) for sqrt(emb_size).
        positions: "sinusoidal" (the default), "sinusoidal_halves", "sinusoidal_padding" or
            "learned", as above.
        layernorm_embedding: a layer norm right after token + position (default False).
        final_norm: the stacks' final norms (default True).
        decoder_padding_mask: derive the target's key padding mask from pad_id (default True).
        padding_idx: the pad_id rows of the token embeddings get no gradient (default False).
    """

    _children = ("transformer", "generator", "src_tok_emb", "tgt_tok_emb", "src_pos_emb",
                 "tgt_pos_emb", "src_emb_norm", "tgt_emb_norm")

    def __init__(self, num_encoder_layers, num_decoder_layers, emb_size, nhead, src_vocab_size,
                 tgt_vocab_size, dim_feedforward=512, dropout=0.1, *, activation="relu",
                 norm_first=False, layer_norm_eps=1e-5, pad_id=None, max_len=5000,
                 backend="fast", seed=None, init="xavier", embed_scale=None,
                 positions="sinusoidal", layernorm_embedding=False, final_norm=True,
                 decoder_padding_mask=True, padding_idx=False):
        super().__init__(backend)
        if init not in INITS:
            raise ValueError(f"Seq2SeqTransformer: init must be one of "
                             f"{', '.join(map(repr, INITS))}, got {init!r}")
        if positions not in POSITIONS:
            raise ValueError(f"Seq2SeqTransformer: positions must be one of "
                             f"{', '.join(map(repr, POSITIONS))}, got {positions!r}")
        pad_id = _check_pad_id(pad_id, src_vocab_size, tgt_vocab_size)
        if positions == "sinusoidal_padding" and pad_id is None:
            raise ValueError("Seq2SeqTransformer: positions='sinusoidal_padding' counts "
                             "positions over the tokens that are not pad_id: give pad_id")
        rng = rng_from(seed)
        activation = check_activation(activation)      # torch's callables -> their names
        self.config = dict(num_encoder_layers=num_encoder_layers,
                           num_decoder_layers=num_decoder_layers, emb_size=emb_size,
                           nhead=nhead, src_vocab_size=src_vocab_size,
                           tgt_vocab_size=tgt_vocab_size, dim_feedforward=dim_feedforward,
                           activation=activation, norm_first=bool(norm_first),
                           layer_norm_eps=layer_norm_eps, pad_id=pad_id, max_len=max_len)
        options = dict(embed_scale=None if embed_scale is None else float(embed_scale),
                       positions=positions, layernorm_embedding=bool(layernorm_embedding),
                       final_norm=bool(final_norm),
                       decoder_padding_mask=bool(decoder_padding_mask),
                       padding_idx=bool(padding_idx))
        defaults = dict(embed_scale=None, positions="sinusoidal", layernorm_embedding=False,
                        final_norm=True, decoder_padding_mask=True, padding_idx=False)
        # written to config (and so to saved files) only where they differ from the tutorial's
        self.config.update((k, v) for k, v in options.items() if v != defaults[k])
        self.dropout = check_dropout(dropout)
        self.config["dropout"] = self.dropout
        self.transformer = Transformer(emb_size, nhead, num_encoder_layers, num_decoder_layers,
                                       dim_feedforward, dropout, activation=activation,
                                       layer_norm_eps=layer_norm_eps, norm_first=norm_first,
                                       backend=backend, seed=rng)
        self.generator = Linear(emb_size, tgt_vocab_size, backend=backend, seed=rng)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size, scale=embed_scale,
                                          backend=backend, seed=rng)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size, scale=embed_scale,
                                          backend=backend, seed=rng)
        layout = POSITIONS[positions]
        self.positional_encoding = PositionalEncoding(
            emb_size, max_len, dropout=dropout, layout=layout or "interleaved",
            padding_idx=pad_id if layout == "padding" else None, backend=backend)
        self.src_pos_emb = self.tgt_pos_emb = self.src_emb_norm = self.tgt_emb_norm = None
        if layout is None:                   # BART's learned tables: N(0, 1) as nn.Embedding
            self.src_pos_emb = Embedding(max_len + LEARNED_OFFSET, emb_size, backend=backend,
                                         seed=rng)
            self.tgt_pos_emb = Embedding(max_len + LEARNED_OFFSET, emb_size, backend=backend,
                                         seed=rng)
        if layernorm_embedding:
            self.src_emb_norm = LayerNorm(emb_size, layer_norm_eps, backend=backend)
            self.tgt_emb_norm = LayerNorm(emb_size, layer_norm_eps, backend=backend)
        if not final_norm:
            self.transformer.encoder.norm = self.transformer.decoder.norm = None
        self.decoder_padding_mask = bool(decoder_padding_mask)
        if padding_idx and pad_id is None:
            raise ValueError("Seq2SeqTransformer: padding_idx=True freezes the pad_id row of the "
                             "token embeddings: give pad_id")
        self.padding_idx = bool(padding_idx)
        self.pad_id = pad_id
        self.emb_size = emb_size
        if init == "xavier":                 # the tutorial's loop over model.parameters()
            for _, p in self.named_parameters():
                if p.ndim > 1:
                    p[...] = xavier(rng, p.shape)
            self.invalidate_caches()

    @property
    def max_len(self):
        """Positions the model can embed (the positional table's length)."""
        return self.positional_encoding.max_len

    @property
    def tgt_vocab_size(self):
        """The target vocabulary size (the generator's outputs)."""
        return self.tgt_tok_emb.embedding.num_embeddings

    def _ignored_keys(self):
        return ("positional_encoding.pos_embedding",)

    def _padding(self, ids, given):
        if given is not None or self.pad_id is None:
            return given
        return np.asarray(ids) == self.pad_id

    def _embed(self, emb, name, ids, offset=0, ws=None):
        """ids (B, L) -> ((B, L, C) token embedding * scale + positions offset... (then the
        embedding layer norm where the model has one), and EmbeddingSaved in a training pass,
        else None). A training forward writes into this model's buffers and applies
        dropout."""
        ids = token_ids(name, ids, emb.embedding.num_embeddings)
        if ids.ndim != 2:
            raise ValueError(f"{name} must be (B, L) token ids, got shape {ids.shape}")
        B, L = ids.shape
        pe = self.positional_encoding
        src = emb is self.src_tok_emb
        learned = self.src_pos_emb if src else self.tgt_pos_emb
        norm = self.src_emb_norm if src else self.tgt_emb_norm
        rows = pe.rows(ids, offset, L)                    # checks offset + L <= max_len
        training = ws is not None and ws.training
        if not training:
            x = emb(ids)
        else:
            bufs = self._bufs()
            kept = bufs.get(name + ".ids", (B, L), np.int64)
            kept[...] = ids
            x = emb._scaled_into(kept, bufs.get(name + ".x", (B, L, self.emb_size)))
        if learned is not None:
            table, lo = learned.weight, offset + LEARNED_OFFSET
            x += table[lo:lo + L]
        elif rows is None:
            x += pe.pe[offset:offset + L]
        else:
            x += pe.pe[rows]
        if not training:
            if norm is not None:
                x = norm._apply(x.reshape(B * L, -1)).reshape(B, L, -1)
            return x, None
        x2 = x.reshape(B * L, self.emb_size)
        norm_saved = None
        if norm is not None:
            x2, norm_saved = norm._forward_train(x2)
            x = x2.reshape(B, L, self.emb_size)
        x2, seed = self._dropout(x2, self.dropout, ws)
        return x, EmbeddingSaved(kept.reshape(-1), seed, norm_saved, offset, L)

    def _encode(self, src_ids, src_key_padding_mask, src_mask, ws):
        """-> (memory (B, S, C), (EmbeddingSaved, StackSaved) in a training pass, else
        None)."""
        x, emb_saved = self._embed(self.src_tok_emb, "src_ids", src_ids, ws=ws)
        B, S, C = x.shape
        if B == 0:
            return np.zeros((B, S, C), np.float32), None
        m = prepare_mask("src_mask", src_mask, self._padding(src_ids, src_key_padding_mask),
                         B, self.transformer.nhead, S, S, False, "src_key_padding_mask")
        mem, saved = self.transformer.encoder._forward(_stream(x, ws), m, ws, B)
        mem = mem.reshape(B, S, C)
        if ws.training:                               # a buffer kept till the backward
            return mem, (emb_saved, saved)
        return mem.copy(), None

    def _decode(self, tgt_ids, memory, tgt_mask, memory_key_padding_mask,
                tgt_key_padding_mask, tgt_is_causal, ws):
        """-> (hidden (B, T, C), (EmbeddingSaved, StackSaved) in a training pass, else
        None)."""
        y, emb_saved = self._embed(self.tgt_tok_emb, "tgt_ids", tgt_ids, ws=ws)
        mem = features("memory", memory, self.emb_size)
        B, T, C = y.shape
        check_batch("memory", mem, B)
        if B == 0:
            return np.zeros((B, T, C), np.float32), None
        tgt_pad = self._padding(tgt_ids, tgt_key_padding_mask) if self.decoder_padding_mask \
            else tgt_key_padding_mask
        tm, mm = decoder_masks(self.transformer.nhead, B, T, mem.shape[1], tgt_mask, None,
                               tgt_pad,
                               memory_key_padding_mask, tgt_is_causal, False)
        out, saved = self.transformer.decoder._forward(_stream(y, ws), mem, tm, mm, ws, B)
        if ws.training:
            return out.reshape(B, T, C), (emb_saved, saved)
        return out.reshape(B, T, C).copy(), None

    def encode(self, src_ids, src_key_padding_mask=None, src_mask=None):
        """Encode a batch of sources (inference: the training forward is the model's own call).

        Args:
            src_ids: (B, S) integer token ids.
            src_key_padding_mask: (B, S), True = padding; None (the default) derives it from
                pad_id.
            src_mask: (S, S) attention mask over the source, or None (the default).

        Returns:
            memory, (B, S, C) float32.
        """
        return self._encode(src_ids, src_key_padding_mask, src_mask, Workspace(self._ops))[0]

    def decode(self, tgt_ids, memory, tgt_mask=None, memory_key_padding_mask=None,
               tgt_key_padding_mask=None, tgt_is_causal=True):
        """Decode a batch of targets against the encoder's memory (causal by default).

        Args:
            tgt_ids: (B, T) integer token ids.
            memory: (B, S, C) from `encode`.
            tgt_mask: (T, T) attention mask over the target, or None (the default).
            memory_key_padding_mask: (B, S), True = padding, or None (the default).
            tgt_key_padding_mask: (B, T), True = padding; None (the default) derives it from
                pad_id (with decoder_padding_mask).
            tgt_is_causal: apply the causal rule when no tgt_mask is given (default True).

        Returns:
            hidden, (B, T, C) float32 (before the generator).
        """
        return self._decode(tgt_ids, memory, tgt_mask, memory_key_padding_mask,
                            tgt_key_padding_mask, tgt_is_causal, Workspace(self._ops))[0]

    def __call__(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None,
                 src_key_padding_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, tgt_is_causal=True):
        """-> logits (B, T, tgt_vocab_size). Padding masks come from pad_id when not given;
        the memory padding mask defaults to the source padding mask. In training mode the
        forward applies dropout and keeps what backward(d_logits) needs."""
        logits, saved = self._forward(src_ids, tgt_ids, src_mask, tgt_mask,
                                      src_key_padding_mask, tgt_key_padding_mask,
                                      memory_key_padding_mask, tgt_is_causal)
        if self.training:
            self._saved = PublicSaved(saved, None, None)
            logits = logits.copy()                   # the training buffer is the next step's
        return logits

    def attention_weights(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None,
                          src_key_padding_mask=None, tgt_key_padding_mask=None,
                          memory_key_padding_mask=None, tgt_is_causal=True):
        """The attention weights of every layer, from an inference pass with the forward's math.

        The masks are the forward's (causal target; padding from pad_id where no mask is
        given). A row sums to 1, or is zeros where the masks leave its query no key; masked
        entries are exactly 0. The forward itself never pays for it: only this pass takes the
        attention path that stores the weights.

        Args:
            src_ids: (B, S) integer token ids.
            tgt_ids: (B, T) integer token ids.
            src_mask: as in the forward (default None).
            tgt_mask: as in the forward (default None).
            src_key_padding_mask: as in the forward (default None: from pad_id).
            tgt_key_padding_mask: as in the forward (default None: from pad_id).
            memory_key_padding_mask: as in the forward (default None).
            tgt_is_causal: as in the forward (default True).

        Returns:
            {"encoder": [(B, H, S, S) per layer], "decoder": [(B, H, T, T) per layer, the
                masked self-attention], "cross": [(B, H, T, S) per layer]}, float32 arrays.

        Raises:
            RuntimeError: in train mode, whose dropout would change the weights.
        """
        rec = recording_workspace(self, "attention_weights")
        logits, _ = self._forward(src_ids, tgt_ids, src_mask, tgt_mask, src_key_padding_mask,
                                  tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                                  ws=rec)
        B, T, _ = logits.shape
        return collect_weights(self.transformer, rec.weights, B, np.shape(src_ids)[1], T)

    def _forward(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None,
                 src_key_padding_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, tgt_is_causal=True, ws=None):
        """The forward -> (logits (B, T, V), Seq2SeqSaved in a training pass, else None); in
        training mode the logits are a buffer of the generator's, rewritten by the next
        training forward. ws: a recording workspace, or None (this module's own)."""
        src_pad = self._padding(src_ids, src_key_padding_mask)
        if memory_key_padding_mask is None:
            memory_key_padding_mask = src_pad
        if ws is None:
            ws = self._workspace()
        memory, enc = self._encode(src_ids, src_pad, src_mask, ws)
        hidden, dec = self._decode(tgt_ids, memory, tgt_mask, memory_key_padding_mask,
                                   tgt_key_padding_mask, tgt_is_causal, ws)
        B, T, C = hidden.shape
        saved = None
        if ws.training and B:
            logits, gen = self.generator._forward_train(hidden.reshape(B * T, C))
            saved = Seq2SeqSaved(memory.shape, (B, T, C), enc[0], dec[0], enc[1], dec[1], gen)
        else:
            logits = self.generator._apply(hidden.reshape(B * T, C), ws)
        return logits.reshape(B, T, self.tgt_vocab_size), saved   # not -1: B may be 0

    def backward(self, grad_output):
        """Backward after a training-mode forward, into every parameter (gradients accumulate).

        Through the generator, the decoder, the encoder and into both embeddings.

        Args:
            grad_output: d_logits, (B, T, V).

        Returns:
            None (token ids have no gradient).
        """
        public = self._check_saved()
        saved = public.record
        B, T, _ = (0, 0, 0) if saved is None else saved.tgt_shape
        d = features("grad_output", grad_output, self.tgt_vocab_size)
        if saved is None:                                  # an empty batch: nothing to do
            return
        if d.shape[:2] != (B, T):
            self._saved = public
            raise ValueError(f"Seq2SeqTransformer.backward: grad_output must be "
                             f"{(B, T, self.tgt_vocab_size)}, got {d.shape}")
        self._backward(d.reshape(B * T, -1), saved)

    def _backward(self, d_logits, saved):
        """d_logits (B*T, V) (not written) and the forward's Seq2SeqSaved back to both
        embeddings, through scratch buffers shared by the whole backward."""
        tr = self.transformer
        bufs = self._bufs()
        B, T, C = saved.tgt_shape
        S = saved.memory_shape[1]
        dh = self.generator._backward(d_logits, saved.generator,
                                      bufs.get("grad.hidden", (B * T, C)))
        dmem = bufs.get("grad.memory", (B * S, C))
        dmem.fill(0.0)
        d_tgt = tr.decoder._backward(dh, saved.decoder, dmem, bufs)         # (B*T, C)
        self._embed_backward(self.tgt_tok_emb, self.tgt_pos_emb, self.tgt_emb_norm, d_tgt,
                             saved.tgt, bufs)                   # before its buffer is reused
        d_src = tr.encoder._backward(dmem, saved.encoder, bufs)
        self._embed_backward(self.src_tok_emb, self.src_pos_emb, self.src_emb_norm, d_src,
                             saved.src, bufs)

    def _embed_backward(self, emb, learned, norm, d, saved, bufs):
        """The embeddings' gradients (tokens; a learned position table; the embedding layer
        norm) from d (N, C), the gradient of the dropout's output (a scratch buffer,
        overwritten); saved its EmbeddingSaved."""
        d = self._dropout_backward(d, self.dropout, saved.seed, d)
        if norm is not None:
            d = norm._backward(d, saved.norm, bufs.get("grad.embed_norm", d.shape))
        if learned is not None:
            N = d.shape[0]
            lo = saved.offset + LEARNED_OFFSET
            rows = np.tile(np.arange(lo, lo + saved.length, dtype=np.int64),
                           N // saved.length)
            learned._accumulate(d, rows)
        if self.padding_idx:
            d[saved.ids == self.pad_id] = 0.0
        emb._accumulate(d, saved.ids)

    def loss(self, src_ids, tgt_ids, *, label_smoothing=0.0, backward=False):
        """Teacher-forced cross-entropy: the decoder reads tgt_ids[:, :-1] and predicts
        tgt_ids[:, 1:]; padding masks and ignored targets come from pad_id; the mean over the
        targets that are not padding (0.0 when every target is padding). backward=True (in
        training mode) accumulates the gradients in the same call; the (B, T, V) logits do not
        outlive it.

        Args:
            src_ids: (B, S) integer source token ids.
            tgt_ids: (B, T) integer target token ids, start token first.
            label_smoothing: in [0, 1) (default 0).
            backward: also accumulate the gradients (training mode only; default False).

        Returns:
            The loss, a float.

        Raises:
            RuntimeError: backward=True outside training mode.
        """
        if backward and not self.training:
            raise RuntimeError("loss(backward=True) needs training mode: call model.train()")
        tgt = token_ids("tgt_ids", tgt_ids, self.tgt_vocab_size)
        if tgt.ndim != 2 or tgt.shape[1] < 2:
            raise ValueError(f"loss: tgt_ids must be (B, T) with T >= 2 (a start token and at "
                             f"least one target), got shape {tgt.shape}")
        logits, saved = self._forward(src_ids, tgt[:, :-1])                 # (B, T-1, V)
        B, T, V = logits.shape
        ignore = -100 if self.pad_id is None else self.pad_id
        bufs = self._bufs()
        targets = bufs.get("targets", (B, T), np.int64)
        targets[...] = tgt[:, 1:]
        loss, dlogits = self._ops.cross_entropy(logits.reshape(B * T, V), targets.reshape(-1),
                                                ignore, label_smoothing, backward,
                                                bufs.get("losses", (B * T,)))
        del logits
        if backward and saved is not None:
            self._backward(dlogits, saved)
        return loss

    # -- decoding ------------------------------------------------------------------------------
    def init_cache(self, src_ids, src_key_padding_mask=None, *, beams=1, max_len):
        """Encode src_ids (B, S) and prepare decoding of up to max_len positions with `beams`
        rows per source: the memory's cross-attention keys and values are projected once here.
        The source padding mask (given, or from pad_id) masks the memory exactly as in
        ``model(src_ids, tgt_ids)``: a float mask is added, a bool mask blocks.

        Args:
            src_ids: (B, S) integer token ids.
            src_key_padding_mask: (B, S); None (the default) derives it from pad_id.
            beams: rows per source (default 1).
            max_len: the most positions to decode (at most the model's max_len).

        Returns:
            The `DecoderCache`.

        Raises:
            ValueError: max_len beyond the model's.
        """
        if isinstance(max_len, int) and not isinstance(max_len, bool) and \
                max_len > self.max_len:
            raise ValueError(f"init_cache: max_len={max_len} exceeds the model's "
                             f"max_len={self.max_len} positions")
        kpm = self._padding(src_ids, src_key_padding_mask)
        memory = self.encode(src_ids, kpm)
        return self.transformer.decoder.init_cache(memory, kpm, beams=beams, max_len=max_len)

    def step(self, tokens, cache):
        """One decode step: the logits for the next position of each row.

        Args:
            tokens: (R,) int, the target token at position cache.t of each row; R = live
                sources x beams (row r belongs to source r // beams).
            cache: the `DecoderCache` from `init_cache`.

        Returns:
            logits, (R, V) float32.
        """
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"step: tokens must be (R,) token ids, got shape {tokens.shape}")
        if cache.t >= cache.max_len:
            raise ValueError(f"step: the cache holds max_len={cache.max_len} positions, all "
                             "written")
        x = self._embed(self.tgt_tok_emb, "tokens", tokens[:, None], offset=cache.t)[0][:, 0]
        x = cache._check_step(x, self.emb_size)
        layers, generator = cache.plan(self._step_plan)
        hidden = self.transformer.decoder._step(x, cache, cache.ws, layers)
        cache.t += 1
        return generator(hidden, np.empty((hidden.shape[0], self.tgt_vocab_size), np.float32))

    def _step_plan(self, R, B):
        """The decode step for R rows over B sources, planned: (the decoder layers' plans,
        the generator's product)."""
        return self.transformer.decoder._step_plan(R, B), self.generator._step_fn(R)

    def _prepare_decode(self):
        self.generator._decode_weight("weight")

    def generate(self, src_ids, *, max_new_tokens, start_id, end_id=None, pad_id=0,
                 src_key_padding_mask=None, method="greedy", beam_size=4, length_penalty=1.0,
                 temperature=1.0, top_k=None, top_p=None, seed=None):
        """Generate target ids: greedy, beam or sample, one position per step through `step`.

        The arguments are `fastattn.generate.generate`'s, which has the exact rules.

        Args:
            src_ids: (B, S) integer source token ids.
            max_new_tokens: the most tokens to generate per row.
            start_id: the decoder's first token.
            end_id: the token that ends a row; None (the default) never stops early.
            pad_id: pads the output after a row's end (default 0).
            src_key_padding_mask: (B, S), True = padding; None (the default) from pad_id.
            method: "greedy" (the default), "beam" or "sample".
            beam_size: beams per source for "beam" (default 4).
            length_penalty: beam search's length exponent (default 1.0).
            temperature: the sampling temperature (default 1.0).
            top_k: sample from the k largest logits; None (the default) for all.
            top_p: nucleus sampling's mass; None (the default) for all.
            seed: the sampling seed; None (the default) for a fresh one.

        Returns:
            (B, T) int64 token ids, rows starting with start_id.
        """
        from ..generate import generate
        return generate(self, src_ids, max_new_tokens=max_new_tokens, start_id=start_id,
                        end_id=end_id, pad_id=pad_id,
                        src_key_padding_mask=src_key_padding_mask, method=method,
                        beam_size=beam_size, length_penalty=length_penalty,
                        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)

    def translate(self, texts, src_tokenizer, tgt_tokenizer, **generate_kwargs):
        """Text in, text out: encode, generate, decode (specials dropped).

        Args:
            texts: a list of strings.
            src_tokenizer: encodes the texts (with `<start>` / `<end>` when it has them).
            tgt_tokenizer: decodes the output.
            **generate_kwargs: passed to `generate`; start_id, end_id and pad_id default to
                tgt_tokenizer's specials.

        Returns:
            A list of strings.

        Raises:
            TypeError: `texts` is a single str.
            ValueError: a text has more ids than `max_len` (only its head is split to find
                out, so a huge text costs little).
        """
        if isinstance(texts, str):
            raise TypeError("translate: texts must be a list of strings, got a single str")
        texts = list(texts)
        if not texts:
            return []
        t = tgt_tokenizer
        kw = dict(start_id=t.start_id, end_id=t.end_id,
                  pad_id=t.pad_id if t.pad_id is not None else 0)
        kw.update(generate_kwargs)
        if kw["start_id"] is None:
            raise ValueError("translate: tgt_tokenizer has no <start> token; pass start_id")
        kw.setdefault("max_new_tokens", 64)
        s = src_tokenizer
        # only a text's head is split: one id past max_len shows a text too long for the model
        # without splitting the rest of it (a text of hundreds of megabytes costs its head)
        ids, kpm = s.encode_batch(
            texts, add_start_end=s.start_id is not None and s.end_id is not None,
            max_length=self.max_len + 1)
        if ids.shape[1] > self.max_len:
            longer = [i for i in range(len(texts)) if not kpm[i, self.max_len]][:5]
            raise ValueError(
                f"translate: texts {longer} have more than max_len={self.max_len} ids, the "
                f"positions the model embeds; cut them (fastattn complete and the corpus "
                f"runners cut long lines)")
        out = self.generate(ids, src_key_padding_mask=kpm, **kw)
        return [tgt_tokenizer.decode(row.tolist()) for row in out]
