"""Rebinding a parameter (``layer.linear1.weight = w``, as torch users do) is checked when it
happens: a wrong shape is a ValueError naming the parameter and both shapes, never an array the
kernels would read past (they trust their callers). Every parameter of a Seq2SeqTransformer,
float32 and quantized, against shapes drawn by hypothesis; then the model still runs its
forward, generate and a training step."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastattn import nn as fnn
from fastattn.ops import QuantizedWeight

V, C = 20, 32


def model(compute_type="float32"):
    m = fnn.Seq2SeqTransformer(2, 2, C, 4, V, V, dim_feedforward=64, dropout=0.0, pad_id=0,
                               max_len=16, seed=0)
    if compute_type != "float32":
        m.eval().quantize(compute_type)
    return m


SLOTS = [(key, name) for key, _, name in model()._named_slots()]
SRC = np.array([[2, 5, 6, 7, 3], [2, 8, 9, 3, 0]])
TGT = np.array([[2, 7, 6, 5, 3], [2, 9, 8, 3, 0]])


def owner(m, key):
    for k, mod, name in m._named_slots():
        if k == key:
            return mod, name
    raise KeyError(key)


def still_runs(m, compute_type):
    m.eval()
    logits = m(SRC, TGT[:, :-1])
    assert logits.shape == (2, 4, V) and np.isfinite(logits).all()
    out = m.generate(SRC, max_new_tokens=4, start_id=2, end_id=3)
    assert out.shape[0] == 2
    if compute_type == "float32":
        m.train()
        assert np.isfinite(m.loss(SRC, TGT, backward=True))
        m.eval()


shapes = st.lists(st.integers(0, 70), min_size=0, max_size=3).map(tuple)


@settings(max_examples=60)
@given(slot=st.sampled_from(SLOTS), shape=shapes,
       compute_type=st.sampled_from(["float32", "int8", "bf16"]))
def test_a_wrong_shape_is_refused_when_set(slot, shape, compute_type):
    m = model(compute_type)
    key, name = slot
    mod, name = owner(m, key)
    old = getattr(mod, name)
    if tuple(shape) == tuple(old.shape):
        shape = tuple(old.shape) + (1,)
    with pytest.raises((ValueError, TypeError)) as info:
        if isinstance(old, QuantizedWeight):
            setattr(mod, name, QuantizedWeight.from_float(
                np.ones(shape if len(shape) == 2 else (3, 5), np.float32), compute_type))
        else:
            setattr(mod, name, np.ones(shape, np.float32))
    assert name in str(info.value)
    assert getattr(mod, name) is old
    still_runs(m, compute_type)


@pytest.mark.parametrize("key, name", SLOTS[:6] + SLOTS[-6:])
def test_a_right_shape_is_taken_and_used(key, name):
    m = model()
    mod, name = owner(m, key)
    old = getattr(mod, name)
    new = np.full(old.shape, 0.01, np.float64)           # another dtype: a float32 copy
    setattr(mod, name, new)
    got = getattr(mod, name)
    assert got.dtype == np.float32 and got.flags.c_contiguous and np.all(got == 0.01)
    same = np.full(old.shape, 0.02, np.float32)           # float32 C-contiguous: its memory
    setattr(mod, name, same)                              # kept, as a Parameter
    assert isinstance(getattr(mod, name), fnn.Parameter)
    assert np.shares_memory(getattr(mod, name), same)
    ref = model()
    ref.load_state_dict(m.state_dict())
    np.testing.assert_array_equal(m.eval()(SRC, TGT[:, :-1]), ref.eval()(SRC, TGT[:, :-1]))
    still_runs(m, "float32")


def test_examples_of_the_probe():
    m = model()
    with pytest.raises(ValueError, match=r"Linear.weight must keep its shape \(64, 32\), got "
                                         r"\(64, 1\)"):
        m.transformer.encoder.layers[0].linear1.weight = np.ones((64, 1), np.float32)
    lin = fnn.Linear(64, 64)
    with pytest.raises(ValueError, match=r"\(64, 64\), got \(64, 1\)"):
        lin.weight = np.ones((64, 1))
    with pytest.raises(ValueError, match="built without it"):
        fnn.Linear(4, 4, bias=False).bias = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="built with it"):
        fnn.Linear(4, 4).bias = None
    with pytest.raises(TypeError, match="non-numeric dtype bool"):
        fnn.LayerNorm(4).weight = np.ones(4, bool)
    with pytest.raises(TypeError, match="assignment: LayerNorm.weight has non-numeric dtype "
                                        "object"):
        fnn.LayerNorm(4).weight = {"a": 1}
    q = model("int8")
    with pytest.raises(TypeError, match="quantized weights"):
        q.generator.weight = np.ones((V, C), np.float32)


def test_quantized_state_dict_values_refuse_edits():
    q = model("int8")
    sd = q.state_dict()
    with pytest.raises(ValueError, match="read-only"):
        sd["generator.weight"][...] = 0
    sd["generator.bias"][...] = 0             # a float32 parameter: the model's own array
    assert np.all(q.generator.bias == 0)


def test_max_len_is_capped_before_allocating():
    with pytest.raises(ValueError, match=r"max_len=1000000000 x d_model=32 needs a positional "
                                         r"table of 32000000000 floats \(119.2 GiB\)"):
        fnn.Seq2SeqTransformer(1, 1, 32, 4, 20, 20, max_len=10 ** 9)
