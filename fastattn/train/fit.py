"""fit: train a Seq2SeqTransformer on text pairs, with evaluation, checkpoints and exact resume.

```python
from fastattn.train import fit, read_pairs
history = fit(model, read_pairs("train.tsv"), src_tokenizer=tok, tgt_tokenizer=tok,
              valid_pairs=read_pairs("valid.tsv"), max_steps=20_000, batch_tokens=4096,
              checkpoint_dir="ckpt", checkpoint_every=1000, eval_every=1000)
```

One step: a token-budget batch (fastattn.train.batching), ``model.loss(src, tgt,
label_smoothing=..., backward=True)``, gradient clipping, an AdamW update, the schedule's next
rate. See ``fit`` for every argument and rule.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
import signal
import threading
import time

import numpy as np

from .. import get_num_threads, optim
from ..nn.backends import precision_name
from . import batching, distributed
from .checkpoint import (latest_checkpoint, load_best, load_checkpoint, lock_directory,
                         remove_temporaries, save_best, save_checkpoint)
from .defaults import COMM_TIMEOUT, DEFAULT_LR, EXACT_SAMPLE, SCHEDULES, default_warmup
from .evaluate import EncodedPairs, Evaluator
from .history import History
from .progress import make_progress

__all__ = ["fit", "SCHEDULES", "DEFAULT_LR", "Diverged"]

_ORDER_SETTINGS = ("seed", "batch_tokens")     # a resume must keep these (the data order)


# ---- argument checks ------------------------------------------------------------------------

def _int(value, name, minimum, none=False):
    if value is None and none:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        extra = " or None" if none else ""
        raise ValueError(f"fit: {name} must be an int >= {minimum}{extra}, got {value!r}")
    return int(value)


def _real(value, name, lo, hi=None, none=False):
    if value is None and none:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        math.isfinite(value) and value >= lo and (hi is None or value < hi)
    if not ok:
        span = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
        extra = " or None" if none else ""
        raise ValueError(f"fit: {name} must be a finite number {span}{extra}, got {value!r}")
    return float(value)


def _precision(model, precision):
    """The run's precision: the one given, else the model's (set_precision); a ValueError
    when the two contradict (the model set to bf16, fp32 given) or when none is given and
    the model's submodules were set apart."""
    if precision is not None:
        precision = precision_name(precision, "fit: precision")
    held = sorted({getattr(m, "precision", "fp32") for m in model.modules()}) \
        if hasattr(model, "modules") else ["fp32"]
    if precision is None:
        if len(held) > 1:
            raise ValueError("fit: the model's submodules are set to different precisions "
                             f"({' and '.join(held)}, set_precision on a part): give "
                             "precision='fp32' or 'bf16' for the whole run")
        return held[0]
    if precision == "fp32" and "bf16" in held:
        raise ValueError("fit: precision='fp32' but the model is set to 'bf16' "
                         "(model.set_precision): leave precision out (or give 'bf16') to "
                         "train in bf16, or call model.set_precision('fp32') first")
    return precision


def _check_tokenizer(tok, name, model_vocab, model_pad, need_start_end):
    if not getattr(tok, "is_fitted", False):
        raise ValueError(f"fit: {name} must be a trained fastattn tokenizer, got {tok!r}")
    if tok.pad_id is None:
        raise ValueError(f"fit: {name} has no <pad> token; batches need one")
    if tok.pad_id != model_pad:
        raise ValueError(f"fit: {name}.pad_id is {tok.pad_id} but the model's pad_id is "
                         f"{model_pad!r}; build the model with pad_id={tok.pad_id} so that "
                         "padding is masked and ignored by the loss")
    if tok.vocab_size > model_vocab:
        raise ValueError(f"fit: {name} has {tok.vocab_size} ids, more than the model's "
                         f"vocabulary of {model_vocab}")
    if need_start_end and (tok.start_id is None or tok.end_id is None):
        raise ValueError(f"fit: {name} needs <start> and <end> tokens (targets are "
                         "<start> text <end>)")


def _check_pairs(pairs, name):
    if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__iter__"):
        raise TypeError(f"fit: {name} must be a list of (source, target) str pairs, got "
                        f"{type(pairs).__name__}")
    pairs = list(pairs)
    for i, p in enumerate(pairs):
        if not (isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str)
                and isinstance(p[1], str)):
            raise ValueError(f"fit: {name}[{i}] must be a (source, target) pair of str, got "
                             f"{p!r:.80}")
    return pairs


# ---- schedules ------------------------------------------------------------------------------

class _Constant:
    def __init__(self, lr):
        self.lr = lr

    def __call__(self, step):
        return self.lr

    def __repr__(self):
        return f"constant({self.lr:g})"


def _schedule(schedule, lr, warmup, d_model, total):
    """The callable step -> lr that `schedule` names (see fit)."""
    if callable(schedule):
        if lr is not None:
            raise ValueError("fit: lr= goes with a named schedule; a callable schedule gives "
                             "every step's rate itself")
        return schedule
    if warmup is None:
        warmup = default_warmup(total)
    if schedule == "inverse_sqrt":
        warmup = _int(warmup, "warmup", 1)
        factor = 1.0 if lr is None else lr * math.sqrt(d_model * warmup)
        return optim.inverse_sqrt(d_model, warmup, factor)
    if schedule == "cosine":
        if total is None:
            raise ValueError("fit: schedule='cosine' needs the run's length: give max_steps "
                             "or epochs")
        warmup = _int(warmup, "warmup", 0)
        return optim.warmup_cosine(DEFAULT_LR if lr is None else lr, min(warmup, total), total)
    if schedule == "constant":
        return _Constant(DEFAULT_LR if lr is None else lr)
    raise ValueError(f"fit: schedule must be one of {', '.join(SCHEDULES)} or a callable "
                     f"step -> lr, got {schedule!r}")


class Diverged(RuntimeError):
    """The training loss of a step is NaN or infinite.

    The weights diverged, as a learning rate far too high makes them: fit stops before that
    step's update, naming the step and the learning rate.
    """


# ---- interrupts -----------------------------------------------------------------------------

class _Interrupts:
    """Ctrl-C during a step (or a checkpoint write) takes effect when it ends, so the model,
    the optimiser and the history always agree when KeyboardInterrupt reaches fit; a second
    Ctrl-C inside a step interrupts at once (the step is then torn: no checkpoint of it).
    Only in the main thread and only when SIGINT has Python's default handler."""

    def __init__(self):
        self.pending = self.inside = self.torn = False
        self._old = None

    def install(self):
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._old = signal.signal(signal.SIGINT, self._handler)

    def uninstall(self):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None

    def _handler(self, signum, frame):
        if self.inside and not self.pending:
            self.pending = True
            return
        raise KeyboardInterrupt

    def __enter__(self):
        self.inside = True
        return self

    def __exit__(self, exc_type, exc, tb):
        self.inside = False
        if exc_type is not None:
            self.torn = self.torn or issubclass(exc_type, KeyboardInterrupt)
            return False
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt
        return False


# ---- the run --------------------------------------------------------------------------------

def _fingerprint(src, tgt):
    """sha256 of the encoded training pairs (ids and lengths), in order."""
    h = hashlib.sha256()
    for seqs in (src, tgt):
        h.update(np.array([len(s) for s in seqs], np.int64).tobytes())
        for s in seqs:
            h.update(s.tobytes())
    return h.hexdigest()


class _Run:
    def __init__(self, model, train_pairs, src_tokenizer, tgt_tokenizer, valid_pairs,
                 max_steps, epochs, batch_tokens, optimizer, lr, schedule, warmup,
                 label_smoothing, clip_norm, seed, checkpoint_dir, checkpoint_every,
                 checkpoint_minutes, keep_checkpoints, eval_every, resume, progress, callbacks,
                 keep_best, patience, exact_sample, comm=None, comm_timeout=COMM_TIMEOUT,
                 precision=None):
        for attr in ("loss", "manual_seed", "train", "eval", "config", "max_len"):
            if not hasattr(model, attr):
                raise TypeError(f"fit: model must be a fastattn.nn.Seq2SeqTransformer, got "
                                f"{type(model).__name__}")
        self.model = model
        self.precision = _precision(model, precision)
        cfg = model.config
        _check_tokenizer(src_tokenizer, "src_tokenizer", cfg["src_vocab_size"], model.pad_id,
                         False)
        _check_tokenizer(tgt_tokenizer, "tgt_tokenizer", cfg["tgt_vocab_size"], model.pad_id,
                         True)
        self.src_tok, self.tgt_tok, self.pad = src_tokenizer, tgt_tokenizer, model.pad_id
        if max_steps is not None and epochs is not None:
            raise ValueError(f"fit: give max_steps or epochs, not both (got max_steps="
                             f"{max_steps!r}, epochs={epochs!r})")
        if max_steps is None and epochs is None:
            epochs = 1
        self.max_steps = _int(max_steps, "max_steps", 1, none=True)
        self.epochs = _int(epochs, "epochs", 1, none=True)
        self.batch_tokens = batching.check_budget(batch_tokens, "fit: batch_tokens")
        self.label_smoothing = _real(label_smoothing, "label_smoothing", 0.0, 1.0)
        self.clip_norm = _real(clip_norm, "clip_norm", 0.0, none=True) or None
        self.seed = _int(seed, "seed", 0)
        self.checkpoint_every = _int(checkpoint_every, "checkpoint_every", 1, none=True)
        minutes = _real(checkpoint_minutes, "checkpoint_minutes", 0.0, none=True)
        if minutes == 0:
            raise ValueError("fit: checkpoint_minutes must be > 0 or None, got 0")
        self.checkpoint_seconds = None if minutes is None else 60.0 * minutes
        self.eval_every = _int(eval_every, "eval_every", 1, none=True)
        self.keep = _int(keep_checkpoints, "keep_checkpoints", 1, none=True)
        self.patience = _int(patience, "patience", 1, none=True)
        self.keep_best = bool(keep_best)
        comm_timeout = _real(comm_timeout, "comm_timeout", 0.0)
        if comm_timeout == 0:
            raise ValueError("fit: comm_timeout must be > 0 seconds, got 0")
        self.group = distributed.group(comm, comm_timeout)
        self.lead = self.group is None or self.group.lead     # writes, evaluates, reports
        exact_sample = _int(exact_sample, "exact_sample", 0, none=True)
        if lr is not None:
            lr = _real(lr, "lr", 0.0)
        if checkpoint_dir is None and (resume or self.checkpoint_every or
                                       self.checkpoint_seconds):
            raise ValueError("fit: resume=True, checkpoint_every and checkpoint_minutes need a "
                             "checkpoint_dir")
        if valid_pairs is None and self.eval_every:
            raise ValueError("fit: eval_every needs valid_pairs")
        if valid_pairs is None and self.patience:
            raise ValueError("fit: patience (early stopping) needs valid_pairs")
        self.checkpoint_dir, self.resume = checkpoint_dir, bool(resume)
        if callable(callbacks):
            callbacks = (callbacks,)
        self.callbacks = tuple(callbacks)
        for cb in self.callbacks:
            if not callable(cb):
                raise TypeError(f"fit: callbacks must be callables (record, model), got "
                                f"{type(cb).__name__}")

        self.data = EncodedPairs(_check_pairs(train_pairs, "train_pairs"), src_tokenizer,
                                 tgt_tokenizer, model.max_len)
        if len(self.data) == 0:
            raise ValueError(f"fit: no training pairs (of {self.data.skipped} given, "
                             f"{self.data.skipped} are longer than the model's max_len="
                             f"{model.max_len} or empty)")
        self.valid = None
        if valid_pairs is not None and self.lead:
            self.valid = Evaluator(_check_pairs(valid_pairs, "valid_pairs"),
                                   src_tokenizer=src_tokenizer, tgt_tokenizer=tgt_tokenizer,
                                   max_len=model.max_len, batch_tokens=self.batch_tokens,
                                   exact_sample=exact_sample, seed=self.seed)
        self.window = batching.default_window(self.data.src_lens, self.data.tgt_lens,
                                              self.batch_tokens)
        self._plan_epoch, self._plan = None, None
        if self.max_steps is not None:
            self.total = self.max_steps
        else:
            self.total = sum(len(self.plan(e)) for e in range(self.epochs))
        self.schedule = _schedule(schedule, lr, warmup, cfg["emb_size"], self.total)
        self.optimizer = optimizer if optimizer is not None else optim.AdamW(
            model, lr=self.schedule(1), betas=(0.9, 0.98), eps=1e-9)
        self.settings = dict(seed=self.seed, batch_tokens=self.batch_tokens,
                             label_smoothing=self.label_smoothing, clip_norm=self.clip_norm,
                             max_steps=self.max_steps, epochs=self.epochs,
                             schedule=repr(self.schedule), window=self.window,
                             ranks=1 if self.group is None else self.group.size,
                             precision=self.precision)
        self.progress_arg = progress if self.lead else False
        self.flat = None                # the model's flat gradient buffer (several ranks)
        self.history = History(skipped={"train": self.data.skipped,
                                        "valid": 0 if self.valid is None else
                                        self.valid.skipped})
        self.step, self.epoch, self.batch = 0, 0, 0
        self.saved_step = None
        self.lock = None                # checkpoint_dir's, held while the run writes it
        self.saved_at = None            # time.monotonic() of the latest checkpoint (or start)
        self.best = None                # (valid_loss, step, {key: weights copy}) of the best eval
        self.fingerprint = _fingerprint(self.data.src, self.data.tgt)
        self.interrupts = _Interrupts()

    # -- data order
    def plan(self, epoch):
        """The batches of `epoch` (the latest one is kept)."""
        if self._plan_epoch != epoch:
            self._plan = batching.epoch_batches(self.data.src_lens, self.data.tgt_lens,
                                                self.batch_tokens, seed=self.seed,
                                                epoch=epoch, window=self.window)
            self._plan_epoch = epoch
        return self._plan

    def rng_state(self):
        return np.random.default_rng((self.seed, self.epoch)).bit_generator.state

    # -- checkpoints
    def state(self):
        best = None if self.best is None else {"step": self.best[1],
                                                "valid_loss": self.best[0]}
        return dict(step=self.step, epoch=self.epoch, batch=self.batch, seed=self.seed,
                    numpy_rng=self.rng_state(), data={"train_pairs": len(self.data),
                                                      "sha256": self.fingerprint},
                    fit=self.settings, best=best)

    def save(self):
        with self.interrupts:             # Ctrl-C while writing: after it, not in it
            save_checkpoint(self.checkpoint_dir, model=self.model, optimizer=self.optimizer,
                            src_tokenizer=self.src_tok, tgt_tokenizer=self.tgt_tok,
                            state=self.state(), history=self.history, keep=self.keep)
            self.saved_step = self.step
            self.saved_at = time.monotonic()

    def restore(self, path):
        ck = load_checkpoint(path, backend=getattr(self.model, "backend", "fast"))
        where = ck.path
        st = ck.state
        data = st.get("data", {})
        if data.get("sha256") != self.fingerprint:
            raise ValueError(f"{where}: the checkpoint was trained on other data "
                             f"({data.get('train_pairs')} pairs, sha256 "
                             f"{str(data.get('sha256'))[:12]}...; now {len(self.data)} pairs, "
                             f"{self.fingerprint[:12]}...): resume needs the same pairs and "
                             "tokenizers")
        for k in _ORDER_SETTINGS:
            if st.get(k, st.get("fit", {}).get(k)) != self.settings[k]:
                raise ValueError(f"{where}: {k}={st.get(k, st.get('fit', {}).get(k))!r} in "
                                 f"the checkpoint, {self.settings[k]!r} now; a resume must "
                                 "keep it (it decides the data order)")
        if ck.src_tokenizer != self.src_tok or ck.tgt_tokenizer != self.tgt_tok:
            raise ValueError(f"{where}: the checkpoint's tokenizers differ from the ones given")
        if st["numpy_rng"] != np.random.default_rng(
                (self.seed, st["epoch"])).bit_generator.state:
            raise ValueError(f"{where}: this numpy does not recompute the checkpoint's data "
                             "order (its generator state differs); the run cannot resume "
                             "exactly")
        best = st.get("best")
        best_weights = None
        if self.keep_best and best is not None:
            best_weights = load_best(self.checkpoint_dir, best["step"])
        ck.restore(self.model, self.optimizer)           # the checks passed: nothing changed
        self.step, self.epoch, self.batch = st["step"], st["epoch"], st["batch"]
        if best_weights is not None:
            self.best = (best["valid_loss"], best["step"], best_weights)
        records = ck.history.records
        self.history.records = list(records)
        self.saved_step = self.step
        changed = [k for k, v in st.get("fit", {}).items()
                   if k in self.settings and self.settings[k] != v]
        return ck, changed

    # -- several ranks
    def start_ranks(self):
        """The start of a run on several ranks: every rank checks that it holds the same
        model, settings and data as every other (distributed.check_start, which also warns
        of more threads than CPUs), rank 0 resumes (or seeds) as one process does, and
        every rank takes rank 0's weights, optimiser state, run position and dropout state.
        An error on rank 0 here, or a rank that differs, is raised on every rank
        (distributed.agreed).
        Returns what restore() returned on rank 0 (None elsewhere, or for a new run)."""
        g, model, opt = self.group, self.model, self.optimizer
        # before any collective whose size depends on the model
        distributed.check_start(
            g, distributed.fit_description(model, self.settings, self.schedule, opt,
                                           self.total, len(self.data), self.fingerprint),
            get_num_threads(), "every rank must build the same model and call fit with the "
            "same arguments and training pairs")
        resumed, error = None, None
        if g.lead:
            try:
                resumed = self._start()
            except Exception as exc:        # told to every rank, then raised everywhere
                error = exc
        sd = opt.state_dict() if error is None and g.lead else {}
        head = None
        if g.lead:
            head = dict(error=None if error is None else distributed.told(error),
                        position=dict(step=self.step, epoch=self.epoch, batch=self.batch,
                                      dropout_seed=int(model._dropout_seed),
                                      dropout_calls=int(model._dropout_calls)),
                        arrays={k: (v.shape, v.dtype.str) for k, v in sd.items() if v.ndim},
                        scalars={k: v.item() for k, v in sd.items() if not v.ndim})
        head = g.bcast(head, "the start of the run")
        if head["error"] is not None:
            distributed.raise_told(head["error"], error)
        # rank 0's weights and optimiser state, in place on the others
        for key, p in model.named_parameters():
            g.bcast_array(p, f"the broadcast of {key}")
        if not g.lead:
            sd = {k: np.empty(shape, dtype) for k, (shape, dtype) in head["arrays"].items()}
        for key in sorted(head["arrays"]):
            g.bcast_array(sd[key], f"the broadcast of the optimiser's {key}")
        if not g.lead:
            sd.update((k, np.array(v)) for k, v in head["scalars"].items())
            opt.load_state_dict(sd)
            model.invalidate_caches()
            pos = head["position"]
            self.step, self.epoch, self.batch = pos["step"], pos["epoch"], pos["batch"]
            self.saved_step = self.step
            # each rank draws its own dropout masks; rank 0's stream is one process's
            model._dropout_seed = (pos["dropout_seed"] + g.rank * 0x9E3779B97F4A7C15) % 2 ** 64
            model._dropout_calls = pos["dropout_calls"]
        self.flat = model.flat_grads()
        return resumed

    def _start(self):
        """One process's start: remove what a killed save left, resume from the latest
        checkpoint (with resume=True) or seed the dropout masks -> restore()'s result or
        None."""
        resumed = None
        if self.checkpoint_dir is not None:   # one run at a time writes checkpoint_dir
            os.makedirs(self.checkpoint_dir, exist_ok=True)
            self.lock = lock_directory(self.checkpoint_dir, "fit() writing checkpoints")
            remove_temporaries(self.checkpoint_dir)   # what a killed save or removal left
            if not self.resume:              # a new run's checkpoints would mix with them
                from .checkpoint import _BEST, list_checkpoints

                held = sorted([os.path.basename(p) for p in list_checkpoints(
                    self.checkpoint_dir)] + [n for n in os.listdir(self.checkpoint_dir)
                                             if _BEST.match(n)])
                if held:
                    raise ValueError(
                        f"fit: checkpoint_dir {self.checkpoint_dir} already holds the "
                        f"checkpoints of a run ({', '.join(held[:5])}"
                        f"{', ...' if len(held) > 5 else ''}); resume=True continues it; a "
                        "new run needs a checkpoint_dir without checkpoints: remove them, or "
                        "give another checkpoint_dir")
        if self.resume:
            path = latest_checkpoint(self.checkpoint_dir)
            if path is not None:
                resumed = self.restore(path)
        if resumed is None:
            self.model.manual_seed(self.seed)
        return resumed

    def ranks_step(self, idx, model, opt):
        """Forward and backward of this rank's part of the global batch `idx`, the gradients
        summed over the ranks -> (loss of the global batch, target tokens of the global
        batch, seconds in the all-reduce). Each rank's gradient is that of its part's mean
        loss; weighted by the part's share of the batch's target tokens, the sum is the
        gradient of the global batch's mean loss."""
        g = self.group
        part = distributed.shard(idx, g.rank, g.size)
        lens = self.data.tgt_lens
        tokens = int(lens[idx].sum()) - len(idx)          # the decoder predicts tgt[1:]
        share = (int(lens[part].sum()) - len(part)) / tokens
        opt.zero_grad()
        if len(part):
            src, tgt, _ = self.data.batch(part, self.pad)
            loss = model.loss(src, tgt, label_smoothing=self.label_smoothing, backward=True)
        else:
            loss = 0.0
            model._dropout_calls += 1       # as the skipped forward would have: ranks agree
        if share != 1.0:
            self.flat *= np.float32(share)
        scalars = np.array([share * loss], np.float64)
        seconds = g.allreduce(self.flat, f"step {self.step + 1}'s gradient all-reduce")
        g.allreduce(scalars, f"step {self.step + 1}'s loss all-reduce")
        return float(scalars[0]), tokens, seconds

    # -- steps
    def train_step(self, idx):
        model, opt = self.model, self.optimizer
        padding = batching.padding_fraction(idx, self.data.src_lens, self.data.tgt_lens)
        extra = {}
        if self.group is None:
            src, tgt, tokens = self.data.batch(idx, self.pad)
        with self.interrupts:
            lr = opt.lr
            t0 = time.perf_counter()
            if self.group is None:
                opt.zero_grad()
                loss = model.loss(src, tgt, label_smoothing=self.label_smoothing,
                                  backward=True)
            else:
                loss, tokens, comm = self.ranks_step(idx, model, opt)
                extra = dict(ranks=self.group.size, allreduce_seconds=comm)
            if not math.isfinite(loss):       # before the step: the weights stay finite
                raise Diverged(f"fit: the training loss is {loss} at step {self.step + 1} "
                               f"(learning rate {lr:g}): the training diverged; train again "
                               "with a lower learning rate (--lr)")
            if self.clip_norm is not None:
                optim.clip_grad_norm(model, self.clip_norm)
            opt.step()
            self.scheduler.step()
            seconds = time.perf_counter() - t0
            self.step += 1
            self.batch += 1
            record = self.history.add_step(
                step=self.step, epoch=self.epoch, loss=float(loss), lr=float(lr),
                tokens=tokens, tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
                seconds=seconds, padding=padding, **extra)
        return record

    def evaluate(self):
        """One evaluation on the validation pairs (see fastattn.train.evaluate): recorded in the
        History and the progress output; with keep_best, a new lowest validation loss keeps
        the weights (and writes them beside the checkpoints)."""
        result = self.valid(self.model)
        record = self.history.add_eval(step=self.step, valid_loss=result["valid_loss"],
                                       valid_ppl=result["valid_ppl"],
                                       valid_exact=result["valid_exact"])
        loss = result["valid_loss"]
        if self.keep_best and math.isfinite(loss) and (self.best is None or
                                                       loss < self.best[0]):
            weights = {k: v.copy() for k, v in self.model.state_dict().items()}
            self.best = (loss, self.step, weights)
            if self.checkpoint_dir is not None:
                with self.interrupts:
                    save_best(self.checkpoint_dir, self.model, self.step, loss)
        self.progress.eval(record)
        return record

    def stale_evals(self):
        """Evaluations since the one with the lowest validation loss (early stopping)."""
        evals = [r for r in self.history.evals if math.isfinite(r["valid_loss"])]
        if not evals:
            return 0
        best = min(range(len(evals)), key=lambda i: (evals[i]["valid_loss"], i))
        return len(evals) - 1 - best

    def finished(self):
        if self.max_steps is not None:
            return self.step >= self.max_steps
        return self.epoch >= self.epochs

    def run(self):
        try:
            if self.group is None:
                return self._run()
            try:
                return self._run()
            except BaseException as exc:
                if distributed.is_agreed(exc):
                    raise
                self.group.fail(exc, f" in step {self.step + 1}")
                raise                       # MPI_Abort does not return
        finally:
            if self.lock is not None:
                self.lock.release()

    def _run(self):
        model = self.model
        model.set_precision(self.precision)
        resumed = self._start() if self.group is None else self.start_ranks()
        self.scheduler = optim.LRScheduler(self.optimizer, self.schedule)
        self.progress = make_progress(self.progress_arg, self.total, self.step)
        if self.data.skipped:
            self.progress.info(f"{self.data.skipped} training pairs skipped (longer than "
                               f"max_len={model.max_len} or empty)")
        if self.valid is not None and self.valid.skipped:
            self.progress.info(f"{self.valid.skipped} validation pairs skipped (longer than "
                               f"max_len={model.max_len} or empty)")
        if resumed is not None:
            ck, changed = resumed
            note = f"; settings changed: {', '.join(changed)}" if changed else ""
            self.progress.info(f"resumed from {ck.path} at step {self.step}{note}")
            before = ck.state.get("fit", {}).get("ranks", 1)
            if before != self.settings["ranks"]:
                self.progress.info(
                    f"the run so far was trained on {before} rank(s), it goes on with "
                    f"{self.settings['ranks']}: the data order, schedule and optimiser continue "
                    "exactly; the float32 rounding of the summed gradients (and, with dropout, "
                    "the masks) differ from a run that stays on one count")
        elif self.resume:
            self.progress.info(f"no checkpoint in {self.checkpoint_dir}: starting a new run")
        model.train()
        self.saved_at = time.monotonic()
        self.interrupts.install()
        try:
            self._loop()
        except KeyboardInterrupt:
            if self.lead and self.checkpoint_dir is not None and not self.interrupts.torn \
                    and self.saved_step != self.step:
                self.save()
                self.progress.info(f"interrupted: checkpoint of step {self.step} written to "
                                   f"{self.checkpoint_dir}")
            elif self.interrupts.torn:
                self.progress.info(f"interrupted inside step {self.step + 1}: no checkpoint "
                                   "of it (the model may be half-updated)")
            raise
        finally:
            self.interrupts.uninstall()
            self.progress.close()
        return self.history

    def _after_step(self, record):
        """Progress, callbacks, evaluation and checkpoint after a step (rank 0's alone on
        several ranks) -> (stop: a callback's StopIteration or patience, evaluated)."""
        self.progress.step(record)
        stop = evaluated = False
        for cb in self.callbacks:
            try:
                cb(record, self.model)
            except StopIteration:
                stop = True
        if self.eval_every and self.step % self.eval_every == 0:
            self.evaluate()
            evaluated = True
            if self.patience and self.stale_evals() >= self.patience:
                self.progress.info(
                    f"early stop at step {self.step}: the validation loss has not improved "
                    f"in {self.patience} evaluations")
                stop = True
        if self.checkpoint_due():
            self.save()
        return stop, evaluated

    def checkpoint_due(self):
        """A checkpoint is due after this step: every checkpoint_every steps, and once
        checkpoint_minutes have passed since the latest one."""
        if self.checkpoint_every and self.step % self.checkpoint_every == 0:
            return True
        return self.checkpoint_seconds is not None and \
            time.monotonic() - self.saved_at >= self.checkpoint_seconds

    def _loop(self):
        # a resumed run that had evaluated its last step (it had finished) does not again
        last_eval = self.step if any(r["step"] == self.step for r in self.history.evals) \
            else None
        stop = False
        while not self.finished() and not stop:
            plan = self.plan(self.epoch)
            if self.batch >= len(plan):
                self.epoch, self.batch = self.epoch + 1, 0
                continue
            record = self.train_step(plan[self.batch])
            if self.lead:                   # the other ranks wait for rank 0's decision
                stop, evaluated = self._after_step(record)
                if evaluated:
                    last_eval = self.step
            if self.group is not None:
                stop = self.group.bcast(stop, f"the end of step {self.step}")
        if self.batch >= len(self.plan(self.epoch)):     # an epoch ended with the run
            self.epoch, self.batch = self.epoch + 1, 0
        if not self.lead:
            return
        if self.valid is not None and last_eval != self.step and self.step > 0:
            self.evaluate()
        if self.checkpoint_dir is not None and self.saved_step != self.step:
            self.save()
        if self.best is not None and self.best[1] != self.step:
            loss, step, weights = self.best
            self.model.load_state_dict(weights)
            self.progress.info(f"the model holds the weights of step {step}, the lowest "
                               f"validation loss ({loss:.4f}); the last step's are in the "
                               "latest checkpoint")


def fit(model, train_pairs, *, src_tokenizer, tgt_tokenizer, valid_pairs=None,
        max_steps=None, epochs=None, batch_tokens=4096, optimizer=None, lr=None,
        schedule="inverse_sqrt", warmup=None, label_smoothing=0.1, clip_norm=1.0, seed=0,
        checkpoint_dir=None, checkpoint_every=None, checkpoint_minutes=None,
        keep_checkpoints=3, eval_every=None,
        resume=False, progress=True, callbacks=(), keep_best=True, patience=None,
        exact_sample=EXACT_SAMPLE, comm=None, comm_timeout=COMM_TIMEOUT, precision=None):
    """Train `model` (a fastattn.nn.Seq2SeqTransformer) on text pairs; returns a History.

    Data. train_pairs and valid_pairs are lists of (source, target) str pairs (read_pairs,
    chatterbot_pairs). Sources are encoded with src_tokenizer, wrapped in <start> ... <end>
    when it has both; targets with tgt_tokenizer, always wrapped (the decoder reads
    <start> text and predicts text <end>). Both tokenizers' pad_id must be the model's pad_id
    and their vocabularies must fit the model's. A pair whose source is longer than
    model.max_len (or empty) or whose target, less one, is longer, is skipped: the counts are
    in ``history.skipped`` and reported by the progress output, and a run without any pair
    left is a ValueError. Batches: fastattn.train.batching, at most batch_tokens padded ids
    per side (B * longest <= batch_tokens), shuffled per epoch from (seed, epoch).

    Length. max_steps (updates) or epochs (passes over the pairs), not both; neither means
    epochs=1. With epochs the run's step count is known in advance (the batches of every
    epoch are planned up front), which "cosine" and the ETA use.

    Optimisation. optimizer: a fastattn.optim optimiser over `model` (default AdamW with
    betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01). Its rate is set before every update by
    the schedule (warmup=None, the default: a tenth of the run's steps, max_steps or the
    planned batches of its epochs, at least 1 and at most 4000: the rule of `fastattn
    train`, fastattn.train.defaults.default_warmup): "inverse_sqrt" (the paper's: linear
    warm-up for `warmup` steps, then 1/sqrt(step); it peaks at `(d_model * warmup) ** -0.5`,
    or at lr when lr is given), "cosine" (linear warm-up to lr, then a half cosine to 0 at
    the last step; warmup capped at the run's length), "constant" (lr every step), or a
    callable 1-based step -> lr (then lr must be None). lr defaults to 1e-3 for "cosine"
    and "constant". Loss: model.loss with label_smoothing; gradients clipped to a global
    norm of clip_norm (None: no clipping).

    Precision. "fp32" or "bf16": mixed precision with torch autocast's meaning
    (model.set_precision, which fit calls; the model keeps it after): the products of the
    training forward and backward take bf16-rounded operands and sum in float32; the
    weights, gradients, AdamW state and update, layer norm, softmax, the residual stream and
    the loss stay float32. None (the default): the precision the model is set to ("fp32"
    unless model.set_precision said otherwise). precision="fp32" for a model set to "bf16"
    is a ValueError (the two contradict), as is None for a model whose submodules were set
    to different precisions; both are raised before the model is touched. Evaluations run
    the float32 weights as inference does. The precision is recorded in checkpoints
    (state.json's "fit"); a run resumes exactly in the precision it was saved in, and may
    resume in the other one (weights, optimiser state and data order continue exactly; the
    steps after are computed in the new precision, so the losses follow that precision's
    run, not the saved one's; the resume reports the change).

    Randomness. A new run calls model.manual_seed(seed) (dropout masks) and draws the data
    order from seed; two runs with one seed, one model initialisation and one data set give
    the same per-step losses bit for bit.

    Evaluation (fastattn.train.evaluate). With valid_pairs: every eval_every steps and at the
    end of the run, in model.eval() mode (training mode is restored after; the model is left
    in training mode when fit returns): the mean cross-entropy over every valid target token
    (token-weighted across batches, without label smoothing; padding ignored; NaN if every
    valid pair was skipped), its exp, the perplexity, and the greedy exact match on a fixed
    sample of exact_sample validation pairs (drawn once from seed; None: all of them; 0:
    none), recorded in the History as valid_loss, valid_ppl and valid_exact.

    Best model and early stopping. With valid_pairs and keep_best (the default), the weights
    of the evaluation with the lowest validation loss are kept (a copy in memory, and in
    checkpoint_dir/best-step-N/ with a checkpoint_dir) and put back into the model when the
    run ends, so the model fit leaves is the best one it saw; the latest checkpoint keeps the
    last step's weights, which a resume continues from. patience=k stops the run (as a
    callback's StopIteration does) after k evaluations in a row without a lower validation
    loss; None (the default) never stops early.

    Checkpoints (fastattn.train.checkpoint, layout there). With checkpoint_dir: one every
    checkpoint_every steps (if given), one after the first step that ends checkpoint_minutes
    (if given) after the latest checkpoint (or the start), and one at the end; the newest
    keep_checkpoints are kept. fit locks checkpoint_dir while it runs (another run using it
    meanwhile: checkpoint.DirectoryInUse, at once). What a killed save left in checkpoint_dir
    (.tmp-*, .trash-*) is removed when the run starts. A new run (resume=False) refuses a
    checkpoint_dir that holds checkpoints (ValueError). resume=True continues from the latest
    checkpoint in checkpoint_dir (a new run when there is none): weights, optimiser state,
    dropout state, data position, schedule step and History are restored, so the per-step
    losses continue exactly as in an uninterrupted run. A resume must use the same pairs,
    tokenizers, seed and batch_tokens (ValueError otherwise); max_steps/epochs may be raised
    to train longer.

    A step whose training loss is NaN or infinite stops the run with Diverged (naming the
    step and the learning rate) before its update; the checkpoints written so far stay.

    Progress (fastattn.train.progress): a tqdm bar on a terminal, JSON lines on stderr
    otherwise; progress=False for none, "json" for JSON lines even on a terminal, an int k
    for JSON lines every k steps.

    Callbacks: each callable is called as cb(step_record, model) after every step (the
    record is the History's). A callback may raise StopIteration to stop the run early: the
    other callbacks of that step still run, then the run ends as at max_steps (final
    evaluation and checkpoint included) and fit returns the History.

    Interrupts: Ctrl-C (KeyboardInterrupt) takes effect between steps: the step under way
    finishes, a checkpoint of it is written (with checkpoint_dir), and the KeyboardInterrupt
    is re-raised for the caller to handle; the checkpoint resumes exactly. A second Ctrl-C
    inside a step interrupts at once and no checkpoint is written (the latest one stays).
    A KeyboardInterrupt raised by a callback is handled the same way.

    Several processes (data parallelism over MPI; fastattn.train.distributed). comm: an
    mpi4py communicator (``MPI.COMM_WORLD`` under ``mpiexec -n N``; None or one of one
    process: the run above). Every rank calls fit with the same model and the same arguments
    and data (checked when the run starts, before anything else: the model's config and
    parameter shapes, the settings, the schedule's rates, the optimiser's hyperparameters
    and the pairs; at the first difference, the same ValueError on every rank naming it and
    each rank's value; rank 0 also warns when a machine's ranks run more threads than its
    CPUs); rank 0's weights, optimiser
    state and position are broadcast then, so a run (new or resumed) starts equal everywhere.
    Each global batch of batch_tokens (the batches one process forms) is cut into N parts of
    consecutive pairs, one per rank (about batch_tokens / N each); after the backward the
    ranks' gradients, each weighted by its part's share of the batch's target tokens, are
    summed in one flat float32 buffer by one all-reduce, and every rank clips to the global
    norm and takes the same step. So the run follows one process with the same batches to
    float32 rounding, not bit for bit: each gradient is summed in another order (per part,
    then across the ranks; the key projections' biases, whose exact gradient is zero, follow
    its rounding noise, without effect on the outputs); with dropout, each rank draws its own
    masks (rank 0's are one process's). Step records gain ``ranks`` and ``allreduce_seconds``.
    Rank 0 alone reports progress, runs the callbacks (its StopIteration stops every rank),
    evaluates, keeps the best weights and writes checkpoints; the other ranks return the
    History of their steps and a model holding the last step's weights. A resume continues
    exactly on the same number of ranks; on another number, the data order, schedule and
    optimiser state continue exactly and only the rounding (and dropout masks) differ. An
    exception on some ranks only ends every rank (MPI_Abort, after printing it); comm_timeout:
    the longest a rank waits in one collective (rank 0's evaluations and checkpoints included)
    before it ends the job the same way.

    Args:
        model: the `Seq2SeqTransformer` to train (left in training mode).
        train_pairs: a list of (source, target) str pairs.
        src_tokenizer: encodes the sources (its pad_id must be the model's).
        tgt_tokenizer: encodes the targets (its pad_id must be the model's).
        valid_pairs: validation pairs, or None (the default) for no evaluation.
        max_steps: the number of updates; not with epochs.
        epochs: the number of passes over the pairs; not with max_steps (neither: 1 epoch).
        batch_tokens: the most padded ids per side in a batch (default 4096).
        optimizer: a fastattn.optim optimiser over `model`; None (the default) for AdamW.
        lr: the learning rate (see Optimisation); None (the default) for the schedule's.
        schedule: "inverse_sqrt" (the default), "cosine", "constant" or a callable
            step -> lr.
        warmup: warm-up steps (default None: a tenth of the run, at least 1, at most 4000,
            as `fastattn train`).
        label_smoothing: the loss's label smoothing (default 0.1).
        clip_norm: the global gradient norm clipped to (default 1.0; None: no clipping).
        seed: the dropout masks' and data order's seed (default 0).
        checkpoint_dir: where checkpoints go, or None (the default) for none.
        checkpoint_every: a checkpoint every this many steps, or None (the default).
        checkpoint_minutes: a checkpoint after this many minutes, or None (the default).
        keep_checkpoints: the newest checkpoints kept (default 3).
        eval_every: evaluate every this many steps (needs valid_pairs); None (the default):
            at the end of the run only.
        resume: continue from the latest checkpoint in checkpoint_dir (default False).
        progress: True (the default), False, "json" or an int k (see Progress).
        callbacks: callables `cb(step_record, model)`, called after every step (default
            none).
        keep_best: keep and restore the weights of the best evaluation (default True).
        patience: stop after this many evaluations without improvement; None (the default)
            never stops early.
        exact_sample: validation pairs decoded for exact match (default 100; None: all; 0:
            none).
        comm: an mpi4py communicator for data parallelism, or None (the default).
        comm_timeout: the longest a rank waits in one collective, in seconds (default 1800).
        precision: "fp32", "bf16", or None (the default: the model's; see Precision).

    Returns:
        The run's `History`.

    Raises:
        ValueError: bad arguments, no pair left after skipping, or a resume that does not
            match the checkpoint.
        KeyboardInterrupt: re-raised after the checkpoint of the step under way (see
            Interrupts).
    """
    run = _Run(model, train_pairs, src_tokenizer, tgt_tokenizer, valid_pairs, max_steps,
               epochs, batch_tokens, optimizer, lr, schedule, warmup, label_smoothing,
               clip_norm, seed, checkpoint_dir, checkpoint_every, checkpoint_minutes,
               keep_checkpoints, eval_every, resume, progress, callbacks, keep_best, patience,
               exact_sample, comm, comm_timeout, precision)
    return run.run()
