"""MultiheadAttention against torch.nn.MultiheadAttention and fast vs reference backend.
"""

import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import nn as fnn
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel, scaled

pytestmark = TORCH_WARNINGS


@pytest.mark.parametrize("masking", MHA_MASKS)
@pytest.mark.parametrize("kind", ["self", "cross", "kv_distinct"])
def test_mha_vs_torch_no_weights(rng, kind, masking):
    """self: query is key is value; cross: key is value; kv_distinct: three arrays."""
    torch = requires_torch()
    tm, fm = mha_pair(torch)
    q = features(rng, B, T)
    if kind == "self":
        k = v = q
    else:
        k = features(rng, B, S)
        v = k if kind == "cross" else features(rng, B, S)
    kw = mha_masks(rng, masking, T, k.shape[1])
    with torch_fastpath(torch, kw.values()):
        tq = t(torch, q)
        tk = tq if k is q else t(torch, k)
        tv = tk if v is k else t(torch, v)
        ref, _ = tm(tq, tk, tv, need_weights=False, **{n: t(torch, m) for n, m in kw.items()})
    out, w = fm(q, k, v, need_weights=False, **kw)
    assert w is None
    assert out.shape == q.shape and out.dtype == np.float32
    assert_close(out, ref.numpy(), **max_rel(ref.numpy()), name=f"mha {kind} {masking}")


@pytest.mark.parametrize("masking", MHA_MASKS)
@pytest.mark.parametrize("average", [True, False])
def test_mha_vs_torch_weights(rng, average, masking):
    torch = requires_torch()
    tm, fm = mha_pair(torch, seed=1)
    q, k = features(rng, B, T), features(rng, B, S)
    kw = mha_masks(rng, masking, T, S)
    with torch_fastpath(torch, kw.values()):
        ref, ref_w = tm(t(torch, q), t(torch, k), t(torch, k), need_weights=True,
                        average_attn_weights=average,
                        **{n: t(torch, m) for n, m in kw.items()})
    out, w = fm(q, k, k, need_weights=True, average_attn_weights=average, **kw)
    assert w.shape == ((B, T, S) if average else (B, H, T, S))
    assert_close(out, ref.numpy(), **max_rel(ref.numpy()), name="mha output")
    assert_close(w, ref_w.numpy(), **max_rel(ref_w.numpy()), name="mha weights")
    if "key_padding_mask" in kw:                  # padded keys get exactly zero weight
        blocked = kw["key_padding_mask"]
        blocked = blocked if blocked.dtype == bool else blocked == -np.inf
        pad = blocked[:, None, :] if average else blocked[:, None, None, :]
        assert np.all(w[np.broadcast_to(pad, w.shape)] == 0)


def test_mha_self_attention_weights_vs_torch(rng):
    torch = requires_torch()
    tm, fm = mha_pair(torch, seed=2)
    x = features(rng, B, S)
    with torch.inference_mode():
        tx = t(torch, x)
        ref, ref_w = tm(tx, tx, tx)
    out, w = fm(x, x, x)
    assert_close(out, ref.numpy(), **max_rel(ref.numpy()))
    assert_close(w, ref_w.numpy(), **max_rel(ref_w.numpy()), name="weights")


def test_mha_fast_vs_reference(rng):
    fast = fnn.MultiheadAttention(C, H, seed=14)
    ref = fnn.MultiheadAttention(C, H, seed=14, backend="reference")
    fast.in_proj_bias[...] = ref.in_proj_bias[...] = rng.standard_normal(3 * C)
    q, k = features(rng, B, T), features(rng, B, S)
    kpm = padding(B, S, [S, 2, 4])
    for args in ((q, q, q), (q, k, k)):
        for need in (False, True):
            of, wf = fast(*args, need_weights=need, key_padding_mask=kpm if args[1] is k
                          else None)
            orf, wr = ref(*args, need_weights=need, key_padding_mask=kpm if args[1] is k
                          else None)
            assert_close(of, orf, **scaled(TOL["nn_backends"], orf))
            if need:
                assert_close(wf, wr, **scaled(TOL["nn_backends"], wr), name="weights")
