"""Leaf modules: Linear, Embedding, LayerNorm, PositionalEncoding, TokenEmbedding."""
import math
import numbers

import numpy as np

from .. import ops
from .module import Module, check_positive, contiguous, rng_from, token_ids, uniform


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features) as in torch."""

    _params = ("weight", "bias")

    def __init__(self, in_features, out_features, bias=True, *, backend="fast", seed=None):
        super().__init__(backend)
        self.in_features = check_positive("in_features", in_features)
        self.out_features = check_positive("out_features", out_features)
        rng = rng_from(seed)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = uniform(rng, (out_features, in_features), bound)
        self.bias = uniform(rng, (out_features,), bound) if bias else None

    def __call__(self, x):
        x = ops._array(x, "x", "Linear")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"Linear: x must be (..., {self.in_features}), got {x.shape}")
        x2 = contiguous(x).reshape(x.size // self.in_features, self.in_features)
        return self._ops.linear(x2, self.weight, self.bias).reshape(
            x.shape[:-1] + (self.out_features,))

    def _apply(self, x, ws, key=None, activation=None):
        """x (N, in) -> (N, out) inside a model pass: into workspace buffer `key` when given,
        through the packed weight in a decode step."""
        return self._ops.linear(x, self.weight, self.bias, activation,
                                out=None if key is None else ws.get(key, (x.shape[0],
                                                                          self.out_features)),
                                packed=self._decode_weight(ws))

    def _decode_weight(self, ws):
        return self._packed("weight", self.weight) if ws.decode else None


class Embedding(Module):
    """Token id -> row of ``weight`` (num_embeddings, embedding_dim)."""

    _params = ("weight",)

    def __init__(self, num_embeddings, embedding_dim, *, backend="fast", seed=None):
        super().__init__(backend)
        self.num_embeddings = check_positive("num_embeddings", num_embeddings)
        self.embedding_dim = check_positive("embedding_dim", embedding_dim)
        self.weight = rng_from(seed).standard_normal((num_embeddings, embedding_dim)).astype(
            np.float32)

    def __call__(self, ids):
        ids = token_ids("ids", ids, self.num_embeddings)
        return np.take(self.weight, ids, axis=0)


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
        self.normalized_shape = (check_positive("normalized_shape", normalized_shape),)
        if not (isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps > 0
                and math.isfinite(eps) and np.float32(eps) > 0):
            raise ValueError(f"LayerNorm: eps must be positive and finite in float32, "
                             f"got {eps!r}")
        self.eps = float(eps)
        self.weight = np.ones(self.normalized_shape, np.float32) if elementwise_affine else None
        self.bias = (np.zeros(self.normalized_shape, np.float32)
                     if elementwise_affine and bias else None)

    def __call__(self, x, residual=None):
        """LN(x + residual) over the last axis; x and residual (..., C)."""
        C = self.normalized_shape[0]
        x = contiguous(ops._array(x, "x", "LayerNorm"))
        if x.ndim == 0 or x.shape[-1] != C:
            raise ValueError(f"LayerNorm: x must be (..., {C}), got {x.shape}")
        if residual is not None:
            residual = contiguous(ops._array(residual, "residual", "LayerNorm"))
            if residual.shape != x.shape:
                raise ValueError(f"LayerNorm: residual must have the shape of x {x.shape}, "
                                 f"got {residual.shape}")
            residual = residual.reshape(-1, C)
        return self._apply(x.reshape(-1, C), residual).reshape(x.shape)

    def _apply(self, x, residual=None, out=None):
        """LN(x + residual) of (N, C) rows inside a model pass; out may alias x or residual."""
        return self._ops.add_norm(x, residual, self.weight, self.bias, self.eps, out=out)


class PositionalEncoding(Module):
    """Adds the sinusoidal table (recomputed, never loaded) to (B, L, C) embeddings."""

    def __init__(self, d_model, max_len=5000, *, backend="fast"):
        super().__init__(backend)
        self.d_model = check_positive("d_model", d_model)
        self.max_len = check_positive("max_len", max_len)
        self.pe = ops.positional_encoding(self.max_len, self.d_model)   # (max_len, C)

    def __call__(self, x, offset=0):
        """x (B, L, C) + the table's rows offset .. offset + L - 1."""
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
