"""Training through the modules: after one training-mode forward + backward on the same weights
and batch, every gradient equals torch autograd's (dropout 0), on both backends; dropout > 0
runs the same kernels and regenerates its masks in the backward; the module API around it
(train/eval, named_grads, zero_grad, errors).

Weights are moved off their initial values (biases and norms off 0/1) so that every gradient
path carries signal. Gradients are compared per tensor: max|diff| <= 1e-4 * max|torch's|.
"""
import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import nn as fnn
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel

pytestmark = TORCH_WARNINGS

BACKENDS = ["fast", "reference"]


def twin(torch, tm, make):
    """The fastattn module built by make(), holding torch module tm's weights, in training."""
    fm = make()
    fm.load_state_dict(tm.state_dict())
    return fm.train()


def run_torch(torch, tm, inputs, dout):
    """Forward + backward of torch module tm in train mode; -> (output, input grads)."""
    ts = [torch.tensor(x, requires_grad=True) for x in inputs]
    out = tm(*ts)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.tensor(dout))
    return out.detach().numpy(), [t.grad.numpy() if t.grad is not None else None for t in ts]


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_and_layer_norm_backward_vs_torch(rng, backend):
    torch = requires_torch()
    tl = torch.nn.Linear(C, 24).train()
    perturb(torch, tl)
    fl = twin(torch, tl, lambda: fnn.Linear(C, 24, backend=backend))
    x = features(rng, B, T)
    dy = rng.standard_normal((B, T, 24)).astype(np.float32)
    out, (dx,) = run_torch(torch, tl, [x], dy)
    assert_close(fl(x), out, **max_rel(out))
    assert_close(fl.backward(dy), dx, **max_rel(dx), name="dx")
    assert_grads(fl, tl)

    tn = torch.nn.LayerNorm(C).train()
    perturb(torch, tn, seed=1)
    fn = twin(torch, tn, lambda: fnn.LayerNorm(C, backend=backend))
    dy = rng.standard_normal((B, T, C)).astype(np.float32)
    out, (dx,) = run_torch(torch, tn, [x], dy)
    assert_close(fn(x), out, **max_rel(out))
    assert_close(fn.backward(dy), dx, **max_rel(dx), name="dx")
    assert_grads(fn, tn)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("masking", ["none", "kpm", "2d_float", "3d_bool"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_mha_backward_vs_torch(rng, backend, masking, kind):
    torch = requires_torch()
    tm = torch.nn.MultiheadAttention(C, H, dropout=0.0, batch_first=True).train()
    perturb(torch, tm)
    fm = twin(torch, tm, lambda: fnn.MultiheadAttention(C, H, backend=backend))
    q = features(rng, B, T)
    kv = q if kind == "self" else features(rng, B, S)
    kw = mha_masks(rng, masking, T, kv.shape[1])
    dy = rng.standard_normal((B, T, C)).astype(np.float32)
    tq = torch.tensor(q, requires_grad=True)
    tkv = tq if kind == "self" else torch.tensor(kv, requires_grad=True)
    tkw = {k: torch.tensor(v) for k, v in kw.items()}
    out, _ = tm(tq, tkv, tkv, need_weights=False, **tkw)
    out.backward(torch.tensor(dy))
    ours, _ = fm(q, kv if kind == "cross" else q, kv if kind == "cross" else q,
                 need_weights=False, **kw)
    assert_close(ours, out.detach().numpy(), **max_rel(out.detach().numpy()))
    dq, dk, dv = fm.backward(dy)
    if kind == "self":
        assert_close(dq + dk + dv, tq.grad.numpy(), **max_rel(tq.grad.numpy()), name="d_query")
    else:
        assert_close(dq, tq.grad.numpy(), **max_rel(tq.grad.numpy()), name="d_query")
        assert_close(dk + dv, tkv.grad.numpy(), **max_rel(tkv.grad.numpy()), name="d_key_value")
    assert_grads(fm, tm)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_layers_backward_vs_torch(rng, backend, norm_first, activation):
    torch = requires_torch()
    kw = dict(dim_feedforward=F, dropout=0.0, activation=activation, norm_first=norm_first,
              batch_first=True)
    src, tgt = features(rng, B, S), features(rng, B, T)
    kpm = padding(B, S, [S, 3, 5])
    te = torch.nn.TransformerEncoderLayer(C, H, **kw).train()
    perturb(torch, te)
    fe = twin(torch, te, lambda: fnn.TransformerEncoderLayer(C, H, backend=backend, **kw))
    dy = rng.standard_normal((B, S, C)).astype(np.float32)
    ts = torch.tensor(src, requires_grad=True)
    out = te(ts, src_key_padding_mask=torch.tensor(kpm))
    out.backward(torch.tensor(dy))
    assert_close(fe(src, src_key_padding_mask=kpm), out.detach().numpy(),
                 **max_rel(out.detach().numpy()))
    assert_close(fe.backward(dy), ts.grad.numpy(), **max_rel(ts.grad.numpy()), name="d_src")
    assert_grads(fe, te)

    td = torch.nn.TransformerDecoderLayer(C, H, **kw).train()
    perturb(torch, td, seed=1)
    fd = twin(torch, td, lambda: fnn.TransformerDecoderLayer(C, H, backend=backend, **kw))
    dy = rng.standard_normal((B, T, C)).astype(np.float32)
    tt, tmem = torch.tensor(tgt, requires_grad=True), torch.tensor(src, requires_grad=True)
    mask = fnn.generate_square_subsequent_mask(T)
    out = td(tt, tmem, tgt_mask=torch.tensor(mask), memory_key_padding_mask=torch.tensor(kpm))
    out.backward(torch.tensor(dy))
    assert_close(fd(tgt, src, tgt_mask=mask, memory_key_padding_mask=kpm), out.detach().numpy(),
                 **max_rel(out.detach().numpy()))
    d_tgt, d_mem = fd.backward(dy)
    assert_close(d_tgt, tt.grad.numpy(), **max_rel(tt.grad.numpy()), name="d_tgt")
    assert_close(d_mem, tmem.grad.numpy(), **max_rel(tmem.grad.numpy()), name="d_memory")
    assert_grads(fd, td)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_backward_vs_torch(rng, backend, norm_first, activation):
    """Every gradient of nn.Transformer, padding on source and target, causal target."""
    torch = requires_torch()
    tm = torch.nn.Transformer(C, H, 2, 2, F, dropout=0.0, activation=activation,
                              batch_first=True, norm_first=norm_first).train()
    perturb(torch, tm)
    fm = twin(torch, tm, lambda: fnn.Transformer(C, H, 2, 2, F, dropout=0.0,
                                                 activation=activation, norm_first=norm_first,
                                                 backend=backend))
    src, tgt = features(rng, B, S), features(rng, B, T)
    skpm, tkpm = padding(B, S, [S, 3, 5]), padding(B, T, [T, 2, 4])
    mask = fnn.generate_square_subsequent_mask(T)
    kw = dict(tgt_mask=mask, src_key_padding_mask=skpm, tgt_key_padding_mask=tkpm,
              memory_key_padding_mask=skpm)
    dy = rng.standard_normal((B, T, C)).astype(np.float32)
    ts, tt = torch.tensor(src, requires_grad=True), torch.tensor(tgt, requires_grad=True)
    out = tm(ts, tt, **{k: torch.tensor(v) for k, v in kw.items()})
    out.backward(torch.tensor(dy))
    assert_close(fm(src, tgt, **kw), out.detach().numpy(), **max_rel(out.detach().numpy()))
    d_src, d_tgt = fm.backward(dy)
    assert_close(d_src, ts.grad.numpy(), **max_rel(ts.grad.numpy()), name="d_src")
    assert_close(d_tgt, tt.grad.numpy(), **max_rel(tt.grad.numpy()), name="d_tgt")
    assert_grads(fm, tm)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_seq2seq_loss_and_gradients_vs_tutorial(rng, backend, label_smoothing):
    """Seq2SeqTransformer.loss(backward=True) against the tutorial's training step: teacher
    forcing, padding masks from PAD, CrossEntropyLoss(ignore_index=PAD)."""
    torch = requires_torch()
    torch.manual_seed(0)
    tm = tutorial_model_class(torch)(2, 2, C, H, V_SRC, V_TGT, F, dropout=0.0).train()
    perturb(torch, tm)
    fm = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD,
                                backend=backend)
    fm.load_state_dict(tm.state_dict())
    fm.train()
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 3, 4], T)
    tgt_in = torch.tensor(tgt[:, :-1])
    logits = tm(torch.tensor(src), tgt_in, *tutorial_masks(torch, src, tgt[:, :-1]),
                torch.tensor(src == PAD))
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=label_smoothing)
    ref = loss_fn(logits.reshape(-1, V_TGT), torch.tensor(tgt[:, 1:]).reshape(-1))
    ref.backward()
    loss = fm.loss(src, tgt, label_smoothing=label_smoothing, backward=True)
    assert_close(loss, ref.item(), **TOL["nn_loss_torch"], name="loss vs torch", dtype=None)
    assert_grads(fm, tm)


def test_backends_give_the_same_gradients(rng):
    fast = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD, seed=3)
    ref = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD, seed=3,
                                 backend="reference")
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 3, 4], T)
    losses = [m.train().loss(src, tgt, label_smoothing=0.1, backward=True) for m in (fast, ref)]
    assert_close(losses[0], losses[1], **TOL["nn_backends_loss"], name="loss", dtype=None)
    g_ref = dict(ref.named_grads())
    for k, g in fast.named_grads():
        assert_close(g, g_ref[k], **max_rel(g_ref[k], TOL["nn_backends_grad"]["atol"]), name=k)


# ----------------------------------------------------------------------------------------------
# dropout: the same kernels, masks regenerated in the backward, reproducible per seed


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_is_reproducible_and_changes_with_each_forward(rng, backend):
    m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, dropout=0.3, pad_id=PAD, seed=4,
                               backend=backend).train().manual_seed(7)
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 3, 4], T)
    a, b = m(src, tgt), m(src, tgt)
    assert not np.array_equal(a, b)                        # new masks every forward
    m.manual_seed(7)
    assert np.array_equal(m(src, tgt), a)                  # the same run again
    m.eval()
    assert np.array_equal(m(src, tgt), m(src, tgt))        # no dropout in eval


def test_dropout_backward_equals_the_reference_backend(rng):
    """With dropout 0.2 everywhere, the fast backend's gradients equal the reference
    backend's, whose twins store their masks: the kernels regenerate the same masks."""
    kw = dict(dropout=0.2, pad_id=PAD, seed=5)
    fast = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, **kw).train().manual_seed(11)
    ref = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, backend="reference",
                                 **kw).train().manual_seed(11)
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 3, 4], T)
    lf = fast.loss(src, tgt, backward=True)
    lr = ref.loss(src, tgt, backward=True)
    assert_close(lf, lr, **TOL["nn_backends_loss"], name="loss", dtype=None)
    g_ref = dict(ref.named_grads())
    for k, g in fast.named_grads():
        assert_close(g, g_ref[k], **max_rel(g_ref[k], TOL["nn_backends_grad"]["atol"]), name=k)


def test_dropout_averages_to_the_no_dropout_output(rng):
    m = fnn.TransformerEncoderLayer(C, H, F, dropout=0.2, seed=6)
    x = features(rng, 2, S)
    want = m.eval()(x)
    m.train()
    mean = np.mean([m.manual_seed(s)(x) for s in range(300)], axis=0)
    err = np.abs(mean - want).mean() / np.abs(want).mean()
    assert err < 0.05, err


# ----------------------------------------------------------------------------------------------
# the module API around backward


def test_named_grads_accumulate_and_zero_grad_keeps_the_arrays(rng):
    m = fnn.Transformer(C, H, 1, 1, F, dropout=0.0, seed=8).train()
    src, tgt = features(rng, B, S), features(rng, B, T)
    dy = rng.standard_normal((B, T, C)).astype(np.float32)
    m(src, tgt)
    m.backward(dy)
    first = {k: g.copy() for k, g in m.named_grads()}
    assert list(first) == [k for k, _ in m.named_parameters()]
    m(src, tgt)
    m.backward(dy)
    for k, g in m.named_grads():
        assert_close(g, 2 * first[k], **max_rel(2 * first[k], TOL["nn_grad_accumulate"]["atol"]),
                     name=k)
    arrays = [g for _, g in m.named_grads()]
    m.zero_grad()
    assert all(g is h and not g.any() for (_, g), h in zip(m.named_grads(), arrays))


def test_backward_without_a_training_forward_is_an_error(rng):
    m = fnn.Linear(C, 4)
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        m.backward(np.zeros((1, 4), np.float32))
    m.train()
    m(np.zeros((2, C), np.float32))
    with pytest.raises(ValueError, match=r"grad_output must be \(2, 4\)"):
        m.backward(np.zeros((3, 4), np.float32))
    s2s = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, pad_id=PAD)
    with pytest.raises(RuntimeError, match="training mode"):
        s2s.loss(np.ones((1, 3), np.int64), np.ones((1, 3), np.int64), backward=True)
    with pytest.raises(ValueError, match="T >= 2"):
        s2s.train().loss(np.ones((1, 3), np.int64), np.ones((1, 1), np.int64))


# A setting the backward depends on, changed between a training forward and its backward, and
# the change undone: (change, undo).
SETTING_CHANGES = {
    "backend": (lambda m: m.to_backend("reference"), lambda m: m.to_backend("fast")),
    "precision": (lambda m: m.set_precision("fp32"), lambda m: m.set_precision("bf16")),
    "submodule backend": (lambda m: m.generator.to_backend("reference"),
                          lambda m: m.generator.to_backend("fast")),
    "submodule precision": (lambda m: m.transformer.decoder.set_precision("fp32"),
                            lambda m: m.transformer.decoder.set_precision("bf16")),
    "submodule mode": (lambda m: m.transformer.encoder.eval(),
                       lambda m: m.transformer.encoder.train()),
}


@pytest.mark.parametrize("change", list(SETTING_CHANGES))
def test_backward_refuses_a_forward_made_under_other_settings(rng, change):
    """A bf16 training forward, then its backend, precision or mode changed (on the model or
    a submodule): backward() raises, naming the change, before any gradient is made or
    touched, and keeps the forward; with the change undone, the backward gives the gradients
    of an uninterrupted forward + backward, bit for bit."""
    kw = dict(dropout=0.0, pad_id=PAD, seed=3)
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 3, 4], T)
    dy = rng.standard_normal((B, T, V_TGT)).astype(np.float32)
    plain = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, **kw).set_precision("bf16")
    plain.train()(src, tgt)
    plain.backward(dy)
    m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, **kw).set_precision("bf16").train()
    m(src, tgt)
    do, undo = SETTING_CHANGES[change]
    do(m)
    with pytest.raises(RuntimeError, match="changed since the training forward"):
        m.backward(dy)
    assert list(m.named_grads()) == []                  # nothing made, nothing accumulated
    undo(m)
    m.backward(dy)
    want = dict(plain.named_grads())
    got = dict(m.named_grads())
    assert list(got) == list(want)
    for k, g in got.items():
        assert np.array_equal(g, want[k]), k


def _set_item(m, opt):
    m.transformer.encoder.layers[0].linear1.weight[0, 0] += np.float32(1.0)


def _scale_in_place(m, opt):
    m.generator.weight *= np.float32(0.5)


def _load_state_dict(m, opt):
    m.load_state_dict(m.state_dict())        # the same values, written in place


def _optimizer_step(m, opt):
    opt.step()                               # the gradients of the step before


def _rebind(m, opt):
    m.generator.bias = m.generator.bias.copy()


# An edit of the weights between a training forward and its backward -> the key it names.
WEIGHT_EDITS = {
    "p[...] = ...": (_set_item, "transformer.encoder.layers.0.linear1.weight"),
    "in place": (_scale_in_place, "generator.weight"),
    "load_state_dict": (_load_state_dict, "transformer.encoder.layers.0.self_attn.in_proj_weight"),
    "optimizer step": (_optimizer_step, "transformer.encoder.layers.0.self_attn.in_proj_weight"),
    "rebinding": (_rebind, "generator.bias"),
}


@pytest.mark.parametrize("edit", list(WEIGHT_EDITS))
def test_backward_refuses_a_forward_whose_weights_were_edited_since(rng, edit):
    """A training forward, then a weight written in place or replaced: backward() raises a
    RuntimeError naming the parameter (torch: "modified by an inplace operation"), before any
    gradient is touched; a forward run again differentiates as usual."""
    from fastattn import optim

    m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD,
                               seed=3).train()
    opt = optim.AdamW(m, lr=1e-3)
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 3, 4], T)
    dy = rng.standard_normal((B, T, V_TGT)).astype(np.float32)
    m(src, tgt)
    m.backward(dy)                           # gradients for the optimizer step
    m(src, tgt)
    do, key = WEIGHT_EDITS[edit]
    do(m, opt)
    before = {k: g.copy() for k, g in m.named_grads()}
    with pytest.raises(RuntimeError, match="modified since the training forward") as err:
        m.backward(dy)
    assert str(err.value).startswith(f"Seq2SeqTransformer.backward: {key}")
    after = dict(m.named_grads())
    assert list(after) == list(before)
    assert all(np.array_equal(after[k], g) for k, g in before.items())   # nothing touched
    m(src, tgt)
    m.backward(dy)


def test_a_layer_called_alone_refuses_its_edited_weight(rng):
    lin = fnn.Linear(C, 4).train()
    x = features(rng, B, T)
    lin(x)
    lin.weight[1] = 0.0
    with pytest.raises(RuntimeError, match=r"Linear.backward: weight was modified"):
        lin.backward(np.ones((B, T, 4), np.float32))
    assert list(lin.named_grads()) == []


def test_the_training_loop_runs_as_before(rng):
    """forward, backward, optimizer step, next forward, ...: the step writes the weights after
    the backward it follows, which is no edit of a pending forward; weights tied by
    assignment included."""
    from fastattn import optim

    m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD,
                               seed=3).train()
    m.generator.weight = m.tgt_tok_emb.embedding.weight
    opt = optim.AdamW(m, lr=1e-3)
    dy = rng.standard_normal((B, T, V_TGT)).astype(np.float32)
    for _ in range(3):
        src = token_batch(rng, V_SRC, [S, 3, 5], S)
        tgt = token_batch(rng, V_TGT, [T, 3, 4], T)
        opt.zero_grad()
        m(src, tgt)
        m.backward(dy)
        opt.zero_grad()
        m.loss(src, tgt, backward=True)
        optim.clip_grad_norm(m, 1.0)
        opt.step()


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_in_lockstep_with_torch(rng, backend):
    """The tutorial's model and ours from the same init, on the same batches, with AdamW and
    label smoothing 0.1: the per-step losses agree to 1e-4 relative over 50 steps."""
    torch = requires_torch()
    from fastattn import optim

    torch.manual_seed(1)
    tm = tutorial_model_class(torch)(2, 2, C, H, V_SRC, V_TGT, F, dropout=0.0).train()
    fm = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD,
                                backend=backend)
    fm.load_state_dict(tm.state_dict())
    fm.train()
    t_opt = torch.optim.AdamW(tm.parameters(), lr=3e-3, weight_decay=0.01)
    f_opt = optim.AdamW(fm, lr=3e-3, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    data = np.random.default_rng(9)
    for step in range(50):
        # shapes change from step to step (as length buckets do): buffers grow and are reused
        ls, lt, rows = S + step % 3, T + step % 2, 4 - 2 * (step % 5 == 4)
        src = token_batch(data, V_SRC, [ls, 3, 5, 6][:rows], ls)
        tgt = token_batch(data, V_TGT, [lt, 3, 4, 2][:rows], lt)
        t_opt.zero_grad()
        logits = tm(torch.tensor(src), torch.tensor(tgt[:, :-1]),
                    *tutorial_masks(torch, src, tgt[:, :-1]), torch.tensor(src == PAD))
        ref = loss_fn(logits.reshape(-1, V_TGT), torch.tensor(tgt[:, 1:]).reshape(-1))
        ref.backward()
        t_opt.step()
        f_opt.zero_grad()
        loss = fm.loss(src, tgt, label_smoothing=0.1, backward=True)
        f_opt.step()
        assert_close(loss, ref.item(), **TOL["nn_training_loss_torch"], name=f"loss at step {step}",
                     dtype=None)


def test_optimizer_state_round_trips_through_a_file_and_training_continues(rng, tmp_path):
    """opt.state_dict() written with safetensors, read back with fastattn.io.read_state_dict
    into a fresh model and optimiser: the next steps equal an uninterrupted run's."""
    from safetensors.numpy import save_file

    from fastattn import io, optim

    def make():
        m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD,
                                   seed=12).train()
        return m, optim.AdamW(m, lr=1e-2)

    batches = [(token_batch(rng, V_SRC, [S, 3, 5], S), token_batch(rng, V_TGT, [T, 3, 4], T))
               for _ in range(4)]

    def train(m, opt, bs):
        out = []
        for src, tgt in bs:
            opt.zero_grad()
            out.append(m.loss(src, tgt, backward=True))
            opt.step()
        return out

    m, opt = make()
    full = train(m, opt, batches)
    m, opt = make()
    train(m, opt, batches[:2])
    io.save(m, tmp_path / "model.safetensors")
    save_file(opt.state_dict(), str(tmp_path / "optim.safetensors"))
    m2 = io.load(tmp_path / "model.safetensors").train()
    opt2 = optim.AdamW(m2, lr=1e-2)
    opt2.load_state_dict(io.read_state_dict(tmp_path / "optim.safetensors")[0])
    assert train(m2, opt2, batches[2:]) == full[2:]


# ----------------------------------------------------------------------------------------------
# training buffers: reused from step to step, never seen through a public result


def _step(m, opt, src, tgt):
    from fastattn import optim

    opt.zero_grad()
    loss = m.loss(src, tgt, label_smoothing=0.1, backward=True)
    optim.clip_grad_norm(m, 1.0)
    opt.step()
    return loss


def test_a_warmed_up_training_step_allocates_no_arrays():
    """Once a step of the largest shapes has run, a whole step (forward, loss, backward,
    clipping, AdamW) allocates no array: the Python heap's peak over the step is a few
    Python objects (no activation-sized array: one is 320 KiB here), the same for a batch
    five times smaller."""
    import tracemalloc

    from fastattn import optim

    m = fnn.Seq2SeqTransformer(2, 2, 64, 4, 500, 500, 256, dropout=0.1, pad_id=PAD,
                               seed=0).train()
    opt = optim.AdamW(m, lr=1e-3)
    data = np.random.default_rng(0)
    big = (token_batch(data, 500, [40] + [9] * 31, 40), token_batch(data, 500, [30] + [4] * 31, 30))
    small = (token_batch(data, 500, [13, 5, 2], 13), token_batch(data, 500, [9, 3, 2], 9))
    _step(m, opt, *big)
    _step(m, opt, *small)
    buffers = sum(x._buffers.nbytes for x in m.modules() if x._buffers is not None)
    assert buffers > 20 * 2 ** 20                    # the activations and gradients live there
    peaks = []
    tracemalloc.start()
    try:
        for src, tgt in (big, small, big):
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            _step(m, opt, src, tgt)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()
    assert max(peaks) < 200 * 1024, peaks
    assert max(peaks) - min(peaks) < 32 * 1024, peaks    # nothing grows with the batch
    m.eval()
    assert all(x._buffers is None for x in m.modules())  # eval() gives the memory back


@pytest.mark.parametrize("backend", BACKENDS)
def test_public_training_results_are_not_overwritten_by_the_next_step(rng, backend):
    """What a public call returns in training mode (outputs, input gradients) is the caller's:
    the next forward and backward leave it as it was."""
    x1, x2 = features(rng, B, S), features(rng, B, S)
    dy = rng.standard_normal((B, S, C)).astype(np.float32)
    modules = [
        (fnn.Linear(C, C, backend=backend), lambda m, x: m(x)),
        (fnn.LayerNorm(C, backend=backend), lambda m, x: m(x, x)),
        (fnn.MultiheadAttention(C, H, backend=backend), lambda m, x: m(x, x, x)[0]),
        (fnn.TransformerEncoderLayer(C, H, F, dropout=0.0, backend=backend), lambda m, x: m(x)),
        (fnn.TransformerEncoder(fnn.TransformerEncoderLayer(C, H, F, dropout=0.0,
                                                            backend=backend), 2),
         lambda m, x: m(x)),
        (fnn.Transformer(C, H, 1, 1, F, dropout=0.0, backend=backend), lambda m, x: m(x, x)),
    ]
    for m, call in modules:
        m.train()
        out = call(m, x1)
        grads = m.backward(dy)
        grads = grads if isinstance(grads, tuple) else (grads,)
        kept = [out.copy()] + [g.copy() for g in grads]
        call(m, x2)
        m.backward(2 * dy)
        for a, b in zip([out, *grads], kept):
            assert np.array_equal(a, b), type(m).__name__
    s2s = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD,
                                 backend=backend).train()
    src, tgt = token_batch(rng, V_SRC, [S, 3], S), token_batch(rng, V_TGT, [T, 2], T)
    logits = s2s(src, tgt)
    kept = logits.copy()
    s2s.backward(np.ones_like(logits))
    s2s.loss(src[::-1], tgt[::-1], backward=True)
    assert np.array_equal(logits, kept)
