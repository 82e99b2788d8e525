"""Optimisers for fastattn.nn models: AdamW, Adam, gradient clipping, learning-rate schedules.

Pure Python over the functional ops (``fastattn.ops.adamw_step`` and friends; the NumPy twins
in ``fastattn.reference`` for a model on the reference backend), with torch.optim's defaults
and semantics:

```python
opt = optim.AdamW(model, lr=1e-3)                 # or optim.Adam(model, ...)
sched = optim.LRScheduler(opt, optim.inverse_sqrt(d_model=512, warmup=4000))
for batch in data:
    opt.zero_grad()                               # model.zero_grad()
    loss = ...forward, backward...                # the model accumulates named_grads()
    optim.clip_grad_norm(model, 1.0)              # optional
    opt.step()                                    # one update; model.invalidate_caches()
    sched.step()                                  # lr for the next step
```

What the optimiser needs from the model (fastattn.nn.Module provides it):

- ``named_parameters()``: (state_dict key, float32 array) pairs, updated in place;
- ``named_grads()``: (key, gradient array or None) in named_parameters' order; a parameter
  without a gradient (None, or absent) is skipped and its moments and step count stay as they
  are, as torch skips a parameter whose ``.grad`` is None. A parameter held under two names
  (weights tied by assignment) has one gradient, yielded under its first name only, so it is
  updated once per step, as in torch;
- ``zero_grad()`` and ``invalidate_caches()`` (weights changed: derived packed weights dropped).

State is kept per parameter key: ``exp_avg`` and ``exp_avg_sq`` (float32, the parameter's
shape, created as zeros at its first update) and its own 1-based update count, as torch keeps
``state[p]["step"]``. ``state_dict()`` is a flat dict of NumPy arrays that
``safetensors.numpy.save_file`` writes as is:

```text
"step"                     int64 0-d   step() calls so far (what LRScheduler reads)
"lr", "beta1", "beta2",    float64 0-d the hyper-parameters (load_state_dict restores them,
"eps", "weight_decay"                  as torch restores its param_groups)
"exp_avg.<key>"            float32     first moment of parameter <key>
"exp_avg_sq.<key>"         float32     second moment
"step.<key>"               int64 0-d   updates of parameter <key> so far
```
"""
import math
import numbers

import numpy as np

from . import ops, reference

__all__ = ["Adam", "AdamW", "clip_grad_norm", "LRScheduler", "InverseSqrt", "WarmupCosine",
           "inverse_sqrt", "noam", "warmup_cosine"]

_HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay")


def _functional(model):
    """The op table matching the model's backend: the NumPy twin for a reference model."""
    return reference if getattr(model, "backend", "fast") == "reference" else ops


def _number(value, name, owner, *, lo=0.0, hi=None, hi_open=False):
    """A finite real in [lo, hi] (or [lo, hi) with hi_open) as a float, else a clear error."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be finite, got {value!r}")
    above = hi is not None and (value >= hi if hi_open else value > hi)
    if value < lo or above:
        upper = "" if hi is None else f", {hi}{')' if hi_open else ']'}"
        raise ValueError(f"{owner}: {name} must be in [{lo}{upper or ', inf)'}, got {value!r}")
    return value


class _AdamBase:
    """Adam and AdamW: one update of every parameter that has a gradient per step()."""

    _decoupled = True         # AdamW: p *= 1 - lr * weight_decay; Adam: g += weight_decay * p

    def __init__(self, model, lr, betas, eps, weight_decay):
        name = type(self).__name__
        for attr in ("named_parameters", "named_grads", "zero_grad", "invalidate_caches"):
            if not callable(getattr(model, attr, None)):
                raise TypeError(f"{name}: the model must have {attr}() (a fastattn.nn module), "
                                f"got {type(model).__name__}")
        if getattr(model, "compute_type", "float32") != "float32":
            raise ValueError(f"{name}: the model is quantized ({model.compute_type}), which is "
                             "for inference only; optimize the float32 model")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"{name}: betas must be a pair (beta1, beta2), got {betas!r}")
        self.model = model
        self.lr = lr
        self.betas = tuple(_number(b, f"betas[{i}]", name, hi=1.0, hi_open=True)
                           for i, b in enumerate(betas))
        self.eps = _number(eps, "eps", name)
        self.weight_decay = _number(weight_decay, "weight_decay", name)
        self.steps = 0        # step() calls so far
        self.state = {}       # key -> {"exp_avg": array, "exp_avg_sq": array, "step": int}

    def __repr__(self):
        return (f"{type(self).__name__}(lr={self.lr:g}, betas={self.betas}, eps={self.eps:g}, "
                f"weight_decay={self.weight_decay:g})")

    @property
    def lr(self):
        """The learning rate of the next step(); settable (a schedule sets it every step)."""
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = _number(value, "lr", type(self).__name__)

    def zero_grad(self):
        """Zero the model's gradients (`model.zero_grad()`)."""
        self.model.zero_grad()

    def step(self):
        """One update of every parameter that has a gradient, in place; then the model drops
        what it derived from the old weights (invalidate_caches)."""
        name = type(self).__name__
        params = dict(self.model.named_parameters())
        groups = {}           # update count -> (params, grads, exp_avg, exp_avg_sq)
        for key, grad in self.model.named_grads():
            if grad is None:
                continue
            if key not in params:
                raise KeyError(f"{name}: named_grads() yielded {key!r}, which is not a "
                               "parameter of the model")
            p = params[key]
            if np.shape(grad) != p.shape:
                raise ValueError(f"{name}: the gradient of {key} has shape {np.shape(grad)}, "
                                 f"the parameter {p.shape}")
            st = self.state.get(key)
            if st is None:
                st = self.state[key] = {"exp_avg": np.zeros_like(p),
                                        "exp_avg_sq": np.zeros_like(p), "step": 0}
            st["step"] += 1
            group = groups.setdefault(st["step"], ([], [], [], []))
            for lst, a in zip(group, (p, grad, st["exp_avg"], st["exp_avg_sq"])):
                lst.append(a)
        fn = _functional(self.model)
        update = fn.adamw_step if self._decoupled else fn.adam_step
        for count, (ps, gs, ms, vs) in groups.items():
            update(ps, gs, ms, vs, step=count, lr=self.lr, betas=self.betas, eps=self.eps,
                   weight_decay=self.weight_decay)
        self.steps += 1
        self.model.invalidate_caches()

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self):
        """The optimiser's state as a flat dict of NumPy arrays (see the module docstring).

        The moment arrays are the live ones (as Module.state_dict() returns the live
        parameters): save or copy them before the next step().

        Returns:
            {key: array}, what `safetensors.numpy.save_file` writes as is.
        """
        sd = {"step": np.array(self.steps, np.int64),
              "lr": np.array(self.lr, np.float64),
              "beta1": np.array(self.betas[0], np.float64),
              "beta2": np.array(self.betas[1], np.float64),
              "eps": np.array(self.eps, np.float64),
              "weight_decay": np.array(self.weight_decay, np.float64)}
        for key, st in self.state.items():
            sd[f"exp_avg.{key}"] = st["exp_avg"]
            sd[f"exp_avg_sq.{key}"] = st["exp_avg_sq"]
            sd[f"step.{key}"] = np.array(st["step"], np.int64)
        return sd

    def load_state_dict(self, state_dict):
        """Restore what state_dict() returned (or a safetensors file of it read back):
        hyper-parameters, step count and, per parameter, moments (copied) and update count.
        Every problem (a key the model lacks, a shape mismatch, a moment without its pair or
        count, an unknown key) is named in one ValueError; nothing is changed then.

        Args:
            state_dict: what `state_dict()` returned, or a safetensors file of it read back.

        Raises:
            TypeError: not a mapping of name -> array.
            ValueError: every problem, named; nothing is changed.
        """
        name = type(self).__name__
        if not hasattr(state_dict, "items"):
            raise TypeError(f"{name}.load_state_dict: expected a mapping of name -> array, got "
                            f"{type(state_dict).__name__}")
        sd = dict(state_dict.items())
        params = dict(self.model.named_parameters())
        problems = []
        if "step" not in sd:
            problems.append("missing key: step")
        keys = set()
        for k in sd:
            kind, _, key = k.partition(".")
            if kind in ("exp_avg", "exp_avg_sq", "step") and key:
                keys.add(key)
            elif k != "step" and k not in _HYPER:
                problems.append(f"unexpected key: {k}")
        state = {}
        for key in sorted(keys):
            if key not in params:
                problems.append(f"{key}: not a parameter of the model")
                continue
            parts = [f"exp_avg.{key}", f"exp_avg_sq.{key}", f"step.{key}"]
            absent = [p for p in parts if p not in sd]
            if absent:
                problems.append(f"{key}: missing {', '.join(absent)}")
                continue
            m, v = (np.asarray(sd[p]) for p in parts[:2])
            if m.shape != params[key].shape or v.shape != params[key].shape:
                problems.append(f"{key}: moments of shape {m.shape} and {v.shape}, the "
                                f"parameter {params[key].shape}")
                continue
            count = _count(sd[parts[2]])
            if count is None:
                problems.append(f"{parts[2]}: expected a non-negative integer")
                continue
            state[key] = {"exp_avg": np.array(m, np.float32, order="C"),
                          "exp_avg_sq": np.array(v, np.float32, order="C"), "step": count}
        steps = _count(sd["step"]) if "step" in sd else 0
        if steps is None:
            problems.append("step: expected a non-negative integer")
        hyper = {}
        for h in _HYPER:
            if h in sd:
                a = np.asarray(sd[h])
                if a.shape != () or a.dtype.kind not in "fiu":
                    problems.append(f"{h}: expected a real scalar")
                else:
                    hyper[h] = float(a)
        if problems:
            raise ValueError(f"{name}.load_state_dict: " + " | ".join(problems))
        if "lr" in hyper:
            self.lr = hyper["lr"]
        b1, b2 = hyper.get("beta1", self.betas[0]), hyper.get("beta2", self.betas[1])
        self.betas = tuple(_number(b, f"betas[{i}]", name, hi=1.0, hi_open=True)
                           for i, b in enumerate((b1, b2)))
        self.eps = _number(hyper.get("eps", self.eps), "eps", name)
        self.weight_decay = _number(hyper.get("weight_decay", self.weight_decay),
                                    "weight_decay", name)
        self.steps, self.state = steps, state


def _count(value):
    """A saved step count (0-d integer array or int) as an int >= 0, or None."""
    a = np.asarray(value)
    if a.shape != () or a.dtype.kind not in "iu" or int(a) < 0:
        return None
    return int(a)


class AdamW(_AdamBase):
    """torch.optim.AdamW over a fastattn.nn model: decoupled weight decay.

    p *= 1 - lr * weight_decay before the Adam update. Defaults are torch's. `step()`,
    `zero_grad()`, `lr`, `state_dict()` and `load_state_dict()` are listed below.

    Args:
        model: a fastattn.nn module (float32, not quantized).
        lr: the learning rate (default 1e-3; a schedule may set it every step).
        betas: (beta1, beta2), the moments' decay rates (default (0.9, 0.999)).
        eps: added to the denominator (default 1e-8).
        weight_decay: the decoupled decay (default 0.01).

    Raises:
        TypeError: not a fastattn.nn module.
        ValueError: a quantized model, or a bad hyper-parameter (named).
    """

    _decoupled = True

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(model, lr, betas, eps, weight_decay)


class Adam(_AdamBase):
    """torch.optim.Adam over a fastattn.nn model: weight decay as an L2 term of the gradient.

    g += weight_decay * p. Defaults are torch's. The paper's setting:
    `Adam(model, betas=(0.9, 0.98), eps=1e-9)` with `inverse_sqrt`. The methods are
    `AdamW`'s.

    Args:
        model: a fastattn.nn module (float32, not quantized).
        lr: the learning rate (default 1e-3; a schedule may set it every step).
        betas: (beta1, beta2), the moments' decay rates (default (0.9, 0.999)).
        eps: added to the denominator (default 1e-8).
        weight_decay: the L2 term's factor (default 0).

    Raises:
        TypeError: not a fastattn.nn module.
        ValueError: a quantized model, or a bad hyper-parameter (named).
    """

    _decoupled = False

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(model, lr, betas, eps, weight_decay)


def clip_grad_norm(model, max_norm):
    """torch.nn.utils.clip_grad_norm_ over the model's gradients (`named_grads()`, None skipped).

    Scales them in place by max_norm / (total + 1e-6) when their global L2 norm `total`
    exceeds max_norm.

    Args:
        model: a fastattn.nn module.
        max_norm: the largest global norm kept.

    Returns:
        total, the norm before clipping (a float).
    """
    grads = [g for _, g in model.named_grads() if g is not None]
    return _functional(model).clip_grads(grads, max_norm)


# ---- learning-rate schedules: step (1-based) -> lr ---------------------------------------------

class InverseSqrt:
    """The schedule of "Attention Is All You Need" (the "Noam" schedule), a callable step -> lr.

    `lr(step) = factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)`: a linear rise
    for `warmup` steps, peaking at `factor * (d_model * warmup)**-0.5`, then ~ 1 / sqrt(step).

    Args:
        d_model: the model width, an int >= 1.
        warmup: the warm-up steps, an int >= 1 (default 4000).
        factor: the rate's factor (default 1.0).
    """

    def __init__(self, d_model, warmup=4000, factor=1.0):
        for n, v in (("d_model", d_model), ("warmup", warmup)):
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
                raise ValueError(f"inverse_sqrt: {n} must be an int >= 1, got {v!r}")
        self.d_model, self.warmup = int(d_model), int(warmup)
        self.factor = _number(factor, "factor", "inverse_sqrt")

    def __call__(self, step):
        step = _step(step)
        return self.factor * self.d_model ** -0.5 * min(step ** -0.5,
                                                        step * self.warmup ** -1.5)

    def __repr__(self):
        return f"inverse_sqrt(d_model={self.d_model}, warmup={self.warmup}, " \
               f"factor={self.factor:g})"


class WarmupCosine:
    """A linear warm-up, then a half cosine down to min_lr: a callable step -> lr.

    From 0 to peak_lr over `warmup` steps (lr(warmup) = peak_lr), then a half cosine from
    peak_lr down to min_lr at total_steps, and min_lr from there on:
    `lr(step) = min_lr + (peak_lr - min_lr) * (1 + cos(pi * (step - warmup) /
    (total_steps - warmup))) / 2` for warmup <= step <= total_steps.

    Args:
        peak_lr: the rate at the end of the warm-up.
        warmup: the warm-up steps.
        total_steps: the step where the cosine reaches min_lr.
        min_lr: the final rate (default 0).
    """

    def __init__(self, peak_lr, warmup, total_steps, min_lr=0.0):
        self.peak_lr = _number(peak_lr, "peak_lr", "warmup_cosine")
        self.min_lr = _number(min_lr, "min_lr", "warmup_cosine")
        for n, v in (("warmup", warmup), ("total_steps", total_steps)):
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 0:
                raise ValueError(f"warmup_cosine: {n} must be an int >= 0, got {v!r}")
        if total_steps < warmup:
            raise ValueError(f"warmup_cosine: total_steps ({total_steps}) must be >= warmup "
                             f"({warmup})")
        self.warmup, self.total_steps = int(warmup), int(total_steps)

    def __call__(self, step):
        step = _step(step)
        if step < self.warmup:
            return self.peak_lr * step / self.warmup
        if step >= self.total_steps:
            return self.min_lr
        progress = (step - self.warmup) / (self.total_steps - self.warmup)
        return self.min_lr + (self.peak_lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))

    def __repr__(self):
        return (f"warmup_cosine(peak_lr={self.peak_lr:g}, warmup={self.warmup}, "
                f"total_steps={self.total_steps}, min_lr={self.min_lr:g})")


def _step(step):
    if not isinstance(step, numbers.Integral) or isinstance(step, bool) or step < 1:
        raise ValueError(f"a schedule's step is 1-based (an int >= 1), got {step!r}")
    return int(step)


def inverse_sqrt(d_model, warmup=4000, factor=1.0):
    """The paper's schedule, `InverseSqrt(d_model, warmup, factor)` (also named `noam`).

    Args:
        d_model: the model width, an int >= 1.
        warmup: the warm-up steps, an int >= 1 (default 4000).
        factor: the rate's factor (default 1.0).

    Returns:
        The `InverseSqrt` schedule, a callable 1-based step -> lr.
    """
    return InverseSqrt(d_model, warmup, factor)


noam = inverse_sqrt


def warmup_cosine(peak_lr, warmup, total_steps, min_lr=0.0):
    """A warm-up and cosine schedule, `WarmupCosine(peak_lr, warmup, total_steps, min_lr)`.

    Args:
        peak_lr: the rate at the end of the warm-up.
        warmup: the warm-up steps.
        total_steps: the step where the cosine reaches min_lr.
        min_lr: the final rate (default 0).

    Returns:
        The `WarmupCosine` schedule, a callable 1-based step -> lr.
    """
    return WarmupCosine(peak_lr, warmup, total_steps, min_lr)


class LRScheduler:
    """Drives optimizer.lr from a schedule (any callable: 1-based step -> lr).

    On construction and on every step() it sets ``optimizer.lr = schedule(optimizer.steps +
    1)``: the rate of the update about to be taken. Call step() after each optimizer.step().
    It keeps no state of its own: the position is the optimiser's step count, so after
    ``optimizer.load_state_dict(...)`` a new LRScheduler continues where the run left off.

    Args:
        optimizer: an `AdamW` or `Adam` (anything with `lr` and `steps`).
        schedule: a callable 1-based step -> lr.
    """

    def __init__(self, optimizer, schedule):
        if not callable(schedule):
            raise TypeError(f"LRScheduler: schedule must be callable (step -> lr), got "
                            f"{type(schedule).__name__}")
        self.optimizer, self.schedule = optimizer, schedule
        self.last_lr = None
        self.step()

    def step(self):
        """Set the learning rate of the optimiser's next update.

        Returns:
            The rate set.
        """
        self.last_lr = self.schedule(self.optimizer.steps + 1)
        self.optimizer.lr = self.last_lr
        return self.last_lr
