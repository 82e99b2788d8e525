"""torch.nn-shaped Transformer modules over the kernels (inference; batch-first always).

Names, constructor arguments, forward arguments, defaults and state_dict keys follow torch.nn,
so a model trained there loads here as it is (see ``load_state_dict``). Parameters are NumPy
float32 arrays held in attributes named exactly as torch's state_dict keys.

Every module takes ``backend="fast"`` (the C kernels, buffers reused across layers) or
``backend="reference"`` (the NumPy twin, written the way a prototype would be); both give the
same outputs. Dropout is accepted for signature compatibility and never applied (inference).

Masks use torch's conventions: bool True = not allowed, or float added to the scores; a
``*_key_padding_mask`` is (B, S) with True = padding. A ``tgt_mask`` equal to the square
subsequent mask runs as the kernel's causal mode, never as an (L, L) array. A query with no
allowed key gives zeros where torch gives NaN.

Dimension letters: B batch, S source length, T target length, L either, C d_model, H heads,
D head dim (C / H), F dim_feedforward, V vocabulary.
"""
import copy
import math
import numbers

import numpy as np

from . import ops, reference
from .ops import ACTIVATIONS

__all__ = [
    "Module", "Linear", "Embedding", "LayerNorm", "PositionalEncoding", "MultiheadAttention",
    "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
    "TransformerDecoder", "Transformer", "Seq2SeqTransformer", "TokenEmbedding",
    "generate_square_subsequent_mask",
]

BACKENDS = ("fast", "reference")


# ---- the two backends: one model code path, two sets of ops ------------------------------------

class _FastOps:
    """The kernels, writing into buffers the caller owns (``out``) when it gives one."""

    name = "fast"

    @staticmethod
    def linear(x, weight, bias, activation=None, out=None):          # x (N, K) -> (N, M)
        if out is None:
            out = np.empty((x.shape[0], weight.shape[0]), np.float32)
        return ops._linear_into(out, x, weight, bias, ACTIVATIONS[activation])

    @staticmethod
    def ffn(x, w1, b1, w2, b2, activation, out=None):                # x (N, C) -> (N, C)
        if out is None:
            out = np.empty(x.shape, np.float32)
        return ops._ffn_into(out, x, w1, b1, w2, b2, ACTIVATIONS[activation])

    @staticmethod
    def add_norm(x, residual, weight, bias, eps, out=None, sum_out=None):
        """LN(x + residual) -> out; x + residual -> sum_out when given. (N, C)."""
        if out is None:
            out = np.empty(x.shape, np.float32)
        return ops._layer_norm_into(out, x, weight, bias, eps, residual, sum_out)

    @staticmethod
    def attention(q, k, v, mask, out=None):                 # (B,H,Lq,D) views -> (B,H,Lq,Dv)
        B, H, Lq, D = q.shape
        if out is None:
            out = np.empty((B, H, Lq, v.shape[3]), np.float32)
        bias = None if mask.bias is None else np.broadcast_to(mask.bias, (B, H, Lq, k.shape[2]))
        return ops._attention_into(out, q, k, v, bias, mask.key_bias, mask.causal,
                                   1.0 / math.sqrt(D))


class _ReferenceOps:
    """The NumPy twin, as a prototype would call it: new arrays every time."""

    name = "reference"

    @staticmethod
    def linear(x, weight, bias, activation=None, out=None):
        return _put(out, reference.linear(x, weight, bias, activation=activation))

    @staticmethod
    def ffn(x, w1, b1, w2, b2, activation, out=None):
        return _put(out, reference.ffn(x, w1, b1, w2, b2, activation=activation))

    @staticmethod
    def add_norm(x, residual, weight, bias, eps, out=None, sum_out=None):
        s = x if residual is None else x + residual
        if sum_out is not None:
            sum_out[...] = s
        return _put(out, reference.layer_norm(s, weight, bias, eps=eps))

    @staticmethod
    def attention(q, k, v, mask, out=None):
        kpm = None if mask.key_bias is None else mask.key_bias.reshape(q.shape[0], k.shape[2])
        y = reference.attention(q, k, v, mask=mask.bias, key_padding_mask=kpm,
                                causal=mask.causal)
        return _put(out, y)


def _put(out, y):
    if out is None:
        return y
    out[...] = y
    return out


def _backend(name):
    if name == "fast":
        return _FastOps
    if name == "reference":
        return _ReferenceOps
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")


# ---- masks, normalised once per forward --------------------------------------------------------

class _Mask:
    """Masks in the kernel's form: ``bias`` float broadcastable to (B, H, Lq, Lk) or None,
    ``key_bias`` float (B*Lk,) or None, ``causal`` bool (bottom-right aligned)."""

    __slots__ = ("bias", "key_bias", "causal")

    def __init__(self, bias=None, key_bias=None, causal=False):
        self.bias, self.key_bias, self.causal = bias, key_bias, causal


def _is_subsequent(m):
    """True if m (L, L) is the square subsequent mask (bool True above the diagonal, or float
    -inf above and 0 on and below)."""
    L = m.shape[0]
    upper = np.triu(np.ones((L, L), dtype=bool), k=1)
    if m.dtype == np.bool_:
        return bool(np.array_equal(m, upper))
    return bool(np.all(m[upper] == -np.inf) and np.all(m[~upper] == 0))


def _prepare_mask(name, attn_mask, key_padding_mask, B, H, Lq, Lk, is_causal=False,
                  kpm_name=None):
    """torch-convention masks -> _Mask, with clear errors for bad shapes or dtypes."""
    kpm_name = kpm_name or "key_padding_mask"
    causal = bool(is_causal) and attn_mask is None
    bias = None
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype != np.bool_ and m.dtype.kind != "f":
            raise TypeError(f"{name} must be bool (True = not allowed) or float (added), "
                            f"got dtype {m.dtype}")
        if m.shape == (Lq, Lk) and Lq == Lk and _is_subsequent(m):
            causal = True                       # run as the kernel's causal mode, no array
        elif m.shape == (Lq, Lk):
            bias = ops._mask_bias(m, name, "attention")
        elif m.shape == (B * H, Lq, Lk):
            bias = ops._mask_bias(m, name, "attention").reshape(B, H, Lq, Lk)
        else:
            raise ValueError(f"{name} must be (L, S) = ({Lq}, {Lk}) or (B*nhead, L, S) = "
                             f"({B * H}, {Lq}, {Lk}), got {m.shape}")
    key_bias = None
    if key_padding_mask is not None:
        kp = np.asarray(key_padding_mask)
        if kp.dtype != np.bool_ and kp.dtype.kind != "f":
            raise TypeError(f"{kpm_name} must be bool (True = padding) or float (added), "
                            f"got dtype {kp.dtype}")
        if kp.shape != (B, Lk):
            raise ValueError(f"{kpm_name} must be (B, S) = ({B}, {Lk}), got {kp.shape}")
        key_bias = np.ascontiguousarray(ops._mask_bias(kp, kpm_name, "attention")).reshape(-1)
    return _Mask(bias, key_bias, causal)


def generate_square_subsequent_mask(sz):
    """(sz, sz) float mask: 0 on and below the diagonal, -inf above (torch's helper)."""
    return np.triu(np.full((sz, sz), -np.inf, dtype=np.float32), k=1)


# ---- module base: parameters, children, state_dict ---------------------------------------------

class Module:
    """Parameters are float32 arrays named in ``_params``; submodules in ``_children`` (a list
    attribute holds numbered children, as torch's ModuleList)."""

    _params = ()
    _children = ()

    def __init__(self, backend="fast"):
        self.backend = backend
        self._ops = _backend(backend)

    def named_parameters(self, prefix=""):
        for name in self._params:
            value = getattr(self, name)
            if value is not None:
                yield prefix + name, value
        for cname in self._children:
            child = getattr(self, cname)
            if child is None:
                continue
            if isinstance(child, list):
                for i, c in enumerate(child):
                    yield from c.named_parameters(f"{prefix}{cname}.{i}.")
            else:
                yield from child.named_parameters(f"{prefix}{cname}.")

    def modules(self):
        yield self
        for cname in self._children:
            child = getattr(self, cname)
            for c in (child if isinstance(child, list) else [child]):
                if c is not None:
                    yield from c.modules()

    def state_dict(self):
        """{torch key: float32 array}, in torch's order and layouts."""
        return {k: v for k, v in self.named_parameters()}

    def _ignored_keys(self):
        """Keys torch has that are recomputed here rather than loaded."""
        return ()

    def load_state_dict(self, state_dict, strict=True):
        """Copy parameters from a dict of NumPy arrays or torch tensors keyed as in torch.

        strict=True: every missing key, unexpected key and shape mismatch is named in one
        ValueError. strict=False: loads what matches and returns (missing, unexpected); shape
        mismatches are still an error. Tensors are converted without importing torch here.
        """
        if not hasattr(state_dict, "items"):
            raise TypeError(f"load_state_dict: expected a mapping of name -> array, got "
                            f"{type(state_dict).__name__}")
        own = dict(self.named_parameters())
        given = {k: _to_numpy(k, v) for k, v in state_dict.items()}
        ignored = set(self._ignored_keys())
        missing = [k for k in own if k not in given]
        unexpected = [k for k in given if k not in own and k not in ignored]
        mismatched = [f"{k}: expected {own[k].shape}, got {given[k].shape}"
                      for k in own if k in given and given[k].shape != own[k].shape]
        problems = []
        if mismatched:
            problems.append("shape mismatch: " + "; ".join(mismatched))
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        if problems:
            raise ValueError(f"load_state_dict into {type(self).__name__}: "
                             + " | ".join(problems))
        for k, arr in own.items():
            if k in given:
                arr[...] = given[k]                  # in place: shared views stay valid
        for m in self.modules():                     # derived copies (packed decode weights)
            m.__dict__.pop("_packed_cache", None)
        return missing, unexpected

    def to_backend(self, backend):
        """Switch every submodule to `backend` ("fast" or "reference"); returns self."""
        ops_ = _backend(backend)
        for m in self.modules():
            m.backend, m._ops = backend, ops_
        return self

    def parameters_nbytes(self):
        return sum(v.nbytes for _, v in self.named_parameters())


def _to_numpy(key, value):
    if hasattr(value, "detach") and hasattr(value, "cpu"):       # a torch tensor, duck-typed
        value = value.detach().cpu().float().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
        raise TypeError(f"load_state_dict: {key} has non-numeric dtype {arr.dtype}")
    return arr.astype(np.float32)


def _rng(seed):
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _uniform(rng, shape, bound):
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def _xavier(rng, shape):
    fan_out, fan_in = shape
    return _uniform(rng, shape, math.sqrt(6.0 / (fan_in + fan_out)))


def _check_positive(name, value):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_activation(activation):
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
    return activation


def _check_batch_first(batch_first):
    if not batch_first:
        raise ValueError("fastattn modules are always batch-first: batch_first must be True")


def _features(name, x, C):
    """x as float32 (B, L, C) C-contiguous (a copy only when needed)."""
    x = ops._array(x, name, "forward")
    if x.ndim != 3 or x.shape[2] != C:
        raise ValueError(f"{name} must be (B, L, d_model) = (B, L, {C}), got {x.shape}")
    return np.ascontiguousarray(x)


# ---- leaf modules ------------------------------------------------------------------------------

class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features) as in torch."""

    _params = ("weight", "bias")

    def __init__(self, in_features, out_features, bias=True, *, backend="fast", seed=None):
        super().__init__(backend)
        self.in_features = _check_positive("in_features", in_features)
        self.out_features = _check_positive("out_features", out_features)
        rng = _rng(seed)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = _uniform(rng, (out_features, in_features), bound)
        self.bias = _uniform(rng, (out_features,), bound) if bias else None

    def __call__(self, x):
        x = ops._array(x, "x", "Linear")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"Linear: x must be (..., {self.in_features}), got {x.shape}")
        x2 = np.ascontiguousarray(x).reshape(x.size // self.in_features, self.in_features)
        return self._ops.linear(x2, self.weight, self.bias).reshape(
            x.shape[:-1] + (self.out_features,))


class Embedding(Module):
    """Token id -> row of ``weight`` (num_embeddings, embedding_dim)."""

    _params = ("weight",)

    def __init__(self, num_embeddings, embedding_dim, *, backend="fast", seed=None):
        super().__init__(backend)
        self.num_embeddings = _check_positive("num_embeddings", num_embeddings)
        self.embedding_dim = _check_positive("embedding_dim", embedding_dim)
        self.weight = _rng(seed).standard_normal((num_embeddings, embedding_dim)).astype(
            np.float32)

    def __call__(self, ids):
        ids = _token_ids("ids", ids, self.num_embeddings)
        return np.take(self.weight, ids, axis=0)


def _token_ids(name, ids, V):
    a = np.asarray(ids)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer token ids, got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= V):
        bad = a[(a < 0) | (a >= V)].ravel()[0]
        raise ValueError(f"{name}: token id {int(bad)} is out of range for a vocabulary of "
                         f"{V} (ids must be in [0, {V - 1}])")
    return a.astype(np.int64, copy=False)


class LayerNorm(Module):
    """LN over the last axis with elementwise affine weight and bias."""

    _params = ("weight", "bias")

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, *,
                 backend="fast"):
        super().__init__(backend)
        if isinstance(normalized_shape, (tuple, list)):
            if len(normalized_shape) != 1:
                raise ValueError("LayerNorm: only a last-axis normalized_shape is supported, "
                                 f"got {tuple(normalized_shape)}")
            normalized_shape = normalized_shape[0]
        self.normalized_shape = (_check_positive("normalized_shape", normalized_shape),)
        if not (isinstance(eps, numbers.Real) and eps > 0):
            raise ValueError(f"LayerNorm: eps must be positive, got {eps!r}")
        self.eps = float(eps)
        self.weight = np.ones(self.normalized_shape, np.float32) if elementwise_affine else None
        self.bias = (np.zeros(self.normalized_shape, np.float32)
                     if elementwise_affine and bias else None)

    def __call__(self, x, residual=None):
        if self.backend == "fast":
            return ops.layer_norm(x, self.weight, self.bias, eps=self.eps, residual=residual)
        return reference.layer_norm(x, self.weight, self.bias, eps=self.eps, residual=residual)


class PositionalEncoding(Module):
    """Adds the sinusoidal table (recomputed, never loaded) to (B, L, C) embeddings."""

    def __init__(self, d_model, max_len=5000, *, backend="fast"):
        super().__init__(backend)
        self.d_model = _check_positive("d_model", d_model)
        self.max_len = _check_positive("max_len", max_len)
        self.pe = ops.positional_encoding(self.max_len, self.d_model)   # (max_len, C)

    def __call__(self, x, offset=0):
        L = x.shape[1]
        if offset + L > self.max_len:
            raise ValueError(f"PositionalEncoding: positions up to {offset + L} exceed "
                             f"max_len={self.max_len}")
        return x + self.pe[offset:offset + L]


class TokenEmbedding(Module):
    """Embedding scaled by sqrt(d_model), as in the translation tutorial (key: embedding.*)."""

    _children = ("embedding",)

    def __init__(self, vocab_size, emb_size, *, backend="fast", seed=None):
        super().__init__(backend)
        self.embedding = Embedding(vocab_size, emb_size, backend=backend, seed=seed)
        self.emb_size = emb_size

    def __call__(self, ids):
        return self.embedding(ids) * np.float32(math.sqrt(self.emb_size))


# ---- attention ---------------------------------------------------------------------------------

class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention (batch_first=True): packed in_proj_weight (3C, C) rows q|k|v.

    Self-attention (query is key is value) runs one GEMM for q, k and v; cross-attention (key
    is value) one for q and one for k|v; heads are read in place through strides.
    """

    _params = ("in_proj_weight", "in_proj_bias")
    _children = ("out_proj",)

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=True, *,
                 backend="fast", seed=None):
        super().__init__(backend)
        _check_batch_first(batch_first)
        self.embed_dim = _check_positive("embed_dim", embed_dim)
        self.num_heads = _check_positive("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.head_dim = embed_dim // num_heads
        rng = _rng(seed)
        self.in_proj_weight = _xavier(rng, (3 * embed_dim, embed_dim))
        self.in_proj_bias = np.zeros(3 * embed_dim, np.float32) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, backend=backend, seed=rng)
        if bias:
            self.out_proj.bias[...] = 0.0

    # -- the forward used by the layers: validated, masks prepared, buffers given -------------
    def _project(self, x, rows, ws, key):
        """x (B, L, C) @ in_proj_weight[rows].T + bias[rows] -> (B, L, len(rows))."""
        B, L, C = x.shape
        w = self.in_proj_weight[rows]
        b = None if self.in_proj_bias is None else self.in_proj_bias[rows]
        out = ws.get(key, (B * L, w.shape[0]))
        return self._ops.linear(x.reshape(B * L, C), w, b, out=out).reshape(B, L, w.shape[0])

    def _heads(self, x, part, parts):
        """(B, L, parts*C) -> the `part`-th (B, H, L, D) view, no copy."""
        B, L, _ = x.shape
        C, H = self.embed_dim, self.num_heads
        return x.reshape(B, L, parts, H, C // H)[:, :, part].transpose(0, 2, 1, 3)

    def _forward(self, query, memory, mask, ws, self_attention):
        """query (B, Lq, C), memory (B, Lk, C) or None for self-attention -> (B*Lq, C)."""
        B, Lq, C = query.shape
        H = self.num_heads
        if self_attention:
            qkv = self._project(query, slice(0, 3 * C), ws, "qkv")          # (B, Lq, 3C)
            q, k, v = (self._heads(qkv, i, 3) for i in range(3))
        else:
            qp = self._project(query, slice(0, C), ws, "q")                 # (B, Lq, C)
            kv = self._project(memory, slice(C, 3 * C), ws, "kv")           # (B, Lk, 2C)
            q = self._heads(qp, 0, 1)
            k, v = self._heads(kv, 0, 2), self._heads(kv, 1, 2)
        ctx = ws.get("ctx", (B, Lq, H, C // H))                              # (B, Lq, H, D)
        ctx_v = None if ctx is None else ctx.transpose(0, 2, 1, 3)
        ctx_v = self._ops.attention(q, k, v, mask, out=ctx_v)               # (B, H, Lq, D)
        ctx = ctx_v.transpose(0, 2, 1, 3).reshape(B * Lq, C)                # view when fast
        return self._ops.linear(ctx, self.out_proj.weight, self.out_proj.bias,
                                out=ws.get("proj", (B * Lq, C)))

    def __call__(self, query, key, value, key_padding_mask=None, need_weights=True,
                 attn_mask=None, average_attn_weights=True, is_causal=False):
        """-> (attn_output (B, L, C), attn_weights (B, L, S) averaged over heads, or
        (B, H, L, S), or None when need_weights=False), as torch returns them."""
        C = self.embed_dim
        q = _features("query", query, C)
        k = q if key is query else _features("key", key, C)
        v = k if value is key else _features("value", value, C)
        B, L, _ = q.shape
        S = k.shape[1]
        if k.shape[0] != B or v.shape[:2] != (B, S):
            raise ValueError(f"MultiheadAttention: key {k.shape} and value {v.shape} must be "
                             f"(B, S, C) with B = {B} from query {q.shape}")
        if B == 0:
            w = np.zeros((B, L, S) if average_attn_weights else (B, self.num_heads, L, S),
                         np.float32)
            return np.zeros((B, L, C), np.float32), (w if need_weights else None)
        mask = _prepare_mask("attn_mask", attn_mask, key_padding_mask, B, self.num_heads, L, S,
                             is_causal)
        ws = _Workspace(self._ops)
        if need_weights or value is not key:
            return self._general(q, k, v, mask, need_weights, average_attn_weights, ws)
        out = self._forward(q, None if key is query else k, mask, ws, key is query)
        return out.reshape(B, L, C), None

    def _general(self, q, k, v, mask, need_weights, average, ws):
        """Separate q, k, v projections, and the weights when asked (torch's slow path)."""
        C, H = self.embed_dim, self.num_heads
        B, L, _ = q.shape
        S = k.shape[1]
        heads = []
        for i, x in enumerate((q, k, v)):
            rows = slice(i * C, (i + 1) * C)
            b = None if self.in_proj_bias is None else self.in_proj_bias[rows]
            p = self._ops.linear(x.reshape(B * x.shape[1], C), self.in_proj_weight[rows], b)
            heads.append(p.reshape(B, x.shape[1], H, C // H).transpose(0, 2, 1, 3))
        kpm = None if mask.key_bias is None else mask.key_bias.reshape(B, S)
        F = ops if self.backend == "fast" else reference
        ctx, w = F.attention(*heads, mask=mask.bias, key_padding_mask=kpm, causal=mask.causal,
                             return_weights=True)
        ctx = np.ascontiguousarray(ctx.transpose(0, 2, 1, 3)).reshape(B * L, C)
        out = self._ops.linear(ctx, self.out_proj.weight, self.out_proj.bias).reshape(B, L, C)
        if not need_weights:
            return out, None
        return out, (w.mean(axis=1) if average else w)


class _Workspace:
    """Activation buffers of one forward pass, reused by every layer (fast backend only)."""

    def __init__(self, ops_):
        self.fast = ops_ is _FastOps
        self.bufs = {}

    def get(self, key, shape):
        if not self.fast:
            return None
        buf = self.bufs.get(key)
        size = int(np.prod(shape))
        if buf is None or buf.size < size:
            buf = self.bufs[key] = np.empty(size, np.float32)
        return buf[:size].reshape(shape)


# ---- layers ------------------------------------------------------------------------------------

def _encoder_call(module, src, mask, key_padding_mask, is_causal, mask_name):
    """The public forward shared by an encoder layer and an encoder stack: (B, S, C) in/out."""
    x = _features("src", src, module.d_model)
    B, S, C = x.shape
    if B == 0:
        return np.zeros((B, S, C), np.float32)
    m = _prepare_mask(mask_name, mask, key_padding_mask, B, module.nhead, S, S, is_causal,
                      "src_key_padding_mask")
    ws = _Workspace(module._ops)
    return module._forward(_stream(x, ws), m, ws, B).reshape(B, S, C).copy()


def _decoder_masks(H, B, T, S, tgt_mask, memory_mask, tgt_key_padding_mask,
                   memory_key_padding_mask, tgt_is_causal, memory_is_causal):
    """The decoder's two prepared masks: (self-attention over the target, cross-attention)."""
    tm = _prepare_mask("tgt_mask", tgt_mask, tgt_key_padding_mask, B, H, T, T, tgt_is_causal,
                       "tgt_key_padding_mask")
    mm = _prepare_mask("memory_mask", memory_mask, memory_key_padding_mask, B, H, T, S,
                       memory_is_causal, "memory_key_padding_mask")
    return tm, mm


def _decoder_call(module, tgt, memory, tgt_mask=None, memory_mask=None,
                  tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
                  memory_is_causal=False):
    """The public forward shared by a decoder layer and a decoder stack: (B, T, C) out."""
    x = _features("tgt", tgt, module.d_model)
    mem = _features("memory", memory, module.d_model)
    B, T, C = x.shape
    _check_batch("memory", mem, B)
    if B == 0:
        return np.zeros((B, T, C), np.float32)
    tm, mm = _decoder_masks(module.nhead, B, T, mem.shape[1], tgt_mask, memory_mask,
                            tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                            memory_is_causal)
    ws = _Workspace(module._ops)
    return module._forward(_stream(x, ws), mem, tm, mm, ws, B).reshape(B, T, C).copy()


def _final_norm(stack, x, ws):
    """The optional LayerNorm closing an encoder or decoder stack, over the stream x (N, C)."""
    n = stack.norm
    if n is None:
        return x
    return stack._ops.add_norm(x, None, n.weight, n.bias, n.eps, out=_inplace(x, ws))

class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention and FFN, each with add & norm
    (post-LN: x = norm(x + f(x)); norm_first: x = x + f(norm(x)))."""

    _children = ("self_attn", "linear1", "linear2", "norm1", "norm2")

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True, *,
                 backend="fast", seed=None):
        super().__init__(backend)
        _check_batch_first(batch_first)
        rng = _rng(seed)
        self.d_model, self.nhead = d_model, nhead
        self.activation = _check_activation(activation)
        self.norm_first = bool(norm_first)
        self.self_attn = MultiheadAttention(d_model, nhead, bias=bias, backend=backend, seed=rng)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, backend=backend, seed=rng)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, backend=backend, seed=rng)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)

    def _ffn(self, h, ws):
        return self._ops.ffn(h, self.linear1.weight, self.linear1.bias, self.linear2.weight,
                             self.linear2.bias, self.activation, out=ws.get("ff", h.shape))

    def _sublayer(self, x, norm, f, ws):
        """One residual block on the (N, C) stream x, in place when fast: x <- block(x)."""
        o = self._ops
        if self.norm_first:
            h = o.add_norm(x, None, norm.weight, norm.bias, norm.eps, out=ws.get("h", x.shape))
            y = f(h)
            return _add_into(x, y, ws)
        y = f(x)
        return o.add_norm(y, x, norm.weight, norm.bias, norm.eps, out=_inplace(x, ws))

    def _forward(self, x, mask, ws, B):
        """x (N, C) stream owned by the caller (overwritten when fast) -> (N, C)."""
        C = self.d_model
        L = x.shape[0] // B
        sa = lambda h: self.self_attn._forward(h.reshape(B, L, C), None, mask, ws, True)
        x = self._sublayer(x, self.norm1, sa, ws)
        return self._sublayer(x, self.norm2, lambda h: self._ffn(h, ws), ws)

    def __call__(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        return _encoder_call(self, src, src_mask, src_key_padding_mask, is_causal, "src_mask")


class TransformerDecoderLayer(TransformerEncoderLayer):
    """torch.nn.TransformerDecoderLayer: masked self-attention, cross-attention over the
    encoder's memory, FFN; each with add & norm."""

    _children = ("self_attn", "multihead_attn", "linear1", "linear2", "norm1", "norm2",
                 "norm3")

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True, *,
                 backend="fast", seed=None):
        rng = _rng(seed)
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                         batch_first, norm_first, bias, backend=backend, seed=rng)
        self.multihead_attn = MultiheadAttention(d_model, nhead, bias=bias, backend=backend,
                                                 seed=rng)
        self.norm3 = LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)

    def _forward(self, x, memory, tgt_mask, memory_mask, ws, B):
        C = self.d_model
        T = x.shape[0] // B
        sa = lambda h: self.self_attn._forward(h.reshape(B, T, C), None, tgt_mask, ws, True)
        ca = lambda h: self.multihead_attn._forward(h.reshape(B, T, C), memory, memory_mask,
                                                    ws, False)
        x = self._sublayer(x, self.norm1, sa, ws)
        x = self._sublayer(x, self.norm2, ca, ws)
        return self._sublayer(x, self.norm3, lambda h: self._ffn(h, ws), ws)

    __call__ = _decoder_call


def _check_batch(name, x, B):
    if x.shape[0] != B:
        raise ValueError(f"{name} has batch {x.shape[0]} but the input has batch {B} "
                         f"(shapes {x.shape})")


def _stream(x, ws):
    """The residual stream (N, C): a workspace copy of x when fast (updated in place)."""
    B, L, C = x.shape
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


# ---- stacks ------------------------------------------------------------------------------------

class _Stack(Module):
    """num_layers copies of a layer (torch deep-copies it too), then an optional final
    LayerNorm (``norm``)."""

    _children = ("layers", "norm")

    def __init__(self, layer, num_layers, norm=None, *, backend=None):
        super().__init__(backend or layer.backend)
        self.num_layers = _check_positive("num_layers", num_layers)
        self.layers = [copy.deepcopy(layer) for _ in range(num_layers)]
        self.norm = norm
        self.d_model, self.nhead = layer.d_model, layer.nhead
        self.to_backend(self.backend)


class TransformerEncoder(_Stack):
    """torch.nn.TransformerEncoder(encoder_layer, num_layers, norm=None)."""

    def _forward(self, x, mask, ws, B):
        for layer in self.layers:
            x = layer._forward(x, mask, ws, B)
        return _final_norm(self, x, ws)

    def __call__(self, src, mask=None, src_key_padding_mask=None, is_causal=False):
        return _encoder_call(self, src, mask, src_key_padding_mask, is_causal, "mask")


class TransformerDecoder(_Stack):
    """torch.nn.TransformerDecoder(decoder_layer, num_layers, norm=None)."""

    def _forward(self, x, memory, tgt_mask, memory_mask, ws, B):
        for layer in self.layers:
            x = layer._forward(x, memory, tgt_mask, memory_mask, ws, B)
        return _final_norm(self, x, ws)

    __call__ = _decoder_call


class Transformer(Module):
    """torch.nn.Transformer (batch-first): encoder and decoder stacks, each ending in a
    LayerNorm as torch builds them (so a post-LN model has two norms in a row at the end)."""

    _children = ("encoder", "decoder")

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=True, norm_first=False,
                 bias=True, *, backend="fast", seed=None):
        super().__init__(backend)
        _check_batch_first(batch_first)
        if custom_encoder is not None or custom_decoder is not None:
            raise ValueError("Transformer: custom_encoder/custom_decoder are not supported")
        self.d_model = _check_positive("d_model", d_model)
        self.nhead = _check_positive("nhead", nhead)
        if d_model % nhead:
            raise ValueError(f"d_model {d_model} must be divisible by nhead {nhead}")
        self.config = dict(d_model=d_model, nhead=nhead, num_encoder_layers=num_encoder_layers,
                           num_decoder_layers=num_decoder_layers,
                           dim_feedforward=dim_feedforward, activation=activation,
                           layer_norm_eps=layer_norm_eps, norm_first=bool(norm_first),
                           bias=bool(bias))
        rng = _rng(seed)
        kw = dict(dim_feedforward=dim_feedforward, activation=activation,
                  layer_norm_eps=layer_norm_eps, norm_first=norm_first, bias=bias,
                  backend=backend)
        enc = TransformerEncoderLayer(d_model, nhead, seed=rng, **kw)
        dec = TransformerDecoderLayer(d_model, nhead, seed=rng, **kw)
        norm = lambda: LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)  # noqa
        self.encoder = TransformerEncoder(enc, num_encoder_layers, norm())
        self.decoder = TransformerDecoder(dec, num_decoder_layers, norm())
        for name, p in self.named_parameters():        # torch's _reset_parameters: xavier
            if p.ndim > 1:
                p[...] = _xavier(rng, p.shape)

    def __call__(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                 src_key_padding_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=False,
                 memory_is_causal=False):
        """src (B, S, C), tgt (B, T, C) -> (B, T, C)."""
        x = _features("src", src, self.d_model)
        y = _features("tgt", tgt, self.d_model)
        B, S, C = x.shape
        _check_batch("tgt", y, B)
        T = y.shape[1]
        if B == 0:
            return np.zeros((B, T, C), np.float32)
        H = self.nhead
        sm = _prepare_mask("src_mask", src_mask, src_key_padding_mask, B, H, S, S,
                           bool(src_is_causal), "src_key_padding_mask")
        tm, mm = _decoder_masks(H, B, T, S, tgt_mask, memory_mask, tgt_key_padding_mask,
                                memory_key_padding_mask, tgt_is_causal, memory_is_causal)
        ws = _Workspace(self._ops)
        memory = self.encoder._forward(_stream(x, ws), sm, ws, B).reshape(B, S, C)
        mem_ws = _Workspace(self._ops)           # memory lives on while the decoder runs
        out = self.decoder._forward(_stream(y, mem_ws), memory, tm, mm, mem_ws, B)
        return out.reshape(B, T, C).copy()

    @staticmethod
    def generate_square_subsequent_mask(sz):
        return generate_square_subsequent_mask(sz)


# ---- the translation model ---------------------------------------------------------------------

class Seq2SeqTransformer(Module):
    """The encoder-decoder of PyTorch's "Language Translation with nn.Transformer" tutorial,
    batch-first: keys transformer.*, src_tok_emb.embedding.weight, tgt_tok_emb.embedding.weight,
    generator.weight / generator.bias. Its positional table is recomputed (the tutorial's
    ``positional_encoding.pos_embedding`` buffer is accepted and ignored when loading).

    Token ids are int arrays (B, L). With ``pad_id`` set, padding masks are derived from the ids
    wherever a mask is not given.
    """

    _children = ("transformer", "generator", "src_tok_emb", "tgt_tok_emb")

    def __init__(self, num_encoder_layers, num_decoder_layers, emb_size, nhead, src_vocab_size,
                 tgt_vocab_size, dim_feedforward=512, dropout=0.1, *, activation="relu",
                 norm_first=False, layer_norm_eps=1e-5, pad_id=None, max_len=5000,
                 backend="fast", seed=None):
        super().__init__(backend)
        rng = _rng(seed)
        self.config = dict(num_encoder_layers=num_encoder_layers,
                           num_decoder_layers=num_decoder_layers, emb_size=emb_size,
                           nhead=nhead, src_vocab_size=src_vocab_size,
                           tgt_vocab_size=tgt_vocab_size, dim_feedforward=dim_feedforward,
                           activation=activation, norm_first=bool(norm_first),
                           layer_norm_eps=layer_norm_eps, pad_id=pad_id, max_len=max_len)
        self.transformer = Transformer(emb_size, nhead, num_encoder_layers, num_decoder_layers,
                                       dim_feedforward, activation=activation,
                                       layer_norm_eps=layer_norm_eps, norm_first=norm_first,
                                       backend=backend, seed=rng)
        self.generator = Linear(emb_size, tgt_vocab_size, backend=backend, seed=rng)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size, backend=backend, seed=rng)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size, backend=backend, seed=rng)
        self.positional_encoding = PositionalEncoding(emb_size, max_len, backend=backend)
        self.pad_id = pad_id
        self.emb_size = emb_size

    def _ignored_keys(self):
        return ("positional_encoding.pos_embedding",)

    def _padding(self, ids, given):
        if given is not None or self.pad_id is None:
            return given
        return np.asarray(ids) == self.pad_id

    def _embed(self, emb, name, ids):
        ids = _token_ids(name, ids, emb.embedding.num_embeddings)
        if ids.ndim != 2:
            raise ValueError(f"{name} must be (B, L) token ids, got shape {ids.shape}")
        return self.positional_encoding(emb(ids))           # (B, L, C) * sqrt(C) + pe

    def encode(self, src_ids, src_key_padding_mask=None, src_mask=None):
        """src_ids (B, S) -> memory (B, S, C)."""
        x = self._embed(self.src_tok_emb, "src_ids", src_ids)
        B, S, C = x.shape
        if B == 0:
            return np.zeros((B, S, C), np.float32)
        m = _prepare_mask("src_mask", src_mask, self._padding(src_ids, src_key_padding_mask),
                          B, self.transformer.nhead, S, S, False, "src_key_padding_mask")
        ws = _Workspace(self._ops)
        mem = self.transformer.encoder._forward(_stream(x, ws), m, ws, B)
        return mem.reshape(B, S, C).copy()

    def decode(self, tgt_ids, memory, tgt_mask=None, memory_key_padding_mask=None,
               tgt_key_padding_mask=None, tgt_is_causal=True):
        """tgt_ids (B, T), memory (B, S, C) -> hidden (B, T, C); causal target by default."""
        y = self._embed(self.tgt_tok_emb, "tgt_ids", tgt_ids)
        mem = _features("memory", memory, self.emb_size)
        B, T, C = y.shape
        _check_batch("memory", mem, B)
        if B == 0:
            return np.zeros((B, T, C), np.float32)
        tm, mm = _decoder_masks(self.transformer.nhead, B, T, mem.shape[1], tgt_mask, None,
                                self._padding(tgt_ids, tgt_key_padding_mask),
                                memory_key_padding_mask, tgt_is_causal, False)
        ws = _Workspace(self._ops)
        out = self.transformer.decoder._forward(_stream(y, ws), mem, tm, mm, ws, B)
        return out.reshape(B, T, C).copy()

    def generate(self, src_ids, *, max_new_tokens, start_id, end_id=None, pad_id=0,
                 src_key_padding_mask=None, method="greedy", beam_size=4, length_penalty=1.0,
                 temperature=1.0, top_k=None, top_p=None, seed=None):
        """Generate target ids (B, T) int64 from src_ids (B, S): greedy, beam or sample, with a
        KV cache on the fast backend. See fastattn.generate for the exact rules."""
        from .generate import generate
        return generate(self, src_ids, max_new_tokens=max_new_tokens, start_id=start_id,
                        end_id=end_id, pad_id=pad_id,
                        src_key_padding_mask=src_key_padding_mask, method=method,
                        beam_size=beam_size, length_penalty=length_penalty,
                        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)

    def translate(self, texts, src_tokenizer, tgt_tokenizer, **generate_kwargs):
        """Text in, text out: encode `texts` with src_tokenizer (with <start>/<end> when it has
        them), generate, decode with tgt_tokenizer (specials dropped). generate_kwargs go to
        generate(); start_id, end_id and pad_id default to tgt_tokenizer's specials."""
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
        ids, kpm = s.encode_batch(
            texts, add_start_end=s.start_id is not None and s.end_id is not None)
        out = self.generate(ids, src_key_padding_mask=kpm, **kw)
        return [tgt_tokenizer.decode(row.tolist()) for row in out]

    def __call__(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None,
                 src_key_padding_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, tgt_is_causal=True):
        """-> logits (B, T, tgt_vocab_size). Padding masks come from pad_id when not given;
        the memory padding mask defaults to the source padding mask."""
        src_pad = self._padding(src_ids, src_key_padding_mask)
        if memory_key_padding_mask is None:
            memory_key_padding_mask = src_pad
        memory = self.encode(src_ids, src_pad, src_mask)
        hidden = self.decode(tgt_ids, memory, tgt_mask, memory_key_padding_mask,
                             tgt_key_padding_mask, tgt_is_causal)
        return self.generator(hidden)
