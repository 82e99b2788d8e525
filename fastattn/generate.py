"""Sequence generation for Seq2SeqTransformer: greedy, beam search and sampling.

    out = model.generate(src_ids, max_new_tokens=64, start_id=2, end_id=3)   # (B, T) int64

How the fast backend decodes (one token per step, per row):
- the encoder runs once; each decoder layer's cross-attention keys and values are projected
  once per source and shared by that source's beams (the beams are the attention's queries);
- self-attention keys and values go into a cache preallocated per layer, (rows, H, T_max, D),
  written in place at each step; only the last position runs through the decoder and only its
  logits are computed;
- rows that have finished are dropped from the work (their caches compacted away), and beams
  are reordered by gathering cache rows.
The reference backend decodes the way a NumPy prototype would: it re-runs the full decoder on
the whole prefix at every step. Both feed the same selection code, so they produce the same
tokens (up to float32 rounding in near-ties).

Output: int64 (B, T), each row beginning with start_id, T = 1 + the longest generated row
(at most 1 + max_new_tokens), each row padded with pad_id after its end_id. end_id=None never
stops early.

Beam search: every source keeps ``beam_size`` slots. At each step, the slots' live hypotheses
are extended by every token and the ``beam_size`` best continuations (by summed log
probability; ties to the lower slot, then the lower token id) fill the slots. A continuation
ending in end_id is finished: it is set aside with the score
``sum log p / (generated length) ** length_penalty`` (the end token counts) and its slot stays
empty from then on. A source stops when no live hypothesis is left, or at max_new_tokens,
where the live ones are scored the same way; the best finished-or-live hypothesis wins (ties:
the first found). So beam_size=1 is exactly greedy decoding.

Sampling: logits / temperature, then top_k (keep the k largest), then top_p (keep the smallest
set of most likely tokens whose probability reaches top_p), then one draw per row from a
NumPy Generator seeded with ``seed``: the same seed gives the same output.
"""
import math
import numbers

import numpy as np

from . import ops
from .nn import _Mask

__all__ = ["generate", "METHODS"]

METHODS = ("greedy", "beam", "sample")


# ---- argument checks ---------------------------------------------------------------------------

def _int(name, value, lo, hi=None, allow_none=False):
    if value is None and allow_none:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"generate: {name} must be an int, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        upper = "" if hi is None else f" and <= {hi}"
        raise ValueError(f"generate: {name} must be >= {lo}{upper}, got {value}")
    return int(value)


def _real(name, value, positive=True):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"generate: {name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"generate: {name} must be > 0, got {value!r}")
    return float(value)


def _check(model, src_ids, max_new_tokens, start_id, end_id, pad_id, src_key_padding_mask,
           method, beam_size, length_penalty, temperature, top_k, top_p):
    V = model.tgt_tok_emb.embedding.num_embeddings
    src = np.asarray(src_ids)
    if src.dtype.kind not in "iu":
        raise TypeError(f"generate: src_ids must be integer token ids, got dtype {src.dtype}")
    if src.ndim != 2:
        raise ValueError(f"generate: src_ids must be (B, S), got shape {src.shape}")
    if method not in METHODS:
        raise ValueError(f"generate: method must be one of {METHODS}, got {method!r}")
    args = dict(
        max_new_tokens=_int("max_new_tokens", max_new_tokens, 0),
        start_id=_int("start_id", start_id, 0, V - 1),
        end_id=_int("end_id", end_id, 0, V - 1, allow_none=True),
        pad_id=_int("pad_id", pad_id, 0, V - 1),
        beam_size=_int("beam_size", beam_size, 1),
        length_penalty=_real("length_penalty", length_penalty, positive=False),
        temperature=_real("temperature", temperature),
        top_k=_int("top_k", top_k, 1, allow_none=True),
        top_p=None if top_p is None else _real("top_p", top_p),
    )
    if args["top_p"] is not None and args["top_p"] > 1:
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p!r}")
    if args["max_new_tokens"] + 1 > model.positional_encoding.max_len:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens} exceeds the model's "
                         f"max_len={model.positional_encoding.max_len} positions")
    if src_key_padding_mask is not None:
        kpm = np.asarray(src_key_padding_mask)
        if kpm.shape != src.shape:
            raise ValueError(f"generate: src_key_padding_mask must have the shape of src_ids "
                             f"{src.shape}, got {kpm.shape}")
    return src, args


# ---- decoders: tokens in, last-position logits out ---------------------------------------------

PACKED_MAX_ROWS = 32   # up to this many rows per step, the packed few-row kernel beats BLAS


def _decoder_weights(model):
    """(weight, rows) of every linear a decode step uses: rows=C for the cross-attention's
    query projection (the first C rows of its in_proj_weight)."""
    C = model.transformer.d_model
    out = []
    for layer in model.transformer.decoder.layers:
        out += [(layer.self_attn.in_proj_weight, None), (layer.self_attn.out_proj.weight, None),
                (layer.multihead_attn.in_proj_weight, C),
                (layer.multihead_attn.out_proj.weight, None),
                (layer.linear1.weight, None), (layer.linear2.weight, None)]
    return out + [(model.generator.weight, None)]


def _fingerprint(w):
    """Cheap check that a weight has not been edited in place since it was packed."""
    flat = w.reshape(-1)
    return float(flat[:: max(1, flat.size // 4096)].astype(np.float64).sum()), flat.size


def _packed_weights(model):
    """{(id(weight), rows): PackedWeight} for the decoder, kept on the model between calls and
    rebuilt when a weight was reloaded (load_state_dict) or visibly edited in place."""
    cache = getattr(model, "_packed_cache", None)
    ws = _decoder_weights(model)
    stamp = [(id(w), rows, _fingerprint(w)) for w, rows in ws]
    if cache is not None and cache[0] == stamp:
        return cache[1]
    packed = {(id(w), rows): ops.PackedWeight(w if rows is None else w[:rows]) for w, rows in ws}
    model._packed_cache = (stamp, packed)
    return packed


class _CachedDecoder:
    """Fast backend: one position per step with per-layer KV caches (see module docstring).

    Rows are grouped by source: row r belongs to source r // k (k = beam slots per source)."""

    def __init__(self, model, memory, mem_kpm, k, t_max):
        self.m, self.k = model, k
        self.ops = model._ops
        self.packed = _packed_weights(model)
        tr = model.transformer
        self.layers = tr.decoder.layers
        self.final_norm = tr.decoder.norm
        self.C, self.H = tr.d_model, tr.nhead
        self.D = self.C // self.H
        B, S, C = memory.shape
        R = B * k
        self.R = R
        # cross-attention K and V of every layer, once per source, head-major so each
        # (source, head) reads one contiguous block: (2, B, H, S, D)
        self.cross = []
        for layer in self.layers:
            mha = layer.multihead_attn
            b = None if mha.in_proj_bias is None else mha.in_proj_bias[C:]
            kv = self.ops.linear(memory.reshape(B * S, C), mha.in_proj_weight[C:], b)
            kv = kv.reshape(B, S, 2, self.H, self.D).transpose(2, 0, 3, 1, 4)
            self.cross.append(np.ascontiguousarray(kv))
        self.mem_bias = None                                  # (B, S) float, -inf = padding
        if mem_kpm is not None:
            self.mem_bias = np.where(mem_kpm, np.float32(-np.inf), np.float32(0))
        # self-attention caches, (R, H, T_max, D) per layer, keys and values: each (row, head)
        # reads its keys from one contiguous block
        shape = (R, self.H, t_max, self.D)
        self.kc = [np.empty(shape, np.float32) for _ in self.layers]
        self.vc = [np.empty(shape, np.float32) for _ in self.layers]

    def _linear(self, x, weight, bias, act=None, rows=None):
        """x (R, K) @ weight[:rows].T + bias: packed weights for decode-sized R."""
        packed = self.packed.get((id(weight), rows)) if x.shape[0] <= PACKED_MAX_ROWS else None
        if packed is None:
            w = weight if rows is None else weight[:rows]
            return self.ops.linear(x, w, bias, act)
        y = np.empty((x.shape[0], packed.shape[0]), np.float32)
        return ops._linear_packed_into(y, x, packed, bias, ops.ACTIVATIONS[act])

    def step(self, tokens, t):
        """tokens (R,) at position t -> logits (R, V) for position t + 1."""
        m, o, C, H, D, k = self.m, self.ops, self.C, self.H, self.D, self.k
        R = tokens.shape[0]
        B = R // k
        x = np.take(m.tgt_tok_emb.embedding.weight, tokens, axis=0)          # (R, C)
        x *= np.float32(math.sqrt(C))
        x += m.positional_encoding.pe[t]
        ctx = np.empty((R, C), np.float32)
        lin = self._linear
        for li, layer in enumerate(self.layers):
            # masked self-attention over the cache (the new position sees every earlier one)
            def self_attn(h, li=li, layer=layer):
                mha = layer.self_attn
                qkv = lin(h, mha.in_proj_weight, mha.in_proj_bias)          # (R, 3C)
                parts = qkv.reshape(R, 3, H, D)
                self.kc[li][:, :, t] = parts[:, 1]                           # written in place
                self.vc[li][:, :, t] = parts[:, 2]
                q = parts[:, 0][:, :, None, :]                               # (R, H, 1, D)
                kk = self.kc[li][:, :, :t + 1]                               # (R, H, t+1, D)
                vv = self.vc[li][:, :, :t + 1]
                out = ctx.reshape(R, H, 1, D)
                o.attention(q, kk, vv, _Mask(), out=out)
                return lin(ctx, mha.out_proj.weight, mha.out_proj.bias)

            # cross-attention: the k beams of a source are its queries against its memory
            def cross_attn(h, li=li, layer=layer):
                mha = layer.multihead_attn
                b = None if mha.in_proj_bias is None else mha.in_proj_bias[:C]
                qp = lin(h, mha.in_proj_weight, b, rows=C)                   # (R, C)
                q = qp.reshape(B, k, H, D).transpose(0, 2, 1, 3)              # (B, H, k, D)
                kk, vv = self.cross[li]                                      # (B, H, S, D)
                out = ctx.reshape(B, k, H, D).transpose(0, 2, 1, 3)
                mb = None if self.mem_bias is None else self.mem_bias.reshape(-1)
                o.attention(q, kk, vv, _Mask(key_bias=mb), out=out)
                return lin(ctx, mha.out_proj.weight, mha.out_proj.bias)

            def ffn(h, layer=layer):
                hid = lin(h, layer.linear1.weight, layer.linear1.bias, act=layer.activation)
                return lin(hid, layer.linear2.weight, layer.linear2.bias)

            for norm, f in ((layer.norm1, self_attn), (layer.norm2, cross_attn),
                            (layer.norm3, ffn)):
                if layer.norm_first:
                    x = x + f(o.add_norm(x, None, norm.weight, norm.bias, norm.eps))
                else:
                    x = o.add_norm(f(x), x, norm.weight, norm.bias, norm.eps)
        n = self.final_norm
        if n is not None:
            x = o.add_norm(x, None, n.weight, n.bias, n.eps)
        g = m.generator
        return lin(x, g.weight, g.bias)

    def reorder(self, rows, t, sources=None):
        """Keep cache rows `rows` (new row i = old row rows[i]) for positions < t; `sources`
        (when whole sources were dropped) = the kept sources, for the cross-attention K/V."""
        R = len(rows)
        shrink = R != self.kc[0].shape[0]
        changed = None if shrink else np.flatnonzero(rows != np.arange(R))
        for caches in (self.kc, self.vc):
            for li, c in enumerate(caches):
                if shrink:                                     # rows dropped: a smaller cache
                    new = np.empty((R,) + c.shape[1:], np.float32)
                    np.take(c[:, :, :t], rows, axis=0, out=new[:, :, :t])
                    caches[li] = new
                elif changed.size:                             # beams reordered: gather only
                    c[changed, :, :t] = c[rows[changed], :, :t]   # the rows that moved
        if sources is not None:
            self.cross = [c[:, sources] for c in self.cross]
            if self.mem_bias is not None:
                self.mem_bias = self.mem_bias[sources]


class _RecomputeDecoder:
    """Reference backend: re-run the full decoder on the prefix at every step."""

    def __init__(self, model, memory, mem_kpm, k, t_max):
        self.m, self.k = model, k
        self.memory = np.repeat(memory, k, axis=0)                       # (R, S, C)
        self.mem_kpm = None if mem_kpm is None else np.repeat(mem_kpm, k, axis=0)
        self.prefix = None

    def step(self, tokens, t):
        col = tokens[:, None]
        self.prefix = col if self.prefix is None else np.concatenate([self.prefix, col], 1)
        # generated tokens are never padding, even one equal to pad_id: no target padding mask
        no_pad = np.zeros(self.prefix.shape, dtype=bool)
        hidden = self.m.decode(self.prefix, self.memory, memory_key_padding_mask=self.mem_kpm,
                               tgt_key_padding_mask=no_pad)
        return self.m.generator(hidden[:, -1])                           # (R, V)

    def reorder(self, rows, t, sources=None):
        self.prefix = self.prefix[rows]                  # memory is repeated per row, so the
        self.memory = self.memory[rows]                  # row indices select it too
        if self.mem_kpm is not None:
            self.mem_kpm = self.mem_kpm[rows]


# ---- selection ---------------------------------------------------------------------------------

def _log_softmax(logits):
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _sample_ids(logits, rng, temperature, top_k, top_p):
    z = logits.astype(np.float64) / temperature                      # (R, V)
    if top_k is not None and top_k < z.shape[1]:
        kth = np.partition(z, -top_k, axis=1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, axis=1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=1)
        keep_sorted = np.cumsum(sorted_p, axis=1) - sorted_p < top_p    # reach top_p, no more
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=1, keepdims=True)
    u = rng.random(p.shape[0])[:, None]                               # in [0, 1)
    ids = (np.cumsum(p, axis=1) <= u).sum(axis=1)     # first token whose cumsum passes u: p > 0
    return np.minimum(ids, p.shape[1] - 1)


def _finish(rows_tokens, B, pad_id):
    """list of B token lists (start_id first) -> (B, T) int64, padded with pad_id."""
    T = max(len(r) for r in rows_tokens) if rows_tokens else 1
    out = np.full((B, T), pad_id, dtype=np.int64)
    for i, r in enumerate(rows_tokens):
        out[i, :len(r)] = r
    return out


def _run_single(dec, B, a, pick):
    """Greedy and sampling: one row per source; finished rows are dropped from the work."""
    seqs = [[a["start_id"]] for _ in range(B)]
    live = np.arange(B)                                   # source of each decoder row
    tokens = np.full(B, a["start_id"], dtype=np.int64)
    for t in range(a["max_new_tokens"]):
        logits = dec.step(tokens, t)                      # (R, V)
        nxt = pick(logits)
        for r, src in enumerate(live):
            seqs[src].append(int(nxt[r]))
        alive = np.ones(len(live), bool) if a["end_id"] is None else nxt != a["end_id"]
        if not alive.all():
            if not alive.any():
                break
            keep = np.flatnonzero(alive)
            dec.reorder(keep, t + 1, sources=keep)
            live, nxt = live[keep], nxt[keep]
        tokens = nxt.astype(np.int64)
    return _finish(seqs, B, a["pad_id"])


def _top_k(flat, k):
    """Indices of the k largest entries of each row, best first; ties -> the lower index
    (what a stable sort of -flat gives, without sorting all of it)."""
    n, width = flat.shape
    if k >= width:
        return np.argsort(-flat, axis=1, kind="stable")
    kth = np.partition(flat, width - k, axis=1)[:, width - k][:, None]   # k-th largest
    out = np.empty((n, k), dtype=np.int64)
    for i in range(n):
        idx = np.flatnonzero(flat[i] >= kth[i])                         # >= k candidates
        order = np.argsort(-flat[i, idx], kind="stable")[:k]            # idx is ascending
        out[i] = idx[order]
    return out


def _run_beam(dec, B, a):
    k, end, lp = a["beam_size"], a["end_id"], a["length_penalty"]
    start = a["start_id"]
    live_src = np.arange(B)                               # sources still decoding
    hyps = [[[start] for _ in range(k)] for _ in range(B)]    # per source, per slot
    score = np.full((B, k), -np.inf)
    score[:, 0] = 0.0                                     # one live hypothesis to begin with
    finished = [[] for _ in range(B)]                     # (normalised score, tokens)
    tokens = np.full(B * k, start, dtype=np.int64)
    for t in range(a["max_new_tokens"]):
        n = len(live_src)
        logp = _log_softmax(dec.step(tokens, t)).reshape(n, k, -1)      # (n, k, V)
        V = logp.shape[2]
        cand = score[live_src][:, :, None] + logp                       # (n, k, V)
        flat = cand.reshape(n, k * V)
        best = _top_k(flat, k)                                          # (n, k)
        parent, tok = best // V, best % V
        new_score = np.take_along_axis(flat, best, axis=1)
        rows, keep_src = [], []
        for i, src in enumerate(live_src):
            old = hyps[src]
            new = []
            for slot in range(k):
                s, p, w = new_score[i, slot], parent[i, slot], int(tok[i, slot])
                seq = old[p] + [w]
                if s > -np.inf and end is not None and w == end:   # finished: set aside
                    finished[src].append((s / (len(seq) - 1) ** lp, seq))
                    new_score[i, slot] = -np.inf                   # its slot stays empty
                new.append(seq)
            hyps[src] = new
            score[src] = new_score[i]
            if np.isfinite(score[src]).any():
                keep_src.append(i)
                rows.extend(i * k + parent[i])
        if not keep_src:
            live_src = live_src[:0]
            break
        keep_src = np.asarray(keep_src)
        dec.reorder(np.asarray(rows), t + 1,
                    sources=None if len(keep_src) == n else keep_src)
        tok_live = tok[keep_src].reshape(-1)
        live_src = live_src[keep_src]
        tokens = tok_live.astype(np.int64)
    out = []
    for src in range(B):
        cands = list(finished[src])                        # then the live ones, scored alike
        cands += [(score[src, slot] / (len(hyps[src][slot]) - 1) ** lp, hyps[src][slot])
                  for slot in range(k) if np.isfinite(score[src, slot])]
        best = max(range(len(cands)), key=lambda i: (cands[i][0], -i))   # ties: first found
        out.append(cands[best][1])
    return _finish(out, B, a["pad_id"])


def generate(model, src_ids, *, max_new_tokens, start_id, end_id=None, pad_id=0,
             src_key_padding_mask=None, method="greedy", beam_size=4, length_penalty=1.0,
             temperature=1.0, top_k=None, top_p=None, seed=None):
    """Generate target ids for src_ids (B, S) with a Seq2SeqTransformer; see the module
    docstring. Returns int64 (B, T), rows starting with start_id, padded with pad_id."""
    src, a = _check(model, src_ids, max_new_tokens, start_id, end_id, pad_id,
                    src_key_padding_mask, method, beam_size, length_penalty, temperature, top_k,
                    top_p)
    B = src.shape[0]
    if B == 0 or a["max_new_tokens"] == 0:
        return np.full((B, 1), a["start_id"], dtype=np.int64)
    kpm = model._padding(src, src_key_padding_mask)
    memory = model.encode(src, kpm)                                       # (B, S, C)
    k = a["beam_size"] if method == "beam" else 1
    Decoder = _CachedDecoder if model.backend == "fast" else _RecomputeDecoder
    dec = Decoder(model, memory, None if kpm is None else np.asarray(kpm, bool), k,
                  a["max_new_tokens"])
    if method == "beam":
        return _run_beam(dec, B, a)
    if method == "greedy":
        pick = lambda logits: np.argmax(logits, axis=1)                 # noqa: E731
    else:
        rng = np.random.default_rng(seed)
        pick = lambda logits: _sample_ids(logits, rng, a["temperature"], a["top_k"],  # noqa
                                          a["top_p"])
    return _run_single(dec, B, a, pick)
