"""The training defaults that fit(), ``fastattn train`` and its help share, in one place.

``fastattn train`` without --steps or --epochs trains DEFAULT_STEPS[preset] steps, with the
"inverse_sqrt" schedule peaking at DEFAULT_LR[preset] after a warm-up of
DEFAULT_WARMUP_SHARE of the run (at most MAX_WARMUP steps), evaluates every
DEFAULT_EVAL_EVERY steps and checkpoints every DEFAULT_CHECKPOINT_EVERY steps and after
DEFAULT_CHECKPOINT_MINUTES minutes without one. TRAIN_DEFAULTS holds the rest of its settings
(a resumed run takes its own from its config.json instead).
"""
SCHEDULES = ("inverse_sqrt", "cosine", "constant")
DEFAULT_LR = 1e-3            # fit(): the peak of "cosine" and the rate of "constant" without lr=
PRESET_LR = {"tiny": 1e-3, "small": 1e-3, "base": 7e-4}    # fastattn train's peak rate
DEFAULT_STEPS = {"tiny": 2000, "small": 4000, "base": 10000}
DEFAULT_WARMUP_SHARE = 0.1
MAX_WARMUP = 4000
DEFAULT_EVAL_EVERY = 200
DEFAULT_CHECKPOINT_EVERY = 200
DEFAULT_CHECKPOINT_MINUTES = 5.0   # a kill loses at most about this much of a slow run
EXACT_SAMPLE = 100           # validation pairs decoded greedily at each evaluation
# Data-parallel runs (fastattn.train.distributed): the longest a rank waits in one collective
# before it ends the job; the wait includes rank 0's evaluations and checkpoints.
COMM_TIMEOUT = 1800.0

# fastattn train's settings when neither the command line nor (with --resume) the run gives
# them; steps, lr and warmup depend on the preset (above), vocab_size on the tokenizer
TRAIN_DEFAULTS = dict(model="tiny", tokenizer="bpe", batch_tokens=4096, schedule="inverse_sqrt",
                      clip_norm=1.0, dropout=0.1, label_smoothing=0.1, valid=0.05, seed=0,
                      eval_every=DEFAULT_EVAL_EVERY, exact_sample=EXACT_SAMPLE, patience=None,
                      checkpoint_every=DEFAULT_CHECKPOINT_EVERY,
                      checkpoint_minutes=DEFAULT_CHECKPOINT_MINUTES, precision="fp32")


def default_warmup(total):
    """Warm-up steps for a run of `total` steps (None: unknown): DEFAULT_WARMUP_SHARE of it,
    at least 1, at most MAX_WARMUP."""
    if total is None:
        return MAX_WARMUP
    return max(1, min(MAX_WARMUP, int(round(DEFAULT_WARMUP_SHARE * total))))
