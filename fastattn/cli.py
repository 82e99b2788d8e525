"""The ``fastattn`` command.

    fastattn info                         build and runtime facts (compiler, OpenMP, SIMD, GEMM)
    fastattn bench [--threads N] [--repeat N] [--case NAME ...] [--json PATH] [--quick] [--list]
                                          ops vs the NumPy twin vs torch, as a Markdown table,
                                          then the performance targets (PASS / MISS)
    fastattn demo [--quick] [--out DIR]   train the seeds' dialogue completer (about two
                                          minutes; --quick: seconds), complete, plot
    fastattn train DATA --out RUN_DIR ... train a model on text pairs (.tsv .jsonl .txt .yml)
    fastattn complete RUN_DIR [TEXT ...]  one completion per TEXT (or per line of stdin)
    fastattn translate RUN_DIR --input IN --output OUT [--resume]
                                          every line of a file, streamed and batched, as JSON
                                          lines; a stopped job resumes where it stopped
    fastattn evaluate RUN_DIR DATA        loss, perplexity and greedy exact match on pairs
    fastattn plot RUN_DIR                 RUN_DIR/loss.png: training loss, validation loss,
                                          held-out exact match, lr
    fastattn attention RUN_DIR TEXT --out DIR
                                          attention heatmaps (encoder, masked decoder, cross)

Also runnable as ``python -m fastattn.cli``. Exit status: 0 on success, 1 on an error in the
input (a message, no traceback), 2 on a usage error, 130 after Ctrl-C.
"""
import argparse
import json
import os
import sys
import time
import warnings

import numpy as np


def _probability(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {value}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help text may be finished only when it is shown
    (``finish_help()`` runs then): the bench command's help names the harness's cases and
    defaults, and the harness is imported only for that help or the command itself, so
    ``fastattn info`` and ``fastattn demo`` import neither it nor torch. With ``intermixed``
    set, options may come after positionals and before more of them."""

    finish_help = None
    examples = ()               # command lines shown at the end of the help, as written
    # intermixed = True: options anywhere among the positionals (``complete RUN --method beam
    # TEXT`` as well as ``complete RUN TEXT --method beam``); argparse alone ends a nargs="*"
    # positional at the first option, and the texts after it were 'unrecognized arguments'
    intermixed = False
    _inside = False

    def format_help(self):
        if self.finish_help is not None:
            self.finish_help()
        text = super().format_help()
        if self.examples:
            text += "\nexamples:\n" + "".join(f"  {line}\n" for line in self.examples)
        return text

    def error(self, message):
        """argparse's usage error, with the nearest name for a mistyped command or option."""
        import difflib
        import re
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            near = difflib.get_close_matches(m.group(1), re.findall(r"'([^']*)'", m.group(2)), 1)
            if near:
                message += f"; did you mean '{near[0]}'?"
        m = re.search(r"unrecognized arguments: (-\S+)", message)
        if m:                            # this parser's own options only (parse_args)
            options = sorted({o for a in self._actions for o in a.option_strings})
            near = difflib.get_close_matches(m.group(1).split("=")[0], options, 1)
            if near:
                message += f"; did you mean {near[0]}?"
        super().error(message)

    def parse_args(self, args=None, namespace=None):
        """argparse's, but arguments the command given does not know are that command's
        usage error, so its usage is shown and a near name comes from its own options."""
        args, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parser = action.choices.get(getattr(args, action.dest, None), self)
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return args

    def parse_known_args(self, args=None, namespace=None):
        if not self.intermixed or self._inside:   # the intermixed parse calls back into this
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def _bench_help(repeat, cases):
    """Fill in the help of the bench options `repeat` and `cases` (argparse Actions) from the
    harness: its default counts and its cases."""
    from . import bench

    repeat.help = (f"timed calls per implementation (default {bench.DEFAULT_REPEAT}, "
                   f"{bench.QUICK_REPEAT} with --quick); the NumPy twin gets "
                   f"{bench.DEFAULT_NUMPY_REPEAT} ({bench.QUICK_NUMPY_REPEAT} with --quick)")
    also = " ".join(c for c in bench.CASES if c not in bench.DEFAULT_CASES)
    cases.help = f"cases to run (default: {' '.join(bench.DEFAULT_CASES)}); also: {also}"


def _non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {value}")
    return value


def _parser():
    from . import __version__
    from .train.defaults import (COMM_TIMEOUT, DEFAULT_STEPS, DEFAULT_WARMUP_SHARE,
                                 MAX_WARMUP, PRESET_LR, SCHEDULES, TRAIN_DEFAULTS)

    parser = _Parser(
        prog="fastattn",
        description="Fast CPU Transformers: train encoder-decoder models on text pairs, "
                    "evaluate them, complete and translate texts and whole files with them "
                    "or with pretrained Marian / NLLB / BART models, plot their training and "
                    "attention, benchmark against PyTorch and CTranslate2, and say how the "
                    "build runs on this machine. 'fastattn COMMAND --help' shows each "
                    "command's options and an example.")
    parser.examples = ("fastattn demo", "fastattn train pairs.tsv --out run",
                       "fastattn complete run \"Hello there\"",
                       "fastattn translate --model opus-mt-en-de --input in.txt --output "
                       "out.jsonl", "fastattn info")
    parser.add_argument("--version", action="version", version=f"fastattn {__version__}",
                        help="print fastattn's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)

    i = sub.add_parser("info", help="summarise the CPU, SIMD level, kernel paths and threads",
                       description="A short summary of how fastattn runs on this machine: the "
                                   "CPU, the SIMD level in use, the paths of the float32, "
                                   "int8 and bf16 products, AMX, the threads and the build; "
                                   "--json prints every fact of fastattn.build_info().")
    i.add_argument("--json", action="store_true",
                   help="print fastattn.build_info() whole, as JSON")
    i.examples = ("fastattn info", "fastattn info --json",
                  "FASTATTN_CPU_ISA=avx2 fastattn info")

    b = sub.add_parser("bench", help="benchmark ops vs the NumPy twin vs torch",
                       description="Time fastattn.ops against fastattn.reference (NumPy) and "
                                   "torch, interleaved, and print a Markdown table of medians "
                                   "followed by the performance targets.")
    b.add_argument("--threads", type=_positive_int, metavar="N",
                   help="threads for fastattn, torch and NumPy's BLAS (default: fastattn's "
                        "current count, i.e. OMP_NUM_THREADS or all CPUs)")
    repeat = b.add_argument("--repeat", type=_positive_int, metavar="N",
                            help="timed calls per implementation")
    # Case names are checked by the command (_bench), not by choices=: the parser does not
    # import the harness.
    cases = b.add_argument("--case", dest="cases", action="extend", nargs="+", metavar="NAME",
                           help="cases to run")
    b.add_argument("--json", metavar="PATH",
                   help="also write rows, targets and the machine (CPU, date, build) as JSON "
                        "to PATH; a directory gets a file named by date, CPU, SIMD level and "
                        "threads (as benchmarks/results/ keeps them)")
    b.add_argument("--quick", action="store_true", help="fewer repeats (a rough look)")
    b.add_argument("--list", action="store_true", help="list the cases and exit")
    b.set_defaults(subparser=b)
    b.finish_help = lambda: _bench_help(repeat, cases)

    d = sub.add_parser("demo", help="train the seeds' dialogue completer, complete, plot",
                       description="Train the seeds' dialogue completer on the English "
                                   "conversations of chatterbot-corpus (pip install "
                                   "\"fastattn[demo]\") and the seeds' lines, in about a "
                                   "minute on 2 cores; print the training loss, the validation "
                                   "curve with its held-out exact match, and completions; "
                                   "write loss.png and attention heatmaps into --out.")
    d.add_argument("--quick", action="store_true",
                   help="a seconds-long check: the seeds' lines only, a few hundred steps")
    d.add_argument("--out", metavar="DIR", default="fastattn-demo",
                   help="where the run, loss.png and the heatmaps go (default: %(default)s)")
    d.add_argument("--seconds", type=_positive_float, metavar="S",
                   help="stop training after S seconds, whatever the steps (default: no "
                        "cap: 1000 steps, 300 with --quick)")
    d.add_argument("--quiet", action="store_true", help="no progress bar")

    t = sub.add_parser("train", help="train a dialogue or translation model on text pairs",
                       description="Train a Seq2SeqTransformer on (source, target) text pairs "
                                   "into RUN_DIR (model, tokenizers, config, history, "
                                   "checkpoints). DATA: .tsv (source TAB target), .jsonl "
                                   "({\"source\": ..., \"target\": ...}), .txt (each line is "
                                   "answered by the next) or .yml (chatterbot-corpus format). "
                                   "With --resume the run continues with the settings in its "
                                   "config.json: --steps/--epochs, --eval-every, "
                                   "--exact-sample, --patience and --checkpoint-every/-minutes "
                                   "may change; any other option given must equal the run's. "
                                   "A new run needs RUN_DIR new or empty (else --resume or "
                                   "--overwrite); one run at a time writes a RUN_DIR.")
    # Defaults are None here (train_run fills them in), so that a resume can tell an option
    # given from one left out; the help names the real defaults.
    d = TRAIN_DEFAULTS
    t.add_argument("data", metavar="DATA", help="the pairs file")
    t.add_argument("--out", metavar="RUN_DIR", required=True, help="the run directory")
    t.add_argument("--model", choices=("tiny", "small", "base"),
                   help="tiny: d 128, 4 heads, 2+2 layers, ff 512; small: d 256, 4 heads, 3+3, "
                        f"ff 1024; base: the paper's (default: {d['model']})")
    t.add_argument("--tokenizer", choices=("bpe", "word", "char"),
                   help=f"one tokenizer trained on both sides (default: {d['tokenizer']})")
    t.add_argument("--vocab-size", type=_positive_int, metavar="N",
                   help="tokens in the vocabulary, specials included (default: bpe 4000, word "
                        "8000, at most what the data holds; char: every character seen)")
    length = t.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive_int, metavar="N",
                        help="optimiser steps (default, without --epochs: "
                             + ", ".join(f"{k} {v}" for k, v in DEFAULT_STEPS.items()) + ")")
    length.add_argument("--epochs", type=_positive_int, metavar="N", help="passes over the data")
    t.add_argument("--batch-tokens", type=_positive_int, metavar="N",
                   help=f"padded tokens per batch (default: {d['batch_tokens']})")
    t.add_argument("--schedule", choices=SCHEDULES,
                   help="learning-rate schedule: inverse_sqrt (linear warm-up to the peak, then "
                        "1/sqrt(step)), cosine (warm-up, then a half cosine to 0 at the last "
                        f"step), constant (default: {d['schedule']})")
    t.add_argument("--lr", type=_positive_float, metavar="X",
                   help="peak learning rate (default: "
                        + ", ".join(f"{k} {v:g}" for k, v in PRESET_LR.items()) + ")")
    t.add_argument("--warmup", type=_non_negative_int, metavar="N",
                   help=f"warm-up steps (default: {100 * DEFAULT_WARMUP_SHARE:.0f}%% of the run, "
                        f"at most {MAX_WARMUP}; ignored by constant)")
    t.add_argument("--clip-norm", type=_non_negative_float, metavar="X",
                   help="clip the gradients to this global L2 norm; 0: no clipping "
                        f"(default: {d['clip_norm']})")
    t.add_argument("--dropout", type=_probability, metavar="P",
                   help=f"dropout (default: {d['dropout']})")
    t.add_argument("--label-smoothing", type=_probability, metavar="X",
                   help=f"label smoothing (default: {d['label_smoothing']})")
    t.add_argument("--valid", type=_probability, metavar="FRACTION",
                   help="fraction of the pairs held out for validation (default: "
                        f"{d['valid']})")
    t.add_argument("--eval-every", type=_positive_int, metavar="N",
                   help="evaluate on the held-out pairs every N steps, and at the end: loss, "
                        "perplexity, greedy exact match; the run keeps the weights of the "
                        f"lowest validation loss as its model (default: {d['eval_every']})")
    t.add_argument("--exact-sample", type=_non_negative_int, metavar="N",
                   help="held-out pairs decoded for the exact match at each evaluation; 0: "
                        f"none (default: {d['exact_sample']})")
    t.add_argument("--patience", type=_positive_int, metavar="N",
                   help="stop early after N evaluations without a lower validation loss "
                        "(default: off)")
    t.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                   help="write a checkpoint every N steps, and at the end (default: "
                        f"{d['checkpoint_every']})")
    t.add_argument("--checkpoint-minutes", type=_positive_float, metavar="M",
                   help="also write one when M minutes have passed since the latest (default: "
                        f"{d['checkpoint_minutes']:g})")
    t.add_argument("--precision", choices=("fp32", "bf16"),
                   help="training precision: bf16 is mixed precision (products of bf16 "
                        "operands summed in float32; weights, gradients and optimizer float32), "
                        "fp32 is float32 throughout; a resume may change it (default: "
                        f"{d['precision']})")
    t.add_argument("--seed", type=_non_negative_int, metavar="S",
                   help=f"the run's seed (default: {d['seed']})")
    again = t.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue RUN_DIR from its latest checkpoint, with its settings")
    again.add_argument("--overwrite", action="store_true",
                       help="start a new run in a RUN_DIR that is not empty: the files a run "
                            "writes (model, tokenizers, config, history, checkpoints, "
                            "loss.png) are removed first, other files are kept")
    t.add_argument("--quiet", action="store_true",
                   help="no progress bar, even on a terminal: JSON lines on standard error "
                        "(every 10th step, each evaluation, each message)")
    _threads_argument(t, "; under mpiexec without OMP_NUM_THREADS: the machine's CPUs shared "
                         "out between its ranks")
    t.add_argument("--comm-timeout", type=_positive_float, metavar="S",
                   help="under mpiexec: the longest one rank waits for the others (rank 0's "
                        "evaluations and checkpoints included) before it ends the job "
                        f"(default: {COMM_TIMEOUT:g})")

    c = sub.add_parser("complete", help="complete texts with a trained run",
                       description="One completion per TEXT, or per line of standard input "
                                   "when no TEXT is given (one output line per input line, in "
                                   "order). A text longer than the model takes is cut to it "
                                   "and completed, with a note on standard error naming it, "
                                   "as fastattn translate does.")
    c.intermixed = True
    _model_arguments(c)
    c.add_argument("texts", metavar="TEXT", nargs="*", default=[],
                   help="the texts to complete (default: every line of standard input)")
    _generation_flags(c)
    c.add_argument("--batch-size", type=_positive_int, default=64, metavar="N",
                   help="lines completed together (default: %(default)s)")
    _threads_argument(c)

    tr = sub.add_parser(
        "translate", help="translate every line of a file with a trained run (resumable)",
        description="Translate (or complete) every line of IN with the run in RUN_DIR and write "
                    "one JSON line per input line to OUT, in input order: {\"id\": line "
                    "number, \"source\": ..., \"output\": ...}. IN is read as a stream: text "
                    "lines, or JSON lines with a \"source\" field (.jsonl). Lines are batched "
                    "by a token budget, sorted by length within a window. An empty line gives "
                    "an empty output; a line that is not UTF-8 or not a JSON object (and, with "
                    "--too-long skip, a source longer than the model takes) gives \"output\": "
                    "null and an \"error\". A stopped job (Ctrl-C, kill -9) continues with "
                    "--resume: every line exactly once, the same outputs.")
    _model_arguments(tr)
    tr.add_argument("--input", metavar="IN", required=True, help="the file of source lines")
    tr.add_argument("--output", metavar="OUT", required=True, help="the JSON-lines output")
    tr.add_argument("--format", choices=("auto", "text", "jsonl"), default="auto",
                    help="IN's format (default: %(default)s: .jsonl and .ndjson are JSON "
                         "lines, anything else text)")
    _generation_flags(tr)
    tr.add_argument("--batch-tokens", type=_positive_int, default=4096, metavar="N",
                    help="padded source tokens per batch (default: %(default)s)")
    tr.add_argument("--window", type=_positive_int, default=2048, metavar="N",
                    help="lines sorted by length together (default: %(default)s)")
    tr.add_argument("--too-long", choices=("truncate", "skip"), default="truncate",
                    help="a source longer than the model takes: cut it (and say so in its "
                         "line) or leave it untranslated with an error (default: %(default)s)")
    tr.add_argument("--max-source-tokens", type=_positive_int, metavar="N",
                    help="the longest source, <start> and <end> included (default: the "
                         "model's max_len)")
    again = tr.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue OUT where a stopped job left it")
    again.add_argument("--overwrite", action="store_true", help="start OUT over")
    _threads_argument(tr)
    tr.add_argument("--quiet", action="store_true",
                    help="no progress (a bar on a terminal, else JSON lines on standard error)")

    ev = sub.add_parser("evaluate", help="loss, perplexity and exact match of a run on pairs",
                        description="Evaluate the run in RUN_DIR on the (source, target) pairs "
                                    "of DATA (the formats of fastattn train): the mean "
                                    "cross-entropy per target token (no label smoothing), its "
                                    "perplexity, and the greedy exact match (the whole output "
                                    "equals the target, compared as token ids).")
    ev.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of fastattn train")
    ev.add_argument("data", metavar="DATA", help="the pairs file (.tsv .jsonl .txt .yml)")
    ev.add_argument("--exact-sample", type=_non_negative_int, metavar="N",
                    help="decode only N pairs (a seeded sample) for the exact match; 0: none "
                         "(default: all)")
    ev.add_argument("--batch-tokens", type=_positive_int, default=4096, metavar="N",
                    help="padded tokens per batch (default: %(default)s)")
    ev.add_argument("--compute-type", choices=("float32", "int8", "bf16", "bfloat16"),
                    help="convert the model's linear weights for inference (default: as saved)")
    ev.add_argument("--json", action="store_true", help="print one JSON object instead")
    _threads_argument(ev)

    pl = sub.add_parser("plot", help="plot a run's loss curves to RUN_DIR/loss.png",
                        description="Training loss, validation loss, held-out exact match and "
                                    "learning rate of a run, from RUN_DIR/history.jsonl, as a "
                                    "PNG.")
    pl.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of fastattn train")
    pl.add_argument("--out", metavar="PNG", help="default: RUN_DIR/loss.png")

    a = sub.add_parser("attention", help="attention heatmaps of a run for one text",
                       description="PNG heatmaps of the encoder self-attention, the decoder's "
                                   "masked self-attention and the cross-attention weights, one "
                                   "panel per head, for TEXT and its target (--target, or the "
                                   "model's greedy completion).")
    a.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of fastattn train")
    a.add_argument("text", metavar="TEXT", help="the source text")
    a.add_argument("--target", metavar="TEXT",
                   help="the target text the decoder reads (default: the model's greedy "
                        "completion of TEXT)")
    a.add_argument("--out", metavar="DIR", required=True,
                   help="the directory the PNG heatmaps are written to")
    for name, lines in EXAMPLES.items():
        sub.choices[name].examples = lines
    return parser


def _model_arguments(p):
    """RUN_DIR, or --model DIR: a pretrained model directory (Marian / OPUS-MT, NLLB /
    M2M100, BART / mBART from Hugging Face, or one fastattn.pretrained's Translator.save
    wrote), with its languages."""
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                   help="a run directory of fastattn train")
    p.add_argument("--model", metavar="DIR",
                   help="instead of RUN_DIR: a pretrained model directory (Marian / OPUS-MT, "
                        "NLLB / M2M100, BART / mBART; needs the hf extra for its tokenizer)")
    p.add_argument("--src-lang", metavar="CODE",
                   help="a pretrained multilingual model's source language (e.g. eng_Latn)")
    p.add_argument("--tgt-lang", metavar="CODE",
                   help="a pretrained multilingual model's target language (e.g. fra_Latn)")


def _model_dir(args):
    """The directory of RUN_DIR / --model (exactly one given); --src-lang / --tgt-lang only
    with a pretrained model."""
    if args.model is not None and args.run_dir is not None and hasattr(args, "texts"):
        args.texts.insert(0, args.run_dir)        # complete --model DIR TEXT...: a text
        args.run_dir = None
    if (args.run_dir is None) == (args.model is None):
        raise ValueError("give a RUN_DIR or --model DIR (one of them)")
    if args.model is None and (args.src_lang or args.tgt_lang):
        raise ValueError("--src-lang / --tgt-lang apply to a pretrained model (--model DIR)")
    if args.model is not None:
        from .pretrained import is_model_dir
        if not is_model_dir(args.model):
            raise ValueError(f"--model {args.model}: not a pretrained model directory (no "
                             "config.json with a model_type, nor fastattn-pretrained.json); a "
                             "fastattn run directory is given as RUN_DIR")
    return args.model if args.model is not None else args.run_dir


def _generation_flags(p):
    """The generation options of complete and translate (see fastattn.generate)."""
    p.add_argument("--method", choices=("greedy", "beam", "sample"), default="greedy",
                   help="greedy: the most likely token each step; beam: beam search; sample: "
                        "draw from the model's distribution (default: %(default)s)")
    p.add_argument("--beam-size", type=_positive_int, default=4, metavar="K",
                   help="hypotheses kept per text with --method beam (default: %(default)s)")
    p.add_argument("--temperature", type=_positive_float, default=1.0, metavar="T",
                   help="--method sample: divides the logits; below 1 sharper, above 1 "
                        "flatter (default: %(default)s)")
    p.add_argument("--top-k", type=_positive_int, metavar="K",
                   help="--method sample: draw only from the K most likely tokens (default: "
                        "all)")
    p.add_argument("--top-p", type=_positive_float, metavar="P",
                   help="--method sample: draw only from the smallest set of most likely "
                        "tokens whose probability reaches P, in (0, 1] (default: 1, no cut)")
    p.add_argument("--seed", type=int, metavar="S",
                   help="--method sample: the sampling seed; the same seed gives the same "
                        "output (default: none, a different draw each run)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=64, metavar="N",
                   help="the most tokens generated per text, the end token included "
                        "(default: %(default)s)")
    p.add_argument("--compute-type", choices=("float32", "int8", "bf16", "bfloat16"),
                   help="convert the model's linear weights for inference (int8 / bf16 / "
                        "bfloat16: quantized once while loading; bfloat16 also computes "
                        "the products in bf16; default: as saved)")


def _cpu_name():
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform says."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def info_summary(info):
    """The short human summary of build_info() -> [(label, text)]."""
    import os

    def yes(v):
        return "yes" if v else "no"

    g, amx = info["gemm"], info["amx"]
    if amx.get("int8") or amx.get("bf16"):
        tiles = "used" if amx.get("used") else "granted" if amx.get("permitted") else \
            "not granted by the OS"
        amx_text = f"yes ({', '.join(k for k in ('int8', 'bf16') if amx.get(k))}; {tiles})"
    else:
        amx_text = "no (this CPU has no AMX tiles)"
    builds = [name for name, on in (("native", info["native_build"]),
                                    ("debug", info["debug_build"]),
                                    ("sanitizer", info["sanitize_build"])) if on]
    forced = os.environ.get("FASTATTN_CPU_ISA")
    return [
        ("fastattn", f"{info['version']} ({info['compiler']}, OpenMP {yes(info['openmp'])}, "
                     f"{' + '.join(builds) if builds else 'portable'} build)"),
        ("CPU", f"{_cpu_name()} ({os.cpu_count()} CPUs seen)"),
        ("SIMD level", f"{info['simd']}{' (forced by FASTATTN_CPU_ISA)' if forced else ''}; "
                       f"available: {', '.join(info['simd_available'])}"),
        ("float32 GEMM", f"fastattn's own engine (no BLAS library): K block {g['k_block']}, "
                         f"cache L1 {_size(g['l1'])} / L2 {_size(g['l2'])} / L3 "
                         f"{_size(g['l3'])}"),
        ("int8 path", f"{info['int8_path']} (few rows: {info['int8_path_few_rows']})"),
        ("bf16 path", f"{info['bf16_path']} (few rows: {info['bf16_path_few_rows']}); "
                      f"attention {info['attention_bf16_path']}"),
        ("AMX", amx_text),
        ("threads", f"{info['threads']} (OMP_NUM_THREADS, or all CPUs; "
                    "fastattn.set_num_threads or --threads changes it)"),
    ]


def _info(args):
    import json

    import fastattn

    info = fastattn.build_info()
    if args.json:
        print(json.dumps(info, indent=1, default=str))
        return 0
    rows = info_summary(info)
    width = max(len(label) for label, _ in rows)
    for label, text in rows:
        print(f"{label + ':':{width + 1}} {text}")
    print("every fact: fastattn info --json")
    return 0


def _bench(args):
    import os

    from . import bench

    if args.json and not os.path.isdir(args.json) and \
            not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        args.subparser.error(f"argument --json: no such directory for {args.json!r}")  # exit 2
    unknown = [c for c in args.cases or () if c not in bench.CASES]
    if unknown:  # as argparse words an invalid choice; exit 2
        args.subparser.error(f"argument --case: invalid choice: {unknown[0]!r} (choose from "
                             f"{', '.join(map(repr, bench.CASES))})")

    if args.list:
        for name, case in bench.CASES.items():
            extra = "" if name in bench.DEFAULT_CASES else "  (not run by default)"
            print(f"{name:18} {case.title}{extra}")
        return 0
    repeat = args.repeat or (bench.QUICK_REPEAT if args.quick else bench.DEFAULT_REPEAT)
    numpy_repeat = bench.QUICK_NUMPY_REPEAT if args.quick else bench.DEFAULT_NUMPY_REPEAT
    started = time.perf_counter()
    rows = bench.run(args.cases, repeat=repeat, threads=args.threads,
                     numpy_repeat=numpy_repeat,
                     progress=lambda name: print(f"running {name} ...", file=sys.stderr,
                                                 flush=True))
    elapsed = time.perf_counter() - started
    targets = bench.check_targets(rows)
    print(bench.describe_environment(rows[0]["threads"] if rows else None))
    print(f"medians of {repeat} interleaved calls (NumPy twin: {min(numpy_repeat, repeat)}); "
          f"speedup = other's time / fastattn's time")
    print()
    print(bench.format_table(rows))
    lines = bench.format_targets(targets)
    if lines:
        print()
        print("targets:")
        print(lines)
    print()
    print(f"bench took {elapsed:.1f} s")
    if args.json:
        import datetime

        import fastattn

        info = fastattn.build_info()
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        threads = rows[0]["threads"] if rows else info["threads"]
        payload = {"date": date, "cpu": bench.cpu_model(), "cpus": os.cpu_count(),
                   "threads": threads, "environment": info, "torch": bench.torch_version(),
                   "numpy": np.__version__, "repeat": repeat, "numpy_repeat": numpy_repeat,
                   "elapsed_s": elapsed, "rows": rows, "targets": targets}
        path = args.json
        if os.path.isdir(path):
            name = bench.result_filename(date, payload["cpu"], info["simd"], threads)
            path = os.path.join(path, name)
            n = 2                     # a second run of the day on this machine: name-2.json, ...
            while os.path.exists(path):
                path = os.path.join(args.json, f"{name[:-len('.json')]}-{n}.json")
                n += 1
        print(f"results written to {path}")
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")
    return 0


# fastattn's own exceptions for a user's error that are no ValueError: (module, class name).
# A command reports each as one line; tests check that every exported exception class is here
# or a subclass of a class in _user_errors().
_OWN_ERRORS = (("fastattn.train.checkpoint", "DirectoryInUse"),
               ("fastattn.train.fit", "Diverged"), ("fastattn.tokenizers.base", "NotFittedError"),
               ("fastattn.bench.torch_models", "Unavailable"))


def _user_errors():
    """The exception classes a command reports as an error in the user's input: the built-in
    ones and fastattn's own (_OWN_ERRORS), those of modules not imported left out (nothing
    can have raised them, and importing them here could fail itself)."""
    own = (getattr(sys.modules[m], name, None) for m, name in _OWN_ERRORS if m in sys.modules)
    return (ValueError, OSError, ImportError, *(c for c in own if c is not None))


def _error_line(exc):
    """The message of an error _user_errors() takes: an OS error the system raised (it has an
    errno) as 'PATH: reason', without Python's '[Errno N]'; any other as it is."""
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror:
        paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
        return f"{paths}: {exc.strerror}" if paths else exc.strerror
    return str(exc)


def _errors(fn):
    """Run a command: an error in the user's input (a file, a run directory in use, a
    diverging run, a missing extra, an OS error reading or writing: _user_errors()) is one
    line on standard error and exit status 1, not a traceback; Ctrl-C exits 130."""
    def run(args):
        try:
            return fn(args)
        except _user_errors() as exc:
            print(f"fastattn {args.command}: {_error_line(exc)}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            extra = {"train": "; the last finished step is checkpointed: rerun with --resume "
                              "to continue",
                     "translate": "; the lines written are kept: rerun with --resume to "
                                  "continue"}.get(args.command, "")
            print(f"fastattn {args.command}: interrupted{extra}", file=sys.stderr)
            return 130
    return run


def _threads_argument(p, more=""):
    p.add_argument("--threads", type=_positive_int, metavar="N",
                   help=f"threads fastattn's kernels use (default: OMP_NUM_THREADS, else "
                        f"all CPUs{more})")


def _set_threads(args):
    """--threads, where given (fastattn.set_num_threads: a count it refuses is one line)."""
    if getattr(args, "threads", None):
        import fastattn
        fastattn.set_num_threads(args.threads)


def _train(args):
    """fastattn train; under mpiexec with several processes, one rank of a data-parallel
    run: rank 0 reports and writes, the others stay quiet unless they fail. An error that
    only some ranks meet ends every rank (printed by the rank that met it)."""
    from .train import distributed

    try:
        comm = distributed.world()
    except ImportError as exc:
        print(f"fastattn train: {exc}", file=sys.stderr)
        return 1
    if comm is None:
        return _errors(lambda a: (_set_threads(a), _train_one(a, None))[1])(args)
    from .train.defaults import COMM_TIMEOUT

    group = distributed.Group(comm, args.comm_timeout or COMM_TIMEOUT)
    if args.threads:
        status = _errors(_set_threads)(args)
        if status:
            return status
    elif "OMP_NUM_THREADS" not in os.environ:    # the cores shared out between the ranks
        import fastattn
        fastattn.set_num_threads(max(1, distributed.local_cores() // group.local_size()))
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line
            # rank 0 settles the run: another rank's options would be ignored, so they must
            # be rank 0's (DATA may be another path: its pairs are compared when fit starts)
            distributed.same_everywhere(
                group, {f"--{k.replace('_', '-')}": v for k, v in vars(args).items()
                        if k not in ("command", "data")}, "the options",
                "give every rank the same options", show=_given)
            return _train_one(args, group)
    except BaseException as exc:
        if not distributed.is_agreed(exc):
            group.fail(exc)
        if group.lead:                   # every rank raised it: said once
            print(f"fastattn train: {exc}", file=sys.stderr)
        return 1


def _given(value):
    return "(not given)" if value is None else repr(value)


def _warning_line(message, category, filename, lineno, file=None, line=None):
    """A warning as the command's other messages: one line on standard error."""
    print(f"fastattn train: warning: {message}", file=sys.stderr)


def _train_one(args, group):
    from .train import distributed, read_pairs
    from .train.checkpoint import latest_checkpoint
    from .train.run import FILES

    lead = group is None or group.lead
    pairs = distributed.together(group, lambda: read_pairs(args.data), "reading DATA")
    if args.resume and lead:   # said whatever --quiet asks for: the run starts over
        checkpoints = os.path.join(args.out, FILES["checkpoints"])
        if not os.path.exists(os.path.join(args.out, FILES["config"])):
            print(f"fastattn train: --resume: nothing to resume in {args.out} (no "
                  f"{FILES['config']}): starting a new run", file=sys.stderr)
        elif latest_checkpoint(checkpoints) is None:
            print(f"fastattn train: --resume: no checkpoint in {checkpoints}: starting the run "
                  "over from step 0, with its settings", file=sys.stderr)
    try:
        run, history = _train_run(args, group, pairs)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(_write_error(args.out, exc)) from None
    if lead:
        print(_summary(history))
        print(f"run written to {run.path}")
    return 0


def _write_error(out, exc):
    """One line for an OS error met while writing the run in `out` (no permission, disk
    full, ...): what failed, and what is left."""
    import errno

    where = f" ({exc.filename})" if exc.filename else ""
    text = f"cannot write the run in {out}: {exc.strerror or exc}{where}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        text += ("; the checkpoints already written are complete: free some space and "
                 "rerun with --resume")
    return text


def _train_run(args, group, pairs):
    from .train.run import train_run

    return train_run(
        pairs, args.out, model=args.model, tokenizer=args.tokenizer,
        vocab_size=args.vocab_size, steps=args.steps, epochs=args.epochs,
        batch_tokens=args.batch_tokens, schedule=args.schedule, lr=args.lr,
        warmup=args.warmup, clip_norm=args.clip_norm, dropout=args.dropout,
        label_smoothing=args.label_smoothing, valid=args.valid, seed=args.seed,
        resume=args.resume, overwrite=args.overwrite,
        progress="json" if args.quiet else True, data=args.data,
        eval_every=args.eval_every, exact_sample=args.exact_sample, patience=args.patience,
        checkpoint_every=args.checkpoint_every, checkpoint_minutes=args.checkpoint_minutes,
        precision=args.precision,
        **({} if group is None else dict(comm=group.comm, comm_timeout=group.timeout)))


def _summary(history):
    steps, evals = history.steps, history.evals
    text = f"{len(steps)} steps"
    if steps:
        text += f", final training loss {steps[-1]['loss']:.4f}"
    finite = [r for r in evals if r["valid_loss"] == r["valid_loss"]]
    if finite:
        best = min(finite, key=lambda r: r["valid_loss"])
        text += (f"; the run's model is step {best['step']}'s, the lowest validation loss "
                 f"{best['valid_loss']:.4f} (perplexity {best['valid_ppl']:.2f}")
        if best.get("valid_exact") is not None:
            text += f", held-out exact match {best['valid_exact']:.1%}"
        text += ")"
    return text


# each command's help ends with these lines, as a user would type them
EXAMPLES = {
    "bench": ("fastattn bench --quick", "fastattn bench --threads 2 --case attention_causal "
              "gemm_2048", "fastattn bench --list"),
    "demo": ("fastattn demo", "fastattn demo --quick --out /tmp/demo"),
    "train": ("fastattn train pairs.tsv --out run",
              "fastattn train pairs.tsv --out run --model small --steps 3000 --precision bf16",
              "fastattn train pairs.tsv --out run --resume"),
    "complete": ("fastattn complete run \"Hello there\" \"How are you?\"",
                 "fastattn complete run --method beam --beam-size 4 < prompts.txt",
                 "fastattn complete --model opus-mt-en-de \"The weather is nice.\""),
    "translate": ("fastattn translate run --input in.txt --output out.jsonl",
                  "fastattn translate --model nllb-200-distilled-600M --src-lang eng_Latn "
                  "--tgt-lang fra_Latn --input in.txt --output out.jsonl --resume"),
    "evaluate": ("fastattn evaluate run held_out.tsv", "fastattn evaluate run pairs.tsv "
                 "--exact-sample 200 --json"),
    "plot": ("fastattn plot run", "fastattn plot run --out curves.png"),
    "attention": ("fastattn attention run \"Hello there\" --out heatmaps",),
}


def _generate_kwargs(args):
    kw = dict(method=args.method, max_new_tokens=args.max_new_tokens)
    for key in ("src_lang", "tgt_lang"):
        if getattr(args, key, None) is not None:
            kw[key] = getattr(args, key)
    if args.method == "beam":
        kw["beam_size"] = args.beam_size
    if args.method == "sample":
        kw.update(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                  seed=args.seed)
    return kw


@_errors
def _complete(args):
    from .runners.core import Translator, load_any

    _set_threads(args)
    run = load_any(_model_dir(args), compute_type=args.compute_type)
    # translate's rule for a source longer than the model takes: cut it, say so, go on
    tr = Translator.from_run(run, too_long="truncate", **_generate_kwargs(args))
    texts = (_checked_texts(args.texts) if args.texts else _stdin_lines())
    what = "TEXT" if args.texts else "line"
    batch, done, bad = [], 0, 0

    def flush():
        nonlocal done
        for i, result in enumerate(tr.translate(batch), done + 1):
            if result.truncated:
                print(f"fastattn complete: {what} {i}: longer than the model's "
                      f"{tr.max_source_tokens} source tokens: cut to them (as fastattn "
                      "translate does)", file=sys.stderr)
            print(result.output.replace("\n", " "), flush=False)
        sys.stdout.flush()
        done += len(batch)
        batch.clear()

    bar = _generation_bar(bool(args.texts))
    for text in texts:
        if isinstance(text, _NotText):    # said, answered by an empty line, in order
            if batch:
                bar(len(batch))
                flush()
            print(f"fastattn complete: {what} {done + 1}: {text}: no completion (an empty "
                  "output line)", file=sys.stderr)
            print("", flush=True)
            done, bad = done + 1, bad + 1
            bar(1)
            continue
        batch.append(text)
        if len(batch) == args.batch_size:
            flush()
            bar(args.batch_size)
    if batch:
        bar(len(batch))
        flush()
    bar(None)
    if bad:
        print(f"fastattn complete: {bad} of the {done} {what}s not completed (not UTF-8)",
              file=sys.stderr)
        return 1
    return 0


class _NotText(str):
    """An input line that is not UTF-8: what is wrong with it, as translate words it."""


def _not_utf8(raw):
    """None when the bytes `raw` are UTF-8, else a _NotText naming the first bad byte."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _NotText(f"not UTF-8: byte {raw[exc.start:exc.start + 1]!r} at column "
                        f"{exc.start + 1}")
    return None


def _stdin_lines():
    """Standard input's lines (line ends removed), read as bytes: a line that is not UTF-8
    comes as a _NotText, as translate flags it (a text stream would pass its bytes on as
    surrogate escapes, and the model would answer noise)."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:                   # a text stream put in its place
        yield from (line.rstrip("\r\n") for line in sys.stdin)
        return
    for raw in stream:
        raw = raw.rstrip(b"\r\n")
        yield _not_utf8(raw) or raw.decode("utf-8")


def _checked_texts(texts):
    """The TEXT arguments, each not UTF-8 (the OS hands its bytes over as surrogate escapes)
    as a _NotText."""
    for text in texts:
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:       # a lone surrogate that is no escape: not text
            yield _NotText("not UTF-8 text")
            continue
        yield _not_utf8(raw) or text


def _generation_bar(given):
    """A tqdm bar of lines completed, for standard input on a terminal when tqdm is there;
    otherwise nothing. Returns update(n) (None closes it)."""
    if given or not sys.stderr.isatty():
        return lambda n: None
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda n: None
    bar = tqdm(unit=" lines", file=sys.stderr)
    return lambda n: bar.close() if n is None else bar.update(n)


@_errors
def _translate(args):
    from .runners import translate_file

    _set_threads(args)
    stats = translate_file(_model_dir(args), args.input, args.output, input_format=args.format,
                           batch_tokens=args.batch_tokens, window=args.window,
                           too_long=args.too_long, max_source_tokens=args.max_source_tokens,
                           resume=args.resume, overwrite=args.overwrite,
                           compute_type=args.compute_type, progress=not args.quiet,
                           **_generate_kwargs(args))
    done = f" after the {stats['skipped']} already there" if stats["skipped"] else ""
    print(f"{stats['lines']} lines translated into {args.output}{done} ({stats['errors']} "
          f"errors, {stats['truncated']} truncated): {stats['tokens']} tokens in "
          f"{stats['seconds']:.1f} s ({stats['tokens_per_s']:.0f} tokens/s), padding "
          f"{stats['padding']:.1%}")
    return 0


@_errors
def _evaluate(args):
    from .train import read_pairs
    from .train.evaluate import Evaluator
    from .train.run import load_run

    _set_threads(args)
    run = load_run(args.run_dir, compute_type=args.compute_type)
    pairs = read_pairs(args.data)
    ev = Evaluator(pairs, src_tokenizer=run.src_tokenizer, tgt_tokenizer=run.tgt_tokenizer,
                   max_len=run.model.max_len, batch_tokens=args.batch_tokens,
                   exact_sample=args.exact_sample)
    result = ev(run.model)
    result.update(pairs=len(pairs), skipped=ev.skipped)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{len(pairs)} pairs ({ev.skipped} skipped: longer than the model's "
          f"max_len={run.model.max_len} or empty)")
    print(f"loss {result['valid_loss']:.4f} (mean cross-entropy per target token)")
    print(f"perplexity {result['valid_ppl']:.3f}")
    if result["valid_exact"] is not None:
        print(f"exact match (greedy) {result['valid_exact']:.1%} of "
              f"{result['exact_pairs']} pairs")
    return 0


@_errors
def _plot(args):
    import os

    from .plots import plot_history

    path = os.path.join(args.run_dir, "history.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no history (fastattn train writes it)")
    out = args.out or os.path.join(args.run_dir, "loss.png")
    plot_history(path, out)
    print(out)
    return 0


@_errors
def _attention(args):
    from .plots import plot_model_attention
    from .train.run import load_run

    run = load_run(args.run_dir)
    for path in plot_model_attention(run.model, run.src_tokenizer, run.tgt_tokenizer,
                                     args.text, args.target, out_dir=args.out):
        print(path)
    return 0


@_errors
def _demo(args):
    from .train.demo import demo

    return demo(quick=args.quick, out=args.out, seconds=args.seconds, progress=not args.quiet)


def main(argv=None):
    """Entry point of the ``fastattn`` command; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in ("complete", "translate") and args.run_dir is None and \
            args.model is None:                  # a usage error, as argparse reports one
        print(f"usage: fastattn {args.command} RUN_DIR | --model DIR ... (fastattn "
              f"{args.command} --help)\nfastattn {args.command}: error: the following "
              "arguments are required: RUN_DIR (or --model DIR)", file=sys.stderr)
        return 2
    return {"info": _info, "bench": _bench, "demo": _demo, "train": _train,
            "complete": _complete, "translate": _translate, "evaluate": _evaluate,
            "plot": _plot,
            "attention": _attention}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
