"""Training-step cases: one step of fastattn's training loop (zero_grad, the teacher-forced
loss with its backward, AdamW) against the same step of PyTorch's translation tutorial on the
same model, weights and batch, with dropout 0.1 and label smoothing 0.1 in both.

    train_small   the seeds' dialogue model: d 256, 4 heads, 3 + 3 layers, ff 1024, V 4000,
                  B 32, S = T = 32
    train_base    Transformer-base: V 8000, B 8, S = T = 128
    train_memory  peak RSS growth of one Transformer-base step after a warm-up step:
                  gradients and optimiser moments exist; fastattn's training buffers (kept
                  from step to step) are freed first, so the measured step counts them

Each call is one optimiser step, so the weights move between calls (by a small learning rate);
the two implementations start from the same weights, and their losses are not compared (their
dropout masks come from different generators). tokens/s counts target tokens per step.
"""
import functools


from .. import get_num_threads, nn, optim
from .cases import Case
from .torch_models import require_torch, torch_seq2seq

SMALL = dict(num_encoder_layers=3, num_decoder_layers=3, emb_size=256, nhead=4, vocab=4000,
             dim_feedforward=1024, B=32, S=32, T=32)
BASE = dict(num_encoder_layers=6, num_decoder_layers=6, emb_size=512, nhead=8, vocab=8000,
            dim_feedforward=2048, B=8, S=128, T=128)
DROPOUT, LABEL_SMOOTHING, LR, PAD = 0.1, 0.1, 1e-5, 0


@functools.lru_cache(maxsize=None)
def _model(name):
    cfg = SMALL if name == "small" else BASE
    return nn.Seq2SeqTransformer(cfg["num_encoder_layers"], cfg["num_decoder_layers"],
                                 cfg["emb_size"], cfg["nhead"], cfg["vocab"], cfg["vocab"],
                                 cfg["dim_feedforward"], DROPOUT, pad_id=PAD, seed=0)


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


def _fastattn_step(name):
    def factory(inputs):
        m = _model(name).train()
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


def _torch_step(name):
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
            logits = tm(src, tgt[:, :-1])
            loss = loss_fn(logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            return loss.item()
        return step
    return factory


def _train_case(name, cfg, title, kind="time"):
    impls = {"fastattn": _fastattn_step(name), "torch": _torch_step(name)}
    if kind == "memory":
        impls = {impl: _warmed(f) for impl, f in impls.items()}
    case = Case(f"train_{name}" if kind == "time" else f"train_memory_{name}", title,
                _batch(cfg), impls,
                kind=kind, slow=(), repeats={"fastattn": 5, "torch": 5}, warm=False,
                tokens=cfg["B"] * cfg["T"] if kind == "time" else 0)
    case.check = False            # losses differ (different dropout generators): not compared
    return case


TRAIN_CASES = (
    _train_case("small", SMALL, "training step, dialogue model d256 3+3 V4000 B32 S=T=32, "
                                "dropout 0.1, label smoothing 0.1, AdamW"),
    _train_case("base", BASE, "training step, Transformer-base V8000 B8 S=T=128, dropout 0.1, "
                              "label smoothing 0.1, AdamW"),
    _train_case("base", BASE, "training step memory, Transformer-base V8000 B8 S=T=128",
                kind="memory"),
)
