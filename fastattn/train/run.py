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
any point resumes with the same vocabulary; ``load_run`` reads a finished run back and refuses
tokenizers that are not the model's (``check_tokenizers``: sizes, special ids, and the
vocabularies that config.json records).

One run per directory: train_run holds a lock on RUN_DIR (``.fastattn.lock``, see
fastattn.train.checkpoint.lock_directory) from its start to its end, so a second run into the
same directory stops at once with checkpoint.DirectoryInUse. A new run goes only into a new
or empty directory: RUN_DIR holding anything (a run, or files of any kind) is a RunDirError
unless ``resume`` (continue the run there) or ``overwrite`` (start afresh: the files a run
writes, listed above with their temporaries and loss.png, are removed first; files fastattn
does not write are left as they are).
"""
import hashlib
import json
import math
import os
import random
import shutil

from .. import io, tokenizers
from ..nn import Seq2SeqTransformer
from ..nn.backends import precision_name
from . import distributed
from ..tokenizers.files import read_regular_file, short, unique_keys
from .checkpoint import LOCK_FILE, lock_directory
from .defaults import (COMM_TIMEOUT, DEFAULT_STEPS, PRESET_LR, SCHEDULES, TRAIN_DEFAULTS,
                       default_warmup)

__all__ = ["PRESETS", "TOKENIZERS", "Run", "build_model", "load_run", "read_config",
           "split_pairs", "train_tokenizer", "train_run", "FIXED", "ADJUSTABLE", "RunDirError"]

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
TEMPORARY_SUFFIX = ".tmp"   # config.json.tmp, history.jsonl.tmp: written, then renamed

FILES = {"config": "config.json", "src_tokenizer": "src_tokenizer.json",
         "tgt_tokenizer": "tgt_tokenizer.json", "model": "model.safetensors",
         "history": "history.jsonl", "checkpoints": "checkpoints"}
PLOT = "loss.png"                # fastattn plot's default output: part of the run too
_OLD_PREFIX = ".fastattn-old-"   # a run's checkpoints being removed by overwrite


class RunDirError(ValueError):
    """The run directory cannot take this run: it is not a directory, or it holds a run (or
    other files) and neither resume nor overwrite was asked for."""

# The settings a run keeps in config.json, and what a resume does with one given again:
# FIXED ones decide the data, the model or the optimisation so far, and must equal the run's;
# ADJUSTABLE ones may change (a longer run, other evaluations or checkpoints).
FIXED = ("model", "tokenizer", "vocab_size", "seed", "valid", "batch_tokens", "dropout",
         "label_smoothing", "schedule", "lr", "warmup", "clip_norm")
ADJUSTABLE = ("steps", "epochs", "eval_every", "exact_sample", "patience", "checkpoint_every",
              "checkpoint_minutes", "precision")


# ---- config.json: written by train_run, read back as input that may be wrong -------------------

def _int_at_least(lo, none=False):
    def rule(v):
        return (none and v is None) or (isinstance(v, int) and not isinstance(v, bool)
                                         and v >= lo)
    return rule, f"an int >= {lo}" + (" or null" if none else "")


def _number(lo, hi=None, above=False, none=False):
    def rule(v):
        if none and v is None:
            return True
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (v > lo if above else v >= lo) and (hi is None or v < hi))
    span = f"in [{lo}, {hi})" if hi is not None else f"{'>' if above else '>='} {lo}"
    return rule, f"a number {span}" + (" or null" if none else "")


def _one_of(names):
    return (lambda v: isinstance(v, str) and v in names), "one of " + ", ".join(names)


def _optional_text():
    return (lambda v: v is None or isinstance(v, str)), "a string or null"


def _tokenizer_records():
    roles = ("pad_id", "unk_id", "start_id", "end_id")

    def record(r):
        return (isinstance(r, dict) and set(r) == {"vocab_size", "vocab_sha256", *roles}
                and _int_at_least(1)[0](r["vocab_size"]) and isinstance(r["vocab_sha256"], str)
                and all(_int_at_least(0, none=True)[0](r[k]) for k in roles))
    return ((lambda v: v is None or (isinstance(v, dict) and set(v) == {"src", "tgt"} and
                                     all(record(r) for r in v.values()))),
            "null or {src, tgt} records of vocab_size, vocab_sha256, pad_id, unk_id, start_id, "
            "end_id")


_REQUIRED = object()
# key: ((rule, what it must be), value when the key is absent (_REQUIRED: it must be there));
# keys added after the first runs were written have a value for the runs without them
CONFIG_KEYS = {
    "model": (_one_of(tuple(PRESETS)), _REQUIRED),
    "tokenizer": (_one_of(tuple(TOKENIZERS)), _REQUIRED),
    "vocab_size": (_int_at_least(1), _REQUIRED),
    "dropout": (_number(0, 1), _REQUIRED),
    "label_smoothing": (_number(0, 1), _REQUIRED),
    "batch_tokens": (_int_at_least(1), _REQUIRED),
    "lr": (_number(0, above=True, none=True), _REQUIRED),
    "warmup": (_int_at_least(0, none=True), _REQUIRED),
    "steps": (_int_at_least(1, none=True), _REQUIRED),
    "epochs": (_int_at_least(1, none=True), _REQUIRED),
    "valid": (_number(0, 1), _REQUIRED),
    "seed": (_int_at_least(0), _REQUIRED),
    "schedule": (_one_of(SCHEDULES), "inverse_sqrt"),
    "clip_norm": (_number(0, none=True), 1.0),
    "requested_vocab_size": (_int_at_least(1, none=True), None),
    "eval_every": (_int_at_least(1, none=True), TRAIN_DEFAULTS["eval_every"]),
    "exact_sample": (_int_at_least(0, none=True), TRAIN_DEFAULTS["exact_sample"]),
    "patience": (_int_at_least(1, none=True), None),
    "checkpoint_every": (_int_at_least(1, none=True), TRAIN_DEFAULTS["checkpoint_every"]),
    "checkpoint_minutes": (_number(0, above=True, none=True),
                           TRAIN_DEFAULTS["checkpoint_minutes"]),
    "precision": (_one_of(("fp32", "bf16")), "fp32"),
    "data": (_optional_text(), None),
    "train_pairs": (_int_at_least(0, none=True), None),
    "valid_pairs": (_int_at_least(0, none=True), None),
    # what the model was trained with, checked when the run is loaded (runs before: null)
    "tokenizers": (_tokenizer_records(), None),
}


def read_config(run_dir):
    """The config.json of the run in `run_dir`, checked -> dict: every key train_run writes,
    each of its type (keys added since the first runs get their value for older runs; other
    keys are kept as they are). Every problem is a ValueError naming the file: not a regular
    file, not UTF-8, not JSON (or nested too deeply), not an object, a key missing or of the
    wrong type, steps and epochs both given. A missing file is FileNotFoundError.

    Args:
        run_dir: the run directory.

    Returns:
        The config, a dict.

    Raises:
        FileNotFoundError: no config.json.
        ValueError: any problem with it (the file named).
    """
    path = _path(run_dir, "config")
    data = read_regular_file(path, path, "a run's config.json")
    if not data.strip():
        raise ValueError(f"{path}: the file is empty (fastattn train writes it before the "
                         "first step)")
    try:
        config = json.loads(data.decode("utf-8"), object_pairs_hook=unique_keys)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {data[exc.start:exc.start + 1]!r} at "
                         f"offset {exc.start})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a run's config (JSON nested too deeply)") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object (a run's settings), got "
                         f"{type(config).__name__} {short(config)}")
    missing = [k for k, (_, absent) in CONFIG_KEYS.items()
               if absent is _REQUIRED and k not in config]
    if missing:
        raise ValueError(f"{path}: not a fastattn train run's config: {', '.join(missing)} "
                         "missing")
    bad = [f"{k} must be {what}, got {short(config[k])}"
           for k, ((rule, what), _) in CONFIG_KEYS.items() if k in config and not rule(config[k])]
    if bad:
        raise ValueError(f"{path}: " + "; ".join(bad))
    if config["steps"] is not None and config["epochs"] is not None:
        raise ValueError(f"{path}: steps and epochs are both given ({config['steps']}, "
                         f"{config['epochs']}); a run has one")
    for k, (_, absent) in CONFIG_KEYS.items():
        if k not in config:
            config[k] = absent
    return config


class Run:
    """A loaded run; its arguments are its attributes (made by `load_run` and `train_run`).

    Args:
        path: the run directory.
        model: the `Seq2SeqTransformer`, in eval mode.
        src_tokenizer: the source tokenizer.
        tgt_tokenizer: the target tokenizer.
        config: config.json, as a dict.
    """

    def __init__(self, path, model, src_tokenizer, tgt_tokenizer, config):
        self.path, self.model, self.config = path, model, config
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.train_pairs, self.valid_pairs = [], []    # set by train_run

    def complete(self, texts, **generate_kwargs):
        """One completion (text) per input text, as `Seq2SeqTransformer.translate` makes it.

        Args:
            texts: a list of strings.
            **generate_kwargs: passed to `generate`.

        Returns:
            A list of strings.
        """
        generate_kwargs.setdefault("max_new_tokens", 64)
        return self.model.translate(list(texts), self.src_tokenizer, self.tgt_tokenizer,
                                    **generate_kwargs)


def build_model(preset, src_vocab_size, tgt_vocab_size, *, pad_id, dropout=0.1,
                max_len=MAX_LEN, seed=0):
    """A Seq2SeqTransformer of a preset size (see PRESETS).

    Args:
        preset: "tiny", "small" or "base".
        src_vocab_size: the source vocabulary size.
        tgt_vocab_size: the target vocabulary size.
        pad_id: the padding id.
        dropout: the dropout probability in training (default 0.1).
        max_len: the positions the model embeds (default 256).
        seed: the initialisation's seed (default 0).

    Returns:
        The `Seq2SeqTransformer`.
    """
    if preset not in PRESETS:
        raise ValueError(f"model preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    return Seq2SeqTransformer(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                              dropout=dropout, pad_id=pad_id, max_len=max_len, seed=seed,
                              **PRESETS[preset])


def train_tokenizer(kind, texts, vocab_size=None):
    """A tokenizer of a kind, trained on texts.

    The vocabulary is smaller than vocab_size when the texts hold fewer tokens (word, char) or
    allow fewer merges (BPE stops when no pair is left).

    Args:
        kind: "bpe", "word" or "char".
        texts: the texts to train on.
        vocab_size: all tokens, specials included; None (the default) for
            DEFAULT_VOCAB[kind].

    Returns:
        The trained tokenizer.
    """
    if kind not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {kind!r}")
    size = vocab_size if vocab_size is not None else DEFAULT_VOCAB[kind]
    return TOKENIZERS[kind]().train(list(texts), vocab_size=size)


def split_pairs(pairs, valid_fraction, seed=0, keep_in_train=()):
    """Hold out a seeded random fraction of the pairs.

    At least one pair is held out when the fraction is positive and there are two or more
    pairs.

    Args:
        pairs: the (source, target) pairs.
        valid_fraction: the share held out, in [0, 1).
        seed: the split's seed (default 0).
        keep_in_train: pairs that always stay in train (default none).

    Returns:
        `(train, valid)` lists of pairs.
    """
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


def _write_history(path, history):
    """history.jsonl, written beside `path` and renamed over it, as the model file is."""
    tmp = path + TEMPORARY_SUFFIX
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            history.write(f)
        os.replace(tmp, path)
    except BaseException:
        _remove_entry(tmp)
        raise


def _is_temporary(name):
    """Whether `name` is a file a run writes and renames (config.json.tmp, history.jsonl.tmp,
    io.save's .fastattn-*.tmp), or the checkpoints an overwrite was removing."""
    return (name in (FILES["config"] + TEMPORARY_SUFFIX, FILES["history"] + TEMPORARY_SUFFIX)
            or (name.startswith(io.TEMPORARY_PREFIX) and name.endswith(io.TEMPORARY_SUFFIX))
            or name.startswith(_OLD_PREFIX))


def _remove_temporaries(run_dir):
    """Remove what a run killed while writing (or an overwrite killed while removing) left in
    run_dir."""
    for name in os.listdir(run_dir):
        if _is_temporary(name):
            _remove_entry(os.path.join(run_dir, name))


def _remove_entry(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def _run_files(run_dir):
    """The names in run_dir that a run writes (FILES, loss.png, temporaries), sorted."""
    ours = set(FILES.values()) | {PLOT}
    return sorted(n for n in os.listdir(run_dir) if n in ours or _is_temporary(n))


def _remove_run(run_dir):
    """Remove the run in run_dir (overwrite): its checkpoints first (renamed out of the way in
    one step, so no half-removed checkpoint is ever seen), config.json last, so a removal cut
    short leaves either the old run's config (--resume goes on with that run) or no run."""
    names = _run_files(run_dir)
    checkpoints = _path(run_dir, "checkpoints")
    if FILES["checkpoints"] in names:
        trash = os.path.join(run_dir, _OLD_PREFIX + os.urandom(4).hex())
        os.replace(checkpoints, trash)
        names.append(os.path.basename(trash))
    last = [n for n in names if n == FILES["config"]]
    for name in [n for n in names if n not in last and n != FILES["checkpoints"]] + last:
        _remove_entry(os.path.join(run_dir, name))


def _open_run_dir(out, resume, overwrite):
    """RUN_DIR made (if needed), locked and checked for a new run or a resume -> the lock,
    which the caller releases when the run has been written."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise RunDirError(f"{out}: not a directory (a file of that name is there); the run "
                          "directory must be a new or an existing directory")
    os.makedirs(out, exist_ok=True)
    lock = lock_directory(out, "fastattn train run")
    try:
        present = sorted(n for n in os.listdir(out) if n != LOCK_FILE)
        if present and not resume:
            if not overwrite:
                ours = _run_files(out)
                listed = ", ".join((ours or present)[:5]) + (", ..." if len(ours or present) > 5
                                                            else "")
                what = (f"already holds a run ({listed})" if ours
                        else f"is not empty (it holds {listed})")
                raise RunDirError(
                    f"{out}: {what}; a new run goes into a new or empty directory: resume "
                    "(--resume) continues the run there, overwrite (--overwrite) starts afresh "
                    "(removing the files a run writes, keeping any others), or choose another "
                    "directory")
            _remove_run(out)
        _remove_temporaries(out)
    except BaseException:
        lock.release()
        raise
    return lock


def write_json_atomic(path, obj):
    """obj as JSON in `path`, written beside it, synced and renamed over it (atomic)."""
    tmp = path + TEMPORARY_SUFFIX
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove_entry(tmp)
        raise


def tokenizer_record(tok):
    """What config.json keeps of a run's tokenizer: its size, the ids of its special roles
    and a SHA-256 of its vocabulary (class and tokens in id order: what ties an id to the
    model's embedding row and output)."""
    vocab = json.dumps([type(tok).__name__, list(tok.vocab)], ensure_ascii=True)
    return {"vocab_size": tok.vocab_size,
            "vocab_sha256": hashlib.sha256(vocab.encode("ascii")).hexdigest(),
            "pad_id": tok.pad_id, "unk_id": tok.unk_id, "start_id": tok.start_id,
            "end_id": tok.end_id}


def check_tokenizers(run_dir, config, model, src, tgt):
    """ValueError naming both files when a run's tokenizers are not the ones its model was
    trained with: a vocabulary size other than the model's (src_vocab_size, tgt_vocab_size),
    a <pad> id other than the model's pad_id, and, for runs whose config.json records them
    (``tokenizers``), other special ids or another vocabulary."""
    model_file, config_file = _path(run_dir, "model"), _path(run_dir, "config")
    records = config.get("tokenizers") or {}
    for side, tok in (("src", src), ("tgt", tgt)):
        tok_file = _path(run_dir, f"{side}_tokenizer")
        key = f"{side}_vocab_size"
        size = model.config[key]
        if tok.vocab_size != size:
            raise ValueError(f"{tok_file} does not match {model_file}: the tokenizer has "
                             f"{tok.vocab_size} tokens, the model's {key} is {size} (the "
                             "files come from different runs)")
        if model.pad_id is not None and tok.pad_id != model.pad_id:
            raise ValueError(f"{tok_file} does not match {model_file}: the tokenizer's <pad> "
                             f"id is {tok.pad_id}, the model was trained with pad_id="
                             f"{model.pad_id} (the files come from different runs)")
        record = records.get(side)
        if record is None:
            continue
        have = tokenizer_record(tok)
        for role in ("pad_id", "unk_id", "start_id", "end_id", "vocab_size"):
            if have[role] != record[role]:
                raise ValueError(f"{tok_file} does not match {config_file}: the tokenizer's "
                                 f"{role} is {have[role]}, the run was trained with "
                                 f"{record[role]} (the files come from different runs)")
        if have["vocab_sha256"] != record["vocab_sha256"]:
            raise ValueError(f"{tok_file} does not match {config_file}: its vocabulary (SHA-256 "
                             f"{have['vocab_sha256'][:12]}...) is not the one the run was "
                             f"trained with ({record['vocab_sha256'][:12]}...), though both "
                             f"hold {tok.vocab_size} tokens (the files come from different "
                             "runs)")


def load_run(run_dir, *, backend="fast", compute_type=None):
    """Load the run in a run directory (see the module docstring).

    Args:
        run_dir: the run directory.
        backend: "fast" (the default) or "reference".
        compute_type: the model's weights as fastattn.io.load converts them ("int8" / "bf16"
            / "bfloat16" quantize once, for inference); None (the default) keeps them.

    Returns:
        The `Run`.

    Raises:
        FileNotFoundError: a missing file (named, with what writes it).
        ValueError: an unreadable file (named).
    """
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
    config = read_config(run_dir)
    model = io.load(_path(run_dir, "model"), backend=backend,
                    compute_type=compute_type).eval()
    src = tokenizers.load(_path(run_dir, "src_tokenizer"))
    tgt = tokenizers.load(_path(run_dir, "tgt_tokenizer"))
    check_tokenizers(run_dir, config, model, src, tgt)
    return Run(run_dir, model, src, tgt, config)


def _clip(value):
    """clip_norm as fit takes it: a positive float, or None for no clipping (0 or None)."""
    return float(value) if value else None


def _resume_settings(path, config, given):
    """The settings of a resumed run: the run's (config.json at `path`), with the ADJUSTABLE
    ones given again applied; a FIXED one given with another value is a ValueError naming
    each (option and value)."""
    settings = {k: config[k] for k in FIXED + ADJUSTABLE}
    asked = config["requested_vocab_size"] or config["vocab_size"]
    differ = []
    for k in FIXED:
        if k not in given:
            continue
        have, want = settings[k], given[k]
        if k == "clip_norm":
            have, want = _clip(have), _clip(want)
        if k == "vocab_size":
            have = asked
        if want != have:
            differ.append(f"{k}={have!r}, not {want!r} (--{k.replace('_', '-')})")
    if differ:
        raise ValueError(f"{path}: a resume continues the run with its own settings, and it "
                         f"was trained with {'; '.join(differ)}: leave the option out, or "
                         "train a new run into another directory")
    if "steps" in given or "epochs" in given:           # a longer (or shorter) run
        settings["steps"], settings["epochs"] = given.get("steps"), given.get("epochs")
    settings.update((k, given[k]) for k in ("eval_every", "exact_sample", "patience",
                                              "checkpoint_every", "checkpoint_minutes",
                                              "precision")
                    if k in given)
    return settings


def _new_settings(given):
    """The settings of a new run: TRAIN_DEFAULTS, the preset's steps and lr, a warm-up of a
    tenth of the run, updated with those given."""
    settings = dict(TRAIN_DEFAULTS, vocab_size=None, steps=None, epochs=None, lr=None,
                    warmup=None)
    settings.update(given)
    model = settings["model"]
    if model not in PRESETS:
        raise ValueError(f"model preset must be one of {', '.join(PRESETS)}, got {model!r}")
    if settings["tokenizer"] not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got "
                         f"{settings['tokenizer']!r}")
    if settings["steps"] is None and settings["epochs"] is None:
        settings["steps"] = DEFAULT_STEPS[model]
    if settings["lr"] is None:
        settings["lr"] = PRESET_LR[model]
    if settings["warmup"] is None and settings["steps"] is not None:
        settings["warmup"] = default_warmup(settings["steps"])   # kept if the run is extended
    settings["clip_norm"] = _clip(settings["clip_norm"])
    return settings


def train_run(pairs, out, *, model=None, tokenizer=None, vocab_size=None, steps=None,
              epochs=None, batch_tokens=None, schedule=None, lr=None, warmup=None,
              clip_norm=None, dropout=None, label_smoothing=None, valid=None, seed=None,
              resume=False, overwrite=False, progress=True, keep_in_train=(), data=None,
              eval_every=None, exact_sample=None, patience=None, checkpoint_every=None,
              checkpoint_minutes=None, precision=None, comm=None, **fit_kwargs):
    """Train a run from (source, target) text pairs into the directory `out` -> (Run,
    History). What ``fastattn train`` does: split off `valid` of the pairs, train one
    tokenizer on both sides, build the preset model, fit() with checkpoints in
    out/checkpoints, then write the model and the history.

    Settings (None: not given). A new run takes those given and, for the others,
    fastattn.train.defaults: TRAIN_DEFAULTS; without steps or epochs, DEFAULT_STEPS[model]
    steps; lr: PRESET_LR[model], the peak of the schedule; warmup: DEFAULT_WARMUP_SHARE of the
    run, at most MAX_WARMUP steps; clip_norm 0 turns clipping off. They are written to
    config.json before the first step. With resume=True and a config.json in `out`, the run
    continues with its own settings, tokenizers and data split, from the latest checkpoint
    (from step 0 when there is none): a setting given again is applied when it may change
    (ADJUSTABLE: steps or epochs, eval_every, exact_sample, patience, checkpoint_every,
    checkpoint_minutes, precision ("fp32" or "bf16", fit's); they are written back to
    config.json) and must equal the run's otherwise (FIXED: ValueError naming each that
    differs). Without a config.json,
    resume=True starts a new run. A run (new or resumed) starts by removing the temporary
    files and directories that a killed run left in `out` and its checkpoints.

    `out` is locked for the whole run (checkpoint.DirectoryInUse, naming it, when another
    run holds it). A new run needs `out` new or empty: anything in it (a run or other files) is a
    RunDirError unless resume=True, or overwrite=True, which removes the files a run writes
    (those of the module docstring) before the new run starts and keeps any others. A file
    named `out` is a RunDirError.

    With held-out pairs (valid > 0) the run evaluates every eval_every steps and its model
    (model.safetensors) is the one of the lowest validation loss (fit's keep_best); the last
    step's weights stay in the latest checkpoint.

    comm: an mpi4py communicator of several processes (fit's data parallelism). Rank 0
    alone reads and writes `out` (which the others need not see): it settles the settings
    and the tokenizers as above and sends them to the others, which split the same pairs
    (every rank reads the data itself); an error there is raised on every rank. Every rank
    must give the same settings, `out`, `resume` and `overwrite` (a ValueError on every rank
    names the first that differs and each rank's value). The other ranks write nothing and
    return a Run whose model holds the last step's weights.

    Args:
        pairs: the (source, target) text pairs.
        out: the run directory to write.
        model: the preset, "tiny", "small" or "base".
        tokenizer: the tokenizer kind, "bpe", "word" or "char".
        vocab_size: the tokenizer's vocabulary size.
        steps: the number of updates (not with epochs).
        epochs: the number of passes (not with steps).
        batch_tokens: fit's.
        schedule: fit's.
        lr: the schedule's peak.
        warmup: fit's.
        clip_norm: fit's (0 turns clipping off).
        dropout: the model's dropout.
        label_smoothing: fit's.
        valid: the share of the pairs held out.
        seed: the run's seed (split, initialisation, data order, dropout).
        resume: continue the run in `out` (default False).
        overwrite: start a new run in `out` over a previous one (default False).
        progress: fit's (default True).
        keep_in_train: pairs that stay in train (default none).
        data: the data's path, recorded in config.json, or None (the default).
        eval_every: fit's.
        exact_sample: fit's.
        patience: fit's.
        checkpoint_every: fit's.
        checkpoint_minutes: fit's.
        precision: fit's, "fp32" or "bf16".
        comm: an mpi4py communicator, or None (the default) for one process.
        **fit_kwargs: passed to fit.

    Each setting left None takes the run's (resume) or the default, as above.

    Returns:
        `(run, history)`: the `Run` and its `History`.

    Raises:
        ValueError: a bad setting, or a resume given a FIXED setting that differs.
        RunDirError: `out` is a file, or holds files without resume or overwrite.
        DirectoryInUse: another run holds `out`'s lock.
    """
    out = os.fspath(out)
    given = {k: v for k, v in dict(
        model=model, tokenizer=tokenizer, vocab_size=vocab_size, steps=steps, epochs=epochs,
        batch_tokens=batch_tokens, schedule=schedule, lr=lr, warmup=warmup,
        clip_norm=clip_norm, dropout=dropout, label_smoothing=label_smoothing, valid=valid,
        seed=seed, eval_every=eval_every, exact_sample=exact_sample, patience=patience,
        checkpoint_every=checkpoint_every, checkpoint_minutes=checkpoint_minutes,
        precision=None if precision is None else precision_name(precision)).items()
        if v is not None}
    if steps is not None and epochs is not None:
        raise ValueError(f"give steps or epochs, not both (got {steps!r}, {epochs!r})")
    if resume and overwrite:
        raise ValueError("give resume or overwrite, not both: resume continues the run in "
                         f"{out}, overwrite starts a new one there")
    group = distributed.group(comm, fit_kwargs.get("comm_timeout", COMM_TIMEOUT))
    opened = (resume, overwrite)
    if group is None:
        prepared = _prepare(pairs, out, given, opened, keep_in_train, data)
    else:
        prepared = _prepare_ranks(group, pairs, out, given, opened, keep_in_train, data)
    settings, src_tok, tgt_tok, config, train_pairs, valid_pairs, lock = prepared
    try:
        return _train(out, settings, src_tok, tgt_tok, config, train_pairs, valid_pairs,
                      resume, progress, group, comm, fit_kwargs)
    finally:
        if lock is not None:
            lock.release()


def _train(out, settings, src_tok, tgt_tok, config, train_pairs, valid_pairs, resume,
           progress, group, comm, fit_kwargs):
    """fit() into the prepared (and locked) run directory, then the model and history."""
    from .fit import fit

    net = build_model(settings["model"], src_tok.vocab_size, tgt_tok.vocab_size,
                      pad_id=src_tok.pad_id, dropout=settings["dropout"], seed=settings["seed"])
    kw = dict(src_tokenizer=src_tok, tgt_tokenizer=tgt_tok, valid_pairs=valid_pairs or None,
              max_steps=settings["steps"], epochs=settings["epochs"],
              batch_tokens=settings["batch_tokens"], schedule=settings["schedule"],
              lr=settings["lr"], warmup=settings["warmup"],
              clip_norm=_clip(settings["clip_norm"]),
              label_smoothing=settings["label_smoothing"], seed=settings["seed"],
              checkpoint_dir=_path(out, "checkpoints"),
              checkpoint_every=settings["checkpoint_every"],
              checkpoint_minutes=settings["checkpoint_minutes"],
              eval_every=settings["eval_every"] if valid_pairs else None,
              exact_sample=settings["exact_sample"],
              patience=settings["patience"], resume=resume,
              precision=settings["precision"],
              progress=progress if group is None or group.lead else False, comm=comm)
    kw.update(fit_kwargs)
    history = fit(net, train_pairs, **kw)
    if group is None or group.lead:
        _write_history(_path(out, "history"), history)
        io.save(net, _path(out, "model"))
    net.eval()
    run = Run(out, net, src_tok, tgt_tok, config)
    run.train_pairs, run.valid_pairs = train_pairs, valid_pairs
    return run, history


def _prepare_ranks(group, pairs, out, given, opened, keep_in_train, data):
    """_prepare on rank 0, its settings and tokenizers sent to the others, which split the
    pairs as rank 0 did; an error on rank 0 is raised on every rank, and so is a setting,
    `out`, `resume` or `overwrite` that differs between the ranks (a ValueError naming it)."""
    # rank 0 settles the settings: another rank's would be ignored, so they must be rank 0's
    distributed.same_everywhere(
        group, dict(given, out=out, resume=bool(opened[0]), overwrite=bool(opened[1])),
        "train_run's arguments",
        "every rank must call train_run with the same arguments", prefix="train_run: ")
    payload, error, prepared = None, None, None
    if group.lead:
        try:
            prepared = _prepare(pairs, out, given, opened, keep_in_train, data)
            settings, src_tok, tgt_tok, config = prepared[:4]
            payload = dict(settings=settings, config=config, src=src_tok.to_dict(),
                           tgt=tgt_tok.to_dict())
        except Exception as exc:         # told to every rank, then raised everywhere
            error, payload = exc, dict(error=distributed.told(exc))
    payload = group.bcast(payload, "the run's settings from rank 0")
    if "error" in payload:
        distributed.raise_told(payload["error"], error)
    if group.lead:
        return prepared
    settings = payload["settings"]
    src_tok = tokenizers.Tokenizer.from_dict(payload["src"], where="rank 0's src tokenizer")
    tgt_tok = tokenizers.Tokenizer.from_dict(payload["tgt"], where="rank 0's tgt tokenizer")
    train_pairs, valid_pairs = split_pairs(list(pairs), settings["valid"], settings["seed"],
                                           keep_in_train)
    return settings, src_tok, tgt_tok, payload["config"], train_pairs, valid_pairs, None


def _prepare(pairs, out, given, opened, keep_in_train, data):
    """The run directory made ready (and locked), as one process does -> (settings, src_tok,
    tgt_tok, config, train_pairs, valid_pairs, lock). opened: (resume, overwrite)."""
    lock = _open_run_dir(out, *opened)
    try:
        return _prepared(pairs, out, given, opened[0], keep_in_train, data) + (lock,)
    except BaseException:
        lock.release()
        raise


def _prepared(pairs, out, given, resume, keep_in_train, data):
    config_path = _path(out, "config")
    if resume and os.path.exists(config_path):
        config = read_config(out)
        settings = _resume_settings(config_path, config, given)
        src_tok = tokenizers.load(_path(out, "src_tokenizer"))
        tgt_tok = tokenizers.load(_path(out, "tgt_tokenizer"))
        train_pairs, valid_pairs = split_pairs(list(pairs), settings["valid"],
                                               settings["seed"], keep_in_train)
        if any(config[k] != settings[k] for k in ADJUSTABLE):
            config.update((k, settings[k]) for k in ADJUSTABLE)
            write_json_atomic(config_path, config)
    else:
        settings = _new_settings(given)
        train_pairs, valid_pairs = split_pairs(list(pairs), settings["valid"],
                                               settings["seed"], keep_in_train)
        if not train_pairs:
            raise ValueError("no training pairs")
        kind = settings["tokenizer"]
        src_tok = train_tokenizer(kind, [t for p in train_pairs for t in p],
                                  settings["vocab_size"])
        tgt_tok = src_tok
        config = dict(settings, model_config=PRESETS[settings["model"]],
                      vocab_size=src_tok.vocab_size,
                      requested_vocab_size=settings["vocab_size"] or DEFAULT_VOCAB[kind],
                      data=None if data is None else os.fspath(data),
                      train_pairs=len(train_pairs), valid_pairs=len(valid_pairs),
                      tokenizers={"src": tokenizer_record(src_tok),
                                  "tgt": tokenizer_record(tgt_tok)})
        order = ["model", "model_config", "tokenizer", *CONFIG_KEYS]
        config = {k: config[k] for k in sorted(config, key=order.index)}
        src_tok.save(_path(out, "src_tokenizer"))
        tgt_tok.save(_path(out, "tgt_tokenizer"))
        write_json_atomic(config_path, config)
    return settings, src_tok, tgt_tok, config, train_pairs, valid_pairs
