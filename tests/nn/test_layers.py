"""The leaf modules (Linear, Embedding, LayerNorm, PositionalEncoding) against torch.
"""
import math

import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import nn as fnn
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel

pytestmark = TORCH_WARNINGS


def test_leaf_modules_vs_torch(rng):
    torch = requires_torch()
    torch.manual_seed(8)
    tl, te, tn = torch.nn.Linear(C, 24), torch.nn.Embedding(11, C), torch.nn.LayerNorm(C)
    with torch.no_grad():
        tn.weight.normal_()
        tn.bias.normal_()
    fl, fe, fn = fnn.Linear(C, 24), fnn.Embedding(11, C), fnn.LayerNorm(C)
    for f, tmod in ((fl, tl), (fe, te), (fn, tn)):
        assert list(f.state_dict()) == list(tmod.state_dict())
        f.load_state_dict(tmod.state_dict())
    x = features(rng, B, S)
    ids = rng.integers(0, 11, size=(B, S))
    with torch.inference_mode():
        got, want = fl(x), tl(t(torch, x)).numpy()
        assert_close(got, want, **max_rel(want), name="linear")
        got, want = fn(x), tn(t(torch, x)).numpy()
        assert_close(got, want, **max_rel(want), name="layer norm")
        got, want = fe(ids), te(t(torch, ids)).numpy()
        assert_close(got, want, **max_rel(want), name="embedding")
    nobias = fnn.Linear(C, 24, bias=False)
    assert list(nobias.state_dict()) == list(torch.nn.Linear(C, 24, bias=False).state_dict())


def test_positional_encoding_table():
    """The tutorial's table: sin on even features, cos on odd, den = 10000^(-2i/C)."""
    pe = fnn.PositionalEncoding(C, 50)
    pos = np.arange(50, dtype=np.float64)[:, None]
    den = np.exp(-np.arange(0, C, 2) * math.log(10000.0) / C)
    table = np.zeros((50, C))
    table[:, 0::2] = np.sin(pos * den)
    table[:, 1::2] = np.cos(pos * den)
    x = np.zeros((2, 9, C), np.float32)
    assert_close(pe(x), np.broadcast_to(table[:9], (2, 9, C)), **TOL["positional_encoding"],
                 name="pe")
    assert_close(pe(x, offset=40), np.broadcast_to(table[40:49], (2, 9, C)),
                 **TOL["positional_encoding"],
                 name="pe offset")
    with pytest.raises(ValueError, match="max_len"):
        pe(np.zeros((1, 51, C), np.float32))
