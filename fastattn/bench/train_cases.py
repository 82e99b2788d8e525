"""Training-step cases: one step of fastattn's training loop (zero_grad, the teacher-forced
loss with its backward, AdamW) against the same step of PyTorch's translation tutorial on the
same model, weights and batch, with dropout 0.1 and label smoothing 0.1 in both.

    train_small   fastattn.train.fit() on the "small" preset (the seeds' dialogue model: d 256,
                  4 heads, 3 + 3 layers, ff 1024, V 4000) over text pairs that batch to B 32,
                  S = T = 32, against the equivalent PyTorch loop over the same batches (same
                  model, AdamW settings, clipping, dropout, label smoothing); one call is
                  FIT_STEPS optimiser steps (fit: encoding, batching and its optimiser
                  included; torch: its optimiser, the batches already made)
    train_base    Transformer-base: V 8000, B 8, S = T = 128
    train_memory  peak RSS growth of one Transformer-base step after a warm-up step:
                  gradients and optimiser moments exist; fastattn's training buffers (kept
                  from step to step) are freed first, so the measured step counts them

bf16 mixed precision, the same three with the suffix _bf16: fastattn's model in precision
"bf16" (``set_precision``; fit's ``precision="bf16"``) against the same torch loop with
``torch.autocast("cpu", dtype=torch.bfloat16)`` around its forward and loss (the backward and
the optimiser outside, as torch recommends; no gradient scaler: bf16 needs none). Both keep
float32 weights, gradients and AdamW. The time cases also time the float32 step of each,
fastattn's and torch's, between their own calls (the row's float32_fastattn_ms and
float32_torch_ms), so one run shows all four; the memory case measures the bf16 step of each.

Each call is one optimiser step, so the weights move between calls (by a small learning rate);
the two implementations start from the same weights, and their losses are not compared (their
dropout masks come from different generators). tokens/s counts target tokens per step.
"""
import contextlib
import functools

import numpy as np

from .. import get_num_threads, nn, optim
from .base import Case
from .torch_models import require_torch, torch_seq2seq

SMALL = dict(num_encoder_layers=3, num_decoder_layers=3, emb_size=256, nhead=4, vocab=4000,
             dim_feedforward=1024, B=32, S=32, T=32)
BASE = dict(num_encoder_layers=6, num_decoder_layers=6, emb_size=512, nhead=8, vocab=8000,
            dim_feedforward=2048, B=8, S=128, T=128)
DROPOUT, LABEL_SMOOTHING, LR, PAD = 0.1, 0.1, 1e-5, 0
FIT_STEPS, FIT_WORDS = 6, 30       # steps per timed fit() call; words per text (+ <start> <end>)


@functools.lru_cache(maxsize=None)
def _model(name, precision="fp32"):
    """The preset's model (seeded: the same weights in every precision), training in
    `precision`; one model per precision, so no case changes another's."""
    cfg = SMALL if name == "small" else BASE
    return nn.Seq2SeqTransformer(cfg["num_encoder_layers"], cfg["num_decoder_layers"],
                                 cfg["emb_size"], cfg["nhead"], cfg["vocab"], cfg["vocab"],
                                 cfg["dim_feedforward"], DROPOUT, pad_id=PAD,
                                 seed=0).set_precision(precision)


def _autocast(torch, bf16):
    """torch's bf16 autocast context (forward and loss), or a context that does nothing."""
    if bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _batch(cfg):
    def build(rng):
        return {"src": rng.integers(4, cfg["vocab"], size=(cfg["B"], cfg["S"])),
                "tgt": rng.integers(4, cfg["vocab"], size=(cfg["B"], cfg["T"] + 1))}
    return build


def _warmed(factory):
    """A factory whose step has run once (gradients and optimiser moments exist), then has
    released what it keeps between steps (``step.release``): what the measured step grows by
    is its whole working memory, kept buffers included."""
    def warmed(inputs):
        step = factory(inputs)
        step()
        getattr(step, "release", lambda: None)()
        return step
    return warmed


def _fastattn_step(name, precision="fp32"):
    def factory(inputs):
        m = _model(name, precision).train()
        opt = optim.AdamW(m, lr=LR)

        def step():
            opt.zero_grad()
            loss = m.loss(inputs["src"], inputs["tgt"], label_smoothing=LABEL_SMOOTHING,
                          backward=True)
            opt.step()
            return loss
        step.release = lambda: m.eval().train()     # eval() frees the training buffers
        return step
    return factory


def _torch_step(name, bf16=False):
    """torch's step; bf16: forward and loss under autocast bf16, backward and AdamW outside."""
    def factory(inputs):
        torch = require_torch()
        torch.set_num_threads(get_num_threads())
        tm = torch_seq2seq(_model(name), dropout=DROPOUT).train()
        opt = torch.optim.AdamW(tm.parameters(), lr=LR)
        loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=LABEL_SMOOTHING)
        src, tgt = torch.from_numpy(inputs["src"]), torch.from_numpy(inputs["tgt"])
        V = tm.generator.out_features

        def step():
            opt.zero_grad()
            with _autocast(torch, bf16):
                logits = tm(src, tgt[:, :-1])
                loss = loss_fn(logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            return loss.item()
        return step
    return factory


# ---- fit() on text pairs ---------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _fit_data():
    """(pairs, tokenizer, batches): texts of FIT_WORDS words over the small model's vocabulary,
    a word tokenizer, and fit's batches of them (B * 32 = the budget: B 32, S = T = 32)."""
    from ..tokenizers import WordTokenizer
    from ..train.batching import collate, epoch_batches

    cfg = SMALL
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(cfg["vocab"] - 4)]

    def text():
        return " ".join(words[i] for i in rng.integers(0, len(words), FIT_WORDS))
    pairs = [(text(), text()) for _ in range(cfg["B"] * 4 * FIT_STEPS)]
    tok = WordTokenizer().train([t for p in pairs for t in p], vocab_size=cfg["vocab"])
    src = [tok.encode(s, add_start_end=True) for s, _ in pairs]
    tgt = [tok.encode(t, add_start_end=True) for _, t in pairs]
    budget = cfg["B"] * (FIT_WORDS + 2)
    order = epoch_batches([len(x) for x in src], [len(x) for x in tgt], budget, seed=0)
    batches = [(collate(src, b, tok.pad_id), collate(tgt, b, tok.pad_id)) for b in order]
    return pairs, tok, batches, budget


def _fit_build(rng):
    pairs, tok, batches, budget = _fit_data()
    return {"batches": batches}


def _fit_fastattn(precision="fp32"):
    def factory(inputs):
        from ..train import fit

        pairs, tok, _, budget = _fit_data()
        m = _model("small", precision).train()
        calls = []

        def run():
            calls.append(None)
            h = fit(m, pairs, src_tokenizer=tok, tgt_tokenizer=tok, max_steps=FIT_STEPS,
                    batch_tokens=budget, schedule="constant", lr=LR,
                    label_smoothing=LABEL_SMOOTHING, clip_norm=1.0, seed=len(calls),
                    progress=False, precision=precision)
            return h.steps[-1]["loss"]
        return run
    return factory


def _fit_torch(bf16=False):
    """The equivalent torch loop; bf16: forward and loss under autocast bf16, the rest
    outside."""
    def factory(inputs):
        torch = require_torch()
        torch.set_num_threads(get_num_threads())
        tm = torch_seq2seq(_model("small"), dropout=DROPOUT).train()
        loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=LABEL_SMOOTHING)
        batches = [(torch.from_numpy(s), torch.from_numpy(t)) for s, t in inputs["batches"]]
        V = tm.generator.out_features

        def run():
            # fit's defaults: AdamW betas (0.9, 0.98), eps 1e-9, weight decay 0.01; clipping 1
            opt = torch.optim.AdamW(tm.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-9,
                                    weight_decay=0.01)
            for src, tgt in batches[:FIT_STEPS]:
                opt.zero_grad()
                with _autocast(torch, bf16):
                    logits = tm(src, tgt[:, :-1])
                    loss = loss_fn(logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
                opt.step()
            return loss.item()
        return run
    return factory


def _suffix(precision):
    return "" if precision == "fp32" else f"_{precision}"


def _fit_case(precision="fp32"):
    """train_small (fp32) or train_small_bf16: fit() in `precision` against the torch loop
    (bf16: under autocast, with fit() and the torch loop in float32 timed between their
    calls)."""
    bf16 = precision == "bf16"
    what = ", bf16 mixed precision (torch: autocast bf16; float32 of both interleaved)" \
        if bf16 else ""
    case = Case(f"train_small{_suffix(precision)}",
                "training with fit(), dialogue model d256 3+3 V4000 B32 S=T=32 "
                f"({FIT_STEPS} steps a call), dropout 0.1, label smoothing 0.1, AdamW{what}",
                _fit_build, {"fastattn": _fit_fastattn(precision), "torch": _fit_torch(bf16)},
                kind="time", slow=(), repeats={"fastattn": 5, "torch": 5}, warm=False,
                tokens=FIT_STEPS * SMALL["B"] * (FIT_WORDS + 1),
                float32_impl=_fit_fastattn() if bf16 else None,
                float32_torch_impl=_fit_torch() if bf16 else None)
    case.check = False            # losses differ (different dropout generators): not compared
    return case


def _train_case(name, cfg, title, kind="time", precision="fp32"):
    """train_<name> or train_memory_<name> (fp32), with the suffix _bf16 in bf16: fastattn's
    step in `precision` against torch's (bf16: under autocast); a bf16 time case also times
    both steps in float32 between its calls."""
    bf16 = precision == "bf16"
    impls = {"fastattn": _fastattn_step(name, precision), "torch": _torch_step(name, bf16)}
    f32 = {}
    if kind == "memory":
        impls = {impl: _warmed(f) for impl, f in impls.items()}
    elif bf16:
        f32 = dict(float32_impl=_fastattn_step(name), float32_torch_impl=_torch_step(name))
    stem = f"train_{name}" if kind == "time" else f"train_memory_{name}"
    case = Case(stem + _suffix(precision), title, _batch(cfg), impls,
                kind=kind, slow=(), repeats={"fastattn": 5, "torch": 5}, warm=False,
                tokens=cfg["B"] * cfg["T"] if kind == "time" else 0, **f32)
    case.check = False            # losses differ (different dropout generators): not compared
    return case


TRAIN_CASES = (
    _fit_case(),
    _train_case("base", BASE, "training step, Transformer-base V8000 B8 S=T=128, dropout 0.1, "
                              "label smoothing 0.1, AdamW"),
    _train_case("base", BASE, "training step memory, Transformer-base V8000 B8 S=T=128",
                kind="memory"),
    _fit_case("bf16"),
    _train_case("base", BASE, "training step, Transformer-base V8000 B8 S=T=128, dropout 0.1, "
                              "label smoothing 0.1, AdamW, bf16 mixed precision (torch: "
                              "autocast bf16; float32 of both interleaved)", precision="bf16"),
    _train_case("base", BASE, "training step memory, Transformer-base V8000 B8 S=T=128, bf16 "
                              "mixed precision (torch: autocast bf16)", kind="memory",
                precision="bf16"),
)
