"""Pure-NumPy twins of the fastattn functional API: the prototype and the oracle.

Every public function here has a twin of the same name, signature and results in
``fastattn.ops``; switching ``from fastattn import reference as F`` to
``from fastattn import ops as F`` is the whole migration. The code is meant to be read:
one function per concept, no tiling, a shape comment on nearly every line.

Dimension letters (the same legend opens ``csrc/fastattn.h``):

```text
B   batch
H   heads
Lq  query length
Lk  key (and value) length
D   head dim of queries and keys
Dv  head dim of values
C   d_model (features normalised by layer norm, in/out features of linear)
F   d_ff (hidden width of the feed-forward block)
V   vocabulary size
N   flattened rows (= B * L, every leading dim of an input folded together)
```

Conventions:

- Inputs may be any float dtype, any memory layout (non-contiguous views are fine). They are
  converted to float64 and every function computes in float64, the natural precision for an
  oracle; results are returned as float32 arrays, as the kernels return them.
- Linear weights are (out_features, in_features), as in torch: ``y = x @ weight.T + bias``.
- Masks: ``mask`` is bool (True = NOT allowed) or float (added to the scores, 0 / -inf),
  broadcastable to (B, H, Lq, Lk). ``key_padding_mask`` is (B, Lk), bool True = padding, or
  float (added). ``causal=True`` lets query i see key j iff ``j <= i + (Lk - Lq)``: aligned to
  the bottom right, so it holds for a KV cache and equals the usual triangle when Lq == Lk.
  A key is hidden from a query by the causal rule, a bool True or a -inf in either mask: its
  score is -inf whatever q.k is, and its k and v rows take no part in that query's output or
  gradients (a NaN or inf there stays out). Every other mask value is added to the score, as
  torch's scaled_dot_product_attention does; a finite value never hides a key, however large:
  torch.finfo(float32).min (Hugging Face's masked value) gives a key a weight of 0 next to an
  unmasked one, and a row masked that way throughout averages its values.
- Softmax subtracts the row maximum. A row in which every score is -inf gets weights of all
  zeros (never NaN), so an attention query with no allowed key outputs zeros and has
  ``lse = -inf`` (a row that sees a key has a finite lse, clamped to the float32 range). NaN
  in the inputs propagates as NaN, except from a hidden key's rows.
- Layer norm uses the biased (population) variance, as the Transformer paper and torch do. It
  normalises a finite row at any scale (a row of 1e30s as a row of 1s, up to eps). With a
  residual, s = x + residual is a float32 sum (the residual stream's precision, which the
  kernels keep for the backward): a row where it overflows is inf, and normalises to NaN.
- GELU is the exact erf form ``0.5 * x * (1 + erf(x / sqrt(2)))`` (torch's default),
  evaluated as ``0.5 * x * erfc(-x / sqrt(2))`` so the left tail keeps its relative accuracy.
- Training-style variants ``<op>_forward(...)`` return ``(out, cache)``; cache entries carry
  the names shared with the C kernels: ``lse`` (attention), ``mean`` and ``rstd`` (layer norm),
  ``pre`` (linear and FFN: the pre-activation). ``<op>_backward(dout, ...)`` returns the
  gradients of the forward's differentiable inputs, then of its parameters.
- Arguments are checked by ``fastattn._checks``, the functions ``fastattn.ops`` calls too:
  both twins accept the same arguments and refuse the others with the same exception and
  message (dtypes, ranks, shapes, options such as eps, dropout_p, label_smoothing; the values
  inside data arrays are not checked: NaN and inf are data). Degenerate sizes (no rows, no
  keys, D = 0, ...) give the same results in both twins. Dropout drops the elements that
  ``dropout_keep`` chooses, bit for bit, in both.

"""

import math

import numpy as np

from . import _checks
# QuantizedWeight is one class family (fastattn.kinds): containers of arrays that both twins
# compute with; this module reads their .dtype, .data and .scale, never their packed copies
from .kinds import QuantizedWeight  # noqa: F401

__all__ = [
    "attention",
    "attention_forward",
    "attention_backward",
    "softmax",
    "layer_norm",
    "layer_norm_forward",
    "linear",
    "ffn",
    "positional_encoding",
]


# ----------------------------------------------------------------------------------------------
# helpers (float64 in, float64 out)

def _f64(x):
    return np.asarray(x, dtype=np.float64)


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _softmax64(x, axis):
    """Stable softmax in float64; all -inf rows -> zeros. Returns (weights, lse)."""
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)   # row max; -inf for empty rows
    m_safe = np.where(m == -np.inf, 0.0, m)                     # all -inf row: subtract 0 instead
    with np.errstate(divide="ignore", invalid="ignore"):        # NaN/inf inputs propagate quietly
        e = np.exp(x - m_safe)                                  # masked entries -> exp(-inf) = 0
        s = np.sum(e, axis=axis, keepdims=True)                 # 0 for an all -inf row
        w = np.where(s > 0, e / s, 0.0)                         # no 0/0: all -inf row -> zeros
        w = np.where(np.isnan(s), np.nan, w)                    # ... but NaN stays NaN
        lse = m_safe + np.log(s)                                # log(0) = -inf for an all -inf row
    return w, np.squeeze(lse, axis=axis)


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _gelu64(x):
    # exact GELU: x * Phi(x) = 0.5 * x * erfc(-x / sqrt(2)); the erfc form keeps its accuracy in
    # the left tail, where 1 + erf(x / sqrt(2)) cancels. gelu(-inf) = 0, not -inf * 0 = NaN.
    with np.errstate(invalid="ignore"):
        y = 0.5 * x * _erfc(-x / math.sqrt(2.0))
    return np.where(x == -np.inf, 0.0, y)


def _gelu_grad64(x):
    # gelu'(x) = Phi(x) + x * phi(x); the x * phi(x) term is 0 at +-inf (not inf * 0 = NaN)
    cdf = 0.5 * _erfc(-x / math.sqrt(2.0))
    with np.errstate(invalid="ignore", over="ignore"):
        tpdf = x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return cdf + np.where(np.isinf(x), 0.0, tpdf)


_K0, _K1 = math.sqrt(2.0 / math.pi), 0.044715


def _gelu_tanh_a64(x):
    # 1 + tanh(u), u = sqrt(2 / pi) (x + 0.044715 x^3), without cancellation in either tail:
    # q = 2 / (1 + e^(2|u|)); 1 + tanh(u) = q for u < 0, 2 - q for u >= 0
    with np.errstate(invalid="ignore", over="ignore"):
        u = _K0 * (x + _K1 * x * x * x)
        q = 2.0 / (1.0 + np.exp(2.0 * np.abs(u)))
    return np.where(u < 0, q, 2.0 - q)


def _gelu_tanh64(x):
    # torch's GELU(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)));
    # gelu_tanh(-inf) = 0, not -inf * 0 = NaN
    with np.errstate(invalid="ignore"):
        y = 0.5 * x * _gelu_tanh_a64(x)
    return np.where(x == -np.inf, 0.0, y)


def _gelu_tanh_grad64(x):
    # A / 2 + x A (2 - A) sqrt(2 / pi) (1 + 3 * 0.044715 x^2) / 2, A = 1 + tanh(u) (so that
    # 1 - tanh(u)^2 = A (2 - A)); its limits 0 / 1 past |x| = 20 (no inf * 0)
    a = _gelu_tanh_a64(x)
    with np.errstate(invalid="ignore", over="ignore"):
        d = 0.5 * a + 0.5 * x * a * (2.0 - a) * _K0 * (1.0 + 3.0 * _K1 * x * x)
    return np.where(np.abs(x) > 20, (x > 0).astype(np.float64), d)


def _sigmoid2_64(x):
    # sigmoid(x) and 1 - sigmoid(x) without cancellation: e = e^-|x| in (0, 1];
    # s = 1 / (1 + e) for x >= 0, e / (1 + e) below, 1 - s the other one
    e = np.exp(-np.abs(x))
    inv, einv = 1.0 / (1.0 + e), e / (1.0 + e)
    return np.where(x < 0, einv, inv), np.where(x < 0, inv, einv)


def _silu64(x):
    # torch's SiLU: x sigmoid(x); silu(-inf) = 0, not -inf * 0 = NaN
    with np.errstate(invalid="ignore"):
        y = x * _sigmoid2_64(x)[0]
    return np.where(x == -np.inf, 0.0, y)


def _silu_grad64(x):
    # s (1 + x (1 - s)); its limits 0 / 1 past |x| = 40 (no inf * 0)
    s, c = _sigmoid2_64(x)
    with np.errstate(invalid="ignore"):
        d = s * (1.0 + x * c)
    return np.where(np.abs(x) > 40, (x > 0).astype(np.float64), d)


def _act64(pre, activation):
    """act(pre) for activation None, "relu", "gelu", "gelu_tanh" or "silu"."""
    if activation is None:
        return pre
    if activation == "relu":
        return np.maximum(pre, 0.0)
    if activation == "gelu":
        return _gelu64(pre)
    if activation == "silu":
        return _silu64(pre)
    return _gelu_tanh64(pre)                     # "gelu_tanh" (checked by _checks.activation)


def _act_backward64(g, pre, activation):
    """dz = g * act'(pre): relu keeps g where pre > 0 (a select: 0 elsewhere, even for a NaN g),
    gelu multiplies by Phi(pre) + pre * phi(pre)."""
    if activation is None:
        return g
    if activation == "relu":
        positive = pre > 0                                      # the mask a prototype stores
        return np.where(positive, g, 0.0)
    if activation == "gelu":
        return g * _gelu_grad64(pre)
    if activation == "silu":
        return g * _silu_grad64(pre)
    return g * _gelu_tanh_grad64(pre)            # "gelu_tanh" (checked by _checks.activation)


def _linear64(x, weight, bias, activation):
    y = x @ weight.T                                            # (..., in) @ (in, out)
    if bias is not None:
        y = y + bias                                            # (..., out)
    return _act64(y, activation)


# ----------------------------------------------------------------------------------------------
# attention

def attention_forward(q, k, v, *, mask=None, key_padding_mask=None, causal=False, scale=None,
                      dropout_p=0.0, seed=None, compute_type="float32"):
    """Scaled dot-product attention, returning the log-sum-exp saved for the backward pass.

    Args:
        q: (B, H, Lq, D) queries.
        k: (B, H, Lk, D) keys.
        v: (B, H, Lk, Dv) values.
        mask: broadcastable to (B,H,Lq,Lk); bool (True = not allowed) or float (added; -inf = not
            allowed, any finite value is added, however large), to (B, H, Lq, Lk): (Lq, Lk), (B, 1,
            Lq, Lk).
        key_padding_mask: (B, Lk) bool (True = padding) or float (as mask).
        causal: bool; query i sees key j iff j <= i + (Lk - Lq).
        scale: float; default 1 / sqrt(D) (1 if D = 0).
        dropout_p: float in [0,1); dropout on the attention weights (see attention).
        seed: int in [0,2^64); the dropout's seed; required when dropout_p > 0.
        compute_type: str; "float32" or "bfloat16" (see attention; with dropout the dropped weights
            P keep are rounded).

    Returns:
        out: (B, H, Lq, Dv) float32; zeros for a query with no allowed key.
        `cache["lse"]`: (B, H, Lq) float32; logsumexp of the scaled, masked scores per query row
            (before dropout); -inf for a fully masked row, clamped to the float32 range otherwise.

    scores = (q @ k^T) * scale, then every mask is applied (a hidden key's score is -inf, other
    mask values are added), then a stable softmax over the keys (an all -inf row gives weights
    of zeros), then dropout on the weights, then out = weights @ v over the keys each query
    sees (a hidden key's v row is not read, so inf or NaN there stays out).
    """
    p, seed = _checks.attention_dropout(dropout_p, seed, "attention")
    bf16 = _checks.compute_type(compute_type, "attention", p)
    q, k, v, mask, key_padding_mask, scale = _checks.attention(q, k, v, mask, key_padding_mask,
                                                               scale)
    if bf16:
        out, _, lse = _attention64_bf16(q, k, v, mask, key_padding_mask, causal, scale, p, seed)
    else:
        out, _, lse = _attention64(q, k, v, mask, key_padding_mask, causal, scale, p, seed)
    return _f32(out), {"lse": _f32(lse)}


def attention(q, k, v, *, mask=None, key_padding_mask=None, causal=False, scale=None,
              return_weights=False, dropout_p=0.0, seed=None, compute_type="float32"):
    """Scaled dot-product attention: dropout(softmax((q @ k^T) * scale + masks)) @ v.

    Args:
        q: (B, H, Lq, D) queries.
        k: (B, H, Lk, D) keys.
        v: (B, H, Lk, Dv) values.
        mask: broadcastable to (B,H,Lq,Lk); bool (True = not allowed) or float (added; -inf = not
            allowed, any finite value is added, however large), to (B, H, Lq, Lk): (Lq, Lk), (B, 1,
            Lq, Lk).
        key_padding_mask: (B, Lk) bool (True = padding) or float (as mask).
        causal: bool; query i sees key j iff j <= i + (Lk - Lq).
        scale: float; default 1 / sqrt(D) (1 if D = 0).
        return_weights: bool; also return the attention weights.
        dropout_p: float in [0,1); dropout on the attention weights, as torch's MultiheadAttention
            applies it: each weight is kept or zeroed, kept ones are scaled by 1 / (1 - p).
        seed: int in [0,2^64); the dropout's seed; required when dropout_p > 0 (ignored at 0).
            Weight (b, h, i, j) is kept iff dropout_keep(seed, (b*H + h)*Lq + i, j, dropout_p).
        compute_type: str; "float32" (default) or "bfloat16": bf16 products (dropout applied as
            in float32; the backward is attention_backward's), below.

    Returns:
        out: (B, H, Lq, Dv) float32; zeros for a query with no allowed key.
        weights: (B, H, Lq, Lk) float32, only with return_weights=True: the weights after
            dropout (as torch returns them); without dropout, rows sum to 1, or are all zeros for a
            fully masked row.

    compute_type="bfloat16" multiplies in bf16 where torch's CPU flash attention does, and
    keeps the rest float32 (q, k, v are first converted to float32, as always):

    ```text
    q^, k^, v^ = bf16(q), bf16(k), bf16(v)     rounded as vcvtneps2bf16 (bfloat16_round)
    s = (q^ @ k^T) * scale + masks             products exact, sums float32; the scale
                                               multiplies the sum (after the rounding)
    P = exp(s - max_j s), l = sum_j P          float32, P not rounded
    out = (bf16(P) @ v^) / l                   P rounded to bf16 for the product with v^
    weights = P / l                            float32 (not rounded); lse as in float32
    ```

    Masks, all-masked rows (zeros) and NaN as in float32; a value past the largest bf16
    (3.3895e38, half an ulp included) becomes +-inf, and a subnormal one +-0. The kernels sum
    in float32 in their own order (this twin sums in float64): see docs/bf16_attention.md for
    the bound between the two.
    """
    p, seed = _checks.attention_dropout(dropout_p, seed, "attention")
    bf16 = _checks.compute_type(compute_type, "attention", p)
    q, k, v, mask, key_padding_mask, scale = _checks.attention(q, k, v, mask, key_padding_mask,
                                                               scale)
    if bf16:
        out, weights, _ = _attention64_bf16(q, k, v, mask, key_padding_mask, causal, scale, p,
                                            seed)
    else:
        out, weights, lse = _attention64(q, k, v, mask, key_padding_mask, causal, scale, p,
                                         seed)
    if return_weights:
        return _f32(out), _f32(weights)
    return _f32(out)


def _scores64(q, k, mask, key_padding_mask, causal, scale):
    """(scores, hidden), both (B,H,Lq,Lk): the scaled scores with every mask applied (float64)
    and which keys each query cannot see. q (B,H,Lq,D), k (B,H,Lk,D) float64; scale a float
    (None: 1 / sqrt(D)).

    A key is hidden from a query by the causal rule, a bool True or a -inf in either mask: its
    score is -inf whatever q.k is (so a NaN in a hidden key's row stays out). Every other mask
    value is added to the score, finite ones of any size included (torch.finfo(float32).min
    lowers a key's weight to 0 next to an unmasked key; it does not hide it)."""
    Lq, Lk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D > 0 else 1.0            # D = 0: every q.k is 0 anyway
    with np.errstate(invalid="ignore", over="ignore"):          # inf / NaN in q or k: data
        scores = (q @ np.swapaxes(k, -1, -2)) * scale           # (B,H,Lq,Lk)
    hidden = np.zeros(scores.shape, dtype=bool)                 # (B,H,Lq,Lk)
    kpm = None if key_padding_mask is None else np.asarray(key_padding_mask)[:, None, None, :]
    for m in (mask, kpm):                                       # (.., Lq or 1, Lk) each
        if m is None:
            continue
        m = np.asarray(m)
        if m.dtype == np.bool_:
            hidden |= m                                         # True = not allowed
        else:
            m = _f64(m)
            hidden |= m == -np.inf                              # -inf = not allowed
            with np.errstate(invalid="ignore"):
                scores = scores + np.where(m == -np.inf, 0.0, m)    # any other value: added
    if causal:
        i = np.arange(Lq)[:, None]                              # (Lq,1) query index
        j = np.arange(Lk)[None, :]                              # (1,Lk) key index
        hidden |= j > i + (Lk - Lq)                             # bottom-right aligned
    return np.where(hidden, -np.inf, scores), hidden


def _visible_sum(w, x, hidden):
    """w @ x over the keys each query can see: w (..., Lq, Lk), x (..., Lk, F), hidden (..., Lq,
    Lk) bool. A hidden key has w = 0, but 0 * NaN is NaN: a key whose row of x holds inf or
    NaN is added only to the queries that see it."""
    bad = ~np.isfinite(x).all(axis=-1)                          # (..., Lk) keys with inf / NaN
    out = w @ np.where(bad[..., None], 0.0, x)                  # (..., Lq, F) finite rows
    for idx in zip(*np.nonzero(bad)):                           # each bad key (..., j)
        lead, j = idx[:-1], idx[-1]
        seen = ~hidden[lead + (slice(None), j)]                 # (Lq,) queries that see it
        with np.errstate(invalid="ignore", over="ignore"):
            out[lead][seen] += w[lead + (slice(None), j)][seen, None] * x[lead + (j,)]
    return out


_F32_MAX = float(np.finfo(np.float32).max)


def _attention64(q, k, v, mask, key_padding_mask, causal, scale, dropout_p=0.0, seed=None):
    """(out, weights, lse) in float64 from checked arguments (see _checks.attention). lse is
    kept within the float32 range for a row that sees a key (-inf means: no key)."""
    q, k, v = _f64(q), _f64(k), _f64(v)           # (B,H,Lq,D), (B,H,Lk,D), (B,H,Lk,Dv)
    scores, hidden = _scores64(q, k, mask, key_padding_mask, causal, scale)  # (B,H,Lq,Lk)
    weights, lse = _softmax64(scores, axis=-1)    # (B,H,Lq,Lk), (B,H,Lq)
    if dropout_p > 0:
        weights = weights * _attention_keep(seed, dropout_p, weights.shape)  # dropped -> 0
    out = _visible_sum(weights, v, hidden)        # (B,H,Lq,Lk) @ (B,H,Lk,Dv) -> (B,H,Lq,Dv)
    lse = np.where(np.isfinite(lse), np.clip(lse, -_F32_MAX, _F32_MAX), lse)   # (B,H,Lq)
    return out, weights, lse


def bfloat16_round(x):
    """x (any real dtype, converted to float32 first) rounded to the nearest bf16, returned as
    float32, as vcvtneps2bf16 rounds: nearest, ties to even; a subnormal to +-0 (the
    instruction treats them as zero); NaN stays NaN; past the largest bf16 (3.3895e38 plus half
    an ulp), +-inf. Exact twin of the attention kernels' rounding."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)        # (...) float32 bits
    mag = b & np.uint32(0x7fffffff)
    r = (b + np.uint32(0x7fff) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xffff0000)
    r = np.where(mag > np.uint32(0x7f800000),                            # NaN: quiet, kept
                 (b | np.uint32(0x00400000)) & np.uint32(0xffff0000), r)
    r = np.where(mag < np.uint32(0x00800000), b & np.uint32(0x80000000), r)   # subnormal: +-0
    return r.astype(np.uint32).view(np.float32)


def _attention64_bf16(q, k, v, mask, key_padding_mask, causal, scale, dropout_p=0.0, seed=None):
    """attention's compute_type="bfloat16" from checked arguments: (out, weights, lse) in
    float64 (see attention). The products are exact in float64 as in float32; the sums here
    are float64. With dropout, P keep is rounded (bf16 training)."""
    q, k, v = (_f64(bfloat16_round(t)) for t in (q, k, v))   # (B,H,Lq,D), (B,H,Lk,D), (B,H,Lk,Dv)
    scores, hidden = _scores64(q, k, mask, key_padding_mask, causal, scale)  # (B,H,Lq,Lk)
    m = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)            # (B,H,Lq,1)
    m = np.where(m == -np.inf, 0.0, m)                      # a row with no key: 2^(-inf) = 0
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(scores - m)                               # (B,H,Lq,Lk), 0 where hidden
        l = np.sum(p, axis=-1, keepdims=True)                # (B,H,Lq,1), float32 P summed
        if dropout_p > 0:
            p = p * _attention_keep(seed, dropout_p, p.shape)   # dropped, then rounded
        p_hat = _f64(bfloat16_round(_f32(p)))                # P rounded for the product with v
        out = _visible_sum(p_hat, v, hidden)                 # (B,H,Lq,Dv)
        out = np.where(l > 0, out / np.where(l > 0, l, 1.0), 0.0)
        out = np.where(np.isnan(l), np.nan, out)
    weights, lse = _softmax64(scores, axis=-1)               # P / l, as in float32
    if dropout_p > 0:
        weights = weights * _attention_keep(seed, dropout_p, weights.shape)
    lse = np.where(np.isfinite(lse), np.clip(lse, -_F32_MAX, _F32_MAX), lse)
    return out, weights, lse


def attention_backward(dout, q, k, v, out, lse, *, mask=None, key_padding_mask=None,
                       causal=False, scale=None, dropout_p=0.0, seed=None,
                       compute_type="float32"):
    """Gradients of attention with respect to q, k and v, from the forward's out and lse.

    Args:
        dout: (B, H, Lq, Dv) gradient of the loss with respect to out.
        q: (B, H, Lq, D) the forward's queries.
        k: (B, H, Lk, D) the forward's keys.
        v: (B, H, Lk, Dv) the forward's values.
        out: (B, H, Lq, Dv) the forward's output (dropout included).
        lse: (B, H, Lq) the forward's cache["lse"].
        mask: as given to the forward.
        key_padding_mask: as given to the forward.
        causal: as given to the forward.
        scale: as given to the forward.
        dropout_p: as given to the forward.
        seed: as given to the forward (the same seed regenerates the same dropped weights).
        compute_type: as given to the forward: "float32" (the default) or "bfloat16" (below).

    Returns:
        dq: (B, H, Lq, D) float32.
        dk: (B, H, Lk, D) float32.
        dv: (B, H, Lk, Dv) float32.

    With P = softmax(scores) the forward's weights (= exp(scores - lse), recomputed from the
    scores: an lse of -3e38 in float32 cannot give P to the digits it needs), keep the
    dropout's mask scaled by 1 / (1 - p) (1 without dropout) and P' = P * keep the weights the
    forward used:

    ```text
    dv = P'^T dout;   dP = (dout v^T) * keep;   Delta_i = sum_e dout_ie out_ie
    dS = P * (dP - Delta), 0 for a hidden key;   dq = scale * dS k over the keys each
    query sees;   dk = scale * dS^T q
    ```

    A query row with no allowed key (lse = -inf) has P = 0: zero gradients, never NaN.

    compute_type="bfloat16" (bf16 training, as torch's CPU flash attention backward): dout,
    q, k and v rounded to bf16 (bfloat16_round) first; P' (float32) rounded before dv = P'^T
    dout, and dS * scale (float32) rounded before dq and dk; Delta, P, dP and dS in float32
    (float64 here), out as given.
    """
    dout, q, k, v, out, lse, mask, key_padding_mask, scale, p, seed = _checks.attention_backward(
        dout, q, k, v, out, lse, mask, key_padding_mask, scale, dropout_p, seed)
    bf16 = _checks.compute_type(compute_type, "attention_backward", p)
    if bf16:
        dout, q, k, v = (bfloat16_round(t) for t in (dout, q, k, v))
    dout, out = _f64(dout), _f64(out)                     # (B,H,Lq,Dv)
    q, k, v = _f64(q), _f64(k), _f64(v)                   # (B,H,Lq,D), (B,H,Lk,D), (B,H,Lk,Dv)
    lse = _f64(lse)[..., None]                            # (B,H,Lq,1)
    scores, hidden = _scores64(q, k, mask, key_padding_mask, causal, scale)  # (B,H,Lq,Lk)

    live = lse > -np.inf                                  # (B,H,Lq,1) rows that see a key
    P, _ = _softmax64(scores, axis=-1)                    # (B,H,Lq,Lk) the forward's weights
    P = np.where(live, P, 0.0)
    keep = _attention_keep(seed, p, P.shape) if p > 0 else 1.0  # (B,H,Lq,Lk): 0 or 1/(1-p)
    Pd = P * keep                                         # the weights the forward used
    with np.errstate(invalid="ignore", over="ignore"):    # NaN/inf inputs propagate quietly
        if bf16:
            Pd = _f64(bfloat16_round(_f32(Pd)))           # (B,H,Lq,Lk) P' rounded
        dv = np.swapaxes(Pd, -1, -2) @ dout               # (B,H,Lk,Lq) @ (B,H,Lq,Dv)
        dP = (dout @ np.swapaxes(v, -1, -2)) * keep       # (B,H,Lq,Lk)
        delta = np.sum(dout * out, axis=-1, keepdims=True)    # (B,H,Lq,1) = sum_j P_ij dP_ij
        dS = np.where(hidden, 0.0, P * (dP - delta))      # (B,H,Lq,Lk) softmax backward
        if bf16:
            dS = _f64(bfloat16_round(_f32(dS * scale)))   # dS * scale rounded
            dq = _visible_sum(dS, k, hidden)              # (B,H,Lq,D)
            dk = np.swapaxes(dS, -1, -2) @ q              # (B,H,Lk,D)
        else:
            dq = _visible_sum(dS, k, hidden) * scale      # (B,H,Lq,D)
            dk = (np.swapaxes(dS, -1, -2) @ q) * scale    # (B,H,Lk,D)
    return _f32(dq), _f32(dk), _f32(dv)


def _attention_keep(seed, p, shape):
    """float64 (B, H, Lq, Lk): 1 / (1 - p) where attention's dropout keeps weight (b, h, i, j)
    (rows (b * H + h) * Lq + i, cols j), 0 where it drops it."""
    B, H, Lq, Lk = shape
    keep = dropout_keep(seed, np.arange(B * H * Lq), np.arange(Lk), p)   # (B*H*Lq, Lk)
    return keep.reshape(shape) / (1.0 - p)


# ---- dropout's random bits (counter-based: a pure function of seed, row, column) ------------

_M64 = (1 << 64) - 1


def _mix64(z):
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return z ^ (z >> np.uint64(31))


def _fmix32(h):
    """MurmurHash3's 32-bit finaliser on uint32 arrays."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85ebca6b)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xc2b2ae35)
    return h ^ (h >> np.uint32(16))


def dropout_keep(seed, rows, cols, p):
    """bool (len(rows), len(cols)): True where dropout with probability p keeps the element
    (row, col) under `seed`, exactly as the kernels decide it (csrc/fa_rng.h):

        row key = high 32 bits of mix64(mix64(seed) + row * 0x9e3779b97f4a7c15)
        bits    = fmix32(row key ^ (col * 0x9e3779b9))
        keep    = bits >= floor(p * 2**32)

    rows and cols are integer index arrays (attention: rows (b * H + h) * Lq + i, cols the
    key j; an activation (N, C): rows n, cols c)."""
    with np.errstate(over="ignore"):
        s = _mix64(np.array([int(seed) & _M64], dtype=np.uint64))
        r = np.asarray(rows, dtype=np.uint64).reshape(-1, 1)
        key = (_mix64(s + r * np.uint64(0x9e3779b97f4a7c15)) >> np.uint64(32)).astype(np.uint32)
        c = np.asarray(cols, dtype=np.uint64).astype(np.uint32).reshape(1, -1)
        bits = _fmix32(key ^ (c * np.uint32(0x9e3779b9)))
    threshold = min(max(int(p * 4294967296.0), 0), 4294967295)
    return bits >= np.uint32(threshold)


# ----------------------------------------------------------------------------------------------
# softmax

def softmax(x, axis=-1):
    """Numerically stable softmax along ``axis``.

    Args:
        x: (..., L, ...) scores; -inf entries get weight 0.
        axis: int; axis to normalise, default the last.

    Returns:
        y: the shape of x, float32; sums to 1 along axis, or all zeros where every entry
            along axis is -inf (torch gives NaN).
    """
    x, axis = _checks.softmax(x, axis)
    w, _ = _softmax64(_f64(x), axis=axis)
    return _f32(w)


# ----------------------------------------------------------------------------------------------
# layer norm

def _ln_input(x, residual):
    """s = x + residual as layer norm normalises it, float64: the sum is rounded to float32, the
    residual stream's precision (the kernels keep s in float32 for the backward, as a model's
    residual add does), so a sum past the float32 range is inf and its row comes out NaN.
    Without a residual, s is x itself."""
    if residual is None:
        return _f64(x)
    with np.errstate(over="ignore"):              # (_f32: lifted by the tests' float64_twins)
        return _f64(_f32(x) + _f32(residual))     # float32 sum, then float64


def layer_norm_forward(x, weight, bias, *, eps=1e-5, residual=None):
    """Layer norm of (x + residual) over the last axis, returning mean and rstd for backward.

    Args:
        x: (..., C) input; every leading dim is a row (N rows in all).
        weight: (C,) gain, or None (= 1).
        bias: (C,) shift, or None (= 0).
        eps: float; added to the variance.
        residual: (..., C) optional, added to x before normalising.

    Returns:
        y: (..., C) float32; (s - mean) * rstd * weight + bias, s = x + residual summed in
            float32 (a row where it overflows gives NaN).
        `cache["mean"]`: (N,) float32; mean of s per row.
        `cache["rstd"]`: (N,) float32; 1 / sqrt(var + eps), biased (population) var.
    """
    x, weight, bias, residual, eps = _checks.layer_norm(x, weight, bias, eps, residual)
    s = _ln_input(x, residual)                    # (..., C)
    with np.errstate(invalid="ignore"):           # a row with inf (or NaN) gives NaN, quietly
        mean = s.mean(axis=-1, keepdims=True)     # (..., 1)
        var = ((s - mean) ** 2).mean(axis=-1, keepdims=True)   # (..., 1) population variance
        rstd = 1.0 / np.sqrt(var + eps)           # (..., 1)
        y = (s - mean) * rstd                     # (..., C)
    if weight is not None:
        y = y * _f64(weight)                      # gain; None = 1
    if bias is not None:
        y = y + _f64(bias)                        # shift; None = 0
    cache = {"mean": _f32(mean.reshape(-1)),      # (N,)
             "rstd": _f32(rstd.reshape(-1))}      # (N,)
    return _f32(y), cache


def layer_norm(x, weight, bias, *, eps=1e-5, residual=None):
    """Layer norm of (x + residual) over the last axis (biased variance).

    Args:
        x: (..., C) input; every leading dim is a row.
        weight: (C,) gain, or None (= 1).
        bias: (C,) shift, or None (= 0).
        eps: float; added to the variance.
        residual: (..., C) optional, added to x before normalising.

    Returns:
        y: (..., C) float32; (s - mean) / sqrt(var + eps) * weight + bias.
    """
    y, _ = layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
    return y


def layer_norm_backward(dy, x, mean, rstd, weight, *, residual=None):
    """Gradients of y = LN(x + residual) * weight + bias, from the forward's saved statistics.

    Args:
        dy: (..., C) gradient of y.
        x: (..., C) the forward's input (N rows in all).
        mean: (N,) cache["mean"] of layer_norm_forward.
        rstd: (N,) cache["rstd"] of layer_norm_forward.
        weight: (C,) gain, or None (= 1).
        residual: (..., C) the forward's residual, or None; s = x + residual is recomputed (in
            float32, as the forward), not saved.

    Returns:
        dx: (..., C) float32; gradient of x, and also of residual (the residual add passes the
            same gradient to both).
        dweight: (C,) float32, or None when weight is None.
        dbias: (C,) float32; column sums of dy (bias or not).

    xhat = (s - mean) * rstd;  g = dy * weight;
    dx = rstd * (g - mean_C(g) - xhat * mean_C(g * xhat))
    """
    dy, x, mean, rstd, weight, residual = _checks.layer_norm_backward(dy, x, mean, rstd, weight,
                                                                      residual)
    N, C = math.prod(x.shape[:-1]), x.shape[-1]
    s = _ln_input(x, residual).reshape(N, C)                    # (N, C)
    dy2 = _f64(dy).reshape(N, C)                                # (N, C)
    with np.errstate(invalid="ignore"):                         # rows with inf or NaN: NaN
        xhat = (s - _f64(mean)[:, None]) * _f64(rstd)[:, None]  # (N, C)
        dbias = dy2.sum(axis=0)                                 # (C,)
        dweight = None if weight is None else (dy2 * xhat).sum(axis=0)   # (C,)
        g = dy2 if weight is None else dy2 * _f64(weight)       # (N, C) gradient of xhat
        c = max(C, 1)                                           # C = 0: empty rows, no 0/0
        dx = _f64(rstd)[:, None] * (g - g.sum(axis=-1, keepdims=True) / c
                                    - xhat * (g * xhat).sum(axis=-1, keepdims=True) / c)
    return (_f32(dx.reshape(x.shape)), None if dweight is None else _f32(dweight),
            _f32(dbias))


# ----------------------------------------------------------------------------------------------
# linear and feed-forward

def linear(x, weight, bias=None, *, activation=None):
    """Affine map with an optional fused activation: act(x @ weight.T + bias).

    Args:
        x: (..., C_in) input; every leading dim is a row.
        weight: (C_out, C_in) torch layout; or a QuantizedWeight (int8, bf16).
        bias: (C_out,) optional.
        activation: str or None; None, "relu", "gelu" (exact erf form), "gelu_tanh" (its tanh
            approximation) or "silu".

    Returns:
        y: (..., C_out) float32.

    With a QuantizedWeight (ops.QuantizedWeight; float32 out, the same in ops and here):

    - int8 (q (M, K), scale (M,)): each row of x is quantised by quantize_int8's rule with
      L = min(32767, (2^31 - 1) // (127 K)) levels in place of 127 (xq in [-L, L], sx[n] =
      amax / L; rows with max |x| below 2^-110 quantise to zero): as many levels as the int32
      sums allow, so 32767 up to K = 516, 8256 at K = 2048, never fewer than 127. Then
      acc[n, m] = sum_k xq[n, k] q[m, k] exactly (int32; K <= INT8_MAX_K); then, in
      float32 with a rounding after every operation and no fused multiply-add,
          y[n, m] = act((float32(acc[n, m]) * (sx[n] * scale[m])) + bias[m])
      ops matches this bit for bit for activation None and relu (gelu, gelu_tanh, silu: to their
      kernels' ~1e-6).
      A row of x holding NaN or inf gives a row of NaN (its sx is NaN), never an error.
      Against float math with the dequantised weight, |error| <= sx[n] / 2 * sum_k |w[m, k]|
      plus float32 rounding.
    - bf16 (bits (M, K) uint16): the weight widened to float32 (exact), x kept float32; the
      product as linear() computes it (float32 sums in ops).
    - bfloat16 (the bf16 compute type; bits (M, K) uint16): x rounded by round_bfloat16 too,
      then in float32, K padded to even with zeros, in this order (vdpbf16ps's):
          acc = 0;  for kk: acc = acc + xb[2kk+1] wb[2kk+1];  acc = acc + xb[2kk] wb[2kk]
          y = act(acc + bias[m])
      Each product of two bf16 values is exact in float32, so ops matches this bit for bit
      on every path and thread count (activation None and relu; gelu to its kernels' ~1e-6)
      while no nonzero product or partial sum falls below 2^-126 in magnitude: such a product
      is not exact in float32 (the AVX512_BF16 path flushes it to zero, an FMA rounds it once
      with the sum): at most 2^-126 per step, K 2^-126 in all. NaN in x or w gives NaN where it meets; an inf gives inf or NaN as IEEE does.
    """
    x, weight, bias, activation = _checks.linear(x, weight, bias, activation, "linear",
                                                 quantized_ok=True)
    if _is_quantized(weight):                                            # int8 / bf16
        return _linear_quantized(x, weight, bias, activation)
    y = _linear64(_f64(x), _f64(weight), None if bias is None else _f64(bias), activation)
    return _f32(y)


def linear_forward(x, weight, bias=None, *, activation=None, compute_type="float32"):
    """linear() keeping the pre-activation for linear_backward.

    Args:
        x: (..., C_in) input; every leading dim is a row (N rows in all).
        weight: (C_out, C_in) torch layout.
        bias: (C_out,) optional.
        activation: str or None; None, "relu", "gelu" (exact erf form), "gelu_tanh" (its tanh
            approximation) or "silu".
        compute_type: "float32" (the default) or "bfloat16" (below).

    Returns:
        y: (..., C_out) float32; act(pre).
        `cache["pre"]`: (N, C_out) float32; x @ weight.T + bias, or None when activation is None
            (then pre = y).

    compute_type="bfloat16" (bf16 training): x and weight rounded to bf16 (bfloat16_round)
    before the product; the sums, bias and activation in float32 (float64 here).
    """
    x, weight, bias, activation = _checks.linear(x, weight, bias, activation)  # (..., C_in)
    if _checks.compute_type(compute_type, "linear_forward"):
        x, weight = bfloat16_round(x), bfloat16_round(weight)
    pre = _linear64(_f64(x), _f64(weight), None if bias is None else _f64(bias), None)
    y = _act64(pre, activation)                                          # (..., C_out)
    N, M = math.prod(x.shape[:-1]), weight.shape[0]
    return _f32(y), {"pre": None if activation is None else _f32(pre.reshape(N, M))}


def linear_backward(dy, x, weight, *, pre=None, activation=None, compute_type="float32"):
    """Gradients of y = act(x @ weight.T + bias).

    Args:
        dy: (..., C_out) gradient of y.
        x: (..., C_in) the forward's input (N rows in all).
        weight: (C_out, C_in) torch layout.
        pre: (N, C_out) cache["pre"] of linear_forward; needed (and only read) when activation is
            not None.
        activation: str or None; the forward's.
        compute_type: "float32" (the default) or "bfloat16" (below).

    Returns:
        dx: (..., C_in) float32; dz @ weight.
        dweight: (C_out, C_in) float32; dz^T @ x.
        dbias: (C_out,) float32; column sums of dz (whether or not the forward had a bias).

    dz = dy * act'(pre): relu'(pre) = [pre > 0] (dz is 0 where pre <= 0), gelu'(pre) =
    Phi(pre) + pre * phi(pre).

    compute_type="bfloat16" (bf16 training, as torch autocast's bf16 gradient): dz (float32)
    rounded to bf16 before both products and the bias sums; x and weight rounded too.
    """
    dy, x, weight, pre, activation = _checks.linear_backward(dy, x, weight, pre, activation)
    bf16 = _checks.compute_type(compute_type, "linear_backward")
    if bf16:
        x, weight = bfloat16_round(x), bfloat16_round(weight)
    weight = _f64(weight)                                                # (M, K)
    (M, K), N = weight.shape, math.prod(x.shape[:-1])
    x2 = _f64(x).reshape(N, K)                                           # (N, K)
    g = _f64(dy).reshape(N, M)                                           # (N, M)
    dz = _act_backward64(g, None if activation is None else _f64(pre).reshape(N, M),
                         activation)                                     # (N, M)
    if bf16:
        dz = _f64(bfloat16_round(_f32(dz)))                              # (N, M) rounded
    dx = dz @ weight                                                     # (N, K)
    dweight = dz.T @ x2                                                  # (M, K)
    dbias = dz.sum(axis=0)                                               # (M,)
    return _f32(dx.reshape(x.shape)), _f32(dweight), _f32(dbias)


def ffn(x, w1, b1, w2, b2, *, activation="relu"):
    """Position-wise feed-forward block: linear(act(linear(x, w1, b1)), w2, b2).

    Args:
        x: (..., C) input; every leading dim is a row.
        w1: (F, C) first layer weight.
        b1: (F,) first layer bias (may be None).
        w2: (C, F) second layer weight.
        b2: (C,) second layer bias (may be None).
        activation: str or None; "relu" (default), "gelu", "gelu_tanh", "silu" or None.

    Returns:
        y: (..., C) float32.

    The hidden activations (..., F) stay in float64 between the two layers, except with a
    QuantizedWeight w1 or w2: then each layer is linear() and the hidden is float32, as the
    kernels keep it (and quantise it, for an int8 w2).
    """
    x, w1, b1, w2, b2, activation = _checks.ffn(x, w1, b1, w2, b2, activation,
                                                quantized_ok=True)   # (..., C), (F, C), (C, F)
    if _is_quantized(w1) or _is_quantized(w2):
        h = np.asarray(linear(x, w1, b1, activation=activation), np.float32)   # (..., F)
        return linear(h, w2, b2)
    b1 = None if b1 is None else _f64(b1)
    b2 = None if b2 is None else _f64(b2)
    h = _linear64(_f64(x), _f64(w1), b1, activation)   # (..., F)
    y = _linear64(h, _f64(w2), b2, None)                # (..., C)
    return _f32(y)


def ffn_forward(x, w1, b1, w2, b2, *, activation="relu", dropout_p=0.0, seed=None,
                compute_type="float32"):
    """The feed-forward block in training: linear2(dropout(act(linear1(x)))), torch's order,
    keeping the pre-activation for ffn_backward.

    Args:
        x: (..., C) input; every leading dim is a row (N rows in all).
        w1: (F, C) first layer's weight.
        b1: (F,) first layer's bias, or None.
        w2: (C, F) second layer's weight.
        b2: (C,) second layer's bias, or None.
        activation: str or None; "relu" (default), "gelu", "gelu_tanh", "silu" or None.
        dropout_p: float; in [0, 1): hidden element (n, f) is kept iff
            `dropout_keep(seed, [n], [f], dropout_p)`, then scaled by 1 / (1 - dropout_p);
            0 = no dropout.
        seed: int; 0 <= seed < 2^64; required when dropout_p > 0.
        compute_type: "float32" (the default) or "bfloat16" (below).

    Returns:
        y: (..., C) float32.
        `cache["pre"]`: (N, F) float32; x @ w1.T + b1. The backward recomputes the activation and
            the dropout mask from it and the seed (N * F * 4 bytes per layer).

    compute_type="bfloat16" (bf16 training): x, w1 and w2 rounded to bf16, and the hidden
    drop(act(pre)) (float32) rounded before the second product.
    """
    x, w1, b1, w2, b2, activation = _checks.ffn_training(
        x, w1, b1, w2, b2, activation, dropout_p, seed, "ffn_forward")   # (..., C), (F, C), (C, F)
    bf16 = _checks.compute_type(compute_type, "ffn_forward")
    if bf16:
        x, w1, w2 = (bfloat16_round(t) for t in (x, w1, w2))
    (F, C), N = w1.shape, math.prod(x.shape[:-1])
    x2 = _f64(x).reshape(N, C)                          # (N, C)
    pre = _linear64(x2, _f64(w1), None if b1 is None else _f64(b1), None)   # (N, F)
    h = _act64(pre, activation)                         # (N, F)
    if dropout_p > 0:
        keep = dropout_keep(seed, np.arange(len(x2)), np.arange(F), dropout_p)   # (N, F) bool
        h = h * keep / (1.0 - dropout_p)                # (N, F)
    if bf16:
        h = _f64(bfloat16_round(_f32(h)))               # (N, F) rounded
    y = _linear64(h, _f64(w2), None if b2 is None else _f64(b2), None)       # (N, C)
    return _f32(y.reshape(x.shape)), {"pre": _f32(pre)}


def ffn_backward(dy, x, w1, b1, w2, b2, pre, *, activation="relu", dropout_p=0.0, seed=None,
                 compute_type="float32"):
    """Gradients of the feed-forward block y = linear2(dropout(act(linear1(x)))).

    Args:
        dy: (..., C) gradient of y.
        x: (..., C) the forward's input (N rows in all).
        w1: (F, C) first layer's weight.
        b1: (F,) first layer's bias, or None.
        w2: (C, F) second layer's weight.
        b2: (C,) second layer's bias, or None.
        pre: (N, F) cache["pre"] of ffn_forward.
        activation: the forward's.
        dropout_p: the forward's (the mask is regenerated, not stored).
        seed: the forward's.
        compute_type: "float32" (the default) or "bfloat16" (below).

    Returns:
        dx: (..., C) float32.
        `dw1, db1`: (F, C), (F,) float32; db1 None when b1 is None.
        `dw2, db2`: (C, F), (C,) float32; db2 None when b2 is None.

    h = drop(act(pre));  dw2 = dy^T h;  dh = dy @ w2;  dpre = dh * keep / (1 - p) * act'(pre);
    dw1 = dpre^T x;  dx = dpre @ w1.

    compute_type="bfloat16" (bf16 training): dy, x, w1 and w2 rounded to bf16; h and dpre
    (float32) rounded before the products and sums that read them.
    """
    dy, x, w1, b1, w2, b2, pre, activation = _checks.ffn_backward(
        dy, x, w1, b1, w2, b2, pre, activation, dropout_p, seed)
    bf16 = _checks.compute_type(compute_type, "ffn_backward")
    if bf16:
        dy, x, w1, w2 = (bfloat16_round(t) for t in (dy, x, w1, w2))
    w1, w2 = _f64(w1), _f64(w2)                         # (F, C), (C, F)
    (F, C), N = w1.shape, math.prod(x.shape[:-1])
    x2 = _f64(x).reshape(N, C)                          # (N, C)
    dy2 = _f64(dy).reshape(N, C)                        # (N, C)
    pre = _f64(pre).reshape(N, F)                       # (N, F)
    drop = np.ones_like(pre)                            # (N, F) keep / (1 - p)
    if dropout_p > 0:
        keep = dropout_keep(seed, np.arange(len(x2)), np.arange(F), dropout_p)   # (N, F) bool
        drop = keep / (1.0 - dropout_p)
    h = _act64(pre, activation) * drop                  # (N, F) the hidden, recomputed
    if bf16:
        h = _f64(bfloat16_round(_f32(h)))               # (N, F) rounded
    dw2 = dy2.T @ h                                     # (C, F)
    db2 = None if b2 is None else dy2.sum(axis=0)       # (C,)
    dh = dy2 @ w2                                       # (N, F)
    dpre = _act_backward64(dh * drop, pre, activation)  # (N, F)
    if bf16:
        dpre = _f64(bfloat16_round(_f32(dpre)))         # (N, F) rounded
    dw1 = dpre.T @ x2                                   # (F, C)
    db1 = None if b1 is None else dpre.sum(axis=0)      # (F,)
    dx = dpre @ w1                                      # (N, C)
    return (_f32(dx.reshape(x.shape)), _f32(dw1), None if db1 is None else _f32(db1),
            _f32(dw2), None if db2 is None else _f32(db2))


# ----------------------------------------------------------------------------------------------
# dropout

def dropout(x, p, *, seed=None):
    """Dropout over the last axis: y = x * keep / (1 - p).

    Args:
        x: (..., C) every leading dim is a row: row n of the flattened (N, C), column c.
        p: float; drop probability in [0, 1); 0 returns a copy.
        seed: int; 0 <= seed < 2^64; required when p > 0.

    Returns:
        y: (..., C) float32; keep = dropout_keep(seed, rows, cols, p).

    The mask is a pure function of (seed, n, c), so dropout_backward regenerates it. A dropped
    NaN or inf becomes NaN (x * 0), as in torch.
    """
    x = _checks.dropout(x, p, seed, "dropout", "x")
    x64 = _f64(x)
    if p == 0:
        return _f32(x64.copy())
    C = x.shape[-1]
    N = math.prod(x.shape[:-1])
    keep = dropout_keep(seed, np.arange(N), np.arange(C), p)    # (N, C) bool: the stored mask
    with np.errstate(invalid="ignore"):                         # a dropped inf: NaN, quietly
        y = x64.reshape(N, C) * keep / (1.0 - p)                # (N, C)
    return _f32(y.reshape(x.shape))


def dropout_backward(dy, p, *, seed=None):
    """Gradient of dropout: dx = dy * keep / (1 - p), the forward's mask regenerated from seed.

    Args:
        dy: (..., C) gradient of y.
        p: the forward's drop probability.
        seed: the forward's seed.

    Returns:
        dx: (..., C) float32.
    """
    dy = _checks.dropout(dy, p, seed, "dropout_backward", "dy")
    return dropout(dy, p, seed=seed)


# ----------------------------------------------------------------------------------------------
# embedding

def embedding_backward(dout, ids, num_embeddings):
    """Gradient of an embedding lookup out = weight[ids]: rows of dout added into the rows of
    their ids.

    Args:
        dout: (..., C) gradient of the looked-up rows; leading dims = ids'.
        ids: (...) int64, each in [0, num_embeddings).
        num_embeddings: int; V, rows of the embedding table.

    Returns:
        dweight: (V, C) float32; dweight[v] = sum of dout[i] over ids[i] = v, 0 for ids that do
            not occur.
    """
    dout, ids, V = _checks.embedding_backward(dout, ids, num_embeddings)
    ids = ids.reshape(-1)                                      # (N,)
    C = dout.shape[-1]
    dweight = np.zeros((V, C))                                 # (V, C)
    np.add.at(dweight, ids, _f64(dout).reshape(len(ids), C))   # scatter-add, repeats summed
    return _f32(dweight)


__all__ += ["layer_norm_backward", "linear_forward", "linear_backward", "ffn_forward",
            "ffn_backward", "dropout", "dropout_backward", "embedding_backward"]


# ----------------------------------------------------------------------------------------------
# positional encoding

def positional_encoding(length, d_model):
    """Sinusoidal positional encoding of "Attention Is All You Need".

    Args:
        length: int; number of positions p = 0 .. length-1.
        d_model: int; number of features (odd allowed: last column is sin).

    Returns:
        pe: (length, C) float32, C = d_model; `pe[p, 2i] = sin(p / 10000^(2i / d_model))` and
            `pe[p, 2i+1] = cos(p / 10000^(2i / d_model))`.
    """
    length, d_model = _checks.positional_encoding(length, d_model)
    pos = np.arange(length, dtype=np.float64)[:, None]           # (length, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]  # (1, ceil(C/2)) even features
    angle = pos / np.power(10000.0, two_i / d_model)             # (length, ceil(C/2))
    pe = np.zeros((length, d_model), dtype=np.float64)           # (length, C)
    pe[:, 0::2] = np.sin(angle)                                  # even features
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])               # odd features share the angle
    return _f32(pe)


# ----------------------------------------------------------------------------------------------
# loss

__all__ += ["cross_entropy"]


def cross_entropy(logits, targets, *, ignore_index=-100, label_smoothing=0.0, reduction="mean",
                  return_grad=False):
    """Cross-entropy of softmax(logits) against integer class targets, with label smoothing:
    torch.nn.functional.cross_entropy with the classes on the LAST axis.

    Args:
        logits: (..., V) unnormalised scores; every leading dim is a row (N rows in all).
        targets: (...) int class index per row, in [0, V), or ignore_index.
        ignore_index: int; rows with this target count for nothing: loss 0, gradient 0, not in the
            mean's count.
        label_smoothing: float in [0,1]; eps: the target distribution is (1 - eps) one-hot + eps /
            V uniform.
        reduction: str; "mean" (over the rows not ignored), "sum" or "none".
        return_grad: bool; also return d loss / d logits.

    Returns:
        loss: float (...) float32; "mean" / "sum"; a mean over no counted row is 0 (torch gives
            NaN) "none": one loss per row (0 where ignored).
        dlogits: (..., V) float32, only with return_grad: the gradient of the returned loss
            ("none": of the sum of the losses).

    Per row n with target t:

    ```text
    logp = x - logsumexp(x)  (a log-softmax over V)
    loss_n = (1 - eps) * (-logp_t) + eps * mean_v(-logp_v)
    d loss_n / d x_v = softmax(x)_v - eps / V - (1 - eps) * [v == t]
    ```

    mean: sum_n loss_n / count and the gradient divided by count, count = rows not ignored.
    (The eps term is left out entirely when eps = 0, as in torch: a -inf logit elsewhere in
    the row then leaves the loss finite.)
    """
    x, t, _, ignore_index, eps = _checks.cross_entropy(logits, targets, ignore_index,
                                                       label_smoothing, reduction)
    x = _f64(x)                                                            # (..., V)
    lead, V = x.shape[:-1], x.shape[-1]
    x = x.reshape(-1, V)                                                   # (N, V)
    N = x.shape[0]
    keep = t != ignore_index                                               # (N,) rows counted
    rows = np.arange(N)                                                    # (N,)
    tk = np.where(keep, t, 0)                                              # (N,) safe index
    _, lse = _softmax64(x, axis=-1)                                        # (N,)
    with np.errstate(invalid="ignore"):
        logp = x - lse[:, None]                                            # (N, V) log-softmax
    if V:
        loss = -logp[rows, tk]                                             # (N,) nll
        if eps > 0:
            loss = (1 - eps) * loss + eps * -logp.mean(axis=-1)            # (N,) smoothed
    else:
        loss = np.zeros(N)                                                 # every row ignored
    loss = np.where(keep, loss, 0.0)                                       # (N,)
    count = int(keep.sum())
    if reduction == "none":
        out = _f32(loss.reshape(lead))                                     # (...)
    elif reduction == "sum":
        out = float(loss.sum())
    else:                                                                  # "mean"
        out = float(loss.sum() / count) if count else 0.0
    if not return_grad:
        return out
    scale = 1.0 / count if reduction == "mean" and count else 1.0
    onehot = np.zeros((N, V))                                              # (N, V)
    if V:
        onehot[rows, tk] = 1.0
    d = np.exp(logp) - eps / V - (1 - eps) * onehot if V else onehot       # (N, V)
    d = np.where(keep[:, None], d, 0.0) * scale                            # (N, V)
    return out, _f32(d.reshape(lead + (V,)))


# ----------------------------------------------------------------------------------------------
# optimiser

__all__ += ["adamw_step", "adam_step", "grad_norm", "clip_grads"]


def _adam64(p, g, m, v, step, lr, betas, eps, weight_decay, decoupled):
    """One Adam / AdamW update of one float32 tensor in place, computed in float64."""
    b1, b2 = betas
    p64, g64, m64, v64 = _f64(p), _f64(g), _f64(m), _f64(v)
    if decoupled:
        p64 = p64 * (1 - lr * weight_decay)               # AdamW: decay the weight itself
    else:
        g64 = g64 + weight_decay * p64                    # Adam: L2 term in the gradient
    m64 = b1 * m64 + (1 - b1) * g64                       # first moment
    v64 = b2 * v64 + (1 - b2) * g64 * g64                 # second moment
    bc1 = 1 - b1 ** step                                  # bias corrections, step 1-based
    bc2 = 1 - b2 ** step
    denom = np.sqrt(v64) / math.sqrt(bc2) + eps           # sqrt(v_hat) + eps
    p64 = p64 - (lr / bc1) * m64 / denom                  # p -= lr * m_hat / denom
    p[...], m[...], v[...] = p64, m64, v64                # stored back as float32


def adamw_step(params, grads, exp_avg, exp_avg_sq, *, step, lr, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=0.01):
    """One AdamW update (torch.optim.AdamW), in place, on each tensor of the lists.

    Args:
        params: list of arrays; float32, updated in place (or one array).
        grads: same shapes float32 gradients.
        exp_avg: same shapes float32 first moments m, updated (zeros at first).
        exp_avg_sq: same shapes float32 second moments v, updated (zeros at first).
        step: int >= 1; this update's number (1-based), for the bias corrections.
        lr: float; the learning rate.
        betas: (beta1, beta2), the moments' decay rates, as torch (default (0.9, 0.999)).
        eps: float; added to the denominator, as torch (default 1e-8).
        weight_decay: float; decoupled (p *= 1 - lr * weight_decay; default 0.01).

    The update, computed in float64 per step and stored in float32:

    ```text
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
    p = p - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
    ```
    """
    tensors, step, lr, b1, b2, eps, weight_decay = _checks.adam(
        params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay, "adamw_step")
    for p, g, m, v in tensors:                            # flat views, updated in place
        _adam64(p, g, m, v, step, lr, (b1, b2), eps, weight_decay, True)


def adam_step(params, grads, exp_avg, exp_avg_sq, *, step, lr, betas=(0.9, 0.999), eps=1e-8,
              weight_decay=0.0):
    """One Adam update (torch.optim.Adam), in place, on each tensor of the lists.

    As `adamw_step`, except that the weight decay is an L2 term added to the gradient
    (g = g + weight_decay * p) instead of decoupled.

    Args:
        params: list of arrays; float32, updated in place (or one array).
        grads: same shapes float32 gradients.
        exp_avg: same shapes float32 first moments m, updated (zeros at first).
        exp_avg_sq: same shapes float32 second moments v, updated (zeros at first).
        step: int >= 1; this update's number (1-based), for the bias corrections.
        lr: float; the learning rate.
        betas: (beta1, beta2), the moments' decay rates, as torch (default (0.9, 0.999)).
        eps: float; added to the denominator, as torch (default 1e-8).
        weight_decay: float; the L2 term's factor (default 0).
    """
    tensors, step, lr, b1, b2, eps, weight_decay = _checks.adam(
        params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay, "adam_step")
    for p, g, m, v in tensors:                            # flat views, updated in place
        _adam64(p, g, m, v, step, lr, (b1, b2), eps, weight_decay, False)


def grad_norm(grads):
    """Global L2 norm of a list of arrays: sqrt(sum over all elements of g^2), in float64.

    Args:
        grads: a list of arrays, or one array.

    Returns:
        The norm, as a float.
    """
    grads = _checks.grad_list(grads, "grad_norm")
    return math.sqrt(sum(float(np.sum(_f64(g) ** 2)) for g in grads))


def clip_grads(grads, max_norm):
    """Clip gradients by their global norm, in place, as torch.nn.utils.clip_grad_norm_.

    total = grad_norm(grads); when total > max_norm (or is NaN), every gradient is scaled in
    place by max_norm / (total + 1e-6).

    Args:
        grads: a list of float32 arrays, or one array; updated in place.
        max_norm: float; the largest norm kept.

    Returns:
        total, the norm before clipping (a float).
    """
    grads, max_norm = _checks.clip_grads(grads, max_norm)  # flat views, updated in place
    total = grad_norm(grads)
    if not total <= max_norm:
        coef = max_norm / (total + 1e-6)
        for g in grads:
            g[...] = _f64(g) * coef
    return total


# ----------------------------------------------------------------------------------------------
# quantised weights: int8 with per-row scales, bfloat16

__all__ += ["quantize_int8", "dequantize_int8", "to_bfloat16", "from_bfloat16",
            "round_bfloat16", "QuantizedWeight", "INT8_MAX_K"]

INT8_MAX_K = (2**31 - 1) // (127 * 127)   # 133144: K * 127 * 127 still fits an int32 sum
INT8_MIN_AMAX = np.float32(2.0**-121)     # rows with a smaller max |x| quantise to zero
_ACT_MIN_AMAX = np.float32(2.0**-110)     # the same for a product's activation rows


def _act_levels(K):
    """The levels L of a product's activations over K (fastattn.h, fa_int8_act_levels): the
    most that keep |sum_k xq q| <= 127 L K within an int32, at most 32767 (int16 lanes)."""
    return min(32767, (2**31 - 1) // (127 * max(K, 1)))


def _is_quantized(w):
    return getattr(type(w), "_fastattn_quantized", False)


def _row_name(row, lead):
    """Row `row` of the flattened leading dims `lead`, as an index into them."""
    idx = np.unravel_index(row, lead) if lead else ()
    return str(int(idx[0])) if len(idx) == 1 else str(tuple(int(i) for i in idx))


def _quantize_rows(x, levels=127, min_amax=INT8_MIN_AMAX):
    """The int8 rule on float32 rows x (R, K) -> q (R, K) int8 (int16 for levels > 127),
    scale (R,) float32, and which rows are not finite (their q is 0 and scale NaN)."""
    amax = np.max(np.abs(x), axis=-1, initial=np.float32(0))      # (R,) float32; NaN stays NaN
    bad = ~np.isfinite(amax)
    zero = amax < min_amax                                          # zeros, or L/amax = inf
    safe = np.where(bad | zero, np.float32(1), amax)                # (R,) float32
    L = np.float32(levels)
    scale = safe / L                                                # float32 division
    inv = L / safe                                                  # float32 division
    t = np.where(bad[:, None], np.float32(0), x) * inv[:, None]     # float32 products
    q = np.rint(np.clip(t, -L, L)).astype(np.int8 if levels <= 127 else np.int16)  # ties even
    q[bad | zero] = 0
    scale = np.where(zero, np.float32(0), np.where(bad, np.float32(np.nan), scale))
    scale = scale.astype(np.float32)
    return q, scale, bad


def quantize_int8(x):
    """Symmetric per-row int8 quantisation of the last axis.

    Args:
        x: (..., K) converted to float32 first; must be finite.

    Returns:
        q: (..., K) int8 clip(rint(x * (127 / amax)), -127, 127).
        scale: (...,) float32 amax / 127, amax = max |x| over the row.

    Both divisions are float32 (127 / amax and amax / 127), the product x * (127 / amax) too,
    and rint rounds ties to even, so ops and reference agree bit for bit. A row with amax below
    2^-121 (~3.8e-37: zeros, or values so small that 127 / amax would overflow) gets scale 0
    and q 0. A row with NaN or inf raises ValueError naming it. |x - q * scale| <= scale / 2.
    """
    x = np.asarray(_checks.rows(x, "x", "quantize_int8", "(..., K)"), np.float32)
    lead, K = x.shape[:-1], x.shape[-1]
    q, scale, bad = _quantize_rows(x.reshape(-1, K))
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"quantize_int8: x row {_row_name(row, lead)} is not finite (NaN or "
                         "inf); int8 quantisation needs finite values")
    return q.reshape(x.shape), scale.reshape(lead)


def dequantize_int8(q, scale):
    """The float32 values of int8 rows with their per-row scales: q * scale[..., None].

    Args:
        q: (..., K) int8.
        scale: (...,) float32, one scale per row.

    Returns:
        (..., K) float32.
    """
    q, scale = _checks.dequantize_int8(q, scale)
    return q.astype(np.float32) * scale[..., None]


def to_bfloat16(x):
    """The bfloat16 bits of x: the top 16 bits of float32, rounded to nearest, ties to even.

    A value past the largest bfloat16 becomes inf; NaN stays a quiet NaN with its sign and top
    payload bits.

    Args:
        x: an array of real numbers, converted to float32 first.

    Returns:
        uint16 array of the shape of x.
    """
    b = np.asarray(_checks.real(x, "x", "to_bfloat16"), np.float32).view(np.uint32)
    rounded = (b + np.uint32(0x7FFF) + ((b >> 16) & 1)) >> 16      # no overflow: b < 2^32 - 2^16
    nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (b >> 16) | 0x0040, rounded).astype(np.uint16)


def from_bfloat16(bits):
    """The float32 values of bfloat16 bits, exactly (bits << 16).

    Args:
        bits: uint16 array of bfloat16 bits.

    Returns:
        float32 array of the same shape.
    """
    b = _checks.bfloat16_bits(bits)
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_bfloat16(x):
    """The bf16 compute type's operand rounding, as vcvtneps2bf16.

    x rounded to bfloat16, to nearest even, a zero or subnormal float32 becoming a zero of its
    sign, NaN a quiet NaN (`to_bfloat16` keeps subnormals; this is the instruction's rule).

    Args:
        x: an array of real numbers, converted to float32 first.

    Returns:
        float32 array of the shape of x, each value a bfloat16.
    """
    x = np.asarray(_checks.real(x, "x", "round_bfloat16"), np.float32)
    b = np.ascontiguousarray(x).view(np.uint32)
    top = to_bfloat16(b.view(np.float32)).astype(np.uint32)              # RNE, quiet NaN
    tiny = (b & np.uint32(0x7F800000)) == 0                              # zero or subnormal
    top = np.where(tiny, (b >> 16) & np.uint32(0x8000), top).astype(np.uint32)
    return (top << 16).view(np.float32)


def _linear_bfloat16(x, weight, bias, activation, order="vdpbf16ps"):
    """linear() with a bfloat16 QuantizedWeight: the sums in the kernels' order (see linear).
    order="amx": the AMX path's (FASTATTN_BF16_PATH=amx): per block of 16 pairs of k, the even
    elements' products in one float32 sum and the odd ones' in another, both from zero, then
    acc = acc + (s_even + s_odd) (TDPBF16PS)."""
    M, K = weight.shape
    lead = x.shape[:-1]
    xb = round_bfloat16(x.reshape(math.prod(lead), K))                  # (N, K) float32
    wb = round_bfloat16(from_bfloat16(weight.data))                     # (M, K) float32
    N = xb.shape[0]
    acc = np.zeros((N, M), np.float32)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        for kk in range((K + 1) // 2 if order != "amx" else 0):
            for k in (2 * kk + 1, 2 * kk):                              # odd k first
                if k < K:
                    acc += xb[:, k:k + 1] * wb[None, :, k]              # exact products
        for k0 in range(0, K if order == "amx" else 0, 32):             # 16 pairs a block
            s = [np.zeros((N, M), np.float32), np.zeros((N, M), np.float32)]
            for k in range(k0, min(k0 + 32, K)):
                s[k % 2] += xb[:, k:k + 1] * wb[None, :, k]
            acc += s[0] + s[1]
        if bias is not None:
            acc = acc + np.asarray(bias, np.float32)                    # float32
    y = _act64(acc.astype(np.float64), activation)
    return _f32(y.reshape(lead + (M,)))


def _linear_quantized(x, weight, bias, activation):
    """linear() with a QuantizedWeight: the kernels' math, step by step.

    int8: x quantised per row by quantize_int8's rule with _act_levels(K) levels (a row that
    is not finite gets scale NaN, so its output row is NaN); acc = xq @ q^T exactly
    (computed in float64: every partial sum is an integer below 2^31 < 2^53); then in
    float32, rounding after each operation:
        y = act(float32(acc) * (sx[n] * scale[m]) + bias[m])
    (act in float64 on that float32 value). bf16: the weight widened to float32 (exact), then
    linear() in float64.
    """
    x = np.asarray(x, np.float64 if weight.dtype == "bf16" else np.float32)
    M, K = weight.shape
    if weight.dtype == "bfloat16":
        return _linear_bfloat16(x, weight, bias, activation)
    if weight.dtype == "bf16":
        w = from_bfloat16(weight.data).astype(np.float64)
        return _f32(_linear64(x, w, None if bias is None else _f64(bias), activation))
    lead = x.shape[:-1]
    xq, sx, _ = _quantize_rows(x.reshape(math.prod(lead), K), _act_levels(K), _ACT_MIN_AMAX)
    acc = xq.astype(np.float64) @ weight.data.astype(np.float64).T  # (N, M), exact integers
    s = sx[:, None] * np.asarray(weight.scale, np.float32)[None, :]  # (N, M) float32
    with np.errstate(invalid="ignore", over="ignore"):
        pre = acc.astype(np.float32) * s                            # float32
        if bias is not None:
            pre = pre + np.asarray(bias, np.float32)                # float32
    y = _act64(pre.astype(np.float64), activation)
    return _f32(y.reshape(lead + (M,)))
