"""Shared hypothesis strategies.

Hypothesis draws the *structure* of a problem (sizes, mask kind, flags) and one integer seed;
the arrays themselves come from ``np.random.default_rng(seed)``, which is far faster than
hypothesis-drawn arrays and still reproducible from the printed example.

Sizes are biased toward small values and the boundaries of vector lanes and tiles: one below,
at and one above each tile size of every SIMD level this build runs (vector widths, attention
query and key blocks, the one-row-at-a-time limit, softmax chunks, packed panels), as
fastattn.build_info() reports them, so off-by-one tails show up there.
"""
import dataclasses
import math

import numpy as np
from hypothesis import strategies as st

import fastattn

_TILES = fastattn.build_info()["tiles_by_isa"].values()


def _around(*sizes):
    """Each size and its neighbours (positive ones only), sorted."""
    return tuple(sorted({n + d for n in sizes for d in (-1, 0, 1) if n + d >= 1}))


BOUNDARY_LENGTHS = _around(1, *(t[key] * m for t in _TILES for m in (1, 2) for key in (
    "attention_block_q", "attention_block_k", "attention_rows_max_q")))
BOUNDARY_FEATURES = _around(2, *(t[key] * m for t in _TILES for m in (1, 2) for key in (
    "vector_width", "softmax_chunk", "packed_panel", "packed_tile_features")),
    128, 512, 1024)
HEAD_DIMS = (1, 7, 32, 64, 80, 128)
MASK_KINDS = ("none", "bool_full", "bool_broadcast", "additive", "key_padding",
              "key_padding_float")

# Attention problems above this many multiply-adds (B*H*Lq*Lk*(D+Dv)) get fewer batches/heads,
# so that the float64 reference stays cheap.
ATTENTION_WORK_BUDGET = 2e7

seeds = st.integers(min_value=0, max_value=2**32 - 1)


def sizes(lo, hi, boundary):
    """An int in [lo, hi]: small values, boundary values, or anything (shrinks toward small)."""
    marked = sorted({b for b in boundary if lo <= b <= hi} | {lo, hi})
    return st.one_of(st.integers(lo, min(hi, lo + 7)), st.sampled_from(marked),
                     st.integers(lo, hi))


def lengths(lo=1, hi=300):
    """Sequence lengths (Lq, Lk): 1..300 by default."""
    return sizes(lo, hi, BOUNDARY_LENGTHS)


def features(lo=1, hi=1100):
    """Feature sizes (C, K, M, F) that exercise vector tails: 1..1100 by default."""
    return sizes(lo, hi, BOUNDARY_FEATURES)


def rows(lo=0, hi=300):
    """Row counts N (0 allowed: an empty batch)."""
    return sizes(lo, hi, BOUNDARY_LENGTHS)


def rand(rng, shape, magnitude=1.0):
    """float32 standard normal data times `magnitude`."""
    return (rng.standard_normal(shape) * magnitude).astype(np.float32)


# ---- layer norm ------------------------------------------------------------------------------

# inputs that stress the mean and variance: O(1) values, a mean far above the spread (the
# variance must not cancel), large values, tiny values
LAYER_NORM_KINDS = ("normal", "large_mean", "large_magnitude", "tiny")


def layer_norm_input(rng, kind, N, C):
    """x (N, C) float32 of one of LAYER_NORM_KINDS."""
    if kind == "normal":
        return rand(rng, (N, C), 2.0) + np.float32(0.5)
    if kind == "large_mean":
        return rand(rng, (N, C)) + np.float32(1e4)
    if kind == "large_magnitude":
        return rand(rng, (N, C), 1e4)
    return rand(rng, (N, C), 1e-3)


# ---- attention ---------------------------------------------------------------------------------

@dataclasses.dataclass(repr=False)
class AttentionProblem:
    B: int
    H: int
    Lq: int
    Lk: int
    D: int
    Dv: int
    mask_kind: str
    with_padding: bool      # a key_padding_mask on top of a mask of another kind
    causal: bool
    fully_masked: bool      # some query rows (or a whole batch element) see no key by mask
    magnitude: float        # |q|, |k|, |v| ~ magnitude (scale shrinks so scores stay O(1..50))
    seed: int
    q: np.ndarray = None
    k: np.ndarray = None
    v: np.ndarray = None
    mask: object = None
    key_padding_mask: object = None
    scale: object = None

    def kwargs(self):
        return dict(mask=self.mask, key_padding_mask=self.key_padding_mask, causal=self.causal,
                    scale=self.scale)

    def __repr__(self):
        mshape = None if self.mask is None else np.shape(self.mask)
        return (f"AttentionProblem(B={self.B}, H={self.H}, Lq={self.Lq}, Lk={self.Lk}, "
                f"D={self.D}, Dv={self.Dv}, mask_kind={self.mask_kind!r} {mshape}, "
                f"with_padding={self.with_padding}, causal={self.causal}, "
                f"fully_masked={self.fully_masked}, magnitude={self.magnitude:g}, "
                f"scale={self.scale!r}, seed={self.seed})")


def _bool_rows_blocked(rng, mask):
    """Set a random non-empty subset of rows (all but the last axis) to True."""
    flat = mask.reshape(-1, mask.shape[-1])
    n = flat.shape[0]
    pick = rng.choice(n, size=max(1, n // 4), replace=False)
    flat[pick] = True
    return flat.reshape(mask.shape)


def build_attention(p):
    """Fill q, k, v, masks and scale of an AttentionProblem from its seed (deterministic)."""
    rng = np.random.default_rng(p.seed)
    B, H, Lq, Lk, D, Dv = p.B, p.H, p.Lq, p.Lk, p.D, p.Dv
    p.q = rand(rng, (B, H, Lq, D), p.magnitude)
    p.k = rand(rng, (B, H, Lk, D), p.magnitude)
    p.v = rand(rng, (B, H, Lk, Dv), p.magnitude)
    if p.magnitude == 1.0:
        p.scale = [None, None, 1.0, 0.3][rng.integers(4)]
    else:
        # q.k ~ magnitude^2 * sqrt(D): pick a scale that keeps the scores within about +-20
        p.scale = float(4.0 / (p.magnitude ** 2 * math.sqrt(D)))
    density = [0.1, 0.5, 0.9][rng.integers(3)]

    kind = p.mask_kind
    if kind == "bool_full":
        m = rng.random((B, H, Lq, Lk)) < density
        p.mask = _bool_rows_blocked(rng, m) if p.fully_masked else m
    elif kind == "bool_broadcast":
        m = rng.random((Lq, Lk)) < density
        p.mask = _bool_rows_blocked(rng, m) if p.fully_masked else m
    elif kind == "additive":
        shape = [(B, H, Lq, Lk), (Lq, Lk), (B, 1, Lq, Lk), (1, H, 1, Lk)][rng.integers(4)]
        m = rng.standard_normal(shape) * 2.0                       # a finite bias ...
        m[rng.random(shape) < density] = -np.inf                   # ... and some -inf
        if p.fully_masked:
            m = np.where(_bool_rows_blocked(rng, np.zeros(shape, bool)), -np.inf, m)
        p.mask = m.astype(np.float32) if rng.integers(2) else m    # float32 or float64
    if kind in ("key_padding", "key_padding_float") or p.with_padding:
        kpm = rng.random((B, Lk)) < density
        if p.fully_masked and kind in ("key_padding", "key_padding_float"):
            kpm[rng.integers(B)] = True                            # a batch element fully padded
        if kind == "key_padding_float":
            bias = (rng.standard_normal((B, Lk)) * 2.0).astype(np.float32)
            p.key_padding_mask = np.where(kpm, np.float32(-np.inf), bias)
        else:
            p.key_padding_mask = kpm
    return p


@st.composite
def attention_problems(draw, max_len=300, head_dims=HEAD_DIMS, mask_kinds=MASK_KINDS,
                       magnitudes=(1.0, 1e4)):
    B = draw(st.integers(1, 4))
    H = draw(st.integers(1, 4))
    Lq = draw(lengths(1, max_len))
    Lk = draw(st.one_of(st.just(Lq), lengths(1, max_len)))
    D = draw(st.sampled_from(head_dims))
    Dv = draw(st.one_of(st.just(D), st.sampled_from(head_dims)))
    while B * H * Lq * Lk * (D + Dv) > ATTENTION_WORK_BUDGET and B * H > 1:
        if B >= H:
            B -= 1
        else:
            H -= 1
    mask_kind = draw(st.sampled_from(mask_kinds))
    with_padding = mask_kind in ("bool_full", "bool_broadcast", "additive") and draw(st.booleans())
    causal = draw(st.booleans())
    fully_masked = mask_kind != "none" and draw(st.booleans())
    magnitude = draw(st.sampled_from(magnitudes))
    seed = draw(seeds)
    return build_attention(AttentionProblem(B, H, Lq, Lk, D, Dv, mask_kind, with_padding,
                                            causal, fully_masked, magnitude, seed))
