"""The encoder and decoder layers, their stacks, and nn.Transformer.

Each layer's math is written once (``_block``): its forward and its decode step differ only in
the attention and FFN sublayers they plug in (over the whole sequence, or one new position
against a cache, planned once per cache: ``DecoderCache.plan``), so a change to a layer
changes both.
"""
import copy

import numpy as np

from ..ops import ACTIVATIONS
from . import activations
from .attention import MultiheadAttention
from .backends import Workspace
from .layers import LayerNorm, Linear
from .masks import decoder_masks, generate_square_subsequent_mask, key_bias, prepare_mask
from .module import (Layout, Module, check_activation, check_batch, check_batch_first,
                     check_dropout, check_positive, features, rng_from, xavier)
from .parameter import writes
from .saved import (FFNSaved, LayerSaved, PublicSaved, StackSaved, SublayerSaved,
                    TransformerSaved)


# ---- the residual stream -----------------------------------------------------------------------

def _stream(x, ws, module=None, key="x"):
    """The residual stream (N, C) of x (B, L, C): a workspace copy when fast (updated in
    place), x itself on the reference backend (never written). A training pass copies x into
    `module`'s buffer `key` (the backward reads it after the caller's array may have
    changed), or takes x itself when no module is given (a buffer the caller owns)."""
    B, L, C = x.shape
    if ws.training:
        if module is None:
            return x.reshape(B * L, C)
        s = module._bufs().get(key, (B * L, C))
        s[...] = x.reshape(B * L, C)
        return s
    s = ws.get("x", (B * L, C))
    if s is None:
        return x.reshape(B * L, C)
    s[...] = x.reshape(B * L, C)
    return s


def _inplace(x, ws):
    """Where a post-LN block writes its result: over the stream itself when fast."""
    return x if ws.fast else None


def _add_into(x, y, ws):
    if ws.fast:
        np.add(x, y, out=x)
        return x
    return x + y


# ---- decoding caches ---------------------------------------------------------------------------

class DecoderLayerCache:
    """One decoder layer's cache: ``self_attn`` (attention.SelfAttentionCache, this layer's
    keys and values of the positions decoded so far) and ``cross_attn``
    (attention.CrossAttentionCache, the memory's keys and values)."""

    __slots__ = ("self_attn", "cross_attn")

    def __init__(self, self_attn, cross_attn):
        self.self_attn, self.cross_attn = self_attn, cross_attn


class DecoderCache:
    """What decoding keeps between steps: one DecoderLayerCache per layer, the position ``t``
    the next step writes, ``beams`` rows per source (row r belongs to source r // beams), the
    buffers the steps reuse and the decode plan. Made by ``init_cache`` of a decoder layer, a
    decoder stack or a Seq2SeqTransformer; advanced by their ``step``.

    Args:
        layers: the layer caches, one per decoder layer.
        beams: rows per source.
        max_len: the most positions to decode.
        ops_: the backend's op table.
    """

    def __init__(self, layers, beams, max_len, ops_):
        self.layers, self.beams, self.max_len = layers, beams, max_len
        self.t = 0
        self.ws = Workspace(ops_)
        self._plan, self._plan_key = None, None

    def plan(self, make):
        """The owner's decode plan for the current rows, made by `make(R, B)` when needed.

        Made on the first step and again when the rows changed or anything was written to a
        parameter or a module setting since (parameter.writes(): weights edited, rebound,
        loaded or quantized, an optimiser step, to_backend, a changed activation), so a step
        always runs the model as it is now. Keys and values already in the cache stay as the
        earlier steps made them.

        Args:
            make: `make(R, B)` builds the plan for R rows over B sources.

        Returns:
            The plan.
        """
        key = (self.rows, writes())
        if self._plan_key != key:
            self._plan = make(self.rows, self.sources)
            self._plan_key = key
        return self._plan

    @property
    def rows(self):
        """Rows each step takes: live sources x beams."""
        return self.layers[0].self_attn.k.shape[0] if self.layers else 0

    @property
    def sources(self):
        """Live sources (rows // beams)."""
        return self.layers[0].cross_attn.k.shape[0] if self.layers else 0

    def reorder(self, rows, sources=None):
        """Continue with some of the rows, in a new order (beams moved, rows dropped).

        Args:
            rows: new row i is old row rows[i].
            sources: when whole sources were dropped, the kept ones (in order); len(rows) must
                then be len(sources) * beams. None (the default): the same sources.
        """
        rows = np.asarray(rows, dtype=np.int64)
        for lc in self.layers:
            lc.self_attn.reorder(rows, self.t)
            if sources is not None:
                lc.cross_attn.select(np.asarray(sources, dtype=np.int64))

    def _check_step(self, x, C):
        x = features("x", x, C, ndim=2)
        if x.shape[0] != self.rows:
            raise ValueError(f"step: x has {x.shape[0]} rows but the cache holds {self.rows} "
                             f"(sources x beams)")
        if self.t >= self.max_len:
            raise ValueError(f"step: the cache holds max_len={self.max_len} positions, all "
                             "written")
        return x.copy()                                    # the stream is updated in place


def _init_cache(module, layers, memory, memory_key_padding_mask, beams, max_len):
    """A DecoderCache for `layers` over memory (B, S, C)."""
    beams = check_positive("beams", beams)
    max_len = check_positive("max_len", max_len)
    layout = Layout(module.batch_first, memory)
    mem = features("memory", layout.features_in(memory, "memory"), module.d_model)
    B, S, _ = mem.shape
    kb = key_bias(layout.padding_in(memory_key_padding_mask), B, S, "memory_key_padding_mask")
    ws = Workspace(module._ops)
    caches = [DecoderLayerCache(layer.self_attn._init_self_cache(B * beams, max_len),
                                layer.multihead_attn._init_cross_cache(mem, kb, ws))
              for layer in layers]
    return DecoderCache(caches, beams, max_len, module._ops)


# ---- layers ------------------------------------------------------------------------------------

def _encoder_call(module, src, mask, key_padding_mask, is_causal, mask_name):
    """The public forward shared by an encoder layer and an encoder stack: (B, S, C) in/out
    (or the module's torch layout: see module.Layout)."""
    layout = Layout(module.batch_first, src)
    x = features("src", layout.features_in(src, "src"), module.d_model)
    key_padding_mask = layout.padding_in(key_padding_mask)
    B, S, C = x.shape
    if B == 0:
        return layout.features_out(np.zeros((B, S, C), np.float32))
    m = prepare_mask(mask_name, mask, key_padding_mask, B, module.nhead, S, S, is_causal,
                     "src_key_padding_mask")
    ws = module._workspace()
    out, saved = module._forward(_stream(x, ws, module), m, ws, B)
    if ws.training:
        module._saved = PublicSaved(saved, (x.shape,), layout)
    return layout.features_out(out.reshape(B, S, C).copy())


def _decoder_call(module, tgt, memory, tgt_mask=None, memory_mask=None,
                  tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
                  memory_is_causal=False):
    """The public forward shared by a decoder layer and a decoder stack: (B, T, C) out (or
    the module's torch layout: see module.Layout)."""
    layout = Layout(module.batch_first, tgt)
    x = features("tgt", layout.features_in(tgt, "tgt"), module.d_model)
    mem = features("memory", layout.features_in(memory, "memory"), module.d_model)
    tgt_key_padding_mask = layout.padding_in(tgt_key_padding_mask)
    memory_key_padding_mask = layout.padding_in(memory_key_padding_mask)
    B, T, C = x.shape
    check_batch("memory", mem, B)
    if B == 0:
        return layout.features_out(np.zeros((B, T, C), np.float32))
    tm, mm = decoder_masks(module.nhead, B, T, mem.shape[1], tgt_mask, memory_mask,
                           tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                           memory_is_causal)
    ws = module._workspace()
    if ws.training:
        mem = _stream(mem, ws, module, "memory").reshape(mem.shape)
    out, saved = module._forward(_stream(x, ws, module), mem, tm, mm, ws, B)
    if ws.training:
        module._saved = PublicSaved(saved, (x.shape, mem.shape), layout)
    return layout.features_out(out.reshape(B, T, C).copy())


def _public_backward(module, grad_output, decoder):
    """The public backward of a layer or stack: (B, L, C) in; d_src, or (d_tgt, d_memory)."""
    public = module._check_saved()
    shapes, layout = public.shapes, public.layout
    d = features("grad_output", layout.features_in(grad_output, "grad_output"), module.d_model)
    if d.shape != shapes[0]:
        module._saved = public
        raise ValueError(f"{type(module).__name__}.backward: grad_output must be {shapes[0]} "
                         f"(batch-first), got {d.shape}")
    d2 = d.reshape(-1, module.d_model)
    bufs = module._bufs()
    if not decoder:
        return layout.features_out(module._backward(d2, public.record, bufs).reshape(
            shapes[0]).copy())
    dmem = _zeros(bufs, "grad.memory", (shapes[1][0] * shapes[1][1], module.d_model))
    d_tgt = module._backward(d2, public.record, dmem, bufs).reshape(shapes[0]).copy()
    return layout.features_out(d_tgt), layout.features_out(dmem.reshape(shapes[1]).copy())


def _zeros(bufs, key, shape):
    """Buffer `key` of `shape`, zeroed (where a backward accumulates the memory's gradient)."""
    z = bufs.get(key, shape)
    z.fill(0.0)
    return z


# ---- attention weights on request --------------------------------------------------------------
#
# ``attention_weights`` (Transformer, Seq2SeqTransformer) runs the inference forward through the
# layers' one code path with a recording workspace (Workspace.weights a dict): each
# MultiheadAttention then calls the ops' weight-returning attention (ops.attention(...,
# return_weights=True), or its reference twin) instead of the fused kernel, and stores the
# weights under itself. Every other pass has weights=None: one attribute test per attention call.

def recording_workspace(module, where):
    """An inference Workspace that records attention weights. Train mode is refused: its
    dropout would change the weights (and a pending backward's records would be disturbed)."""
    if module.training:
        raise RuntimeError(f"{type(module).__name__}.{where} is an inference pass: call "
                           "model.eval() first (train mode applies dropout to the weights)")
    return Workspace(module._ops, weights={})


def collect_weights(transformer, weights, B, S, T):
    """What a recording pass stored, per kind and layer: {"encoder": [(B, H, S, S)],
    "decoder": [(B, H, T, T)], "cross": [(B, H, T, S)]} float32 (zeros when B == 0)."""
    def get(mha, Lq, Lk):
        w = weights.get(mha)
        return np.zeros((B, mha.num_heads, Lq, Lk), np.float32) if w is None else w

    enc, dec = transformer.encoder.layers, transformer.decoder.layers
    return {"encoder": [get(layer.self_attn, S, S) for layer in enc],
            "decoder": [get(layer.self_attn, T, T) for layer in dec],
            "cross": [get(layer.multihead_attn, T, S) for layer in dec]}


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention and FFN, each with add & norm
    (post-LN: x = norm(x + f(x)); norm_first: x = x + f(norm(x))).

    Args:
        d_model: the model width C.
        nhead: attention heads (d_model must be a multiple).
        dim_feedforward: the feed-forward hidden width (default 2048).
        dropout: the dropout probability in training (default 0.1).
        activation: the feed-forward's activation (default "relu"), as above.
        layer_norm_eps: the layer norms' eps (default 1e-5).
        batch_first: True (the default here; torch's is False) for (B, L, C) inputs, False
            for (L, B, C).
        norm_first: pre-norm layers (default False: post-norm, as torch).
        bias: whether the linear layers and layer norms have biases (default True).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
        seed: the initialisation's seed, or a numpy Generator; None (the default) draws a
            fresh one.

    ``activation``: "relu" / "gelu" / "gelu_tanh" / "silu" (fused into the FFN kernel), torch's
    relu / gelu / silu callables and GELU(approximate="tanh") (the same, by name), or any other
    callable, run as a plain Python function over linear1's (N, dim_feedforward) float32 NumPy
    output (unfused; inference only: train() raises). ``self.activation`` holds the name, or that
    callable."""

    _children = ("self_attn", "linear1", "linear2", "norm1", "norm2")

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True, *,
                 backend="fast", seed=None):
        super().__init__(backend)
        self.batch_first = check_batch_first(batch_first)
        rng = rng_from(seed)
        self.d_model, self.nhead = d_model, nhead
        self.activation = check_activation(activation)
        self.norm_first = bool(norm_first)
        self.dropout = check_dropout(dropout)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, backend=backend, seed=rng)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, backend=backend, seed=rng)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, backend=backend, seed=rng)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)

    def _check_trainable(self):
        if not activations.trainable(self.activation):
            raise RuntimeError(
                f"{type(self).__name__} cannot train with activation="
                f"{activations.describe(self.activation)}: a plain Python function has no "
                "derivative in fastattn (it runs in inference only, unfused). Train with "
                "'relu', 'gelu', torch.nn.functional.relu / gelu or torch.nn.ReLU() / "
                "GELU(approximate='none' | 'tanh')")

    def _ffn(self, h, ws):
        """linear2(dropout(act(linear1(h)))) of the (N, C) rows h -> (y, FFNSaved in a training
        pass, else None)."""
        l1, l2 = self.linear1, self.linear2
        if not activations.fused(self.activation):
            return self._ffn_unfused(h, ws), None
        if ws.training:
            seed = ws.seed() if self.dropout > 0 else None
            bufs = self._bufs()
            pre = bufs.get("ffn.pre", (h.shape[0], l1.out_features))
            y = l1._kind("weight").ffn_train(h, l1.bias, l2._kind("weight"), l2.bias,
                                             ACTIVATIONS[self.activation], self.dropout, seed,
                                             bufs.get("ffn.y", h.shape), pre)
            return y, FFNSaved(h, pre, seed)
        out = ws.get("ff", h.shape)
        if out is None:
            out = np.empty(h.shape, np.float32)
        return l1._kind("weight").ffn_product(l1.bias, l2._kind("weight"), l2.bias,
                                              ACTIVATIONS[self.activation])(h, out), None

    def _ffn_step(self, R):
        """The FFN of a decode step of R rows, planned: f(h (R, C)) -> (R, C), the weights in
        their decode kind (its ffn_product for R rows; an unfused activation: two planned
        products around it), into a buffer of the plan's."""
        l1, l2 = self.linear1, self.linear2
        out = np.empty((R, self.d_model), np.float32)
        if not activations.fused(self.activation):
            first, second = l1._step_fn(R), l2._step_fn(R)
            pre = np.empty((R, l1.out_features), np.float32)
            act = self.activation
            return lambda h: second(activations.apply(act, first(h, pre)), out)
        ffn = l1._decode_weight("weight").ffn_product(l1.bias, l2._decode_weight("weight"),
                                                      l2.bias, ACTIVATIONS[self.activation], R)
        return lambda h: ffn(h, out)

    def _ffn_unfused(self, h, ws):
        """The FFN of a plain callable activation (activations.py; inference only): linear1,
        the activation over its (N, F) output as a NumPy array, linear2."""
        l1, l2 = self.linear1, self.linear2
        pre = l1._apply(h, ws, "ffn.pre")                                  # (N, F)
        return l2._apply(activations.apply(self.activation, pre), ws, "ff")

    def _ffn_backward(self, dy, saved, bufs):
        """dy (N, C) and the forward's FFNSaved -> the FFN input's gradient, in the backward's
        "fdx" buffer (every trainable activation is fused)."""
        h, pre, seed = saved.h, saved.pre, saved.seed
        l1, l2 = self.linear1, self.linear2
        grads = tuple(None if getattr(lin, name) is None else lin._grad(name)
                      for lin in (l1, l2) for name in ("weight", "bias"))
        return l1._kind("weight").ffn_backward(
            dy, h, l1.bias, l2._kind("weight"), l2.bias, pre, ACTIVATIONS[self.activation],
            self.dropout, seed, grads, bufs.get("fdx", h.shape), bufs.get("ffn.h", pre.shape))

    def _block(self, x, sublayers, ws):
        """The layer on the (N, C) stream x (owned by the caller; overwritten when fast): its
        residual blocks [(norm, f)] in order, f(h) -> (y, f's record or None) -> (x,
        LayerSaved in a training pass, else None)."""
        blocks = []
        for i, (norm, f) in enumerate(sublayers):
            x, saved = self._sublayer(x, norm, f, ws, i)
            blocks.append(saved)
        return x, (LayerSaved(blocks) if ws.training else None)

    def _sublayer(self, x, norm, f, ws, i):
        """Residual block i on the (N, C) stream x, in place when fast: x <- block(x) -> (x,
        SublayerSaved or None). Training adds dropout on the sublayer's output (before the
        residual add) and writes into this layer's buffers (x is left as it is: the backward
        reads it)."""
        if ws.training:
            if self.norm_first:                           # x + drop(f(norm(x)))
                h, norm_saved = norm._forward_train(x)
                y, f_saved = f(h)
                y, seed = self._dropout(y, self.dropout, ws)
                out = np.add(x, y, out=self._bufs().get(f"res{i}", x.shape))
            else:                                         # norm(x + drop(f(x)))
                y, f_saved = f(x)
                y, seed = self._dropout(y, self.dropout, ws)
                out, norm_saved = norm._forward_train(y, x, s=y)   # the sum kept over f's y
            return out, SublayerSaved(seed, norm_saved, f_saved)
        if self.norm_first:
            return _add_into(x, f(norm._apply(x, out=ws.get("h", x.shape)))[0], ws), None
        return norm._apply(f(x)[0], x, out=_inplace(x, ws)), None

    def _sublayer_backward(self, dout, norm, f_backward, saved, bufs):
        """The gradient of a residual block's input from its output's, through f_backward
        (the sublayer's backward: (its output's gradient, its record, bufs) -> its input's,
        in bufs' "fdx"); saved: the block's SublayerSaved. The result is in one of bufs' two
        alternating gradient buffers, never dout's."""
        drop = bufs.get("drop", dout.shape)
        if self.norm_first:
            dh = f_backward(self._dropout_backward(dout, self.dropout, saved.seed, drop),
                            saved.f, bufs)
            dx = norm._backward(dh, saved.norm, bufs.other(dout, dout.shape))
            return np.add(dx, dout, out=dx)
        ds = norm._backward(dout, saved.norm, bufs.other(dout, dout.shape))  # of x + y: both
        df = f_backward(self._dropout_backward(ds, self.dropout, saved.seed, drop), saved.f,
                        bufs)
        return np.add(ds, df, out=ds)

    def _self_attention_backward(self, dy, saved, bufs):
        """dy (N, C) -> the gradient of the self-attention's input (q, k and v at once)."""
        return self.self_attn._backward(dy, saved, bufs, (bufs.get("fdx", dy.shape),))[0]

    def _backward(self, dout, saved, bufs):
        """dout (N, C) and the forward's LayerSaved -> the gradient of the layer's input
        (N, C), in one of bufs' two alternating gradient buffers (bufs: the backward's shared
        scratch)."""
        attn, ffn = saved.blocks
        d = self._sublayer_backward(dout, self.norm2, self._ffn_backward, ffn, bufs)
        return self._sublayer_backward(d, self.norm1, self._self_attention_backward, attn, bufs)

    def backward(self, grad_output):
        """Backward after a training-mode forward: accumulates every parameter's gradient.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            The gradient of src.
        """
        return _public_backward(self, grad_output, decoder=False)

    def _forward(self, x, mask, ws, B):
        """x (N, C) stream owned by the caller (overwritten when fast) -> ((N, C), LayerSaved
        in a training pass, else None)."""
        C = self.d_model
        L = x.shape[0] // B
        sa = lambda h: self.self_attn._self_attention(h.reshape(B, L, C), mask, ws)  # noqa
        return self._block(x, [(self.norm1, sa), (self.norm2, lambda h: self._ffn(h, ws))], ws)

    def __call__(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        return _encoder_call(self, src, src_mask, src_key_padding_mask, is_causal, "src_mask")


class TransformerDecoderLayer(TransformerEncoderLayer):
    """torch.nn.TransformerDecoderLayer: masked self-attention, cross-attention, FFN.

    Each sublayer with add & norm; the cross-attention reads the encoder's memory.
    `init_cache` / `step` decode one position at a time through the same block. The activation
    is as `TransformerEncoderLayer`'s.

    Args:
        d_model: the model width C.
        nhead: attention heads (d_model must be a multiple).
        dim_feedforward: the feed-forward hidden width (default 2048).
        dropout: the dropout probability in training (default 0.1).
        activation: the feed-forward's activation (default "relu"), as above.
        layer_norm_eps: the layer norms' eps (default 1e-5).
        batch_first: True (the default here; torch's is False) for (B, L, C) inputs, False
            for (L, B, C).
        norm_first: pre-norm layers (default False: post-norm, as torch).
        bias: whether the linear layers and layer norms have biases (default True).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
        seed: the initialisation's seed, or a numpy Generator; None (the default) draws a
            fresh one.
    """

    _children = ("self_attn", "multihead_attn", "linear1", "linear2", "norm1", "norm2",
                 "norm3")

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True, *,
                 backend="fast", seed=None):
        rng = rng_from(seed)
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                         batch_first, norm_first, bias, backend=backend, seed=rng)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, backend=backend,
                                                 seed=rng)
        self.norm3 = LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)

    def _forward(self, x, memory, tgt_mask, memory_mask, ws, B):
        """x (N, C) stream (see the encoder layer's), memory (B, S, C) -> ((N, C),
        LayerSaved or None)."""
        C = self.d_model
        T = x.shape[0] // B
        return self._block(x, [
            (self.norm1, lambda h: self.self_attn._self_attention(h.reshape(B, T, C), tgt_mask,
                                                                  ws)),
            (self.norm2, lambda h: self.multihead_attn._cross_attention(
                h.reshape(B, T, C), memory, memory_mask, ws)),
            (self.norm3, lambda h: self._ffn(h, ws))], ws)

    def _prepare_decode(self):
        """The decode kinds of the weights the steps stream (Module.eval)."""
        C = self.d_model
        self.self_attn._decode_weight("in_proj_weight", 3 * C)
        self.multihead_attn._decode_weight("in_proj_weight", C)
        for lin in (self.self_attn.out_proj, self.multihead_attn.out_proj, self.linear1,
                    self.linear2):
            lin._decode_weight("weight")

    def _step_plan(self, R, B):
        """This layer's decode step for R rows over B sources, planned (DecoderCache.plan):
        (self-attention, cross-attention, FFN)."""
        return (self.self_attn._step(R, R, "qkv"), self.multihead_attn._step(R, B, "q"),
                self._ffn_step(R))

    def _step(self, x, cache, t, ws, plan):
        """x (R, C) at position t, cache a DecoderLayerCache, plan this layer's _step_plan ->
        (R, C)."""
        sa, ca, ffn = plan
        return self._block(x, [
            (self.norm1, lambda h: (sa.self_attention(h, cache.self_attn, t), None)),
            (self.norm2, lambda h: (ca.cross_attention(h, cache.cross_attn), None)),
            (self.norm3, lambda h: (ffn(h), None))], ws)[0]

    def _backward(self, dout, saved, dmem, bufs):
        """dout (N, C) and the forward's LayerSaved -> the gradient of the layer's target
        input (N, C); the memory's gradient is added to dmem (B*S, C)."""
        attn, cross, ffn = saved.blocks

        def cross_backward(dy, saved, bufs):
            dx = bufs.get("fdx", dy.shape)
            dm = bufs.get("attn.dmemory", dmem.shape)
            self.multihead_attn._backward(dy, saved, bufs, (dx, dm))
            np.add(dmem, dm, out=dmem)
            return dx

        d = self._sublayer_backward(dout, self.norm3, self._ffn_backward, ffn, bufs)
        d = self._sublayer_backward(d, self.norm2, cross_backward, cross, bufs)
        return self._sublayer_backward(d, self.norm1, self._self_attention_backward, attn, bufs)

    def backward(self, grad_output):
        """Backward after a training-mode forward: accumulates every parameter's gradient.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            `(d_tgt, d_memory)`.
        """
        return _public_backward(self, grad_output, decoder=True)

    __call__ = _decoder_call

    def init_cache(self, memory, memory_key_padding_mask=None, *, beams=1, max_len):
        """A DecoderCache for decoding up to max_len positions of `beams` rows per source.

        The memory's keys and values are projected here, once.

        Args:
            memory: (B, S, C) the encoder's output.
            memory_key_padding_mask: (B, S) as in the forward; None (the default) for none.
            beams: rows per source (default 1).
            max_len: the most positions to decode.

        Returns:
            The `DecoderCache`.
        """
        return _init_cache(self, [self], memory, memory_key_padding_mask, beams, max_len)

    def step(self, x, cache):
        """One decode step: what the forward gives at position cache.t under a causal mask.

        Args:
            x: (R, C) the layer input at position cache.t of each row (R = sources x beams).
            cache: the `DecoderCache` from `init_cache`.

        Returns:
            (R, C) float32.
        """
        x = cache._check_step(x, self.d_model)
        plan = cache.plan(self._step_plan)
        out = self._step(x, cache.layers[0], cache.t, cache.ws, plan)
        cache.t += 1
        return out.copy()


# ---- stacks ------------------------------------------------------------------------------------

class _Stack(Module):
    """num_layers copies of a layer (torch deep-copies it too), then an optional final
    LayerNorm (``norm``). The layer and the norm are fastattn modules (torch's are refused,
    naming the argument: load torch's weights with load_state_dict instead)."""

    _children = ("layers", "norm")
    _layer_class = None                      # the class of layer a stack of this kind takes

    def __init__(self, layer, num_layers, norm=None, *, backend=None):
        name = "encoder_layer" if self._layer_class is TransformerEncoderLayer else \
            "decoder_layer"
        if not isinstance(layer, self._layer_class) or (
                self._layer_class is TransformerEncoderLayer
                and isinstance(layer, TransformerDecoderLayer)):
            raise TypeError(f"{type(self).__name__}: {name} must be a fastattn.nn."
                            f"{self._layer_class.__name__}, got {_describe_type(layer)}")
        if norm is not None and not isinstance(norm, LayerNorm):
            raise TypeError(f"{type(self).__name__}: norm must be a fastattn.nn.LayerNorm or "
                            f"None, got {_describe_type(norm)}")
        super().__init__(backend or layer.backend)
        self.num_layers = check_positive("num_layers", num_layers)
        self.layers = [copy.deepcopy(layer) for _ in range(num_layers)]
        self.norm = norm
        self.d_model, self.nhead = layer.d_model, layer.nhead
        self.batch_first = layer.batch_first        # torch reads it from the layer too
        self.to_backend(self.backend)

    def _final_norm(self, x, ws):
        """The optional LayerNorm closing the stack, over the stream x (N, C) -> (x, its
        NormSaved in a training pass, else None)."""
        if self.norm is None:
            return x, None
        if ws.training:
            return self.norm._forward_train(x)
        return self.norm._apply(x, out=_inplace(x, ws)), None

    def _final_norm_backward(self, d, saved, bufs):
        return d if self.norm is None else self.norm._backward(d, saved,
                                                               bufs.other(d, d.shape))

    def _stack(self, x, layer_forward, ws):
        """The layers in order, then the final norm: layer_forward(layer, x) -> (x, record)
        -> (x, StackSaved in a training pass, else None)."""
        layers = []
        for layer in self.layers:
            x, saved = layer_forward(layer, x)
            layers.append(saved)
        x, norm = self._final_norm(x, ws)
        return x, (StackSaved(layers, norm) if ws.training else None)


def _describe_type(obj):
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class TransformerEncoder(_Stack):
    """torch.nn.TransformerEncoder: a stack of encoder layers and an optional final norm.

    enable_nested_tensor and mask_check are accepted and kept, and change nothing: fastattn
    never builds nested tensors, so the output at padded source positions is computed like any
    other (torch's nested-tensor path returns zeros there).

    Args:
        encoder_layer: the `TransformerEncoderLayer` to copy num_layers times.
        num_layers: the number of layers.
        norm: a `LayerNorm` after the last layer, or None (the default).
        enable_nested_tensor: accepted, no effect (default True).
        mask_check: accepted, no effect (default True).
        backend: "fast" or "reference"; None (the default) takes the layer's.
    """

    _layer_class = TransformerEncoderLayer

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True, *, backend=None):
        super().__init__(encoder_layer, num_layers, norm, backend=backend)
        self.enable_nested_tensor = bool(enable_nested_tensor)
        self.mask_check = bool(mask_check)

    def _forward(self, x, mask, ws, B):
        """x (N, C) stream -> ((N, C), StackSaved or None)."""
        return self._stack(x, lambda layer, x: layer._forward(x, mask, ws, B), ws)

    def _backward(self, d, saved, bufs):
        d = self._final_norm_backward(d, saved.norm, bufs)
        for layer, layer_saved in zip(reversed(self.layers), reversed(saved.layers)):
            d = layer._backward(d, layer_saved, bufs)
        return d

    def backward(self, grad_output):
        """Backward after a training-mode forward; parameter gradients accumulate.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            The gradient of src.
        """
        return _public_backward(self, grad_output, decoder=False)

    def __call__(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        return _encoder_call(self, src, mask, src_key_padding_mask, is_causal, "mask")


class TransformerDecoder(_Stack):
    """torch.nn.TransformerDecoder(decoder_layer, num_layers, norm=None).

    `init_cache` / `step` decode one position at a time through the layers' own steps.

    Args:
        decoder_layer: the `TransformerDecoderLayer` to copy num_layers times.
        num_layers: the number of layers.
        norm: a `LayerNorm` after the last layer, or None (the default).
        backend: "fast" or "reference"; None (the default) takes the layer's.
    """

    _layer_class = TransformerDecoderLayer

    def __init__(self, decoder_layer, num_layers, norm=None, *, backend=None):
        super().__init__(decoder_layer, num_layers, norm, backend=backend)

    def _forward(self, x, memory, tgt_mask, memory_mask, ws, B):
        """x (N, C) stream, memory (B, S, C) -> ((N, C), StackSaved or None)."""
        return self._stack(
            x, lambda layer, x: layer._forward(x, memory, tgt_mask, memory_mask, ws, B), ws)

    def _step_plan(self, R, B):
        """The layers' decode steps for R rows over B sources, planned."""
        return [layer._step_plan(R, B) for layer in self.layers]

    def _step(self, x, cache, ws, plans):
        for layer, lc, plan in zip(self.layers, cache.layers, plans):
            x = layer._step(x, lc, cache.t, ws, plan)
        return self._final_norm(x, ws)[0]

    def _backward(self, d, saved, dmem, bufs):
        d = self._final_norm_backward(d, saved.norm, bufs)
        for layer, layer_saved in zip(reversed(self.layers), reversed(saved.layers)):
            d = layer._backward(d, layer_saved, dmem, bufs)
        return d

    def backward(self, grad_output):
        """Backward after a training-mode forward; parameter gradients accumulate.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            `(d_tgt, d_memory)`.
        """
        return _public_backward(self, grad_output, decoder=True)

    __call__ = _decoder_call

    def init_cache(self, memory, memory_key_padding_mask=None, *, beams=1, max_len):
        """A DecoderCache for the stack (one layer cache per layer); see the layer's.

        Args:
            memory: (B, S, C) the encoder's output.
            memory_key_padding_mask: (B, S) as in the forward; None (the default) for none.
            beams: rows per source (default 1).
            max_len: the most positions to decode.

        Returns:
            The `DecoderCache`.
        """
        return _init_cache(self, self.layers, memory, memory_key_padding_mask, beams, max_len)

    def step(self, x, cache):
        """One decode step through every layer: the stack's output at position cache.t.

        Args:
            x: (R, C) the stack's input at position cache.t of each row.
            cache: the `DecoderCache` from `init_cache`.

        Returns:
            (R, C) float32.
        """
        x = cache._check_step(x, self.d_model)
        out = self._step(x, cache, cache.ws, cache.plan(self._step_plan))
        cache.t += 1
        return out.copy()


class Transformer(Module):
    """torch.nn.Transformer: encoder and decoder stacks, each ending in a
    LayerNorm as torch builds them (so a post-LN model has two norms in a row at the end).

    ``custom_encoder`` / ``custom_decoder`` replace a stack, as in torch (and are re-initialised
    with the rest, as torch does). A fastattn TransformerEncoder / TransformerDecoder runs as
    the built one does. Anything else is called as torch calls it, with NumPy float32 arrays
    (B, L, C): ``custom_encoder(src, mask=..., src_key_padding_mask=..., is_causal=...)`` ->
    memory (B, S', C); ``custom_decoder(tgt, memory, tgt_mask=..., memory_mask=...,
    tgt_key_padding_mask=..., memory_key_padding_mask=..., tgt_is_causal=...,
    memory_is_causal=...)`` -> (B, T, C). Only a fastattn module (one with backward) trains;
    ``attention_weights`` needs fastattn's own stacks; ``io.save`` refuses custom parts (its
    config cannot rebuild them). torch modules are refused: fastattn runs NumPy arrays.

    Args:
        d_model: the model width C (default 512).
        nhead: attention heads (default 8; d_model must be a multiple).
        num_encoder_layers: encoder layers (default 6).
        num_decoder_layers: decoder layers (default 6).
        dim_feedforward: the feed-forward hidden width (default 2048).
        dropout: the dropout probability in training (default 0.1).
        activation: the feed-forward's activation (default "relu"), as
            `TransformerEncoderLayer`'s.
        custom_encoder: a module replacing the encoder stack, or None (the default).
        custom_decoder: a module replacing the decoder stack, or None (the default).
        layer_norm_eps: the layer norms' eps (default 1e-5).
        batch_first: True (the default here; torch's is False) for (B, L, C) inputs, False
            for (L, B, C).
        norm_first: pre-norm layers (default False: post-norm, as torch).
        bias: whether the linear layers and layer norms have biases (default True).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
        seed: the initialisation's seed, or a numpy Generator; None (the default) draws a
            fresh one.
    """

    _children = ("encoder", "decoder")

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=True, norm_first=False,
                 bias=True, *, backend="fast", seed=None):
        super().__init__(backend)
        self.batch_first = check_batch_first(batch_first)
        self.d_model = check_positive("d_model", d_model)
        self.nhead = check_positive("nhead", nhead)
        if d_model % nhead:
            raise ValueError(f"d_model {d_model} must be divisible by nhead {nhead}")
        activation = check_activation(activation)      # torch's callables -> their names
        self.config = dict(d_model=d_model, nhead=nhead, num_encoder_layers=num_encoder_layers,
                           num_decoder_layers=num_decoder_layers,
                           dim_feedforward=dim_feedforward, activation=activation,
                           layer_norm_eps=layer_norm_eps, norm_first=bool(norm_first),
                           bias=bool(bias), dropout=check_dropout(dropout))
        custom = {"custom_encoder": custom_encoder, "custom_decoder": custom_decoder}
        self.custom_parts = tuple(k for k, v in custom.items() if v is not None)
        for name in self.custom_parts:
            _check_custom(name, custom[name], d_model)
        rng = rng_from(seed)
        kw = dict(dim_feedforward=dim_feedforward, activation=activation,
                  layer_norm_eps=layer_norm_eps, norm_first=norm_first, bias=bias,
                  batch_first=self.batch_first, backend=backend)
        kw["dropout"] = dropout
        enc = TransformerEncoderLayer(d_model, nhead, seed=rng, **kw) \
            if custom_encoder is None else None
        dec = TransformerDecoderLayer(d_model, nhead, seed=rng, **kw) \
            if custom_decoder is None else None
        norm = lambda: LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)  # noqa
        self.encoder = custom_encoder if enc is None else \
            TransformerEncoder(enc, num_encoder_layers, norm())
        self.decoder = custom_decoder if dec is None else \
            TransformerDecoder(dec, num_decoder_layers, norm())
        self.to_backend(backend)                          # custom fastattn parts follow
        for name, p in self.named_parameters():        # torch's _reset_parameters: xavier
            if p.ndim > 1:
                p[...] = xavier(rng, p.shape)
        self.invalidate_caches()

    def _check_trainable(self):
        for name in self.custom_parts:
            part = getattr(self, name[len("custom_"):])
            if not (isinstance(part, Module) and callable(getattr(part, "backward", None))):
                raise RuntimeError(
                    f"Transformer cannot train: {name} is {_describe_type(part)}, not a "
                    "fastattn module with a backward (fastattn has no autograd: a part trains "
                    "only through its own backward)")

    def _own(self, stack):
        """True when `stack` ("encoder" or "decoder") is fastattn's own stack class, which
        runs inside the model's pass (shared workspace, masks prepared once)."""
        cls = TransformerEncoder if stack == "encoder" else TransformerDecoder
        return isinstance(getattr(self, stack), cls)

    def __call__(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                 src_key_padding_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                 memory_is_causal=False):
        """src (B, S, C), tgt (B, T, C) -> (B, T, C) (batch_first=False: (S, B, C), (T, B, C)
        -> (T, B, C); unbatched: (S, C), (T, C) -> (T, C))."""
        layout = Layout(self.batch_first, src)
        out = self._forward(None, layout, src, tgt, src_mask, tgt_mask, memory_mask,
                            src_key_padding_mask, tgt_key_padding_mask,
                            memory_key_padding_mask, src_is_causal, tgt_is_causal,
                            memory_is_causal)
        return layout.features_out(out)

    def attention_weights(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                          src_key_padding_mask=None, tgt_key_padding_mask=None,
                          memory_key_padding_mask=None, src_is_causal=None,
                          tgt_is_causal=None, memory_is_causal=False):
        """The attention weights of every layer, from an inference pass with the forward's math.

        Eval mode only. The arguments are the forward's. A row sums to 1, or is zeros where the
        masks leave its query no key.

        Args:
            src: (B, S, C) the source (as batch_first says; unbatched (S, C) too).
            tgt: (B, T, C) the target.
            src_mask: as in the forward (default None).
            tgt_mask: as in the forward (default None).
            memory_mask: as in the forward (default None).
            src_key_padding_mask: as in the forward (default None).
            tgt_key_padding_mask: as in the forward (default None).
            memory_key_padding_mask: as in the forward (default None).
            src_is_causal: as in the forward (default None).
            tgt_is_causal: as in the forward (default None).
            memory_is_causal: as in the forward (default False).

        Returns:
            {"encoder": [(B, H, S, S) per layer], "decoder": [(B, H, T, T) per layer],
                "cross": [(B, H, T, S) per layer]}, float32 (batch-major whatever batch_first
                says; no batch axis for unbatched inputs).

        Raises:
            RuntimeError: in train mode.
            TypeError: a custom stack (not fastattn's own).
        """
        for name in self.custom_parts:
            stack = name[len("custom_"):]
            if not self._own(stack):
                raise TypeError(f"Transformer.attention_weights records the layers of "
                                f"fastattn's own Transformer{stack.capitalize()}; the {stack} "
                                f"({name}) is {_describe_type(getattr(self, stack))}")
        rec = recording_workspace(self, "attention_weights")
        layout = Layout(self.batch_first, src)
        out = self._forward(rec, layout, src, tgt, src_mask, tgt_mask, memory_mask,
                            src_key_padding_mask, tgt_key_padding_mask,
                            memory_key_padding_mask, src_is_causal, tgt_is_causal,
                            memory_is_causal)
        S = np.shape(layout.features_in(src, "src"))[1]
        weights = collect_weights(self, rec.weights, out.shape[0], S, out.shape[1])
        return {kind: [layout.weights_out(w) for w in ws] for kind, ws in weights.items()}

    def _forward(self, ws, layout, src, tgt, src_mask, tgt_mask, memory_mask,
                 src_key_padding_mask, tgt_key_padding_mask, memory_key_padding_mask,
                 src_is_causal, tgt_is_causal, memory_is_causal):
        """The forward in workspace ws (a recording one; None: this module's own, training
        or inference) of inputs in `layout` -> (B, T, C), batch-first. Custom parts are called
        in the caller's layout, as torch calls them."""
        x = features("src", layout.features_in(src, "src"), self.d_model)
        y = features("tgt", layout.features_in(tgt, "tgt"), self.d_model)
        src_key_padding_mask = layout.padding_in(src_key_padding_mask)
        tgt_key_padding_mask = layout.padding_in(tgt_key_padding_mask)
        memory_key_padding_mask = layout.padding_in(memory_key_padding_mask)
        B, S, C = x.shape
        check_batch("tgt", y, B)
        T = y.shape[1]
        if B == 0:
            return np.zeros((B, T, C), np.float32)
        if ws is None:
            ws = self._workspace()
        if self._own("encoder"):
            sm = prepare_mask("src_mask", src_mask, src_key_padding_mask, B, self.encoder.nhead,
                              S, S, bool(src_is_causal), "src_key_padding_mask")
            memory, enc_saved = self.encoder._forward(_stream(x, ws, self, "src"), sm, ws, B)
            memory = memory.reshape(B, S, C)
        else:
            enc_saved = None
            memory = self.encoder(layout.features_out(x), mask=src_mask,
                                  src_key_padding_mask=_unpad(layout, src_key_padding_mask),
                                  is_causal=src_is_causal)
            memory = _custom_output("custom_encoder", layout.features_in(
                memory, "the memory custom_encoder returned"), B, None, C)
            if ws.training:        # kept for the decoder's backward, whatever the part does
                memory = _stream(memory, ws, self, "memory").reshape(memory.shape)
        if self._own("decoder"):
            dec = self.decoder
            tm, mm = decoder_masks(dec.nhead, B, T, memory.shape[1], tgt_mask, memory_mask,
                                   tgt_key_padding_mask, memory_key_padding_mask,
                                   tgt_is_causal, memory_is_causal)
            # the memory lives on while the decoder runs: its own buffers (inference)
            mem_ws = ws if ws.training else Workspace(self._ops, weights=ws.weights)
            out, dec_saved = dec._forward(_stream(y, mem_ws, self, "tgt"), memory, tm, mm,
                                          mem_ws, B)
        else:
            dec_saved = None
            out = self.decoder(
                layout.features_out(y), layout.features_out(memory), tgt_mask=tgt_mask,
                memory_mask=memory_mask,
                tgt_key_padding_mask=_unpad(layout, tgt_key_padding_mask),
                memory_key_padding_mask=_unpad(layout, memory_key_padding_mask),
                tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
            out = _custom_output("custom_decoder", layout.features_in(
                out, "the output custom_decoder returned"), B, T, C)
        if ws.training:
            self._saved = PublicSaved(TransformerSaved(x.shape, y.shape, memory.shape,
                                                       enc_saved, dec_saved), None, layout)
        return out.reshape(B, T, C).copy()

    def backward(self, grad_output):
        """Backward after a training-mode forward: accumulates every parameter's gradient.

        Custom parts run their own backward: the decoder's returns (d_tgt, d_memory), the
        encoder's d_src.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            `(d_src, d_tgt)`, in the inputs' layout.
        """
        public = self._check_saved()
        saved, layout = public.record, public.layout
        d = features("grad_output", layout.features_in(grad_output, "grad_output"), self.d_model)
        if d.shape != saved.tgt_shape:
            self._saved = public
            raise ValueError(f"Transformer.backward: grad_output must be {saved.tgt_shape} "
                             f"(batch-first), got {d.shape}")
        src_shape, tgt_shape, mem_shape = saved.src_shape, saved.tgt_shape, saved.memory_shape
        C = self.d_model
        bufs = self._bufs()
        if self._own("decoder"):
            dmem = _zeros(bufs, "grad.memory", (mem_shape[0] * mem_shape[1], C))
            d_tgt = self.decoder._backward(d.reshape(-1, C), saved.decoder, dmem, bufs).reshape(
                tgt_shape).copy()
        else:
            d_tgt, dmem = self.decoder.backward(layout.features_out(d))
            d_tgt = _custom_output("custom_decoder.backward's d_tgt", layout.features_in(
                d_tgt, "custom_decoder.backward's d_tgt"), *tgt_shape)
            dmem = _custom_output("custom_decoder.backward's d_memory", layout.features_in(
                dmem, "custom_decoder.backward's d_memory"), *mem_shape).reshape(-1, C)
        if self._own("encoder"):
            d_src = self.encoder._backward(np.ascontiguousarray(dmem), saved.encoder,
                                           bufs).reshape(src_shape).copy()
        else:
            d_src = self.encoder.backward(layout.features_out(dmem.reshape(mem_shape)))
            d_src = _custom_output("custom_encoder.backward's d_src", layout.features_in(
                d_src, "custom_encoder.backward's d_src"), *src_shape)
        return layout.features_out(d_src), layout.features_out(d_tgt)

    @staticmethod
    def generate_square_subsequent_mask(sz):
        """torch's causal mask helper: (sz, sz) float32, 0 on and below the diagonal, -inf above.

        Args:
            sz: the mask's size.

        Returns:
            (sz, sz) float32.
        """
        return generate_square_subsequent_mask(sz)


def _check_custom(name, part, d_model):
    """A custom_encoder / custom_decoder fastattn can call: a fastattn module of d_model
    features, or any callable over NumPy arrays; torch modules are refused."""
    if isinstance(part, Module):
        C = getattr(part, "d_model", d_model)
        if C != d_model:
            raise ValueError(f"Transformer: {name} has d_model {C}, the model {d_model}")
        return
    if type(part).__module__.split(".")[0] == "torch":
        raise TypeError(f"Transformer: {name} is {_describe_type(part)}, a torch module; "
                        "fastattn calls its parts with NumPy arrays: give a fastattn.nn module "
                        "(e.g. fastattn.nn.TransformerEncoder, with torch's weights loaded by "
                        "load_state_dict) or a callable over NumPy arrays")
    if not callable(part):
        raise TypeError(f"Transformer: {name} must be callable, got {_describe_type(part)}")


def _unpad(layout, mask):
    """A key padding mask back in the caller's layout ((S,) when unbatched)."""
    return mask[0] if mask is not None and layout.unbatched else mask


def _custom_output(name, out, B, L, C):
    """What a custom part returned, as float32 (B, L, C) (L None: any length)."""
    try:
        a = features(f"the array {name} returned", out, C)
    except TypeError:
        raise TypeError(f"Transformer: {name} returned {type(out).__name__}, not an array "
                        "of numbers") from None
    if a.shape[0] != B or (L is not None and a.shape[1] != L):
        raise ValueError(f"Transformer: {name} returned shape {a.shape}, expected "
                         f"({B}, {'L' if L is None else L}, {C})")
    return a
