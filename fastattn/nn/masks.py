"""Masks in torch's conventions, prepared once per forward (or per decoding) for the kernels.

torch's conventions: an attention mask is bool (True = not allowed) or float (added to the
scores), shaped (L, S) or (B * nhead, L, S); a ``*_key_padding_mask`` is (B, S), bool (True =
padding) or float (added). A mask equal to the square subsequent mask runs as the kernel's
causal mode, never as an (L, L) array. The forward and the decode steps both prepare their masks
here, so a float padding mask means the same thing in both. Float masks reach the kernels as
they are: only -inf hides a key, any finite value (torch.finfo(float32).min included) is added
to the scores, as in torch (see fastattn.ops.attention).
"""
import numpy as np

from .. import ops


class Mask:
    """Masks in the kernel's form.

    bias      float, broadcastable to (B, H, Lq, Lk), or None
    key_bias  float (B * Lk,) C-contiguous, or None (-inf = padding)
    causal    bool, bottom-right aligned
    """

    __slots__ = ("bias", "key_bias", "causal")

    def __init__(self, bias=None, key_bias=None, causal=False):
        self.bias, self.key_bias, self.causal = bias, key_bias, causal

    def key_padding(self, q, k):
        """key_bias as the functional API's (B, Lk) key_padding_mask (or None)."""
        return None if self.key_bias is None else self.key_bias.reshape(q.shape[0], k.shape[2])


NO_MASK = Mask()


def is_subsequent(m):
    """True if m (L, L) is the square subsequent mask (bool True above the diagonal, or float
    -inf above and 0 on and below)."""
    L = m.shape[0]
    upper = np.triu(np.ones((L, L), dtype=bool), k=1)
    if m.dtype == np.bool_:
        return bool(np.array_equal(m, upper))
    return bool(np.all(m[upper] == -np.inf) and np.all(m[~upper] == 0))


def key_bias(key_padding_mask, B, Lk, name="key_padding_mask"):
    """A (B, Lk) padding mask (bool True = padding, or float added) -> float32 (B, Lk), or None."""
    if key_padding_mask is None:
        return None
    kp = np.asarray(key_padding_mask)
    if kp.dtype != np.bool_ and kp.dtype.kind != "f":
        raise TypeError(f"{name} must be bool (True = padding) or float (added), "
                        f"got dtype {kp.dtype}")
    if kp.shape != (B, Lk):
        raise ValueError(f"{name} must be (B, S) = ({B}, {Lk}), got {kp.shape}")
    return np.ascontiguousarray(ops._mask_bias(kp, name, "attention"), dtype=np.float32)


def prepare_mask(name, attn_mask, key_padding_mask, B, H, Lq, Lk, is_causal=False,
                 kpm_name="key_padding_mask", extra_keys=0):
    """torch-convention masks -> Mask, with clear errors for bad shapes or dtypes. Lk is the
    number of keys the caller gave; `extra_keys` more follow them (MultiheadAttention's
    add_bias_kv / add_zero_attn), which every query may see, as torch pads its masks."""
    causal = bool(is_causal) and attn_mask is None
    bias = None
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype != np.bool_ and m.dtype.kind != "f":
            raise TypeError(f"{name} must be bool (True = not allowed) or float (added), "
                            f"got dtype {m.dtype}")
        if m.shape == (Lq, Lk) and Lq == Lk and is_subsequent(m):
            causal = True                       # run as the kernel's causal mode, no array
        elif m.shape == (Lq, Lk):
            bias = ops._mask_bias(m, name, "attention")
        elif m.shape == (B * H, Lq, Lk):
            bias = ops._mask_bias(m, name, "attention").reshape(B, H, Lq, Lk)
        else:
            raise ValueError(f"{name} must be (L, S) = ({Lq}, {Lk}) or (B*nhead, L, S) = "
                             f"({B * H}, {Lq}, {Lk}), got {m.shape}")
    kb = key_bias(key_padding_mask, B, Lk, kpm_name)
    if extra_keys:
        bias, kb = _allow_extra_keys(bias, kb, causal, Lq, Lk, extra_keys)
        causal = False
    return Mask(bias, None if kb is None else kb.reshape(-1), causal)


def _allow_extra_keys(bias, kb, causal, Lq, Lk, extra):
    """(bias, key_bias) with `extra` allowed key columns appended (torch's pad(mask, (0, 1))
    once per extra key: 0 added, nothing blocked). A causal rule over the Lk keys given
    becomes an explicit (Lq, Lk) array first (the kernel's causal mode would count the extra
    keys as positions)."""
    if causal:                                           # j <= i + (Lk - Lq), bottom right
        blocked = np.arange(Lk)[None, :] > np.arange(Lq)[:, None] + (Lk - Lq)
        bias = np.where(blocked, np.float32(-np.inf), np.float32(0.0))
    if bias is not None:
        bias = np.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(0, extra)])
    if kb is not None:
        kb = np.pad(kb, ((0, 0), (0, extra)))
    return bias, kb


def decoder_masks(H, B, T, S, tgt_mask, memory_mask, tgt_key_padding_mask,
                  memory_key_padding_mask, tgt_is_causal, memory_is_causal):
    """The decoder's two prepared masks: (self-attention over the target, cross-attention)."""
    tm = prepare_mask("tgt_mask", tgt_mask, tgt_key_padding_mask, B, H, T, T, tgt_is_causal,
                      "tgt_key_padding_mask")
    mm = prepare_mask("memory_mask", memory_mask, memory_key_padding_mask, B, H, T, S,
                      memory_is_causal, "memory_key_padding_mask")
    return tm, mm


def generate_square_subsequent_mask(sz):
    """torch's causal mask helper: 0 on and below the diagonal, -inf above.

    Args:
        sz: the mask's size.

    Returns:
        (sz, sz) float32.
    """
    return np.triu(np.full((sz, sz), -np.inf, dtype=np.float32), k=1)
