"""The training defaults that fit(), ``fastattn train`` and its help share, in one place.

``fastattn train`` without --steps or --epochs trains DEFAULT_STEPS[preset] steps, with the
"inverse_sqrt" schedule peaking at DEFAULT_LR[preset] after a warm-up of
DEFAULT_WARMUP_SHARE of the run (at most MAX_WARMUP steps), evaluates every
DEFAULT_EVAL_EVERY steps and checkpoints every DEFAULT_CHECKPOINT_EVERY steps.
"""
SCHEDULES = ("inverse_sqrt", "cosine", "constant")
DEFAULT_LR = 1e-3            # fit(): the peak of "cosine" and the rate of "constant" without lr=
PRESET_LR = {"tiny": 1e-3, "small": 1e-3, "base": 7e-4}    # fastattn train's peak rate
DEFAULT_STEPS = {"tiny": 2000, "small": 4000, "base": 10000}
DEFAULT_WARMUP_SHARE = 0.1
MAX_WARMUP = 4000
DEFAULT_EVAL_EVERY = 200
DEFAULT_CHECKPOINT_EVERY = 200
EXACT_SAMPLE = 100           # validation pairs decoded greedily at each evaluation


def default_warmup(total):
    """Warm-up steps for a run of `total` steps (None: unknown): DEFAULT_WARMUP_SHARE of it,
    at least 1, at most MAX_WARMUP."""
    if total is None:
        return MAX_WARMUP
    return max(1, min(MAX_WARMUP, int(round(DEFAULT_WARMUP_SHARE * total))))
