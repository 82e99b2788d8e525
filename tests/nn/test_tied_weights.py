"""Weights tied by assignment (the target embedding and the generator as one Parameter, torch's
way) train as torch trains them: named_parameters() / parameters() yield the Parameter once,
under its first name, its gradient sums both uses, and an optimiser step updates it once;
state_dict() keeps both names, as torch's does."""
import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import nn as fnn, optim
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel

pytestmark = TORCH_WARNINGS

# AdamW's eps, both sides: Adam's step g / (sqrt(v) + eps) is about lr x sign(g) wherever |g|
# is well above eps, also for gradients at the level of float32 rounding (the key projection's
# bias, whose gradient the softmax cancels, and other near-zero entries), whose sign rounding
# decides. An eps well above that level keeps the step proportional to such a gradient, so
# rounding in the gradients stays rounding in the weights.
EPS = 1e-3
TIED = ("generator.weight", "tgt_tok_emb.embedding.weight")   # the first name, then the other


def tied_pair(torch, backend):
    """The tutorial's model with its generator tied to its target embedding, and ours holding
    the same weights, tied the same way; both in training mode."""
    torch.manual_seed(0)
    tm = tutorial_model_class(torch)(1, 1, C, H, V_SRC, V_TGT, F, dropout=0.0).train()
    perturb(torch, tm)
    tm.generator.weight = tm.tgt_tok_emb.embedding.weight
    fm = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD,
                                backend=backend)
    fm.load_state_dict(tm.state_dict())
    fm.generator.weight = fm.tgt_tok_emb.embedding.weight
    return tm, fm.train()


def test_a_tied_parameter_is_yielded_once_and_saved_under_both_names():
    torch = requires_torch()
    tm, fm = tied_pair(torch, "fast")
    names = [k for k, _ in fm.named_parameters(remove_duplicate=True)]
    assert names == [k for k, _ in tm.named_parameters()]
    assert TIED[0] in names and TIED[1] not in names
    assert [id(p) for p in fm.parameters()] == [id(p) for _, p in
                                                fm.named_parameters(remove_duplicate=True)]
    every = [k for k, _ in fm.named_parameters()]          # every name, as state_dict keys
    assert every == [k for k, _ in tm.named_parameters(remove_duplicate=False)]
    sd = fm.state_dict()
    assert list(sd) == [k for k in tm.state_dict() if k != "positional_encoding.pos_embedding"]
    assert sd[TIED[0]] is sd[TIED[1]]
    assert fm.parameters_nbytes() == sum(p.nbytes for p in fm.parameters())


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_tied_weights_train_as_in_torch(rng, backend):
    """One backward: the tied weight's one gradient is the sum of its two uses, as torch's
    .grad; then AdamW steps on both sides: after one and after three steps every weight
    (both tied names included) equals torch's, and so does each step's loss."""
    torch = requires_torch()
    tm, fm = tied_pair(torch, backend)
    t_opt = torch.optim.AdamW(tm.parameters(), lr=1e-3, eps=EPS, weight_decay=0.01)
    f_opt = optim.AdamW(fm, lr=1e-3, eps=EPS, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD)
    for step in range(1, 4):
        src = token_batch(rng, V_SRC, [S, 3, 5], S)
        tgt = token_batch(rng, V_TGT, [T, 3, 4], T)
        t_opt.zero_grad()
        logits = tm(torch.tensor(src), torch.tensor(tgt[:, :-1]),
                    *tutorial_masks(torch, src, tgt[:, :-1]), torch.tensor(src == PAD))
        ref = loss_fn(logits.reshape(-1, V_TGT), torch.tensor(tgt[:, 1:]).reshape(-1))
        ref.backward()
        f_opt.zero_grad()
        loss = fm.loss(src, tgt, backward=True)
        assert_close(loss, ref.item(), **TOL["nn_training_loss_torch"],
                     name=f"loss at step {step}", dtype=None)
        if step == 1:
            assert_grads(fm, tm)
        t_opt.step()
        f_opt.step()
        if step in (1, 3):
            ours = fm.state_dict()
            for k, v in tm.state_dict().items():
                if k in ours:
                    want = v.numpy()
                    assert_close(ours[k], want, **max_rel(want), name=f"{k} after step {step}")
            assert ours[TIED[0]] is ours[TIED[1]]


def _tie_generator(m):
    m.generator.weight = m.tgt_tok_emb.embedding.weight


def _tie_embedding(m):
    m.tgt_tok_emb.embedding.weight = m.generator.weight


@pytest.mark.parametrize("tie", [_tie_generator, _tie_embedding])
def test_a_tied_parameter_has_one_gradient_array(rng, tie):
    """Tied either way, after an untied backward (whose gradient of the rebound name is the
    old parameter's, dropped): both names accumulate into one array, also in flat_grads()
    (the buffer the data-parallel all-reduce sums), which holds it once; the gradients equal,
    bit for bit, those of the same tied model without a flat buffer."""
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 3, 4], T)

    def tied(flat):
        m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD,
                                   seed=4).train()
        m.loss(src, tgt, backward=True)              # untied gradients, then the tie
        tie(m)
        m.zero_grad()
        buffer = m.flat_grads() if flat else None
        m.loss(src, tgt, backward=True)
        return m, buffer

    m, buffer = tied(flat=True)
    assert m.generator._grads["weight"] is m.tgt_tok_emb.embedding._grads["weight"]
    grads = dict(m.named_grads())
    assert list(grads) == [k for k, _ in m.named_parameters(remove_duplicate=True)]
    assert TIED[1] not in grads and grads[TIED[0]].base is buffer
    assert buffer.size == sum(-(-p.size // fnn.module.GRAD_ALIGN) * fnn.module.GRAD_ALIGN
                              for p in m.parameters())
    plain, _ = tied(flat=False)
    want = dict(plain.named_grads())
    assert list(want) == list(grads)
    for k, g in grads.items():
        assert np.array_equal(g, want[k]), k
