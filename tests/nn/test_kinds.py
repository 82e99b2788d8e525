"""Weight kinds as the modules hold them (fastattn.kinds): which kind each mode and precision
installs, when they are made and dropped, and that precision is a setting, not a second table
(a bf16-precision model's inference passes are float32's, allocation for allocation).
"""
import tracemalloc

import numpy as np
import pytest

from fastattn import kinds, ops
from fastattn import nn as fnn
from fastattn.nn.backends import FastOps, ReferenceOps, TwinWeight, Workspace
from nn_util import PAD, token_batch


def seq2seq(seed=0):
    return fnn.Seq2SeqTransformer(1, 1, 32, 4, 30, 30, 64, dropout=0.0, pad_id=PAD, seed=seed)


def held_kinds(model):
    """{type name} of the kinds every module of `model` holds, decode kinds included."""
    return {type(entry[2]).__name__ for m in model.modules() for entry in m._kinds.values()}


def test_each_mode_installs_its_kinds_at_known_points():
    m = seq2seq().eval()
    # eval(): every float32 weight packed once for the engine; the forwards and the decode
    # steps multiply by the same packed kind (one copy of the panels, no decode entries)
    assert held_kinds(m) == {"PackedFloat32Weight"}
    gen = m.generator
    assert isinstance(gen._kinds["weight"][2], kinds.PackedFloat32Weight)
    assert gen._decode_weight("weight") is gen._kind("weight")
    assert not any(isinstance(key, tuple) for mod in m.modules() for key in mod._kinds)
    attn = m.transformer.decoder.layers[0].multihead_attn
    q = attn._decode_weight("in_proj_weight", 32)       # the queries' rows: a view of the panels
    assert np.shares_memory(q.panels, attn._kind("in_proj_weight").panels)
    m.train()                              # the packed panels are for inference: dropped
    assert held_kinds(m) == {"Float32Weight"}
    m.set_precision("bf16")                # bf16 training's copies, made now, not on use
    assert held_kinds(m) == {"Bf16TrainingWeight"}
    assert all(m._ops is FastOps for m in m.modules())   # one fast table for every precision
    m.eval()                               # the copies end with training in bf16
    assert held_kinds(m) == {"PackedFloat32Weight"}
    m.quantize("int8")
    assert held_kinds(m) == {"Int8Weight"}
    m.quantize("float32").to_backend("reference")
    assert held_kinds(m) == {"TwinWeight"}
    assert all(m._ops is ReferenceOps for m in m.modules())


@pytest.mark.parametrize("dtype", ["int8", "bf16", "bfloat16"])
def test_quantized_weights_are_one_class_per_stored_type(dtype):
    w = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    qw = ops.QuantizedWeight.from_float(w, dtype)
    assert isinstance(qw, ops.QuantizedWeight) and isinstance(qw, kinds.WeightKind)
    assert type(qw) is {"int8": kinds.Int8Weight, "bf16": kinds.Bf16Weight,
                        "bfloat16": kinds.Bfloat16Weight}[dtype]
    assert qw.dtype == qw.kind == dtype
    assert type(qw[0:4]) is type(qw)


def test_an_optimizer_step_rounds_the_bf16_copies_again_in_place():
    """The step is a known point: the copies are rounded again there (into the same arrays),
    not at the next forward."""
    from fastattn import optim
    m = seq2seq().train().set_precision("bf16")
    opt = optim.AdamW(m, lr=1e-2)
    data = np.random.default_rng(1)
    src, tgt = token_batch(data, 30, [6, 4], 6), token_batch(data, 30, [5, 3], 5)
    lin = m.transformer.encoder.layers[0].linear1
    kind = lin._kind("weight")
    copy = kind.data
    m.loss(src, tgt, backward=True)
    opt.step()
    assert lin._kinds["weight"][1] == lin.weight.version     # refreshed by the step itself
    assert lin._kind("weight") is kind and kind.data is copy
    np.testing.assert_array_equal(copy, ops.round_bfloat16(lin.weight))


def test_twin_kinds_carry_the_compute_type():
    w = np.ones((4, 3), np.float32)
    assert ReferenceOps.weight_kind(w, "bf16").compute_type == "bfloat16"
    assert ReferenceOps.weight_kind(w, "fp32").compute_type == "float32"
    assert isinstance(ReferenceOps.weight_kind(w)[1:3], TwinWeight)


def _peak(fn):
    """The Python heap's peak above its level before fn() (tracemalloc), in bytes."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_bf16_precision_model_serves_as_float32_does():
    """After fit(precision="bf16") the model keeps its precision; its eval passes and decode
    steps are float32's: the workspace reuses its buffers (Workspace.fast) and, once warmed
    up, a forward and a decode step allocate no more than the float32 model's."""
    fp32, bf16 = seq2seq(seed=3), seq2seq(seed=3)
    bf16.train().set_precision("bf16").eval()
    assert bf16.precision == "bf16"
    assert Workspace(bf16._ops).fast and Workspace(fp32.eval()._ops).fast
    data = np.random.default_rng(2)
    src, tgt = token_batch(data, 30, [12, 7, 9], 12), token_batch(data, 30, [8, 5, 8], 8)
    peaks = {}
    for name, m in (("fp32", fp32), ("bf16", bf16)):
        cache = m.init_cache(src, beams=1, max_len=8)
        tokens = np.full(src.shape[0], 1)

        def run():
            m(src, tgt)
            m.step(tokens, cache)
        for _ in range(2):                  # warm-up: the workspaces and the decode plan
            run()
            cache.t = 0
        peaks[name] = _peak(run)
        np.testing.assert_array_equal(fp32(src, tgt), m(src, tgt))
    assert peaks["bf16"] <= peaks["fp32"] + 4096, peaks     # a few Python objects of slack
