"""A run directory: what ``fastattn train`` writes and ``complete``, ``plot``, ``attention``
(and the corpus runners) read.

    RUN_DIR/
      config.json            the run: model preset and its config, tokenizer, training options
      src_tokenizer.json     the tokenizers (fastattn.tokenizers files; one trained on both
      tgt_tokenizer.json     sides of the pairs, written twice, so each side has its own file)
      model.safetensors      the final model (fastattn.io)
      history.jsonl          one JSON object per training step and per evaluation
      checkpoints/           fit()'s checkpoints (the latest is what --resume continues from)
      loss.png               written by ``fastattn plot``

``train_run`` writes the tokenizers and config.json before the first step, so a run stopped at
any point resumes with the same vocabulary; ``load_run`` reads a finished run back.
"""
import json
import os
import random

from .. import io, tokenizers
from ..nn import Seq2SeqTransformer
from .defaults import DEFAULT_CHECKPOINT_EVERY, DEFAULT_EVAL_EVERY, DEFAULT_STEPS, PRESET_LR

__all__ = ["PRESETS", "TOKENIZERS", "Run", "build_model", "load_run", "split_pairs",
           "train_tokenizer", "train_run"]

# The model presets of ``fastattn train --model``: (layers each side, d_model, heads, d_ff).
PRESETS = {
    "tiny": dict(num_encoder_layers=2, num_decoder_layers=2, emb_size=128, nhead=4,
                 dim_feedforward=512),
    "small": dict(num_encoder_layers=3, num_decoder_layers=3, emb_size=256, nhead=4,
                  dim_feedforward=1024),
    "base": dict(num_encoder_layers=6, num_decoder_layers=6, emb_size=512, nhead=8,
                 dim_feedforward=2048),
}
TOKENIZERS = {"bpe": tokenizers.BPETokenizer, "word": tokenizers.WordTokenizer,
              "char": tokenizers.CharTokenizer}
DEFAULT_VOCAB = {"bpe": 4000, "word": 8000, "char": None}
MAX_LEN = 256            # positions a run's model embeds (longer pairs are skipped by fit)

FILES = {"config": "config.json", "src_tokenizer": "src_tokenizer.json",
         "tgt_tokenizer": "tgt_tokenizer.json", "model": "model.safetensors",
         "history": "history.jsonl", "checkpoints": "checkpoints"}


class Run:
    """A loaded run: ``model`` (eval mode), ``src_tokenizer``, ``tgt_tokenizer``, ``config``
    (config.json as a dict) and ``path``."""

    def __init__(self, path, model, src_tokenizer, tgt_tokenizer, config):
        self.path, self.model, self.config = path, model, config
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.train_pairs, self.valid_pairs = [], []    # set by train_run

    def complete(self, texts, **generate_kwargs):
        """One completion (text) per input text; see Seq2SeqTransformer.translate."""
        generate_kwargs.setdefault("max_new_tokens", 64)
        return self.model.translate(list(texts), self.src_tokenizer, self.tgt_tokenizer,
                                    **generate_kwargs)


def build_model(preset, src_vocab_size, tgt_vocab_size, *, pad_id, dropout=0.1,
                max_len=MAX_LEN, seed=0):
    """A Seq2SeqTransformer of preset "tiny", "small" or "base" (see PRESETS)."""
    if preset not in PRESETS:
        raise ValueError(f"model preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    return Seq2SeqTransformer(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                              dropout=dropout, pad_id=pad_id, max_len=max_len, seed=seed,
                              **PRESETS[preset])


def train_tokenizer(kind, texts, vocab_size=None):
    """A tokenizer of `kind` ("bpe", "word" or "char") trained on `texts`. vocab_size (all
    tokens, specials included) defaults to DEFAULT_VOCAB[kind]; the vocabulary is smaller when
    the texts hold fewer tokens (word, char) or allow fewer merges (BPE stops when no pair is
    left)."""
    if kind not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {kind!r}")
    size = vocab_size if vocab_size is not None else DEFAULT_VOCAB[kind]
    return TOKENIZERS[kind]().train(list(texts), vocab_size=size)


def split_pairs(pairs, valid_fraction, seed=0, keep_in_train=()):
    """(train, valid): a seeded random `valid_fraction` of the pairs held out (at least one
    pair when the fraction is positive and there are two or more pairs); pairs listed in
    keep_in_train always stay in train."""
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"valid fraction must be in [0, 1), got {valid_fraction!r}")
    keep = set(keep_in_train)
    movable = [i for i, p in enumerate(pairs) if p not in keep]
    n = int(round(valid_fraction * len(pairs)))
    if valid_fraction > 0 and n == 0 and len(movable) >= 2:
        n = 1
    chosen = set(random.Random(seed).sample(movable, min(n, max(0, len(movable) - 1))))
    train = [p for i, p in enumerate(pairs) if i not in chosen]
    valid = [p for i, p in enumerate(pairs) if i in chosen]
    return train, valid


def _path(run_dir, name):
    return os.path.join(os.fspath(run_dir), FILES[name])


def write_json_atomic(path, obj):
    """obj as JSON in `path`, written beside it, synced and renamed over it (atomic)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_run(run_dir, *, backend="fast", compute_type=None):
    """The run in `run_dir` (see the module docstring) -> Run. A missing or unreadable file is
    an error naming it and saying what writes it. compute_type: the model's weights as
    fastattn.io.load converts them ("int8" / "bf16" quantize once, for inference)."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"{run_dir}: no such run directory (fastattn train DATA --out "
                                f"{run_dir} creates one)")
    missing = [FILES[k] for k in ("config", "src_tokenizer", "tgt_tokenizer", "model")
               if not os.path.exists(_path(run_dir, k))]
    if missing:
        raise FileNotFoundError(f"{run_dir} is not a finished run: {', '.join(missing)} "
                                f"missing (fastattn train writes them; --resume finishes a "
                                f"stopped run)")
    with open(_path(run_dir, "config"), encoding="utf-8") as f:
        try:
            config = json.load(f)
        except ValueError as exc:
            raise ValueError(f"{_path(run_dir, 'config')}: not valid JSON ({exc})") from None
    model = io.load(_path(run_dir, "model"), backend=backend,
                    compute_type=compute_type).eval()
    src = tokenizers.load(_path(run_dir, "src_tokenizer"))
    tgt = tokenizers.load(_path(run_dir, "tgt_tokenizer"))
    return Run(run_dir, model, src, tgt, config)


def train_run(pairs, out, *, model="tiny", tokenizer="bpe", vocab_size=None, steps=None,
              epochs=None, batch_tokens=4096, schedule="inverse_sqrt", lr=None, warmup=None,
              clip_norm=1.0, dropout=0.1, label_smoothing=0.1, valid=0.05, seed=0,
              resume=False, progress=True, keep_in_train=(), data=None,
              eval_every=DEFAULT_EVAL_EVERY, checkpoint_every=DEFAULT_CHECKPOINT_EVERY,
              **fit_kwargs):
    """Train a run from (source, target) text pairs into the directory `out` -> (Run,
    History). What ``fastattn train`` does: split off `valid` of the pairs, train one
    tokenizer on both sides, build the preset model, fit() with checkpoints in
    out/checkpoints, then write the model and the history. With resume=True the tokenizers
    and config already in `out` are used and fit() continues from the latest checkpoint.

    Defaults (fastattn.train.defaults): without steps or epochs, DEFAULT_STEPS[model] steps;
    lr: PRESET_LR[model], the peak of the schedule; warmup (None): DEFAULT_WARMUP_SHARE of the
    run, at most MAX_WARMUP steps. With held-out pairs (valid > 0) the run evaluates every
    eval_every steps and its model (model.safetensors) is the one of the lowest validation
    loss (fit's keep_best); the last step's weights stay in the latest checkpoint."""
    from .fit import fit

    out = os.fspath(out)
    if model not in PRESETS:
        raise ValueError(f"model preset must be one of {', '.join(PRESETS)}, got {model!r}")
    if steps is None and epochs is None:
        steps = DEFAULT_STEPS[model]
    if lr is None:
        lr = PRESET_LR[model]
    os.makedirs(out, exist_ok=True)
    train_pairs, valid_pairs = split_pairs(list(pairs), valid, seed, keep_in_train)
    if resume and os.path.exists(_path(out, "config")):
        with open(_path(out, "config"), encoding="utf-8") as f:
            config = json.load(f)
        src_tok = tokenizers.load(_path(out, "src_tokenizer"))
        tgt_tok = tokenizers.load(_path(out, "tgt_tokenizer"))
        model, tokenizer = config["model"], config["tokenizer"]
        dropout = config["dropout"]
    else:
        if not train_pairs:
            raise ValueError("no training pairs")
        src_tok = train_tokenizer(tokenizer, [t for p in train_pairs for t in p], vocab_size)
        tgt_tok = src_tok
        config = dict(model=model, model_config=PRESETS.get(model), tokenizer=tokenizer,
                      vocab_size=src_tok.vocab_size, dropout=dropout,
                      label_smoothing=label_smoothing, batch_tokens=batch_tokens,
                      schedule=schedule, lr=lr, warmup=warmup, clip_norm=clip_norm,
                      steps=steps, epochs=epochs, valid=valid, seed=seed,
                      data=None if data is None else os.fspath(data),
                      train_pairs=len(train_pairs), valid_pairs=len(valid_pairs))
        src_tok.save(_path(out, "src_tokenizer"))
        tgt_tok.save(_path(out, "tgt_tokenizer"))
        write_json_atomic(_path(out, "config"), config)
    net = build_model(model, src_tok.vocab_size, tgt_tok.vocab_size, pad_id=src_tok.pad_id,
                      dropout=dropout, seed=seed)
    kw = dict(src_tokenizer=src_tok, tgt_tokenizer=tgt_tok, valid_pairs=valid_pairs or None,
              max_steps=steps, epochs=epochs, batch_tokens=batch_tokens, schedule=schedule,
              lr=lr, warmup=warmup, clip_norm=clip_norm,
              label_smoothing=label_smoothing, seed=seed,
              checkpoint_dir=_path(out, "checkpoints"), checkpoint_every=checkpoint_every,
              eval_every=eval_every if valid_pairs else None, resume=resume,
              progress=progress)
    kw.update(fit_kwargs)
    history = fit(net, train_pairs, **kw)
    history.to_jsonl(_path(out, "history"))
    io.save(net, _path(out, "model"))
    net.eval()
    run = Run(out, net, src_tok, tgt_tok, config)
    run.train_pairs, run.valid_pairs = train_pairs, valid_pairs
    return run, history
