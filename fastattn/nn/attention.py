"""MultiheadAttention, and the key/value caches its decode steps read and write.

One set of pieces serves the forward and the decode step: the input projections (``_project``),
the attention plus output projection (``_attend``); a decode step differs only in where keys and
values come from (a cache written in place) and in streaming packed weights for its few rows.
"""
import numpy as np

from .backends import _put
from .layers import Linear
from .masks import NO_MASK, Mask, prepare_mask
from .module import (Module, check_batch_first, check_dropout, check_positive, features,
                     rng_from, xavier)


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


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention (batch_first=True): packed in_proj_weight (3C, C) rows q|k|v.

    Self-attention (query is key is value) runs one GEMM for q, k and v; cross-attention (key
    is value) one for q and one for k|v; heads are read in place through strides.
    """

    _params = ("in_proj_weight", "in_proj_bias")
    _quantizable = ("in_proj_weight",)
    _children = ("out_proj",)

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=True, *,
                 backend="fast", seed=None):
        super().__init__(backend)
        check_batch_first(batch_first)
        self.embed_dim = check_positive("embed_dim", embed_dim)
        self.num_heads = check_positive("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.head_dim = embed_dim // num_heads
        self.dropout = check_dropout(dropout)
        rng = rng_from(seed)
        self.in_proj_weight = xavier(rng, (3 * embed_dim, embed_dim))
        self.in_proj_bias = np.zeros(3 * embed_dim, np.float32) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, backend=backend, seed=rng)
        if bias:
            self.out_proj.bias[...] = 0.0

    # -- pieces shared by the forward and the decode step -------------------------------------
    def _project(self, x, part, ws, key):
        """x (N, C) @ in_proj_weight[rows].T + in_proj_bias[rows] -> (N, len(rows)); part is
        "qkv", "q" or "kv" (rows 0:3C, 0:C, C:3C)."""
        C = self.embed_dim
        lo, hi = {"qkv": (0, 3 * C), "q": (0, C), "kv": (C, 3 * C)}[part]
        w = self.in_proj_weight[lo:hi]
        b = None if self.in_proj_bias is None else self.in_proj_bias[lo:hi]
        packed = None
        if ws.decode and lo == 0:                 # decode steps project their queries (q, qkv)
            packed = self._packed(part, self.in_proj_weight, hi)
        return self._ops.linear(x, w, b, out=ws.get(key, (x.shape[0], hi - lo)), packed=packed)

    def _heads(self, x, part, parts):
        """(B, L, parts*C) -> the `part`-th (B, H, L, D) view, no copy."""
        B, L, _ = x.shape
        return x.reshape(B, L, parts, self.num_heads, self.head_dim)[:, :, part].transpose(
            0, 2, 1, 3)

    def _attend(self, q, k, v, mask, ws):
        """(B, H, Lq, D) queries against (B, H, Lk, D) keys/values, then out_proj ->
        (B*Lq, C) rows ordered (batch, query). A recording pass (ws.weights a dict) also
        stores the attention weights (B, H, Lq, Lk) in ws.weights[self]."""
        B, H, Lq, D = q.shape
        ctx = ws.get("ctx", (B, Lq, H, D))
        ctx_v = None if ctx is None else ctx.transpose(0, 2, 1, 3)
        if ws.weights is None:
            ctx_v = self._ops.attention(q, k, v, mask, out=ctx_v)           # (B, H, Lq, D)
        else:                         # a recording pass: the slow path that keeps the weights
            y, ws.weights[self] = self._ops.attention_weights(q, k, v, mask)
            ctx_v = _put(ctx_v, y)
        ctx = ctx_v.transpose(0, 2, 1, 3).reshape(B * Lq, H * D)            # view when fast
        return self.out_proj._apply(ctx, ws, "proj")

    # -- the forward used by the layers -------------------------------------------------------
    def _self_attention(self, x, mask, ws):
        """x (B, L, C) -> (B*L, C)."""
        if ws.training:
            return self._attention_train([(x, "qkv")], mask, ws)
        B, L, C = x.shape
        qkv = self._project(x.reshape(B * L, C), "qkv", ws, "qkv").reshape(B, L, 3 * C)
        return self._attend(*(self._heads(qkv, i, 3) for i in range(3)), mask, ws)

    def _cross_attention(self, x, memory, mask, ws):
        """x (B, Lq, C) against memory (B, Lk, C) -> (B*Lq, C)."""
        if ws.training:
            return self._attention_train([(x, "q"), (memory, "kv")], mask, ws)
        B, Lq, C = x.shape
        Lk = memory.shape[1]
        qp = self._project(x.reshape(B * Lq, C), "q", ws, "q").reshape(B, Lq, C)
        kv = self._project(memory.reshape(B * Lk, C), "kv", ws, "kv").reshape(B, Lk, 2 * C)
        return self._attend(self._heads(qp, 0, 1), self._heads(kv, 0, 2), self._heads(kv, 1, 2),
                            mask, ws)

    # -- training: the forward that keeps what the backward needs, and the backward -----------
    def _in_proj(self, part):
        """(weight rows, bias rows) of in_proj for `part` ("qkv", "q", "kv", "k" or "v")."""
        C = self.embed_dim
        lo, hi = _PARTS[part]
        b = self.in_proj_bias
        return (self.in_proj_weight[lo * C:hi * C],
                None if b is None else b[lo * C:hi * C])

    def _attention_train(self, inputs, mask, ws):
        """A training forward -> (B*Lq, C) rows from out_proj. `inputs` lists (x (B, L, C),
        part): [(x, "qkv")] for self-attention, [(x, "q"), (memory, "kv")] for
        cross-attention, or one input each for "q", "k" and "v"; each input is projected by
        its rows of in_proj in one GEMM, the heads are read in place, the attention (with
        dropout on its weights) writes the context straight into out_proj's input layout, and
        everything the backward needs is kept, in this module's buffers."""
        C, H, D = self.embed_dim, self.num_heads, self.head_dim
        bufs = self._bufs()
        proj, heads = [], {}
        for x, part in inputs:
            B, L, _ = x.shape
            x2 = x.reshape(B * L, C)
            w, b = self._in_proj(part)
            y = self._ops.linear_train(x2, w, b, None, bufs.get(part, (B * L, len(part) * C)),
                                       None)
            proj.append((x2, part))
            heads.update(self._part_heads(y, part, B))
        q, k, v = heads["q"], heads["k"], heads["v"]
        B, _, Lq, _ = q.shape
        ctx = bufs.get("ctx", (B, Lq, H, D))
        out, lse = ctx.transpose(0, 2, 1, 3), bufs.get("lse", (B, H, Lq))
        seed = ws.seed() if self.dropout > 0 else None
        self._ops.attention_train(q, k, v, mask, self.dropout, seed, out, lse)
        self._saved = (proj, (q, k, v), out, lse, mask, seed)
        return self.out_proj._apply(ctx.reshape(B * Lq, C), ws)

    def _part_heads(self, y, part, B):
        """{name: (B, H, L, D) view} of the heads of y (B*L, len(part)*C), one per letter."""
        n = len(part)
        y = y.reshape(B, y.shape[0] // B, n * self.embed_dim)
        return {name: self._heads(y, i, n) for i, name in enumerate(part)}

    def _attention_backward(self, dy, bufs, dxs):
        """dy (B*Lq, C) -> the gradients of the training forward's inputs, written into dxs
        (one (B*L, C) buffer per input, in order); accumulates in_proj_* and out_proj.*
        gradients. Scratch comes from `bufs` (the backward's shared buffers)."""
        proj, (q, k, v), out, lse, mask, seed = self._check_saved()
        B, H, Lq, D = q.shape
        C = H * D
        dctx = self.out_proj._backward(dy, bufs.get("attn.dctx", (B * Lq, C)))
        dout = dctx.reshape(B, Lq, H, D).transpose(0, 2, 1, 3)               # (B, H, Lq, D)
        dproj, dheads = [], {}
        for x2, part in proj:                 # dq, dk, dv written in the projections' layout
            d = bufs.get("attn.d" + part, (x2.shape[0], len(part) * C))
            dproj.append(d)
            dheads.update(self._part_heads(d, part, B))
        self._ops.attention_backward(dout, q, k, v, out, lse, mask, self.dropout, seed,
                                     dheads["q"], dheads["k"], dheads["v"])
        gw = self._grad("in_proj_weight")
        gb = None if self.in_proj_bias is None else self._grad("in_proj_bias")
        for (x2, part), d, dx in zip(proj, dproj, dxs):
            lo, hi = _PARTS[part]
            w, _ = self._in_proj(part)
            self._ops.linear_backward(d, x2, w, None, None, gw[lo * C:hi * C],
                                      None if gb is None else gb[lo * C:hi * C], dx)
        return dxs

    def backward(self, grad_output):
        """After a training-mode forward: accumulates the gradients of in_proj_* and
        out_proj.*, and returns (d_query, d_key, d_value) (sum them when one array was passed
        as several of the inputs)."""
        saved, shapes = self._check_saved()
        self._saved = saved
        dy = features("grad_output", grad_output, self.embed_dim)
        if dy.shape != shapes[0]:
            raise ValueError(f"MultiheadAttention.backward: grad_output must be {shapes[0]}, "
                             f"got {dy.shape}")
        dxs = tuple(np.empty((s[0] * s[1], self.embed_dim), np.float32) for s in shapes)
        self._attention_backward(dy.reshape(-1, self.embed_dim), self._bufs(), dxs)
        return tuple(d.reshape(s) for d, s in zip(dxs, shapes))

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

    def _self_attention_step(self, x, cache, t, ws):
        """x (R, C) at position t: its key and value go into the cache, its query attends to
        positions 0..t (the causal rule of the forward, one row of it) -> (R, C)."""
        R = x.shape[0]
        parts = self._project(x, "qkv", ws, "qkv").reshape(R, 3, self.num_heads, self.head_dim)
        cache.k[:, :, t] = parts[:, 1]                                       # written in place
        cache.v[:, :, t] = parts[:, 2]
        q = parts[:, 0][:, :, None, :]                                       # (R, H, 1, D)
        return self._attend(q, cache.k[:, :, :t + 1], cache.v[:, :, :t + 1], NO_MASK, ws)

    def _cross_attention_step(self, x, cache, ws):
        """x (R, C), R = sources x beams, against each source's memory -> (R, C)."""
        B = cache.k.shape[0]
        R, C = x.shape
        qp = self._project(x, "q", ws, "q")                                  # (R, C)
        q = qp.reshape(B, R // B, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)
        return self._attend(q, cache.k, cache.v, cache.mask, ws)

    # -- the public forward --------------------------------------------------------------------
    def __call__(self, query, key, value, key_padding_mask=None, need_weights=True,
                 attn_mask=None, average_attn_weights=True, is_causal=False):
        """-> (attn_output (B, L, C), attn_weights (B, L, S) averaged over heads, or
        (B, H, L, S), or None when need_weights=False), as torch returns them."""
        C = self.embed_dim
        q = features("query", query, C)
        k = q if key is query else features("key", key, C)
        v = k if value is key else features("value", value, C)
        B, L, _ = q.shape
        S = k.shape[1]
        if k.shape[0] != B or v.shape[:2] != (B, S):
            raise ValueError(f"MultiheadAttention: key {k.shape} and value {v.shape} must be "
                             f"(B, S, C) with B = {B} from query {q.shape}")
        if B == 0:
            w = np.zeros((B, L, S) if average_attn_weights else (B, self.num_heads, L, S),
                         np.float32)
            return np.zeros((B, L, C), np.float32), (w if need_weights else None)
        mask = prepare_mask("attn_mask", attn_mask, key_padding_mask, B, self.num_heads, L, S,
                            is_causal)
        ws = self._workspace()
        if ws.training:
            out = self._attention_train([(q, "q"), (k, "k"), (v, "v")], mask, ws)
            out = out.reshape(B, L, C).copy()        # the training buffer is the next step's
            _, heads, _, _, _, seed = self._saved
            self._saved = (self._saved, (q.shape, k.shape, v.shape))
            if not need_weights:
                return out, None
            _, w = self._ops.F.attention(*heads, mask=mask.bias,
                                         key_padding_mask=mask.key_padding(*heads[:2]),
                                         causal=mask.causal, return_weights=True,
                                         dropout_p=self.dropout, seed=seed)
            return out, (w.mean(axis=1) if average_attn_weights else w)
        if need_weights or value is not key:
            return self._general(q, k, v, mask, need_weights, average_attn_weights, ws)
        if key is query:
            out = self._self_attention(q, mask, ws)
        else:
            out = self._cross_attention(q, k, mask, ws)
        return out.reshape(B, L, C), None

    def _general(self, q, k, v, mask, need_weights, average, ws):
        """Separate q, k, v projections, and the weights when asked (torch's slow path)."""
        C, H = self.embed_dim, self.num_heads
        B, L, _ = q.shape
        heads = []
        for i, x in enumerate((q, k, v)):
            rows = slice(i * C, (i + 1) * C)
            b = None if self.in_proj_bias is None else self.in_proj_bias[rows]
            p = self._ops.linear(x.reshape(B * x.shape[1], C), self.in_proj_weight[rows], b)
            heads.append(p.reshape(B, x.shape[1], H, C // H).transpose(0, 2, 1, 3))
        ctx, w = self._ops.attention_weights(*heads, mask)
        ctx = np.ascontiguousarray(ctx.transpose(0, 2, 1, 3)).reshape(B * L, C)
        out = self.out_proj._apply(ctx, ws).reshape(B, L, C)
        if not need_weights:
            return out, None
        return out, (w.mean(axis=1) if average else w)
