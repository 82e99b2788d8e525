"""fastattn.optim: AdamW / Adam over a model against torch.optim over the same parameters and
gradients, skipped parameters, state_dict through safetensors (a resumed run continues bit for
bit), gradient clipping, the learning-rate schedules and the scheduler.

The optimiser needs only named_parameters / named_grads / zero_grad / invalidate_caches from a
model; FakeModel provides them, so these tests do not depend on the model layer's backward.
"""
import math

import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import optim
from tolerances import TOL, scaled

SHAPES = {"embed.weight": (37, 16), "layers.0.linear.weight": (16, 16),
          "layers.0.linear.bias": (16,), "layers.0.norm.weight": (16,), "head.bias": (5,),
          "scale": ()}


class FakeModel:
    """Parameters and gradients by state_dict key; counts invalidate_caches() calls."""

    def __init__(self, seed=0, shapes=SHAPES, backend="fast"):
        rng = np.random.default_rng(seed)
        self.backend = backend
        self.params = {k: np.array(rng.standard_normal(s), np.float32) for k, s in shapes.items()}
        self.grads = {k: np.zeros_like(p) for k, p in self.params.items()}
        self.invalidated = 0
        self.zeroed = 0

    def named_parameters(self):
        yield from self.params.items()

    def named_grads(self):
        for k in self.params:
            yield k, self.grads.get(k)

    def zero_grad(self):
        self.zeroed += 1
        for g in self.grads.values():
            if g is not None:
                g[...] = 0.0

    def invalidate_caches(self):
        self.invalidated += 1
        return self

    def set_grads(self, rng, skip=()):
        """Fresh random gradients; keys in `skip` get None (no gradient this step)."""
        for k, p in self.params.items():
            self.grads[k] = None if k in skip else np.array(
                rng.standard_normal(p.shape) * 10.0 ** rng.integers(-3, 1), np.float32)


def torch_twin(model):
    torch = requires_torch()
    return {k: torch.tensor(p.copy(), requires_grad=True) for k, p in model.params.items()}


def feed_torch(tparams, model):
    torch = requires_torch()
    for k, t in tparams.items():
        g = model.grads[k]
        t.grad = None if g is None else torch.tensor(g.copy())


# ---- against torch.optim -------------------------------------------------------------------------

@pytest.mark.parametrize("name, kw", [
    ("AdamW", {}),
    ("Adam", {}),
    ("AdamW", dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("Adam", dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)),
])
def test_matches_torch_with_skipped_parameters(rng, name, kw):
    """20 steps; some parameters have no gradient on some steps (torch: .grad None), so their
    own step counts (bias corrections) fall behind, as in torch."""
    torch = requires_torch()
    model = FakeModel()
    tparams = torch_twin(model)
    opt = getattr(optim, name)(model, **kw)
    topt = getattr(torch.optim, name)(list(tparams.values()), **kw)
    keys = list(SHAPES)
    for step in range(20):
        skip = {keys[step % len(keys)]} if step % 3 == 0 else set()
        if step == 0:
            skip.add("head.bias")                      # never has a gradient until step 1
        model.set_grads(rng, skip)
        feed_torch(tparams, model)
        opt.step()
        topt.step()
    for k, p in model.params.items():
        t = tparams[k].detach().numpy()
        assert_close(p, t, **scaled(TOL["optim_torch"], t, 1.0), name=k, dtype=None)
    for k, t in tparams.items():
        st = topt.state[t]
        assert opt.state[k]["step"] == int(st["step"]), k
        want = st["exp_avg"].numpy()
        assert_close(opt.state[k]["exp_avg"], want, **scaled(TOL["optim_torch"], want), name=k,
                     dtype=None)
    assert opt.steps == 20
    assert model.invalidated == 20


def test_defaults_are_torchs():
    torch = requires_torch()
    p = [torch.zeros(1, requires_grad=True)]
    for name in ("AdamW", "Adam"):
        ours = getattr(optim, name)(FakeModel())
        theirs = getattr(torch.optim, name)(p).defaults
        assert ours.lr == theirs["lr"] and ours.betas == tuple(theirs["betas"])
        assert ours.eps == theirs["eps"] and ours.weight_decay == theirs["weight_decay"]


def test_parameter_without_gradient_is_untouched(rng):
    model = FakeModel()
    before = {k: p.copy() for k, p in model.params.items()}
    opt = optim.AdamW(model, weight_decay=0.5)
    model.set_grads(rng, skip={"scale", "head.bias"})
    opt.step()
    for k in ("scale", "head.bias"):
        np.testing.assert_array_equal(model.params[k], before[k])   # not even decayed
        assert k not in opt.state
    assert not np.array_equal(model.params["embed.weight"], before["embed.weight"])


def test_zero_grad_and_lr_setter(rng):
    model = FakeModel()
    opt = optim.Adam(model)
    model.set_grads(rng)
    opt.zero_grad()
    assert model.zeroed == 1 and all(not g.any() for g in model.grads.values())
    opt.lr = 0.5
    assert opt.lr == 0.5
    with pytest.raises(ValueError, match="lr must be in"):
        opt.lr = -1.0
    with pytest.raises(ValueError, match="lr must be finite"):
        opt.lr = float("nan")


def test_reference_backend_uses_the_twin(rng):
    """A model on the reference backend is updated by the float64 twin: close to the kernel."""
    fast, ref = FakeModel(), FakeModel(backend="reference")
    of, orf = optim.AdamW(fast), optim.AdamW(ref)
    for _ in range(3):
        fast.set_grads(rng)
        ref.grads = {k: g.copy() for k, g in fast.grads.items()}
        of.step()
        orf.step()
    for k in SHAPES:
        assert_close(fast.params[k], ref.params[k], **scaled(TOL["optim_twin"], ref.params[k], 1.0),
                     name=k, dtype=None)


def test_bad_construction_and_unknown_gradient(rng):
    with pytest.raises(TypeError, match=r"must have named_parameters\(\)"):
        optim.AdamW(object())
    with pytest.raises(ValueError, match="betas must be a pair"):
        optim.AdamW(FakeModel(), betas=0.9)
    with pytest.raises(ValueError, match=r"betas\[0\] must be in"):
        optim.Adam(FakeModel(), betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="eps must be in"):
        optim.Adam(FakeModel(), eps=-1.0)
    model = FakeModel()
    opt = optim.AdamW(model)
    model.named_grads = lambda: iter([("ghost", np.zeros(3, np.float32))])
    with pytest.raises(KeyError, match="ghost"):
        opt.step()
    model.named_grads = lambda: iter([("scale", np.zeros(2, np.float32))])
    with pytest.raises(ValueError, match="gradient of scale has shape"):
        opt.step()


# ---- state_dict ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["AdamW", "Adam"])
def test_state_dict_round_trip_through_safetensors_continues_identically(tmp_path, name):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    plan = [set() if i % 4 else {"head.bias"} for i in range(10)]   # some steps skip one

    def run(model, opt, skips, grads_rng):
        for skip in skips:
            model.set_grads(grads_rng, skip)
            opt.step()

    # uninterrupted: 10 steps
    full = FakeModel()
    run(full, getattr(optim, name)(full, lr=1e-2, weight_decay=0.03), plan,
        np.random.default_rng(1))

    # 6 steps, save the optimiser; a new model holding the weights and a new optimiser with
    # default hyper-parameters load them; the same gradient stream for 4 more steps
    grads_rng = np.random.default_rng(1)
    first = FakeModel()
    opt = getattr(optim, name)(first, lr=1e-2, weight_decay=0.03)
    run(first, opt, plan[:6], grads_rng)
    path = tmp_path / "opt.safetensors"
    safetensors_numpy.save_file(opt.state_dict(), str(path))
    resumed = FakeModel(seed=99)
    resumed.params = {k: p.copy() for k, p in first.params.items()}
    opt2 = getattr(optim, name)(resumed)
    opt2.load_state_dict(safetensors_numpy.load_file(str(path)))
    assert opt2.lr == 1e-2 and opt2.weight_decay == 0.03      # restored from the file
    assert opt2.steps == 6
    run(resumed, opt2, plan[6:], grads_rng)
    for k in SHAPES:
        np.testing.assert_array_equal(resumed.params[k], full.params[k], err_msg=k)


def test_state_dict_layout(rng):
    model = FakeModel()
    opt = optim.AdamW(model)
    model.set_grads(rng, skip={"scale"})
    opt.step()
    sd = opt.state_dict()
    assert sd["step"].dtype == np.int64 and int(sd["step"]) == 1
    for h in ("lr", "beta1", "beta2", "eps", "weight_decay"):
        assert sd[h].shape == () and sd[h].dtype == np.float64
    for k in SHAPES:
        if k == "scale":
            assert f"exp_avg.{k}" not in sd
            continue
        assert sd[f"exp_avg.{k}"].dtype == np.float32
        assert sd[f"exp_avg_sq.{k}"].shape == SHAPES[k]
        assert int(sd[f"step.{k}"]) == 1


def test_load_state_dict_errors_name_every_problem(rng):
    model = FakeModel()
    opt = optim.AdamW(model)
    model.set_grads(rng)
    opt.step()
    sd = dict(opt.state_dict())
    sd["exp_avg.layers.0.linear.bias"] = np.zeros(3, np.float32)
    del sd["exp_avg_sq.head.bias"]
    sd["exp_avg.nope"] = np.zeros(1, np.float32)
    sd["momentum"] = np.zeros(1)
    sd["step.embed.weight"] = np.array(-1)
    before = {k: v["exp_avg"].copy() for k, v in opt.state.items()}
    with pytest.raises(ValueError) as err:
        opt.load_state_dict(sd)
    text = str(err.value)
    for needle in ("layers.0.linear.bias: moments of shape (3,)", "head.bias: missing "
                   "exp_avg_sq.head.bias", "nope: not a parameter", "unexpected key: momentum",
                   "step.embed.weight: expected a non-negative integer"):
        assert needle in text, text
    for k, v in opt.state.items():                              # nothing changed
        np.testing.assert_array_equal(v["exp_avg"], before[k])
    with pytest.raises(ValueError, match="missing key: step"):
        opt.load_state_dict({})
    with pytest.raises(TypeError, match="mapping"):
        opt.load_state_dict([1, 2])


# ---- clipping ------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_norm", [0.1, 1e3])
def test_clip_grad_norm_matches_torch(rng, max_norm):
    torch = requires_torch()
    model = FakeModel()
    model.set_grads(rng, skip={"scale"})
    tparams = torch_twin(model)
    feed_torch(tparams, model)
    theirs = float(torch.nn.utils.clip_grad_norm_(list(tparams.values()), max_norm))
    total = optim.clip_grad_norm(model, max_norm)
    assert_close(total, theirs, **TOL["grad_norm_torch"], name="total vs torch", dtype=None)
    for k, t in tparams.items():
        if t.grad is not None:
            assert_close(model.grads[k], t.grad.numpy(), **TOL["clip_grads"], name=k, dtype=None)


# ---- schedules -----------------------------------------------------------------------------------

def test_inverse_sqrt_is_the_papers_schedule():
    s = optim.inverse_sqrt(512, warmup=4000)
    assert optim.noam is optim.inverse_sqrt
    for step in (1, 10, 3999, 4000, 4001, 100000):
        assert s(step) == pytest.approx(512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5),
                                        rel=TOL["schedule_float64"]["rtol"])
    assert s(4000) >= max(s(n) for n in range(1, 10000, 7))  # peak at the end of the warm-up
    assert optim.inverse_sqrt(512, 4000, factor=2.0)(10) == 2 * s(10)
    with pytest.raises(ValueError, match="1-based"):
        s(0)
    with pytest.raises(ValueError, match="warmup must be an int >= 1"):
        optim.inverse_sqrt(512, warmup=0)


def test_warmup_cosine():
    s = optim.warmup_cosine(1e-3, warmup=10, total_steps=110, min_lr=1e-5)
    for step, want in ((1, 1e-4), (10, 1e-3), (60, 1e-5 + (1e-3 - 1e-5) * 0.5),   # half way down
                       (110, 1e-5)):
        assert_close(s(step), want, **TOL["float64_figure"], name=f"lr at step {step}", dtype=None)
    assert s(10**6) == 1e-5
    lrs = [s(n) for n in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))                  # decreasing after warm-up
    no_warmup = optim.warmup_cosine(1.0, 0, 100)
    assert_close(no_warmup(1), 0.5 * (1 + math.cos(math.pi / 100)), **TOL["float64_figure"],
                 name="lr at step 1", dtype=None)
    with pytest.raises(ValueError, match="total_steps"):
        optim.warmup_cosine(1.0, 10, 5)


def test_scheduler_sets_the_lr_of_the_next_step(rng):
    model = FakeModel()
    opt = optim.AdamW(model)
    sched = optim.inverse_sqrt(64, warmup=5)
    lrs = optim.LRScheduler(opt, sched)
    assert opt.lr == sched(1) and lrs.last_lr == sched(1)
    seen = []
    for _ in range(8):
        model.set_grads(rng)
        seen.append(opt.lr)
        opt.step()
        lrs.step()
    assert seen == [sched(n) for n in range(1, 9)]
    # a new scheduler over a restored optimiser continues at its step count
    opt2 = optim.AdamW(FakeModel())
    opt2.load_state_dict(opt.state_dict())
    optim.LRScheduler(opt2, sched)
    assert opt2.lr == sched(9)
    with pytest.raises(TypeError, match="callable"):
        optim.LRScheduler(opt, 0.1)
