"""Leaf modules: Linear, Embedding, LayerNorm, PositionalEncoding, TokenEmbedding."""
import math
import numbers

import numpy as np

from .. import ops
from .module import (Module, check_dropout, check_positive, contiguous, rng_from, token_ids,
                     uniform)


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
        y = self._apply(x2, self._workspace())
        if self.training:
            self._saved = (self._saved, x.shape)
        return y.reshape(x.shape[:-1] + (self.out_features,))

    def backward(self, grad_output):
        """After a training-mode forward: accumulates weight.grad / bias.grad (named_grads())
        and returns the gradient of the input, shaped like it."""
        saved, shape = self._check_saved()
        self._saved = saved
        dy = contiguous(ops._array(grad_output, "grad_output", "Linear.backward"))
        if dy.shape != shape[:-1] + (self.out_features,):
            raise ValueError(f"Linear.backward: grad_output must be "
                             f"{shape[:-1] + (self.out_features,)}, got {dy.shape}")
        return self._backward(dy.reshape(-1, self.out_features)).reshape(shape)

    def _apply(self, x, ws, key=None, activation=None):
        """x (N, in) -> (N, out) inside a model pass: into workspace buffer `key` when given,
        through the packed weight in a decode step; kept for _backward in training."""
        if ws.training:
            y, pre = self._ops.linear_train(x, self.weight, self.bias, activation)
            self._saved = (x, pre, activation)
            return y
        return self._ops.linear(x, self.weight, self.bias, activation,
                                out=None if key is None else ws.get(key, (x.shape[0],
                                                                          self.out_features)),
                                packed=self._decode_weight(ws))

    def _backward(self, dy):
        """dy (N, out) -> dx (N, in), accumulating the parameter gradients."""
        x, pre, activation = self._check_saved()
        return self._ops.linear_backward(dy, x, self.weight, pre, activation,
                                         self._grad("weight"),
                                         None if self.bias is None else self._grad("bias"))

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
        if self.training:
            self._saved = ids
        return np.take(self.weight, ids, axis=0)

    def backward(self, grad_output):
        """After a training-mode forward: accumulates weight's gradient (the rows of
        grad_output added to the rows of the ids used, deterministically). Returns None."""
        ids = self._check_saved()
        d = contiguous(ops._array(grad_output, "grad_output", "Embedding.backward"))
        if d.shape != ids.shape + (self.embedding_dim,):
            raise ValueError(f"Embedding.backward: grad_output must be "
                             f"{ids.shape + (self.embedding_dim,)}, got {d.shape}")
        self._ops.embedding_backward(d, ids, self._grad("weight"))


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
        y = self._apply(x.reshape(-1, C), residual, training=self.training)
        if self.training:
            self._saved = (self._saved, x.shape)
        return y.reshape(x.shape)

    def backward(self, grad_output):
        """After a training-mode forward: accumulates weight/bias gradients and returns the
        gradient of x, which is also the gradient of the residual when one was given."""
        saved, shape = self._check_saved()
        self._saved = saved
        dy = contiguous(ops._array(grad_output, "grad_output", "LayerNorm.backward"))
        if dy.shape != shape:
            raise ValueError(f"LayerNorm.backward: grad_output must be {shape}, got {dy.shape}")
        return self._backward(dy.reshape(-1, shape[-1])).reshape(shape)

    def _apply(self, x, residual=None, out=None, training=False):
        """LN(x + residual) of (N, C) rows inside a model pass; out may alias x or residual
        (inference). Training keeps x, residual and the statistics for _backward."""
        if training:
            y, mean, rstd = self._ops.add_norm_train(x, residual, self.weight, self.bias,
                                                     self.eps)
            self._saved = (x, residual, mean, rstd)
            return y
        return self._ops.add_norm(x, residual, self.weight, self.bias, self.eps, out=out)

    def _backward(self, dy):
        """dy (N, C) -> the gradient of x (= of residual), accumulating weight/bias grads."""
        x, residual, mean, rstd = self._check_saved()
        return self._ops.add_norm_backward(
            dy, x, residual, mean, rstd, self.weight,
            None if self.weight is None else self._grad("weight"),
            None if self.bias is None else self._grad("bias"))


class PositionalEncoding(Module):
    """Adds the sinusoidal table (recomputed, never loaded) to (B, L, C) embeddings, then
    dropout in training (as the translation tutorial's PositionalEncoding)."""

    def __init__(self, d_model, max_len=5000, *, dropout=0.0, backend="fast"):
        super().__init__(backend)
        self.d_model = check_positive("d_model", d_model)
        self.max_len = check_positive("max_len", max_len)
        self.dropout = check_dropout(dropout)
        self.pe = ops.positional_encoding(self.max_len, self.d_model)   # (max_len, C)

    def __call__(self, x, offset=0):
        """x (B, L, C) + the table's rows offset .. offset + L - 1."""
        return self._apply(x, offset, self._workspace())

    def _apply(self, x, offset, ws):
        L = x.shape[1]
        if offset + L > self.max_len:
            raise ValueError(f"PositionalEncoding: positions up to {offset + L} exceed "
                             f"max_len={self.max_len}")
        y, seed = self._dropout(x + self.pe[offset:offset + L], self.dropout, ws)
        if ws.training:
            self._saved = seed
        return y

    def backward(self, grad_output):
        """The gradient of x (the table is constant): dropout's backward."""
        return self._dropout_backward(np.asarray(grad_output, np.float32), self.dropout,
                                      self._check_saved())


class TokenEmbedding(Module):
    """Embedding scaled by sqrt(d_model), as in the translation tutorial (key: embedding.*)."""

    _children = ("embedding",)

    def __init__(self, vocab_size, emb_size, *, backend="fast", seed=None):
        super().__init__(backend)
        self.embedding = Embedding(vocab_size, emb_size, backend=backend, seed=seed)
        self.emb_size = emb_size

    def __call__(self, ids):
        return self.embedding(ids) * np.float32(math.sqrt(self.emb_size))

    def backward(self, grad_output):
        """Accumulates the embedding's gradient; returns None."""
        self.embedding.backward(np.asarray(grad_output, np.float32)
                                * np.float32(math.sqrt(self.emb_size)))
