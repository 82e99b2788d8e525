"""The rest of torch.nn's Transformer surface, against torch: the activation given as torch's
callables (and as a plain function), MultiheadAttention's kdim / vdim, add_bias_kv,
add_zero_attn, need_weights / average_attn_weights, is_causal and 2-D / 3-D masks,
Transformer's custom_encoder / custom_decoder, TransformerEncoder's enable_nested_tensor /
mask_check / norm=None, bias=False and layer_norm_eps, batch_first=False and unbatched inputs.

Every comparison runs on random weights moved off their initial values (biases off 0, norms
off 1 / 0), on both backends, forward and (where training applies) backward against torch
autograd: max|diff| <= 1e-5 * max|torch's| (REL). State dicts round trip with torch's keys,
both ways, strict. A query with no allowed key gives zeros here where torch gives NaN: such
rows are compared apart (zeros here), every other row equals torch.
"""
import contextlib
import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import assert_close, requires_torch
from fastattn import io
from fastattn import nn as fnn
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel, scaled

pytestmark = TORCH_WARNINGS

REL = TOL["nn_torch_surface"]["atol"]
BACKENDS = ["fast", "reference"]


def tt(torch, x, grad=False):
    """A torch tensor of x (None stays None), optionally requiring grad."""
    if x is None:
        return None
    a = torch.from_numpy(np.array(x))
    return a.requires_grad_() if grad else a


def twin(tm, fm):
    """fm holding tm's weights (keys checked equal first)."""
    assert list(fm.state_dict()) == list(tm.state_dict())
    fm.load_state_dict(tm.state_dict())
    return fm


# ----------------------------------------------------------------------------------------------
# activations: torch's callables by name, tanh-GELU unfused, a plain function in inference

ACTIVATIONS = {                    # id -> (torch's object, given to both; fastattn's name)
    "F.relu": (lambda torch: torch.nn.functional.relu, "relu"),
    "F.gelu": (lambda torch: torch.nn.functional.gelu, "gelu"),
    "torch.relu": (lambda torch: torch.relu, "relu"),
    "nn.ReLU": (lambda torch: torch.nn.ReLU(), "relu"),
    "nn.GELU": (lambda torch: torch.nn.GELU(), "gelu"),
    "nn.GELU-tanh": (lambda torch: torch.nn.GELU(approximate="tanh"), "gelu_tanh"),
    "F.silu": (lambda torch: torch.nn.functional.silu, "silu"),
    "nn.SiLU": (lambda torch: torch.nn.SiLU(), "silu"),
    "partial-gelu-tanh": (lambda torch: functools.partial(torch.nn.functional.gelu,
                                                          approximate="tanh"), "gelu_tanh"),
}


def layer_pair(torch, kind, backend, seed=0, **kw):
    """(torch layer, fastattn layer) of `kind` with the same weights, moved off init."""
    kw = {**dict(dim_feedforward=F, dropout=0.0, batch_first=True), **kw}
    cls = "TransformerEncoderLayer" if kind == "encoder" else "TransformerDecoderLayer"
    torch.manual_seed(seed)
    tl = getattr(torch.nn, cls)(C, H, **kw)
    perturb(torch, tl, seed)
    return tl, twin(tl, getattr(fnn, cls)(C, H, backend=backend, **kw))


def layer_inputs(rng, kind):
    """(positional inputs, keyword masks) of a layer forward; every query keeps key 0."""
    if kind == "encoder":
        kpm = padding(B, S, [S, 4, 6])
        return [features(rng, B, S)], dict(src_mask=bool_mask(rng, (S, S)),
                                           src_key_padding_mask=kpm)
    return [features(rng, B, T), features(rng, B, S)], dict(
        tgt_mask=fnn.generate_square_subsequent_mask(T),
        memory_key_padding_mask=padding(B, S, [S, 3, 5]))


@contextlib.contextmanager
def torch_inference(torch, fastpath=True):
    """inference_mode; fastpath=False turns torch's fused inference path off. That path reads
    GELU(approximate="tanh") as the exact GELU (it keeps only "is it a GELU"), so a tanh-GELU
    layer is compared with torch's own math (its training forward computes the same)."""
    old = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(old and fastpath)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(old)


def check_layer_vs_torch(torch, tl, fl, inputs, masks, rng, rel=REL, fastpath=True):
    """Inference on every non-padded position, then one training forward + backward: the
    output, every input gradient and every parameter gradient."""
    keep = ~masks.get("src_key_padding_mask", np.zeros(inputs[0].shape[:2], bool))
    tl.eval()
    with torch_inference(torch, fastpath):
        ref = tl(*(tt(torch, x) for x in inputs), **{k: tt(torch, m) for k, m in masks.items()})
    out = fl.eval()(*inputs, **masks)
    assert out.shape == inputs[0].shape and out.dtype == np.float32
    assert_close(out[keep], ref.numpy()[keep], **max_rel(ref.numpy()[keep], rel), name="inference")
    tl.train()
    xs = [tt(torch, x, grad=True) for x in inputs]
    ref = tl(*xs, **{k: tt(torch, m) for k, m in masks.items()})
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ref.backward(torch.from_numpy(dy))
    out = fl.train()(*inputs, **masks)
    assert_close(out, ref.detach().numpy(), **max_rel(ref.detach().numpy(), rel),
                 name="training forward")
    grads = fl.backward(dy)
    grads = grads if isinstance(grads, tuple) else (grads,)
    for g, x in zip(grads, xs):
        assert_close(g, x.grad.numpy(), **max_rel(x.grad.numpy(), rel), name="input gradient")
    assert_grads(fl, tl, rel=rel)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_layer_torch_activation_callables_vs_torch(rng, activation, kind, backend):
    """torch's relu / gelu callables are recognised by name (tanh-GELU runs unfused): forward
    and backward equal torch's layer given the same object."""
    torch = requires_torch()
    make, name = ACTIVATIONS[activation]
    tl, fl = layer_pair(torch, kind, backend, activation=make(torch), norm_first=kind == "decoder")
    assert fl.activation == name
    check_layer_vs_torch(torch, tl, fl, *layer_inputs(rng, kind), rng,
                         fastpath=name != "gelu_tanh")


def test_activation_strings_and_names():
    torch = requires_torch()
    assert fnn.TransformerEncoderLayer(C, H, F, activation="gelu").activation == "gelu"
    assert fnn.TransformerEncoderLayer(C, H, F, activation="gelu_tanh").activation == "gelu_tanh"
    m = fnn.Transformer(C, H, 1, 1, F, activation=torch.nn.GELU(approximate="tanh"))
    assert m.config["activation"] == "gelu_tanh"
    assert {layer.activation for layer in m.encoder.layers + m.decoder.layers} == {"gelu_tanh"}
    s2s = fnn.Seq2SeqTransformer(1, 1, C, H, 11, 13, F, activation=torch.nn.functional.gelu)
    assert s2s.config["activation"] == "gelu"


@pytest.mark.parametrize("make,msg", [
    (lambda torch: torch.nn.functional.mish, "mish"),
    (lambda torch: torch.nn.Mish(), "Mish"),
    (lambda torch: torch.tanh, "tanh"),
    (lambda torch: torch.nn.GELU(approximate="erf"), "approximate"),
    (lambda torch: "tanh", "'tanh'"),
    (lambda torch: 3, "3"),
])
def test_unknown_torch_activation_refused_by_name(make, msg):
    """A torch callable fastattn does not compute is refused at construction (it would fail
    on a NumPy array later), naming it."""
    torch = requires_torch()
    with pytest.raises(ValueError, match=msg) as exc:
        fnn.TransformerEncoderLayer(C, H, F, activation=make(torch))
    assert "activation" in str(exc.value)


def _np_act(x):                                   # a prototype's activation over NumPy
    return x * np.tanh(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_plain_callable_activation_vs_torch(rng, kind, backend):
    """Any other callable runs as a plain function over linear1's NumPy output, unfused:
    inference equals torch's layer with the same function written for tensors; train() is
    refused, naming the argument, and changes nothing."""
    torch = requires_torch()
    torch.manual_seed(1)
    cls = "TransformerEncoderLayer" if kind == "encoder" else "TransformerDecoderLayer"
    tl = getattr(torch.nn, cls)(C, H, F, dropout=0.0, activation=lambda x: x * torch.tanh(x),
                                batch_first=True).eval()
    perturb(torch, tl)
    fl = twin(tl, getattr(fnn, cls)(C, H, F, dropout=0.0, activation=_np_act, backend=backend))
    assert fl.activation is _np_act
    inputs, masks = layer_inputs(rng, kind)
    keep = ~masks.get("src_key_padding_mask", np.zeros(inputs[0].shape[:2], bool))
    with torch.inference_mode():
        ref = tl(*(tt(torch, x) for x in inputs), **{k: tt(torch, m) for k, m in masks.items()})
    assert_close(fl(*inputs, **masks)[keep], ref.numpy()[keep], **max_rel(ref.numpy()[keep], REL))
    with pytest.raises(RuntimeError, match="activation=_np_act.*inference only"):
        fl.train()
    assert not any(m.training for m in fl.modules())
    model = fnn.Transformer(C, H, 1, 1, F, activation=_np_act)
    with pytest.raises(RuntimeError, match="activation=_np_act"):
        model.train()


@pytest.mark.parametrize("backend", BACKENDS)
def test_plain_callable_activation_gets_a_numpy_array(rng, backend):
    seen = []

    def act(x):
        seen.append((type(x), x.dtype, x.shape))
        return np.maximum(x, 0.0)

    fl = fnn.TransformerEncoderLayer(C, H, F, dropout=0.0, activation=act, backend=backend,
                                     seed=3)
    ref = fnn.TransformerEncoderLayer(C, H, F, dropout=0.0, backend=backend, seed=3)
    x = features(rng, B, S)
    got, want = fl(x), ref(x)                              # relu by hand = the fused relu
    assert_close(got, want, **scaled(TOL["nn_backends"], want))
    assert seen == [(np.ndarray, np.float32, (B * S, F))]


@pytest.mark.parametrize("result,err,msg", [
    (lambda x: x[:, :3], ValueError, r"returned shape \(21, 3\) for an input of shape \(21, 64\)"),
    (lambda x: "no", TypeError, "returned str, not an array of numbers"),
    (lambda x: None, ValueError, r"returned shape \(\)"),
])
def test_plain_callable_bad_result_named(rng, result, err, msg):
    fl = fnn.TransformerEncoderLayer(C, H, F, activation=result)
    with pytest.raises(err, match=msg):
        fl(features(rng, B, S))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["gelu_tanh", "plain"])
def test_activation_decode_step_equals_forward(rng, backend, activation):
    """The tanh GELU (fused) and a plain callable (unfused) in a decode step (packed weights
    on the fast backend) give what the forward gives under the causal target mask."""
    act = _np_act if activation == "plain" else activation
    fl = fnn.TransformerDecoderLayer(C, H, F, dropout=0.0, activation=act, backend=backend,
                                     seed=5)
    for lin in (fl.linear1, fl.linear2):
        lin.bias += 0.1
    y, mem = features(rng, 2, T), features(rng, 2, S)
    full = fl(y, mem, tgt_is_causal=True)
    cache = fl.init_cache(mem, max_len=T)
    steps = np.stack([fl.step(y[:, t], cache) for t in range(T)], axis=1)
    assert_close(steps, full, **scaled(TOL["nn_backends"], full))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias,eps,norm_first", [(False, 1e-3, False), (False, 1e-6, True),
                                                 (True, 1e-2, True)])
@pytest.mark.parametrize("activation", ["partial-gelu-tanh", "F.relu"])
def test_transformer_options_vs_torch(rng, activation, bias, eps, norm_first, backend):
    """bias=False, layer_norm_eps and a torch activation callable through the whole model:
    forward (masked) and every gradient. (torch.nn.TransformerDecoder deep-copies its layer,
    and the copy of an activation given as a module, nn.GELU(), comes back as F.relu (its
    __setstate__ default): torch's own Transformer then runs relu in the decoder. fastattn
    keeps the activation given; the functional form survives torch's copy, so it is the one
    compared here.)"""
    torch = requires_torch()
    make, _ = ACTIVATIONS[activation]
    kw = dict(dropout=0.0, activation=make(torch), bias=bias, layer_norm_eps=eps,
              norm_first=norm_first, batch_first=True)
    torch.manual_seed(2)
    tm = torch.nn.Transformer(C, H, 2, 2, F, **kw)
    perturb(torch, tm)
    fm = twin(tm, fnn.Transformer(C, H, 2, 2, F, backend=backend, **kw))
    if not bias:
        assert not [k for k in fm.state_dict() if k.endswith("bias")]
    src, tgt = 0.3 * features(rng, B, S), 0.3 * features(rng, B, T)     # eps matters
    skpm = padding(B, S, [S, 3, 5])
    masks = dict(tgt_mask=fnn.generate_square_subsequent_mask(T), src_key_padding_mask=skpm,
                 memory_key_padding_mask=skpm)
    tm.train()
    ts, tg = tt(torch, src, grad=True), tt(torch, tgt, grad=True)
    ref = tm(ts, tg, **{k: tt(torch, m) for k, m in masks.items()})
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ref.backward(torch.from_numpy(dy))
    out = fm.train()(src, tgt, **masks)
    assert_close(out, ref.detach().numpy(), **max_rel(ref.detach().numpy(), REL))
    d_src, d_tgt = fm.backward(dy)
    assert_close(d_src, ts.grad.numpy(), **max_rel(ts.grad.numpy(), REL), name="d_src")
    assert_close(d_tgt, tg.grad.numpy(), **max_rel(tg.grad.numpy(), REL), name="d_tgt")
    assert_grads(fm, tm, rel=REL)
    with torch_inference(torch, fastpath=activation == "F.relu"):
        ref = tm.eval()(*(tt(torch, x) for x in (src, tgt)),
                        **{k: tt(torch, m) for k, m in masks.items()})
    keep = ~padding(B, T, [T, T, T])
    assert_close(fm.eval()(src, tgt, **masks)[keep], ref.numpy()[keep],
                 **max_rel(ref.numpy()[keep], REL), name="inference")


@pytest.mark.parametrize("bias", [True, False])
def test_io_round_trip_of_new_options(tmp_path, rng, bias):
    """bias=False, layer_norm_eps and GELU(approximate="tanh") (saved by name) load back."""
    torch = requires_torch()
    m = fnn.Transformer(C, H, 1, 2, F, dropout=0.0, bias=bias, layer_norm_eps=1e-3,
                        activation=torch.nn.GELU(approximate="tanh"), seed=4)
    for _, p in m.named_parameters():
        p += 0.05
    m.invalidate_caches()
    io.save(m, tmp_path / "m.safetensors")
    back = io.load(tmp_path / "m.safetensors")
    assert back.config == m.config and back.config["activation"] == "gelu_tanh"
    assert list(back.state_dict()) == list(m.state_dict())
    assert list(io.state_dict_shapes("Transformer", m.config)) == [
        (k, v.shape) for k, v in m.state_dict().items()]
    src, tgt = features(rng, 2, S), features(rng, 2, T)
    assert np.array_equal(back(src, tgt), m(src, tgt))


def test_io_save_refuses_what_a_config_cannot_rebuild(tmp_path):
    with pytest.raises(ValueError, match="activation.*callable"):
        io.save(fnn.Transformer(C, H, 1, 1, F, activation=_np_act), tmp_path / "a.safetensors")
    enc = fnn.TransformerEncoder(fnn.TransformerEncoderLayer(C, H, F), 1)
    with pytest.raises(ValueError, match="custom_encoder"):
        io.save(fnn.Transformer(C, H, 1, 1, F, custom_encoder=enc), tmp_path / "b.safetensors")
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------------
# MultiheadAttention: kdim / vdim, add_bias_kv, add_zero_attn, weights, masks, is_causal

KD, VD = 12, 20                     # key and value features when they differ from C
MHA_OPTIONS = {
    "kdim_vdim": dict(kdim=KD, vdim=VD),
    "kdim_eq_vdim": dict(kdim=KD, vdim=KD, bias=False),
    "bias_kv": dict(add_bias_kv=True),
    "zero_attn": dict(add_zero_attn=True),
    "bias_kv_zero_attn_no_bias": dict(add_bias_kv=True, add_zero_attn=True, bias=False),
    "all": dict(kdim=KD, vdim=VD, add_bias_kv=True, add_zero_attn=True),
}


def mha_twins(torch, opts, backend="fast", heads=H, seed=0, **kw):
    torch.manual_seed(seed)
    tm = torch.nn.MultiheadAttention(C, heads, batch_first=True, **opts, **kw).eval()
    perturb(torch, tm, seed)
    fm = fnn.MultiheadAttention(C, heads, backend=backend, **opts, **kw)
    return tm, twin(tm, fm)


def mha_inputs(rng, opts, kind, b, lq, lk):
    """(query, key, value): self (one array), cross (key is value) or distinct arrays."""
    kdim, vdim = opts.get("kdim", C), opts.get("vdim", C)
    q = features(rng, b, lq)
    if kind == "self":
        return q, q, q
    k = features(rng, b, lk, kdim)
    return q, k, (k if kind == "cross" else features(rng, b, lk, vdim))


def kinds_for(opts):
    same = opts.get("kdim", C) == C and opts.get("vdim", C) == C
    return ["self", "cross", "distinct"] if same else \
        (["cross", "distinct"] if opts.get("kdim") == opts.get("vdim") else ["distinct"])


def run_torch_mha(torch, tm, q, k, v, **kw):
    tq = tt(torch, q)
    tk = tq if k is q else tt(torch, k)
    tv = tk if v is k else tt(torch, v)
    masks = [kw.get("attn_mask"), kw.get("key_padding_mask")]
    with torch_fastpath(torch, masks):
        out, w = tm(tq, tk, tv, **{n: tt(torch, m) if isinstance(m, np.ndarray) else m
                                   for n, m in kw.items()})
    return out.numpy(), (None if w is None else w.numpy())


@pytest.mark.parametrize("option", list(MHA_OPTIONS))
def test_mha_options_state_dict_round_trip(rng, option):
    """torch's keys, order and shapes; fastattn -> torch (strict) and back, same outputs."""
    torch = requires_torch()
    opts = MHA_OPTIONS[option]
    tm, fm = mha_twins(torch, opts)
    tsd = tm.state_dict()
    assert [(k, v.shape) for k, v in fm.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in tsd.items()]
    fresh = fnn.MultiheadAttention(C, H, **opts, seed=9)
    assert [(k, v.shape) for k, v in fresh.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in tsd.items()]         # torch's layout from the start
    assert fresh.in_proj_bias is None or not fresh.in_proj_bias.any()   # torch's init: 0
    t2 = torch.nn.MultiheadAttention(C, H, batch_first=True, **opts).eval()
    t2.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in fm.state_dict().items()},
                       strict=True)
    back = fnn.MultiheadAttention(C, H, **opts)
    back.load_state_dict(t2.state_dict(), strict=True)
    for k, v in fm.state_dict().items():
        assert np.array_equal(back.state_dict()[k], v), k
    q, k, v = mha_inputs(rng, opts, "distinct", B, T, S)
    ref, ref_w = run_torch_mha(torch, t2, q, k, v)
    out, w = back(q, k, v)
    assert_close(out, ref, **max_rel(ref, REL))
    assert_close(w, ref_w, **max_rel(ref_w, REL), name="weights")


@st.composite
def mha_cases(draw):
    option = draw(st.sampled_from(list(MHA_OPTIONS)))
    return dict(option=option, kind=draw(st.sampled_from(kinds_for(MHA_OPTIONS[option]))),
                masking=draw(st.sampled_from(MHA_MASKS)),
                weights=draw(st.sampled_from(["none", "average", "per_head"])),
                b=draw(st.integers(1, 3)), lq=draw(st.integers(1, 9)),
                lk=draw(st.integers(1, 9)), heads=draw(st.sampled_from([1, 2, 4, 8])),
                seed=draw(st.integers(0, 2 ** 31)))


def case_masks(rng, masking, b, heads, lq, lk):
    """mha_masks for batch b and `heads` heads (every query keeps key 0)."""
    kw = {}
    if masking.startswith("kpm"):
        kpm = rng.random((b, lk)) < 0.4
        kpm[:, 0] = False
        if masking == "kpm_float":
            kpm = np.where(kpm, -np.inf, rng.standard_normal((b, lk))).astype(np.float32)
        kw["key_padding_mask"] = kpm
    return add_attn_mask(kw, rng, masking, lq, lk, b * heads)


@pytest.mark.parametrize("backend", BACKENDS)
@given(case=mha_cases())
def test_mha_options_vs_torch(backend, case):
    """Every option with self-, cross- and distinct-input attention, every mask kind (2-D and
    3-D, bool and float, key padding bool and float), need_weights off / averaged / per head,
    over sizes from 1."""
    torch = requires_torch()
    rng = np.random.default_rng(case["seed"])
    opts = MHA_OPTIONS[case["option"]]
    tm, fm = mha_twins(torch, opts, backend, heads=case["heads"], seed=case["seed"] % 1000)
    lk = case["lq"] if case["kind"] == "self" else case["lk"]
    q, k, v = mha_inputs(rng, opts, case["kind"], case["b"], case["lq"], lk)
    kw = case_masks(rng, case["masking"], case["b"], case["heads"], case["lq"], lk)
    kw["need_weights"] = case["weights"] != "none"
    kw["average_attn_weights"] = case["weights"] == "average"
    ref, ref_w = run_torch_mha(torch, tm, q, k, v, **kw)
    out, w = fm(q, k, v, **kw)
    assert out.shape == ref.shape and out.dtype == np.float32
    assert_close(out, ref, **max_rel(ref, REL))
    if ref_w is None:
        assert w is None
    else:
        assert w.shape == ref_w.shape and w.dtype == np.float32
        assert_close(w, ref_w, **max_rel(ref_w, REL), name="weights")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("masking", ["kpm", "2d_float", "3d_bool"])
@pytest.mark.parametrize("option", list(MHA_OPTIONS))
def test_mha_options_backward_vs_torch(rng, option, masking, backend):
    """Training: the output, the weights torch returns in training (dropout 0), the input
    gradients and every parameter's (q/k/v_proj_weight, bias_k, bias_v, in_proj_bias,
    out_proj)."""
    torch = requires_torch()
    opts = MHA_OPTIONS[option]
    tm, fm = mha_twins(torch, opts, backend, seed=3)
    q, k, v = mha_inputs(rng, opts, "distinct", B, T, S)
    kw = mha_masks(rng, masking, T, S)
    tq, tk, tv = (tt(torch, x, grad=True) for x in (q, k, v))
    ref, ref_w = tm.train()(tq, tk, tv, **{n: tt(torch, m) for n, m in kw.items()})
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ref.backward(torch.from_numpy(dy))
    out, w = fm.train()(q, k, v, **kw)
    assert_close(out, ref.detach().numpy(), **max_rel(ref.detach().numpy(), REL))
    assert_close(w, ref_w.detach().numpy(), **max_rel(ref_w.detach().numpy(), REL), name="weights")
    for g, x, name in zip(fm.backward(dy), (tq, tk, tv), ("d_query", "d_key", "d_value")):
        assert_close(g, x.grad.numpy(), **max_rel(x.grad.numpy(), REL), name=name)
    assert_grads(fm, tm, rel=REL)
    assert {"bias_k", "bias_v"} <= set(dict(fm.named_grads())) or not opts.get("add_bias_kv")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", ["kdim_vdim", "kdim_eq_vdim", "bias_kv", "zero_attn"])
def test_mha_fully_masked_rows(rng, option, backend):
    """A batch whose keys are all padded: torch gives NaN there (its weights path), fastattn
    zeros from attention (the output row is out_proj's bias); every other row equals torch.
    add_bias_kv / add_zero_attn append keys no mask hides (torch pads its masks): no row is
    fully masked then, and every row equals torch."""
    torch = requires_torch()
    opts = MHA_OPTIONS[option]
    tm, fm = mha_twins(torch, opts, backend, seed=4)
    q, k, v = mha_inputs(rng, opts, "distinct", B, T, S)
    kpm = padding(B, S, [S, 0, 3])                  # batch 1: every key padded
    ref, ref_w = run_torch_mha(torch, tm, q, k, v, key_padding_mask=kpm)
    out, w = fm(q, k, v, key_padding_mask=kpm)
    assert np.isfinite(out).all() and np.isfinite(w).all()
    if fm._extra_keys:
        assert np.isfinite(ref).all()
        assert_close(out, ref, **max_rel(ref, REL))
        assert_close(w, ref_w, **max_rel(ref_w, REL), name="weights")
        return
    assert np.isnan(ref[1]).all()
    live = [0, 2]
    assert_close(out[live], ref[live], **max_rel(ref[live], REL))
    assert_close(w[live], ref_w[live], **max_rel(ref_w[live], REL), name="weights")
    bias = np.zeros(C, np.float32) if fm.out_proj.bias is None else fm.out_proj.bias
    assert np.array_equal(out[1], np.broadcast_to(bias, (T, C)))
    assert np.all(w[1] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", ["plain", "bias_kv", "zero_attn"])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_mha_is_causal_hint(rng, mask_kind, option, backend):
    """is_causal=True with the causal attn_mask equals torch (need_weights on and off, with
    and without key padding). Without an attn_mask torch raises; fastattn applies the causal
    rule itself, which equals torch given the mask."""
    torch = requires_torch()
    opts = {} if option == "plain" else MHA_OPTIONS[option]
    tm, fm = mha_twins(torch, opts, backend, seed=5)
    x = features(rng, B, T)
    causal = np.triu(np.ones((T, T), bool), k=1)
    mask = causal if mask_kind == "bool" else fnn.generate_square_subsequent_mask(T)
    kpm = padding(B, T, [T, 3, 2])
    for kw in (dict(need_weights=False), dict(need_weights=True),
               dict(need_weights=False, key_padding_mask=kpm)):
        ref, _ = run_torch_mha(torch, tm, x, x, x, attn_mask=mask, is_causal=True, **kw)
        if opts:                  # torch's SDPA is_causal ignores the padded mask: ask it
            ref, _ = run_torch_mha(torch, tm, x, x, x, attn_mask=mask, **kw)
        out, _ = fm(x, x, x, attn_mask=mask, is_causal=True, **kw)
        assert_close(out, ref, **max_rel(ref, REL), name=str(kw))
        out, _ = fm(x, x, x, is_causal=True, **kw)
        assert_close(out, ref, **max_rel(ref, REL), name=f"no mask {kw}")
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        tm(tt(torch, x), tt(torch, x), tt(torch, x), is_causal=True)


# ----------------------------------------------------------------------------------------------
# batch_first=False and unbatched inputs

def to_layout(x, layout):
    """A batch-first array in `layout`: "seq_first" (L, B, C) or "unbatched" (batch 0)."""
    return np.ascontiguousarray(x.swapaxes(0, 1)) if layout == "seq_first" else x[0].copy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", ["plain", "all"])
@pytest.mark.parametrize("layout", ["seq_first", "unbatched"])
def test_mha_layouts_vs_torch(rng, layout, option, backend):
    """batch_first=False takes and returns (L, B, C); unbatched (L, C) inputs give (L, C) and
    weights without the batch axis; forward and backward equal torch."""
    torch = requires_torch()
    opts = {} if option == "plain" else MHA_OPTIONS[option]
    b = 1 if layout == "unbatched" else B
    q, k, v = (to_layout(x, layout) for x in mha_inputs(rng, opts, "distinct", b, T, S))
    kpm = padding(b, S, [S, 3, 5][:b])
    kw = dict(key_padding_mask=kpm[0] if layout == "unbatched" else kpm,
              attn_mask=bool_mask(rng, (b * H, T, S)), average_attn_weights=False)
    torch.manual_seed(6)
    tm = torch.nn.MultiheadAttention(C, H, batch_first=False, **opts)
    perturb(torch, tm, 6)
    fm = twin(tm, fnn.MultiheadAttention(C, H, batch_first=False, backend=backend, **opts))
    ref, ref_w = run_torch_mha(torch, tm.eval(), q, k, v, **kw)
    out, w = fm(q, k, v, **kw)
    assert out.shape == ref.shape and w.shape == ref_w.shape
    assert_close(out, ref, **max_rel(ref, REL))
    assert_close(w, ref_w, **max_rel(ref_w, REL), name="weights")
    tq, tk, tv = (tt(torch, x, grad=True) for x in (q, k, v))
    ref, _ = tm.train()(tq, tk, tv, **{n: tt(torch, m) if isinstance(m, np.ndarray) else m
                                       for n, m in kw.items()})
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ref.backward(torch.from_numpy(dy))
    out, _ = fm.train()(q, k, v, **kw)
    assert_close(out, ref.detach().numpy(), **max_rel(ref.detach().numpy(), REL))
    for g, x in zip(fm.backward(dy), (tq, tk, tv)):
        assert g.shape == x.shape
        assert_close(g, x.grad.numpy(), **max_rel(x.grad.numpy(), REL), name="input gradient")
    assert_grads(fm, tm, rel=REL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("layout", ["seq_first", "unbatched"])
def test_layer_layouts_vs_torch(rng, layout, kind, backend):
    torch = requires_torch()
    tl, fl = layer_pair(torch, kind, backend, seed=7, batch_first=False)
    b = 1 if layout == "unbatched" else B
    if kind == "encoder":
        kpm = padding(b, S, [S, 4, 6][:b])
        inputs = [to_layout(features(rng, b, S), layout)]
        masks = dict(src_mask=bool_mask(rng, (S, S)),
                     src_key_padding_mask=kpm[0] if layout == "unbatched" else kpm)
    else:
        kpm = padding(b, S, [S, 3, 5][:b])
        inputs = [to_layout(features(rng, b, T), layout), to_layout(features(rng, b, S), layout)]
        masks = dict(tgt_mask=fnn.generate_square_subsequent_mask(T),
                     memory_key_padding_mask=kpm[0] if layout == "unbatched" else kpm)
    tl.eval()
    with torch.inference_mode():
        ref = tl(*(tt(torch, x) for x in inputs), **{k: tt(torch, m) for k, m in masks.items()})
    out = fl.eval()(*inputs, **masks)
    assert out.shape == ref.shape
    if kind == "encoder":                         # torch's fast path zeros padded positions
        keep = ~kpm[0] if layout == "unbatched" else ~kpm.T
        assert_close(out[keep], ref.numpy()[keep], **max_rel(ref.numpy()[keep], REL))
    else:
        assert_close(out, ref.numpy(), **max_rel(ref.numpy(), REL))
    tl.train()
    xs = [tt(torch, x, grad=True) for x in inputs]
    ref = tl(*xs, **{k: tt(torch, m) for k, m in masks.items()})
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ref.backward(torch.from_numpy(dy))
    assert_close(fl.train()(*inputs, **masks), ref.detach().numpy(),
                 **max_rel(ref.detach().numpy(), REL))
    grads = fl.backward(dy)
    for g, x in zip(grads if isinstance(grads, tuple) else (grads,), xs):
        assert g.shape == x.shape
        assert_close(g, x.grad.numpy(), **max_rel(x.grad.numpy(), REL), name="input gradient")
    assert_grads(fl, tl, rel=REL)


def check_transformer_training(torch, rng, fm, tm, src, tgt, masks):
    """A training forward and backward of fastattn's Transformer fm against torch's tm (the
    same weights): outputs, input gradients and parameter gradients."""
    ts, tg = tt(torch, src, grad=True), tt(torch, tgt, grad=True)
    ref = tm.train()(ts, tg, **{k: tt(torch, m) for k, m in masks.items()})
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ref.backward(torch.from_numpy(dy))
    assert_close(fm.train()(src, tgt, **masks), ref.detach().numpy(),
                 **max_rel(ref.detach().numpy(), REL))
    d_src, d_tgt = fm.backward(dy)
    assert_close(d_src, ts.grad.numpy(), **max_rel(ts.grad.numpy(), REL), name="d_src")
    assert_close(d_tgt, tg.grad.numpy(), **max_rel(tg.grad.numpy(), REL), name="d_tgt")
    assert_grads(fm, tm, rel=REL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["seq_first", "unbatched"])
def test_transformer_layouts_vs_torch(rng, layout, backend):
    torch = requires_torch()
    torch.manual_seed(8)
    tm = torch.nn.Transformer(C, H, 2, 1, F, dropout=0.0, batch_first=False)
    perturb(torch, tm, 8)
    fm = twin(tm, fnn.Transformer(C, H, 2, 1, F, dropout=0.0, batch_first=False,
                                  backend=backend))
    assert fm.encoder.batch_first is False and fm.decoder.layers[0].self_attn.batch_first is False
    b = 1 if layout == "unbatched" else B
    src, tgt = to_layout(features(rng, b, S), layout), to_layout(features(rng, b, T), layout)
    kpm = padding(b, S, [S, 3, 5][:b])
    kpm = kpm[0] if layout == "unbatched" else kpm
    masks = dict(tgt_mask=fnn.generate_square_subsequent_mask(T), memory_key_padding_mask=kpm)
    with torch.inference_mode():
        ref = tm.eval()(tt(torch, src), tt(torch, tgt),
                        **{k: tt(torch, m) for k, m in masks.items()})
    out = fm.eval()(src, tgt, **masks)
    assert out.shape == ref.shape
    assert_close(out, ref.numpy(), **max_rel(ref.numpy(), REL))
    w = fm.attention_weights(src, tgt, **masks)
    assert w["cross"][0].shape == ((H, T, S) if layout == "unbatched" else (B, H, T, S))
    check_transformer_training(torch, rng, fm, tm, src, tgt, masks)


def test_decoder_cache_takes_memory_in_the_module_layout(rng):
    fl = fnn.TransformerDecoder(fnn.TransformerDecoderLayer(C, H, F, dropout=0.0,
                                                            batch_first=False, seed=2), 2)
    y, mem = features(rng, 2, T), features(rng, 2, S)
    full = fl(to_layout(y, "seq_first"), to_layout(mem, "seq_first"), tgt_is_causal=True)
    cache = fl.init_cache(to_layout(mem, "seq_first"), max_len=T)
    steps = np.stack([fl.step(y[:, t], cache) for t in range(T)], axis=0)    # (T, B, C)
    assert_close(steps, full, **scaled(TOL["nn_backends"], full))


def test_layout_errors_name_the_input(rng):
    m = fnn.MultiheadAttention(C, H, batch_first=False)
    with pytest.raises(ValueError, match=r"key must be unbatched.*\(2, 3, 32\)"):
        m(np.zeros((4, C), np.float32), np.zeros((2, 3, C), np.float32),
          np.zeros((2, 3, C), np.float32))
    with pytest.raises(ValueError, match=r"src must be \(L, B, C\)"):
        fnn.TransformerEncoderLayer(C, H, F, batch_first=False)(np.zeros((1, 2, 3, C)))


# ----------------------------------------------------------------------------------------------
# stacks: norm=None, enable_nested_tensor, mask_check; torch modules refused by name

@pytest.mark.parametrize("backend", BACKENDS)
def test_encoder_flags_and_norm_none_vs_torch(rng, backend):
    torch = requires_torch()
    torch.manual_seed(10)
    tl = torch.nn.TransformerEncoderLayer(C, H, F, dropout=0.0, batch_first=True)
    te = torch.nn.TransformerEncoder(tl, 2, norm=None, enable_nested_tensor=False,
                                     mask_check=False)
    perturb(torch, te, 10)
    fe = twin(te, fnn.TransformerEncoder(fnn.TransformerEncoderLayer(C, H, F, dropout=0.0,
                                                                     backend=backend), 2,
                                         norm=None, enable_nested_tensor=False,
                                         mask_check=False))
    assert fe.norm is None and not fe.enable_nested_tensor and not fe.mask_check
    x = features(rng, B, S)
    kpm = padding(B, S, [S, 2, 5])
    check_layer_vs_torch(torch, te, fe, [x], dict(src_key_padding_mask=kpm), rng)


def test_stacks_refuse_torch_modules_by_name():
    torch = requires_torch()
    with pytest.raises(TypeError, match="encoder_layer.*fastattn.nn.TransformerEncoderLayer"):
        fnn.TransformerEncoder(torch.nn.TransformerEncoderLayer(C, H, F), 2)
    with pytest.raises(TypeError, match="encoder_layer"):
        fnn.TransformerEncoder(fnn.TransformerDecoderLayer(C, H, F), 2)
    with pytest.raises(TypeError, match="decoder_layer"):
        fnn.TransformerDecoder(fnn.TransformerEncoderLayer(C, H, F), 2)
    with pytest.raises(TypeError, match="norm.*LayerNorm"):
        fnn.TransformerEncoder(fnn.TransformerEncoderLayer(C, H, F), 2, torch.nn.LayerNorm(C))
    with pytest.raises(TypeError, match="custom_decoder.*torch module"):
        fnn.Transformer(C, H, 1, 1, F, custom_decoder=torch.nn.TransformerDecoder(
            torch.nn.TransformerDecoderLayer(C, H, F), 1))
    with pytest.raises(TypeError, match="custom_encoder must be callable"):
        fnn.Transformer(C, H, 1, 1, F, custom_encoder=3)
    with pytest.raises(ValueError, match="custom_encoder has d_model 16"):
        fnn.Transformer(C, H, 1, 1, F, custom_encoder=fnn.TransformerEncoder(
            fnn.TransformerEncoderLayer(16, 2, F), 1))


# ----------------------------------------------------------------------------------------------
# custom_encoder / custom_decoder

def custom_stacks(torch, backend, n_enc=3, n_dec=1):
    """torch and fastattn custom stacks of other depths than the model's, final norm moved."""
    kw = dict(dim_feedforward=F, dropout=0.0, batch_first=True)
    t_enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(C, H, **kw), n_enc,
                                        torch.nn.LayerNorm(C), enable_nested_tensor=False)
    t_dec = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(C, H, **kw), n_dec,
                                        torch.nn.LayerNorm(C))
    f_enc = fnn.TransformerEncoder(fnn.TransformerEncoderLayer(C, H, **kw), n_enc,
                                   fnn.LayerNorm(C))
    f_dec = fnn.TransformerDecoder(fnn.TransformerDecoderLayer(C, H, **kw), n_dec,
                                   fnn.LayerNorm(C), backend=backend)
    return t_enc, t_dec, f_enc, f_dec


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("parts", ["encoder", "decoder", "both"])
def test_custom_fastattn_stacks_vs_torch(rng, parts, backend):
    """fastattn stacks as custom parts: torch's keys (the custom stacks' own), forward and
    backward equal torch's Transformer built with torch's stacks, state_dict round trip."""
    torch = requires_torch()
    torch.manual_seed(11)
    t_enc, t_dec, f_enc, f_dec = custom_stacks(torch, backend)
    t_kw, f_kw = {}, {}
    if parts in ("encoder", "both"):
        t_kw["custom_encoder"], f_kw["custom_encoder"] = t_enc, f_enc
    if parts in ("decoder", "both"):
        t_kw["custom_decoder"], f_kw["custom_decoder"] = t_dec, f_dec
    tm = torch.nn.Transformer(C, H, 2, 2, F, dropout=0.0, batch_first=True, **t_kw)
    perturb(torch, tm, 11)
    fm = fnn.Transformer(C, H, 2, 2, F, dropout=0.0, backend=backend, **f_kw)
    assert {m.backend for m in fm.modules()} == {backend}
    assert fm.custom_parts == tuple(f_kw)
    twin(tm, fm)
    t2 = torch.nn.Transformer(C, H, 2, 2, F, dropout=0.0, batch_first=True,
                              **{k: type(v)(*_stack_args(v)) for k, v in t_kw.items()})
    t2.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in fm.state_dict().items()},
                       strict=True)
    src, tgt = features(rng, B, S), features(rng, B, T)
    skpm = padding(B, S, [S, 4, 2])
    masks = dict(tgt_mask=fnn.generate_square_subsequent_mask(T), src_key_padding_mask=skpm,
                 memory_key_padding_mask=skpm)
    check_transformer_training(torch, rng, fm, tm, src, tgt, masks)
    with torch.inference_mode():
        ref = t2.eval()(tt(torch, src), tt(torch, tgt),
                        **{k: tt(torch, m) for k, m in masks.items()})
    assert_close(fm.eval()(src, tgt, **masks), ref.numpy(), **max_rel(ref.numpy(), REL),
                 name="inference")
    weights = fm.attention_weights(src, tgt, **masks)
    assert len(weights["encoder"]) == len(fm.encoder.layers)


def _stack_args(stack):
    """A fresh torch stack of the same structure (for a second torch model)."""
    return (stack.layers[0], stack.num_layers, stack.norm)


class TorchScale:
    """A parameterless torch-side custom encoder: memory = 2 * src + mask count."""

    def __init__(self, torch):
        self.torch = torch

    def __call__(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        extra = 0.0 if src_key_padding_mask is None else \
            src_key_padding_mask.float().sum(-1)[:, None, None]
        return 2.0 * src + extra


def np_scale(src, mask=None, src_key_padding_mask=None, is_causal=None):
    """TorchScale over NumPy."""
    extra = 0.0 if src_key_padding_mask is None else \
        src_key_padding_mask.sum(-1)[:, None, None].astype(np.float32)
    return 2.0 * src + extra


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_callable_encoder_vs_torch(rng, backend):
    """A plain callable custom_encoder is called as torch calls it (keywords, NumPy arrays);
    inference equals torch with the same function written for tensors; train() and
    attention_weights refuse it by name; io.save refuses it."""
    torch = requires_torch()
    torch.manual_seed(12)
    tm = torch.nn.Transformer(C, H, 1, 2, F, dropout=0.0, batch_first=True,
                              custom_encoder=TorchScale(torch))
    perturb(torch, tm, 12)
    calls = []

    def enc(src, **kw):
        calls.append(sorted(kw))
        return np_scale(src, **kw)

    fm = twin(tm, fnn.Transformer(C, H, 1, 2, F, dropout=0.0, custom_encoder=enc,
                                  backend=backend))
    assert all(k.startswith("decoder.") for k in fm.state_dict())
    src, tgt = features(rng, B, S), features(rng, B, T)
    kpm = padding(B, S, [S, 3, 5])
    with torch.inference_mode():
        ref = tm.eval()(tt(torch, src), tt(torch, tgt), src_key_padding_mask=tt(torch, kpm),
                        memory_key_padding_mask=tt(torch, kpm), tgt_is_causal=True,
                        tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(T))
    out = fm(src, tgt, src_key_padding_mask=kpm, memory_key_padding_mask=kpm, tgt_is_causal=True)
    assert calls == [["is_causal", "mask", "src_key_padding_mask"]]
    assert_close(out, ref.numpy(), **max_rel(ref.numpy(), REL))
    with pytest.raises(RuntimeError, match="custom_encoder.*backward"):
        fm.train()
    assert not fm.training
    with pytest.raises(TypeError, match="attention_weights.*custom_encoder"):
        fm.attention_weights(src, tgt)


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_callable_decoder_gets_torch_arguments(rng, backend):
    """A plain callable custom_decoder gets the target, the memory (the encoder's output) and
    every mask as given, by torch's keywords; its output is the model's."""
    got = {}

    def dec(tgt, memory, **kw):
        got.update(kw, memory=memory)
        return tgt + memory[:, :1]

    fm = fnn.Transformer(C, H, 1, 1, F, dropout=0.0, custom_decoder=dec, backend=backend)
    src, tgt = features(rng, B, S), features(rng, B, T)
    tmask = fnn.generate_square_subsequent_mask(T)
    out = fm(src, tgt, tgt_mask=tmask, memory_is_causal=False)
    assert sorted(got) == ["memory", "memory_is_causal", "memory_key_padding_mask",
                           "memory_mask", "tgt_is_causal", "tgt_key_padding_mask", "tgt_mask"]
    assert got["tgt_mask"] is tmask
    want = fm.encoder(src)
    assert_close(got["memory"], want, **scaled(TOL["nn_backends"], want))
    want = tgt + got["memory"][:, :1]
    assert_close(out, want, **scaled(TOL["nn_backends"], want))
    bad = fnn.Transformer(C, H, 1, 1, F, custom_decoder=lambda tgt, memory, **kw: tgt[:, :2])
    with pytest.raises(ValueError, match=r"custom_decoder returned shape \(3, 2, 32\)"):
        bad(src, tgt)


def test_custom_part_in_seq_first_layout(rng):
    """With batch_first=False a custom part gets and returns torch's (L, B, C) arrays."""
    shapes = []

    def enc(src, **kw):
        shapes.append(src.shape)
        return src

    fm = fnn.Transformer(C, H, 1, 1, F, dropout=0.0, batch_first=False, custom_encoder=enc)
    src, tgt = features(rng, B, S), features(rng, B, T)
    out = fm(to_layout(src, "seq_first"), to_layout(tgt, "seq_first"))
    assert shapes == [(S, B, C)] and out.shape == (T, B, C)
    want = fm.decoder(to_layout(tgt, "seq_first"), to_layout(src, "seq_first"))
    assert_close(out, want, **scaled(TOL["nn_backends"], want))


# ----------------------------------------------------------------------------------------------
# cases from torch's own MultiheadAttention unit tests (test/nn/test_multihead_attention.py)

@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_case_in_proj_weight_none(rng, backend):
    """kdim = vdim = 2 != embed_dim 4 (4 heads of 1 feature), torch's default layout
    (batch_first=False): separate projection weights, no in_proj_weight. fastattn computes in
    float32 (a float64 input is converted; torch would answer in float64)."""
    torch = requires_torch()
    torch.manual_seed(13)
    tm = torch.nn.MultiheadAttention(4, 4, vdim=2, kdim=2)
    perturb(torch, tm, 13)
    fm = twin(tm, fnn.MultiheadAttention(4, 4, vdim=2, kdim=2, batch_first=False,
                                         backend=backend))
    assert fm.in_proj_weight is None and tm.in_proj_weight is None
    q, k = rng.random((4, 4, 4)), rng.random((4, 4, 2))             # float64, as torch's test
    ref, ref_w = run_torch_mha(torch, tm.eval(), q.astype(np.float32), k.astype(np.float32),
                               k.astype(np.float32))
    out, w = fm(q, k, k)
    assert out.dtype == np.float32
    assert_close(out, ref, **max_rel(ref, REL))
    assert_close(w, ref_w, **max_rel(ref_w, REL), name="weights")


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_case_3d_mask_equals_per_batch_2d(rng, backend):
    """A (B * H, L, S) mask repeating a per-batch (L, S) mask gives, batch by batch, what
    that 2-D mask gives."""
    m = fnn.MultiheadAttention(8, 4, backend=backend, seed=14)
    m.in_proj_bias[...] = rng.standard_normal(24)
    q, k = rng.random((8, 2, 8)), rng.random((8, 3, 8))
    mask = np.where(rng.random((8, 2, 3)) < 0.5, -np.inf, 0.0).astype(np.float32)
    mask[..., 0] = 0.0
    out3, _ = m(q, k, k, attn_mask=np.repeat(mask, 4, axis=0))
    for i in range(8):
        out2, _ = m(q[i:i + 1], k[i:i + 1], k[i:i + 1], attn_mask=mask[i])
        assert_close(out3[i:i + 1], out2, **scaled(TOL["nn_backends"], out2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("need_weights", [False, True])
def test_torch_case_two_masks_fully_masked_rows(need_weights, backend):
    """torch's two-masks case: random bool attn_mask and key padding mask, so some query rows
    have no allowed key. Those are NaN in torch (or whatever its fast path leaves) and zeros
    from attention here (the row is out_proj's bias); every other row equals torch."""
    torch = requires_torch()
    rng = np.random.default_rng(15)
    tm, fm = mha_twins(torch, {}, backend, heads=8, seed=15)
    x = rng.random((8, 5, C)).astype(np.float32)
    attn_mask = rng.random((5, 5)) < 0.5
    kpm = rng.random((8, 5)) < 0.5
    blocked = (attn_mask[None] | kpm[:, None, :]).all(-1)                     # (B, L)
    assert blocked.any() and not blocked.all()
    ref, ref_w = run_torch_mha(torch, tm, x, x, x, attn_mask=attn_mask, key_padding_mask=kpm,
                               need_weights=need_weights)
    out, w = fm(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm, need_weights=need_weights)
    assert np.isfinite(out).all()
    assert_close(out[~blocked], ref[~blocked], **max_rel(ref[~blocked], REL))
    assert np.array_equal(out[blocked], np.broadcast_to(fm.out_proj.bias, out[blocked].shape))
    if need_weights:
        assert_close(w[~blocked], ref_w[~blocked], **max_rel(ref_w[~blocked], REL), name="weights")
        assert np.all(w[blocked] == 0)


@pytest.mark.parametrize("call,msg", [
    (lambda m, x, x2: m(x, x2, x), r"key must be \(B, L, d_model\)"),
    (lambda m, x, x2: m(x, x, x2), r"value must be \(B, L, d_model\)"),
    (lambda m, x, x2: m(x, x, x, key_padding_mask=np.array([0, 0, 1, 1], bool)),
     r"key_padding_mask must be \(B, S\) = \(4, 4\)"),
    (lambda m, x, x2: m(x, x, x, attn_mask=np.array([0, 0, 1, 1], bool)),
     r"attn_mask must be \(L, S\) = \(4, 4\) or \(B\*nhead, L, S\)"),
    (lambda m, x, x2: m(x2, x, x2), r"key must be unbatched"),
    (lambda m, x, x2: m(x2, x2, x), r"value must be unbatched"),
    (lambda m, x, x2: m(x2, x2, x2, key_padding_mask=np.zeros((2, 4), bool)),
     r"key_padding_mask must be \(B, S\) = \(1, 4\)"),
    (lambda m, x, x2: m(x2, x2, x2, attn_mask=np.zeros((5, 4, 4), bool)),
     r"attn_mask must be .*\(4, 4, 4\), got \(5, 4, 4\)"),
])
def test_torch_case_invalid_shapes_named(call, msg):
    """torch's invalid-shape cases (batched and unbatched): a ValueError naming the argument
    and the shape expected (torch raises AssertionError)."""
    m = fnn.MultiheadAttention(4, 4)
    with pytest.raises(ValueError, match=msg):
        call(m, np.zeros((4, 4, 4), np.float32), np.zeros((4, 4), np.float32))


def test_torch_case_bias_false_has_no_projection_biases():
    m = fnn.MultiheadAttention(8, 4, bias=False)
    assert m.in_proj_bias is None and m.out_proj.bias is None
    assert list(m.state_dict()) == ["in_proj_weight", "out_proj.weight"]
