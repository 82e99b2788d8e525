"""Leaf modules: Linear, Embedding, LayerNorm, PositionalEncoding, TokenEmbedding."""
import math
import numbers

import numpy as np

from .. import _convert, ops
from . import positions
from ..ops import ACTIVATIONS
from .backends import Workspace, _put
from .saved import LinearSaved, NormSaved, PositionsSaved, PublicSaved
from .module import (Module, check_dropout, check_positive, contiguous, rng_from, token_ids,
                     uniform)


class Linear(Module):
    """torch.nn.Linear: y = x @ weight.T + bias; weight (out_features, in_features) as in torch.

    Weight and bias are drawn from U(-1/sqrt(in_features), 1/sqrt(in_features)), as torch's.

    Args:
        in_features: the input's last axis.
        out_features: the output's last axis.
        bias: whether the layer has a bias (default True).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
        seed: the initialisation's seed, or a numpy Generator; None (the default) draws a
            fresh one.
    """

    _params = ("weight", "bias")
    _quantizable = ("weight",)

    def __init__(self, in_features, out_features, bias=True, *, backend="fast", seed=None):
        super().__init__(backend)
        self.in_features = check_positive("in_features", in_features)
        self.out_features = check_positive("out_features", out_features)
        rng = rng_from(seed)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = uniform(rng, (out_features, in_features), bound)
        self.bias = uniform(rng, (out_features,), bound) if bias else None

    def __call__(self, x):
        x = _convert.array(x, "x", "Linear")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"Linear: x must be (..., {self.in_features}), got {x.shape}")
        x2 = contiguous(x).reshape(x.size // self.in_features, self.in_features)
        if self.training:
            y, saved = self._forward_train(x2)
            self._saved = PublicSaved(saved, (x.shape,), None)
            y = y.copy()                      # the training buffer is the next step's
        else:
            y = self._apply(x2, self._workspace())
        return y.reshape(x.shape[:-1] + (self.out_features,))

    def backward(self, grad_output):
        """Backward after a training-mode forward: accumulates the weight and bias gradients.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            The gradient of the input, shaped like it (the gradients are in `named_grads()`).
        """
        public = self._check_saved()
        shape = public.shapes[0]
        dy = contiguous(_convert.array(grad_output, "grad_output", "Linear.backward"))
        if dy.shape != shape[:-1] + (self.out_features,):
            self._saved = public              # still there for a right-shaped gradient
            raise ValueError(f"Linear.backward: grad_output must be "
                             f"{shape[:-1] + (self.out_features,)}, got {dy.shape}")
        dx = np.empty((dy.size // self.out_features, self.in_features), np.float32)
        return self._backward(dy.reshape(-1, self.out_features), public.record,
                              dx).reshape(shape)

    def _forward_train(self, x, activation=None):
        """x (N, in) -> (y (N, out), LinearSaved) in a training pass, into this layer's
        buffers; x is kept (the caller leaves it unchanged until the backward)."""
        b = self._bufs()
        shape = (x.shape[0], self.out_features)
        pre = b.get("pre", shape) if activation else None
        y = self._kind("weight").train_forward(x, self.bias, ACTIVATIONS[activation],
                                               b.get("y", shape), pre)
        return y, LinearSaved(x, pre, activation)

    def _apply(self, x, ws, key=None, activation=None):
        """x (N, in) -> (N, out) inside an inference pass: into workspace buffer `key` when
        given."""
        out = None if key is None else ws.get(key, (x.shape[0], self.out_features))
        return self._linear(self._kind("weight"), x, self.bias, activation, out)

    def _backward(self, dy, saved, dx):
        """dy (N, out) and the forward's LinearSaved -> dx (N, in) (the buffer given),
        accumulating the parameter gradients."""
        return self._kind("weight").train_backward(
            dy, saved.x, saved.pre, ACTIVATIONS[saved.activation], self._grad("weight"),
            None if self.bias is None else self._grad("bias"), dx)

    def _step_fn(self, rows, activation=None):
        """This layer's product for a decode step of `rows` rows, planned: f(x, y) -> y, with
        the weight in its decode kind (packed panels for float32 on the fast backend). A
        subclass that overrides _apply gets its _apply called instead."""
        if type(self)._apply is not Linear._apply:
            return lambda x, y: _put(y, self._apply(x, Workspace(self._ops), None, activation))
        return self._decode_weight("weight").product(self.bias, ACTIVATIONS[activation], rows)


class Embedding(Module):
    """torch.nn.Embedding: token id -> row of `weight` (num_embeddings, embedding_dim).

    The weight is drawn from N(0, 1), as torch's.

    Args:
        num_embeddings: the vocabulary size.
        embedding_dim: the row width.
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
        seed: the initialisation's seed, or a numpy Generator; None (the default) draws a
            fresh one.
    """

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
        """Backward after a training-mode forward: accumulates the weight's gradient.

        The rows of grad_output are added to the rows of the ids used, deterministically.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            None (ids have no gradient).
        """
        ids = self._check_saved()
        d = contiguous(_convert.array(grad_output, "grad_output", "Embedding.backward"))
        if d.shape != ids.shape + (self.embedding_dim,):
            raise ValueError(f"Embedding.backward: grad_output must be "
                             f"{ids.shape + (self.embedding_dim,)}, got {d.shape}")
        self._accumulate(d.reshape(-1, self.embedding_dim), np.ascontiguousarray(ids).ravel())

    def _accumulate(self, d, ids):
        """weight's gradient += the rows of d (N, C) scattered to ids (N,) int64."""
        self._ops.embedding_backward(d, ids, self._grad("weight"))


class LayerNorm(Module):
    """torch.nn.LayerNorm over the last axis, with elementwise affine weight and bias.

    Args:
        normalized_shape: the last axis's size (an int, or a one-element tuple or list).
        eps: added to the variance; positive and finite in float32 (default 1e-5).
        elementwise_affine: whether the layer has a weight (and a bias), default True.
        bias: whether the layer has a bias when affine (default True).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
    """

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
        x = contiguous(_convert.array(x, "x", "LayerNorm"))
        if x.ndim == 0 or x.shape[-1] != C:
            raise ValueError(f"LayerNorm: x must be (..., {C}), got {x.shape}")
        if residual is not None:
            residual = contiguous(_convert.array(residual, "residual", "LayerNorm"))
            if residual.shape != x.shape:
                raise ValueError(f"LayerNorm: residual must have the shape of x {x.shape}, "
                                 f"got {residual.shape}")
            residual = residual.reshape(-1, C)
        if self.training:
            y, saved = self._forward_train(x.reshape(-1, C), residual)
            self._saved = PublicSaved(saved, (x.shape,), None)
            y = y.copy()
        else:
            y = self._apply(x.reshape(-1, C), residual)
        return y.reshape(x.shape)

    def backward(self, grad_output):
        """Backward after a training-mode forward: accumulates the weight and bias gradients.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            The gradient of x, which is also the gradient of the residual when one was given.
        """
        public = self._check_saved()
        shape = public.shapes[0]
        dy = contiguous(_convert.array(grad_output, "grad_output", "LayerNorm.backward"))
        if dy.shape != shape:
            self._saved = public
            raise ValueError(f"LayerNorm.backward: grad_output must be {shape}, got {dy.shape}")
        return self._backward(dy.reshape(-1, shape[-1]), public.record,
                              np.empty((dy.size // shape[-1], shape[-1]), np.float32)
                              ).reshape(shape)

    def _apply(self, x, residual=None, out=None):
        """LN(x + residual) of (N, C) rows inside an inference pass; out may alias x or
        residual."""
        return self._ops.add_norm(x, residual, self.weight, self.bias, self.eps, out=out)

    def _forward_train(self, x, residual=None, s=None):
        """LN(x + residual) of (N, C) rows in a training pass, into this norm's buffer ->
        (y, NormSaved). The sum s = x + residual is kept for _backward: in `s` when given (x or
        residual themselves, which the caller then gives up), else in a buffer of this norm's;
        without a residual s is x, which the caller leaves unchanged until the backward."""
        b = self._bufs()
        N = x.shape[0]
        if residual is None:
            s = x
        elif s is None:
            s = b.get("s", x.shape)
        mean, rstd = b.get("mean", (N,)), b.get("rstd", (N,))
        y = self._ops.add_norm_train(x, residual, self.weight, self.bias, self.eps,
                                     b.get("y", x.shape), s, mean, rstd)
        return y, NormSaved(s, mean, rstd)

    def _backward(self, dy, saved, dx):
        """dy (N, C) and the forward's NormSaved -> dx (the buffer given), the gradient of x
        (= of residual), accumulating weight/bias grads."""
        return self._ops.add_norm_backward(
            dy, saved.s, saved.mean, saved.rstd, self.weight,
            None if self.weight is None else self._grad("weight"),
            None if self.bias is None else self._grad("bias"), dx)


MAX_TABLE_FLOATS = 1 << 28      # a positional table of at most 1 GiB (float32)


LAYOUTS = ("interleaved", "halves", "padding")


class PositionalEncoding(Module):
    """Adds a sinusoidal table (recomputed, never loaded) to (B, L, C) embeddings, then
    dropout in training (as the translation tutorial's PositionalEncoding).

    ``layout`` (fastattn.nn.positions has the tables):

    - ``"interleaved"`` (the default): the tutorial's and "Attention Is All You Need"'s table,
      sin on even features and cos on odd ones; token t reads row offset + t;
    - ``"halves"``: Marian's table, sin in the first half of the features and cos in the
      second; token t reads row offset + t;
    - ``"padding"``: M2M100's / NLLB's table (halves with its own frequencies), whose row
      ``padding_idx`` is zero: a token reads padding_idx + its 1-based count among its
      sequence's tokens that are not ``padding_idx`` (plus offset), a padding token the zero
      row, so the token ids are needed (``ids``).

    Args:
        d_model: the embeddings' width.
        max_len: the table's rows (default 5000).
        dropout: the dropout probability in training (default 0).
        layout: "interleaved" (the default), "halves" or "padding", as above.
        padding_idx: the pad id, for the "padding" layout (required there; default None).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
    """

    def __init__(self, d_model, max_len=5000, *, dropout=0.0, layout="interleaved",
                 padding_idx=None, backend="fast"):
        super().__init__(backend)
        self.d_model = check_positive("d_model", d_model)
        self.max_len = check_positive("max_len", max_len)
        if layout not in LAYOUTS:
            raise ValueError(f"PositionalEncoding: layout must be one of "
                             f"{', '.join(map(repr, LAYOUTS))}, got {layout!r}")
        if layout == "padding":
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, numbers.Integral) \
                    or not 0 <= padding_idx <= 1 << 20:
                raise ValueError(f"PositionalEncoding: layout 'padding' needs padding_idx, an "
                                 f"int in [0, {1 << 20}], got {padding_idx!r}")
            padding_idx = int(padding_idx)
        rows = self.max_len + (padding_idx + 1 if layout == "padding" else 0)
        if rows * self.d_model > MAX_TABLE_FLOATS:
            raise ValueError(f"PositionalEncoding: max_len={self.max_len} x d_model="
                             f"{self.d_model} needs a positional table of "
                             f"{rows * self.d_model} floats "
                             f"({rows * self.d_model * 4 / 2 ** 30:.1f} GiB), more than "
                             f"the {MAX_TABLE_FLOATS} allowed; give the longest sequence the "
                             "model will see")
        self.dropout = check_dropout(dropout)
        self.layout, self.padding_idx = layout, padding_idx
        if layout == "interleaved":
            self.pe = ops.positional_encoding(self.max_len, self.d_model)   # (max_len, C)
        elif layout == "halves":
            self.pe = positions.sinusoidal_marian(self.max_len, self.d_model)
        else:
            self.pe = positions.sinusoidal_m2m100(rows, self.d_model, padding_idx)

    def __call__(self, x, offset=0, ids=None):
        """x (B, L, C) + the table's rows for positions offset .. offset + L - 1 (the
        "padding" layout: ids (B, L), the token ids, say which)."""
        ws = self._workspace()
        if not ws.training:
            return self._apply(x, offset, ids)
        y, saved = self._forward_train(x, offset, ws, ids)
        self._saved = PublicSaved(saved, (y.shape,), None)
        return y

    def rows(self, ids, offset, L):
        """The table's rows the tokens read.

        Args:
            ids: (B, L) token ids (read by the "padding" layout only).
            offset: the position of the first token (a decode step's past length).
            L: the number of tokens per sequence.

        Returns:
            None for rows offset .. offset + L - 1 of every sequence, else (B, L) int64 (the
                "padding" layout).

        Raises:
            ValueError: offset + L beyond max_len.
        """
        if offset + L > self.max_len:
            raise ValueError(f"PositionalEncoding: positions up to {offset + L} exceed "
                             f"max_len={self.max_len}")
        if self.layout != "padding":
            return None
        if ids is None:
            raise ValueError("PositionalEncoding: the 'padding' layout needs the token ids")
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[1] != L:
            raise ValueError(f"PositionalEncoding: ids must be (B, {L}), got {ids.shape}")
        return positions.m2m100_rows(ids, self.padding_idx, offset)

    def _apply(self, x, offset, ids=None):
        rows = self.rows(ids, offset, x.shape[1])
        if rows is None:
            return x + self.pe[offset:offset + x.shape[1]]
        return x + self.pe[rows]

    def _forward_train(self, x, offset, ws, ids=None):
        """-> (x + positions, then dropout; PositionsSaved)."""
        y = self._apply(x, offset, ids)
        y2, seed = self._dropout(np.ascontiguousarray(y).reshape(-1, self.d_model),
                                 self.dropout, ws)
        return y2.reshape(y.shape), PositionsSaved(seed, y.shape)

    def backward(self, grad_output):
        """Backward after a training-mode forward: dropout's backward (the table is constant).

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            The gradient of x.
        """
        public = self._check_saved()
        seed, shape = public.record.seed, public.record.shape
        d = np.array(grad_output, np.float32, order="C")
        if d.shape != shape:
            raise ValueError(f"PositionalEncoding.backward: grad_output must be {shape}, "
                             f"got {d.shape}")
        d2 = d.reshape(-1, self.d_model)
        return self._dropout_backward(d2, self.dropout, seed, d2).reshape(shape)


class TokenEmbedding(Module):
    """An embedding scaled by sqrt(emb_size), as in the translation tutorial (key: embedding.*).

    Args:
        vocab_size: the vocabulary size.
        emb_size: the row width.
        scale: the rows' factor instead of sqrt(emb_size): a positive finite number (1 for
            BART's unscaled tokens); None (the default) for sqrt(emb_size).
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
        seed: the initialisation's seed, or a numpy Generator; None (the default) draws a
            fresh one.
    """

    _children = ("embedding",)

    def __init__(self, vocab_size, emb_size, *, scale=None, backend="fast", seed=None):
        super().__init__(backend)
        self.embedding = Embedding(vocab_size, emb_size, backend=backend, seed=seed)
        self.emb_size = emb_size
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
                                  or not 0 < scale < math.inf):
            raise ValueError(f"TokenEmbedding: scale must be a positive finite number or None, "
                             f"got {scale!r}")
        self._scale = np.float32(math.sqrt(emb_size) if scale is None else scale)

    @property
    def scale(self):
        """The factor each row is multiplied by (float32)."""
        return self._scale

    def __call__(self, ids):
        return self.embedding(ids) * self.scale

    def backward(self, grad_output):
        """Backward after a training-mode forward: accumulates the embedding's gradient.

        Args:
            grad_output: the gradient of the forward's output, shaped like it.

        Returns:
            None.
        """
        self.embedding.backward(np.asarray(grad_output, np.float32) * self.scale)

    def _scaled_into(self, ids, out):
        """The scaled rows of ids (B, L) int64 (checked) into out (B, L, C)."""
        np.take(self.embedding.weight, ids, axis=0, out=out, mode="clip")   # ids checked
        return np.multiply(out, self.scale, out=out)

    def _accumulate(self, d, ids):
        """The gradient of the scaled rows, d (N, C) (scaled here, in place), scattered to
        ids (N,) int64."""
        self.embedding._accumulate(np.multiply(d, self.scale, out=d), ids)
