"""MultiheadAttention, and the key/value caches its decode steps read and write.

The forward projects its inputs (``_project``) and attends (``_attend``: the attention, then
out_proj). A decode step (``_AttentionStep``) makes the same products for one new position per
row, planned once per cache: the weights in the kind its few rows multiply by (packed panels
for float32 on the fast backend), the kernels chosen, the buffers and their views made; keys
and values come from a cache written in place.
"""
import math

import numpy as np

from .backends import _put
from .layers import Linear
from .masks import Mask, prepare_mask
from .saved import AttentionSaved, PublicSaved
from .module import (Layout, Module, check_batch_first, check_dropout, check_positive,
                     features, rng_from, xavier)


# in_proj rows of each projection, in units of embed_dim: q | k | v
_PARTS = {"qkv": (0, 3), "q": (0, 1), "kv": (1, 3), "k": (1, 2), "v": (2, 3)}


class SelfAttentionCache:
    """Keys and values of the positions decoded so far: k, v (R, H, T_max, D), one row per
    hypothesis; each (row, head) reads its keys from one contiguous block."""

    __slots__ = ("k", "v")

    def __init__(self, rows, heads, max_len, head_dim):
        shape = (rows, heads, max_len, head_dim)
        self.k = np.empty(shape, np.float32)
        self.v = np.empty(shape, np.float32)

    def reorder(self, rows, t):
        """Keep rows `rows` (new row i = old row rows[i]) for positions < t."""
        R = len(rows)
        if R != self.k.shape[0]:                             # rows dropped: a smaller cache
            for name in ("k", "v"):
                c = getattr(self, name)
                new = np.empty((R,) + c.shape[1:], np.float32)
                np.take(c[:, :, :t], rows, axis=0, out=new[:, :, :t])
                setattr(self, name, new)
            return
        moved = np.flatnonzero(rows != np.arange(R))         # beams reordered: gather only
        if moved.size:                                       # the rows that moved
            for c in (self.k, self.v):
                c[moved, :, :t] = c[rows[moved], :, :t]


class CrossAttentionCache:
    """The memory's keys and values, computed once per source: k, v (B, H, S, D) contiguous,
    and ``key_bias`` (B, S) float (-inf = padding) or None. Decoder row r belongs to source
    r // beams: the beams of a source are its queries."""

    __slots__ = ("k", "v", "key_bias", "mask")

    def __init__(self, k, v, key_bias):
        self.k, self.v, self.key_bias = k, v, key_bias
        self.mask = Mask(key_bias=None if key_bias is None else key_bias.reshape(-1))

    def select(self, sources):
        """Keep the sources `sources` (indices, in order)."""
        kb = None if self.key_bias is None else self.key_bias[sources]
        self.__init__(self.k[sources], self.v[sources], kb)


class _AttentionStep:
    """One MultiheadAttention's decode step for R rows over B sources, planned once per cache
    (and again when the rows or the model change; see transformer.DecoderCache.plan):
    `part` "qkv" is self-attention (q, k and v of the new position, k and v written into the
    cache), "q" queries against a memory (a source's beams are its queries). The products are
    the decode kinds' for R rows (``product(bias, act, R)``), the attention the ops table's
    ``attention_fn``; the buffers and the views of them the attention reads and writes are
    made here. One path for both backends (the reference's kinds and table compute new arrays
    and copy them into the buffers)."""

    __slots__ = ("y", "q", "k_new", "v_new", "ctx", "flat", "proj", "project", "out_proj",
                 "attend")

    def __init__(self, mha, R, B, part):
        C, H, D = mha.embed_dim, mha.num_heads, mha.head_dim
        if part == "qkv":                   # self-attention: q | k | v of the new position
            self.y = np.empty((R, 3 * C), np.float32)
            parts = self.y.reshape(R, 3, H, D)
            self.q = parts[:, 0][:, :, None, :]                          # (R, H, 1, D)
            self.k_new, self.v_new = parts[:, 1], parts[:, 2]            # (R, H, D)
            ctx = np.empty((R, 1, H, D), np.float32)
        else:                               # queries against a memory: a source's beams
            self.y = np.empty((R, C), np.float32)
            self.q = self.y.reshape(B, R // B, H, D).transpose(0, 2, 1, 3)  # (B, H, R/B, D)
            self.k_new = self.v_new = None
            ctx = np.empty((B, R // B, H, D), np.float32)
        self.ctx, self.flat = ctx.transpose(0, 2, 1, 3), ctx.reshape(R, C)
        self.proj = np.empty((R, C), np.float32)
        ops_, o = mha._ops, mha.out_proj
        hi = _PARTS[part][1] * C            # the parts decoded start at row 0 of in_proj
        b = None if mha.in_proj_bias is None else mha.in_proj_bias[:hi]
        self.project = mha._decode_weight("in_proj_weight", hi).product(b, 0, R)
        self.out_proj = o._step_fn(R)
        self.attend = ops_.attention_fn(D, bf16=mha.attention_compute_type == "bfloat16")

    def self_attention(self, x, cache, t):
        """x (R, C) at position t: its key and value go into the cache, its query attends to
        positions 0..t (the causal rule of the forward, one row of it) -> (R, C)."""
        self.project(x, self.y)
        cache.k[:, :, t] = self.k_new                                       # written in place
        cache.v[:, :, t] = self.v_new
        self.attend(self.q, cache.k[:, :, :t + 1], cache.v[:, :, :t + 1], None, self.ctx)
        return self.out_proj(self.flat, self.proj)

    def cross_attention(self, x, cache):
        """x (R, C), R = sources x beams, against each source's memory -> (R, C)."""
        self.project(x, self.y)
        self.attend(self.q, cache.k, cache.v, cache.mask.key_bias, self.ctx)
        return self.out_proj(self.flat, self.proj)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention (batch_first=True): packed in_proj_weight (3C, C) rows q|k|v.

    Self-attention (query is key is value) runs one GEMM for q, k and v; cross-attention (key
    is value) one for q and one for k|v; heads are read in place through strides.

    torch's other options, with torch's keys: ``kdim`` / ``vdim`` other than embed_dim give
    separate q_proj_weight (C, C), k_proj_weight (C, kdim) and v_proj_weight (C, vdim) (no
    in_proj_weight; in_proj_bias stays packed); ``add_bias_kv`` appends the learned bias_k /
    bias_v (1, 1, C) as one more projected key and value, ``add_zero_attn`` a zero key and
    value after them; masks are padded for them as torch pads its masks (every query may see
    them). These run the general path (one GEMM per projection), and train.

    Args:
        embed_dim: the model width C.
        num_heads: attention heads (embed_dim must be a multiple).
        dropout: dropout on the attention weights in training (default 0).
        bias: whether the projections have biases (default True).
        add_bias_kv: append learned bias_k / bias_v as one more key and value (default False).
        add_zero_attn: append a zero key and value (default False).
        kdim: the keys' width; None (the default) is embed_dim.
        vdim: the values' width; None (the default) is embed_dim.
        batch_first: True (the default here; torch's is False) for (B, L, C) inputs, False
            for (L, B, C).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
        seed: the initialisation's seed, or a numpy Generator; None (the default) draws a
            fresh one.
    """

    _params = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
               "in_proj_bias", "bias_k", "bias_v")
    _quantizable = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")
    _children = ("out_proj",)

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=True, *,
                 backend="fast", seed=None):
        super().__init__(backend)
        self.batch_first = check_batch_first(batch_first)
        self.embed_dim = check_positive("embed_dim", embed_dim)
        self.num_heads = check_positive("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.kdim = embed_dim if kdim is None else check_positive("kdim", kdim)
        self.vdim = embed_dim if vdim is None else check_positive("vdim", vdim)
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.head_dim = embed_dim // num_heads
        self.dropout = check_dropout(dropout)
        self.add_zero_attn = bool(add_zero_attn)
        rng = rng_from(seed)
        self.in_proj_weight = self.q_proj_weight = self.k_proj_weight = None
        self.v_proj_weight = None
        if self._qkv_same_embed_dim:
            self.in_proj_weight = xavier(rng, (3 * embed_dim, embed_dim))
        else:
            self.q_proj_weight = xavier(rng, (embed_dim, embed_dim))
            self.k_proj_weight = xavier(rng, (embed_dim, self.kdim))
            self.v_proj_weight = xavier(rng, (embed_dim, self.vdim))
        self.in_proj_bias = np.zeros(3 * embed_dim, np.float32) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, backend=backend, seed=rng)
        if bias:
            self.out_proj.bias[...] = 0.0
        self.bias_k = self.bias_v = None
        if add_bias_kv:                        # torch: xavier_normal_ on (1, 1, C)
            std = math.sqrt(1.0 / embed_dim)
            self.bias_k, self.bias_v = (
                (rng.standard_normal((1, 1, embed_dim)) * std).astype(np.float32)
                for _ in range(2))

    @property
    def _extra_keys(self):
        """Keys appended after the given ones: bias_k (add_bias_kv), then a zero key."""
        return int(self.bias_k is not None) + int(self.add_zero_attn)

    # -- pieces shared by the forward and the decode step -------------------------------------
    def _project(self, x, part, ws, key):
        """x (N, K) @ in_proj_weight[rows].T + in_proj_bias[rows] -> (N, len(rows)); part is
        "qkv", "q", "kv", "k" or "v" (rows 0:3C, 0:C, C:3C, C:2C, 2C:3C). With separate
        projection weights (kdim / vdim), part is one letter and its own weight is used."""
        C = self.embed_dim
        lo, hi = (C * i for i in _PARTS[part])
        w, b = self._in_proj(part)
        return self._linear(w, x, b, out=ws.get(key, (x.shape[0], hi - lo)))

    def _with_extra_keys(self, y, part, out=None):
        """y (B, S, C), projected keys (part "k") or values ("v") -> (B, S + extra, C): the
        bias_k / bias_v row (add_bias_kv), then a zero row (add_zero_attn), after the S rows,
        as torch appends them; into `out` when given. Queries (and no extra key) pass as
        they are."""
        extra = self._extra_keys
        if not extra or part not in ("k", "v"):
            return y
        B, S, C = y.shape
        if out is None:
            out = np.empty((B, S + extra, C), np.float32)
        out[:, :S] = y
        if self.bias_k is not None:
            out[:, S] = (self.bias_k if part == "k" else self.bias_v).reshape(C)
        if self.add_zero_attn:
            out[:, S + extra - 1] = 0.0
        return out

    def _heads(self, x, part, parts):
        """(B, L, parts*C) -> the `part`-th (B, H, L, D) view, no copy."""
        B, L, _ = x.shape
        return x.reshape(B, L, parts, self.num_heads, self.head_dim)[:, :, part].transpose(
            0, 2, 1, 3)

    @property
    def attention_compute_type(self):
        """The compute type of the attention's own products (Q K^T, P V): "bfloat16" once
        the projections are (quantize("bfloat16")), else "float32". The forward (_attend,
        the weights' slow path) and the decode steps (attention_fn) follow it; this is the one
        place that decides it. Training never sees "bfloat16": a quantized model refuses
        train()."""
        return "bfloat16" if self.compute_type == "bfloat16" else "float32"

    def _bf16(self):
        return self.attention_compute_type == "bfloat16"

    def _attend(self, q, k, v, mask, ws):
        """(B, H, Lq, D) queries against (B, H, Lk, D) keys/values, then out_proj ->
        (B*Lq, C) rows ordered (batch, query). A recording pass (ws.weights a dict) also
        stores the attention weights (B, H, Lq, Lk) in ws.weights[self]."""
        B, H, Lq, D = q.shape
        ctx = ws.get("ctx", (B, Lq, H, D))
        ctx_v = None if ctx is None else ctx.transpose(0, 2, 1, 3)
        if ws.weights is None:
            ctx_v = self._ops.attention(q, k, v, mask, out=ctx_v, bf16=self._bf16())  # (B,H,Lq,D)
        else:                         # a recording pass: the slow path that keeps the weights
            y, ws.weights[self] = self._ops.attention_weights(q, k, v, mask, bf16=self._bf16())
            ctx_v = _put(ctx_v, y)
        ctx = ctx_v.transpose(0, 2, 1, 3).reshape(B * Lq, H * D)            # view when fast
        return self.out_proj._apply(ctx, ws, "proj")

    # -- the forward used by the layers -------------------------------------------------------
    def _self_attention(self, x, mask, ws):
        """x (B, L, C) -> ((B*L, C), AttentionSaved in a training pass, else None)."""
        if ws.training:
            return self._forward_train([(x, "qkv")], mask, ws)
        B, L, C = x.shape
        qkv = self._project(x.reshape(B * L, C), "qkv", ws, "qkv").reshape(B, L, 3 * C)
        return self._attend(*(self._heads(qkv, i, 3) for i in range(3)), mask, ws), None

    def _cross_attention(self, x, memory, mask, ws):
        """x (B, Lq, C) against memory (B, Lk, C) -> ((B*Lq, C), AttentionSaved or None)."""
        if ws.training:
            return self._forward_train([(x, "q"), (memory, "kv")], mask, ws)
        B, Lq, C = x.shape
        Lk = memory.shape[1]
        qp = self._project(x.reshape(B * Lq, C), "q", ws, "q").reshape(B, Lq, C)
        kv = self._project(memory.reshape(B * Lk, C), "kv", ws, "kv").reshape(B, Lk, 2 * C)
        return self._attend(self._heads(qp, 0, 1), self._heads(kv, 0, 2), self._heads(kv, 1, 2),
                            mask, ws), None

    # -- training: the forward that keeps what the backward needs, and the backward -----------
    def _in_proj(self, part):
        """(the weight kind of in_proj's rows, bias rows) for `part` ("qkv", "q", "kv", "k" or
        "v"); with separate projection weights (kdim / vdim) part is one letter, and its weight
        whole."""
        C = self.embed_dim
        lo, hi = _PARTS[part]
        b = self.in_proj_bias
        b = None if b is None else b[lo * C:hi * C]
        if self.in_proj_weight is None:
            return self._kind(part + "_proj_weight"), b
        return self._kind("in_proj_weight", lo * C, hi * C), b

    def _in_proj_grads(self, part):
        """The gradient buffers (weight, bias or None) matching _in_proj(part)."""
        C = self.embed_dim
        lo, hi = _PARTS[part]
        gb = None if self.in_proj_bias is None else self._grad("in_proj_bias")[lo * C:hi * C]
        if self.in_proj_weight is None:
            return self._grad(part + "_proj_weight"), gb
        return self._grad("in_proj_weight")[lo * C:hi * C], gb

    def _forward_train(self, inputs, mask, ws):
        """A training forward -> ((B*Lq, C) rows from out_proj, AttentionSaved). `inputs`
        lists (x (B, L, C),
        part): [(x, "qkv")] for self-attention, [(x, "q"), (memory, "kv")] for
        cross-attention, or one input each for "q", "k" and "v"; each input is projected by
        its rows of in_proj in one GEMM, the heads are read in place, the attention (with
        dropout on its weights) writes the context straight into out_proj's input layout, and
        everything the backward needs is kept, in this module's buffers."""
        C, H, D = self.embed_dim, self.num_heads, self.head_dim
        bufs, ops_ = self._bufs(), self._ops
        bf16 = self.precision == "bf16"       # bf16 training: the attention's products too
        proj, projected, heads = [], [], {}
        for x, part in inputs:
            B, L, K = x.shape
            x2 = x.reshape(B * L, K)
            w, b = self._in_proj(part)
            y = w.train_forward(x2, b, 0, ops_.head_buffer(bufs, part, (B * L, len(part) * C),
                                                           bf16), None)
            proj.append((x2, part))
            if part in ("k", "v") and self._extra_keys:     # bias_k / zero key appended
                y = self._with_extra_keys(
                    y.reshape(B, L, C), part,
                    ops_.head_buffer(bufs, "ext." + part,
                                     (B, L + self._extra_keys, C), bf16)).reshape(-1, C)
            projected.append((y, part))
            heads.update(self._part_heads(y, part, B))
        q, k, v = heads["q"], heads["k"], heads["v"]
        B, _, Lq, _ = q.shape
        ctx = bufs.get("ctx", (B, Lq, H, D))
        out, lse = ctx.transpose(0, 2, 1, 3), bufs.get("lse", (B, H, Lq))
        seed = ws.seed() if self.dropout > 0 else None
        ops_.attention_train(q, k, v, mask, self.dropout, seed, out, lse, bf16)
        kept = [(ops_.keep_heads(y, bufs, part, bf16), part) for y, part in projected]
        y, out_saved = self.out_proj._forward_train(ctx.reshape(B * Lq, C))
        return y, AttentionSaved(proj, kept, out, lse, mask, seed, out_saved)

    def _kept_heads(self, saved):
        """The record's q, k, v as float32 (B, H, L, D) views (ops.kept_heads)."""
        heads, B = {}, saved.out.shape[0]
        for kept, part in saved.kept:
            heads.update(self._part_heads(self._ops.kept_heads(kept, "kept." + part), part, B))
        return heads["q"], heads["k"], heads["v"]

    def _part_heads(self, y, part, B):
        """{name: (B, H, L, D) view} of the heads of y (B*L, len(part)*C), one per letter."""
        n = len(part)
        y = y.reshape(B, y.shape[0] // B, n * self.embed_dim)
        return {name: self._heads(y, i, n) for i, name in enumerate(part)}

    def _backward(self, dy, saved, bufs, dxs):
        """dy (B*Lq, C) and the forward's AttentionSaved -> the gradients of the forward's
        inputs, written into dxs (one (B*L, C) buffer per input, in order); accumulates
        in_proj_* and out_proj.* gradients. Scratch comes from `bufs` (the backward's shared
        buffers)."""
        proj, (q, k, v) = saved.inputs, self._kept_heads(saved)
        out, lse, mask, seed = saved.out, saved.lse, saved.mask, saved.seed
        B, H, Lq, D = q.shape
        C = H * D
        dctx = self.out_proj._backward(dy, saved.out_proj, bufs.get("attn.dctx", (B * Lq, C)))
        dout = dctx.reshape(B, Lq, H, D).transpose(0, 2, 1, 3)               # (B, H, Lq, D)
        extra = self._extra_keys
        dproj, dheads = [], {}
        for x2, part in proj:                 # dq, dk, dv written in the projections' layout
            rows = x2.shape[0] + (B * extra if part in ("k", "v") else 0)
            d = bufs.get("attn.d" + part, (rows, len(part) * C))
            dproj.append(d)
            dheads.update(self._part_heads(d, part, B))
        self._ops.attention_backward(dout, q, k, v, out, lse, mask, self.dropout, seed,
                                     dheads["q"], dheads["k"], dheads["v"],
                                     self.precision == "bf16")
        for (x2, part), d, dx in zip(proj, dproj, dxs):
            if d.shape[0] != x2.shape[0]:     # the extra keys' rows: bias_k / bias_v's grads
                d = self._extra_keys_backward(d.reshape(B, -1, C), part, bufs)
            w, _ = self._in_proj(part)
            gw, gb = self._in_proj_grads(part)
            w.train_backward(d, x2, None, 0, gw, gb, dx)
        return dxs

    def _extra_keys_backward(self, d, part, bufs):
        """d (B, S + extra, C), the gradient of _with_extra_keys' output -> that of its y
        (B*S, C) (a buffer); bias_k / bias_v's gradient accumulated (the zero key has none)."""
        B, Sx, C = d.shape
        S = Sx - self._extra_keys
        if self.bias_k is not None:
            g = self._grad("bias_k" if part == "k" else "bias_v")
            g += d[:, S].sum(axis=0).reshape(g.shape)
        dy = bufs.get("attn.dy" + part, (B * S, C))
        dy.reshape(B, S, C)[...] = d[:, :S]
        return dy

    def backward(self, grad_output):
        """Backward after a training-mode forward: accumulates the projections' gradients.

        The gradients of in_proj_* (or q/k/v_proj_weight), bias_k / bias_v and out_proj.*.

        Args:
            grad_output: the gradient of the attention output, shaped like it.

        Returns:
            `(d_query, d_key, d_value)`, in the inputs' layout (sum them when one array was
                passed as several of the inputs).
        """
        public = self._check_saved()
        shapes, layout = public.shapes, public.layout
        dy = features("grad_output", layout.features_in(grad_output, "grad_output"),
                      self.embed_dim)
        if dy.shape != shapes[0]:
            self._saved = public
            raise ValueError(f"MultiheadAttention.backward: grad_output must be {shapes[0]} "
                             f"(batch-first), got {dy.shape}")
        dxs = tuple(np.empty((s[0] * s[1], s[2]), np.float32) for s in shapes)
        self._backward(dy.reshape(-1, self.embed_dim), public.record, self._bufs(), dxs)
        return tuple(layout.features_out(d.reshape(s)) for d, s in zip(dxs, shapes))

    # -- decode steps: one new position per row ----------------------------------------------
    def _init_self_cache(self, rows, max_len):
        return SelfAttentionCache(rows, self.num_heads, max_len, self.head_dim)

    def _init_cross_cache(self, memory, key_bias, ws):
        """memory (B, S, C), key_bias (B, S) float or None -> CrossAttentionCache."""
        B, S, C = memory.shape
        kv = self._project(memory.reshape(B * S, C), "kv", ws, "kv")         # (B*S, 2C)
        kv = kv.reshape(B, S, 2, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        kv = np.ascontiguousarray(kv)                                        # (2, B, H, S, D)
        return CrossAttentionCache(kv[0], kv[1], key_bias)

    def _step(self, R, B, part):
        """The planned decode step of this module for R rows over B sources (see
        _AttentionStep); decoder layers build their attention with packed in-projections."""
        return _AttentionStep(self, R, B, part)

    # -- the public forward --------------------------------------------------------------------
    def __call__(self, query, key, value, key_padding_mask=None, need_weights=True,
                 attn_mask=None, average_attn_weights=True, is_causal=False):
        """-> (attn_output (B, L, C), attn_weights (B, L, S) averaged over heads, or
        (B, H, L, S), or None when need_weights=False), as torch returns them; S counts the
        keys add_bias_kv / add_zero_attn append. batch_first=False takes and returns (L, B, C);
        unbatched (L, C) inputs give (L, C) and weights without the batch axis, as in torch.

        is_causal: torch's hint that attn_mask is the causal mask. fastattn follows the
        attn_mask given; without one (where torch raises) it applies the causal rule itself
        (bottom-right aligned, as DESIGN's masks)."""
        layout = Layout(self.batch_first, query)
        q = layout.features_in(query, "query")
        k = q if key is query else layout.features_in(key, "key")
        v = k if value is key else layout.features_in(value, "value")
        out, w = self._call(q, k, v, layout.padding_in(key_padding_mask), need_weights,
                            attn_mask, average_attn_weights, is_causal, layout)
        return layout.features_out(out), layout.weights_out(w)

    def _call(self, query, key, value, key_padding_mask, need_weights, attn_mask,
              average_attn_weights, is_causal, layout):
        """The public forward on batch-first arrays (`layout`: the caller's, for backward)."""
        C = self.embed_dim
        q = features("query", query, C)
        k = q if key is query and self.kdim == C else features("key", key, self.kdim)
        v = k if value is key and self.vdim == self.kdim else features("value", value,
                                                                       self.vdim)
        B, L, _ = q.shape
        S = k.shape[1]
        if k.shape[0] != B or v.shape[:2] != (B, S):
            raise ValueError(f"MultiheadAttention: key {k.shape} and value {v.shape} must be "
                             f"(B, S, kdim) and (B, S, vdim) with B = {B} from query {q.shape}")
        extra = self._extra_keys
        if B == 0:
            Sx = S + extra
            w = np.zeros((B, L, Sx) if average_attn_weights else (B, self.num_heads, L, Sx),
                         np.float32)
            return np.zeros((B, L, C), np.float32), (w if need_weights else None)
        mask = prepare_mask("attn_mask", attn_mask, key_padding_mask, B, self.num_heads, L, S,
                            is_causal, extra_keys=extra)
        ws = self._workspace()
        if ws.training:
            out, saved = self._forward_train([(q, "q"), (k, "k"), (v, "v")], mask, ws)
            out = out.reshape(B, L, C).copy()        # the training buffer is the next step's
            self._saved = PublicSaved(saved, (q.shape, k.shape, v.shape), layout)
            if not need_weights:
                return out, None
            heads = self._kept_heads(saved)
            _, w = self._ops.F.attention(*heads, mask=mask.bias,
                                         key_padding_mask=mask.key_padding(*heads[:2]),
                                         causal=mask.causal, return_weights=True,
                                         dropout_p=self.dropout, seed=saved.seed)
            return out, (w.mean(axis=1) if average_attn_weights else w)
        if need_weights or value is not key or extra or not self._qkv_same_embed_dim:
            return self._general(q, k, v, mask, need_weights, average_attn_weights, ws)
        if key is query:
            out, _ = self._self_attention(q, mask, ws)
        else:
            out, _ = self._cross_attention(q, k, mask, ws)
        return out.reshape(B, L, C), None

    def _general(self, q, k, v, mask, need_weights, average, ws):
        """Separate q, k, v projections (with the extra keys appended), and the weights when
        asked (torch's slow path)."""
        C = self.embed_dim
        B, L, _ = q.shape
        heads = []
        for x, part in ((q, "q"), (k, "k"), (v, "v")):
            Bx, Lx, K = x.shape
            p = self._project(x.reshape(Bx * Lx, K), part, ws, part).reshape(Bx, Lx, C)
            heads.append(self._heads(self._with_extra_keys(p, part), 0, 1))
        if not need_weights:
            return self._attend(*heads, mask, ws).reshape(B, L, C), None
        ctx, w = self._ops.attention_weights(*heads, mask, bf16=self._bf16())
        ctx = np.ascontiguousarray(ctx.transpose(0, 2, 1, 3)).reshape(B * L, C)
        out = self.out_proj._apply(ctx, ws).reshape(B, L, C)
        return out, (w.mean(axis=1) if average else w)
