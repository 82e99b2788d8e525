"""``fastattn demo``: the seeds' dialogue completer, trained end to end.

The seeds end with a dialogue completer that learns (line, reply) pairs such as "Fool! No man
can kill me" -> "<start> I am no man <end>". The demo trains one on those lines and, when the
``chatterbot-corpus`` package is installed (``pip install "fastattn[demo]"``), on its English
conversations (each turn answered by the next); then it prints the training loss, the
validation curve (loss, perplexity and greedy exact match on held-out corpus pairs), completes
the seed's prompt and a few others, scores exact matches, and writes the run, loss.png and the
attention heatmaps of the seed pair.

What a corpus of about a thousand short exchanges allows, measured: a tiny model learns to
answer the prompts it was trained on (the settings, DEMO, were chosen so that it recalls at
least 80% of the corpus's training pairs exactly within two minutes on 2 cores: 2000 small
batches at a peak rate of 1e-3, light dropout, no label smoothing), and answers new prompts
with replies of the corpus's own that differ from prompt to prompt, but almost never the
held-out reply itself: the validation loss is lowest after a few hundred steps and rises
after, while the recall keeps growing. An earlier demo kept the model of the lowest
validation loss: it had learned too little to recall anything and gave one reply to
everything. So the demo keeps the last step's model (the one that shows what was learned),
reports the validation curve beside it, and says how varied its replies to the held-out
prompts are. The seeds' six pairs are repeated SEED_REPEATS times in the training data so
that the run sees them as often as a corpus pair several times over; the held-out pairs are
drawn from the distinct corpus pairs, as before the repetition.
"""
import os
import random
import sys
import time

import numpy as np

from .. import get_num_threads
from .._runtime import build_info

# The seeds' dialogue pairs (002: "Training a Dialogue Completer", and the masking example).
SEED_PAIRS = [
    ("When you play the games of thrones", "you win or you die"),
    ("It is not our abilities that show who we truly are", "it is our choices"),
    ("Life happens where ever you are", "whether you make it or not"),
    ("All we have to do is decide what to do", "with the time that has been given to us"),
    ("There is some good in this world Mr. Frodo", "and it is worth fighting for"),
    ("Fool! No man can kill me", "I am no man"),
]
SEED_PROMPT, SEED_REPLY = SEED_PAIRS[-1]
UNSEEN = ["Hello there", "What is your favorite book?", "Do you like to play games?"]
MAX_WORDS = 16           # corpus turns longer than this are left out (they are mostly code)
SAMPLE = 200             # corpus training pairs scored for exact match
# The run's settings (see the module docstring), and those of --quick (the seeds alone).
DEMO = dict(model="tiny", tokenizer="word", steps=2000, batch_tokens=512, lr=1e-3, warmup=100,
            dropout=0.1, label_smoothing=0.0, eval_every=200, keep_best=False, seed=0)
QUICK = dict(DEMO, steps=300, batch_tokens=1024, lr=1e-3, warmup=30, dropout=0.1,
             eval_every=None)
SEED_REPEATS = 10
VALID = 0.05             # of the distinct pairs, held out


def _corpus(out):
    """Corpus pairs (short turns only), or [] with a note when the extra is missing."""
    try:
        from . import chatterbot_pairs
        pairs = chatterbot_pairs("english")
    except ImportError:
        print('chatterbot-corpus is not installed: training on the seeds\' lines alone. '
              'pip install "fastattn[demo]" adds the corpus.', file=out)
        return []
    return [(s, t) for s, t in pairs
            if 0 < len(s.split()) <= MAX_WORDS and 0 < len(t.split()) <= MAX_WORDS]


def _normal(tok, text):
    """The text as the tokenizer sees it (a completion is compared with what it can say)."""
    return tok.decode(tok.encode(text))


def _exact_match(run, pairs):
    """Fraction of the prompts whose greedy completion equals one of their training replies
    (a prompt with several replies in the data is right with any of them)."""
    if not pairs:
        return None
    tok = run.tgt_tokenizer
    replies = {}
    for s, t in pairs:
        replies.setdefault(s, set()).add(_normal(tok, t))
    prompts = sorted(replies)
    outs = []
    for i in range(0, len(prompts), 64):
        outs += run.complete(prompts[i:i + 64], max_new_tokens=32)
    return sum(o in replies[p] for p, o in zip(prompts, outs)) / len(prompts)


def demo(quick=False, out="fastattn-demo", seconds=None, progress=True, stream=None):
    """Run the demo (see the module docstring); returns the exit status (0). seconds: a cap
    on the training time (None: the run's steps decide)."""
    from .run import train_run

    stream = stream or sys.stdout
    started = time.perf_counter()
    print(f"fastattn demo: the seeds' dialogue completer ({get_num_threads()} threads, "
          f"simd {build_info()['simd']})", file=stream)
    corpus = [] if quick else _corpus(stream)
    distinct = list(dict.fromkeys(SEED_PAIRS + corpus))
    print(f"pairs: {len(SEED_PAIRS)} from the seeds"
          + (f" (each repeated {SEED_REPEATS} times), {len(distinct) - len(SEED_PAIRS)} from "
             f"chatterbot-corpus (English, turns of at most {MAX_WORDS} words)"
             if corpus else ""), file=stream)
    settings = dict(QUICK if not corpus else DEMO)
    # the same held-out pairs as without the repetition: VALID of the distinct pairs
    pairs = distinct + SEED_PAIRS * (SEED_REPEATS - 1) if corpus else distinct
    valid = VALID * len(distinct) / len(pairs) if corpus else 0.0

    def budget(record, model):
        if seconds is not None and time.perf_counter() - started > seconds:
            raise StopIteration

    if progress and not sys.stderr.isatty():
        progress = 100                  # JSON lines every 100 steps (a bar on a terminal)
    run, history = train_run(
        pairs, os.path.join(out, "run"), valid=valid, progress=progress, overwrite=True,
        keep_in_train=SEED_PAIRS, callbacks=(budget,), exact_sample=None, **settings)
    train_seconds = time.perf_counter() - started
    steps, evals = history.steps, history.evals
    last = steps[-min(20, len(steps)):]
    print(f"\ntrained {len(steps)} steps in {train_seconds:.0f} s "
          f"({np.mean([r['tokens_per_s'] for r in last]):.0f} target tokens/s)", file=stream)
    print(f"training loss (mean of the last {len(last)} steps): "
          f"{np.mean([r['loss'] for r in last]):.3f}", file=stream)
    _validation_curve(evals, len(run.valid_pairs), stream)

    seen = [s for s, _ in random.Random(1).sample(corpus, min(3, len(corpus)))]
    prompts = [SEED_PROMPT] + [s for s, _ in SEED_PAIRS[:2]] + seen + UNSEEN
    print("\ncompletions (greedy):", file=stream)
    for p, c in zip(prompts, run.complete(prompts, max_new_tokens=32)):
        kind = "unseen" if p in UNSEEN else "seen"
        print(f"  [{kind}] {p!r} -> {c!r}", file=stream)

    seed_match = _exact_match(run, SEED_PAIRS)
    valid = set(map(tuple, getattr(run, "valid_pairs", [])))
    train_corpus = [p for p in corpus if p not in valid]
    sample = random.Random(2).sample(train_corpus, min(SAMPLE, len(train_corpus)))
    corpus_match = _exact_match(run, sample)
    print(f"\nexact match (greedy) on the seed pairs: {seed_match:.0%}", file=stream)
    if corpus_match is not None:
        print(f"exact match (greedy) on {len(sample)} corpus training pairs: "
              f"{corpus_match:.0%}", file=stream)
    if evals:
        held = [s for s, _ in run.valid_pairs]
        replies = run.complete(held, max_new_tokens=32)
        common = max(set(replies), key=replies.count)
        print(f"exact match (greedy) on the {len(held)} held-out pairs: "
              f"{100 * evals[-1]['valid_exact']:.0f}%; their replies: {len(set(replies))} "
              f"different, the most common ({common!r}) given to {replies.count(common)}. "
              "A thousand pairs teach the model the replies it was shown, and to give one of "
              "them to a new prompt, not the corpus's own reply to it.", file=stream)
    _pictures(run, history, out, stream)
    print(f"\nwall time {time.perf_counter() - started:.0f} s; the run is in "
          f"{os.path.join(out, 'run')} (fastattn complete {os.path.join(out, 'run')} TEXT)",
          file=stream)
    return 0


def _validation_curve(evals, n, stream):
    """The evaluations as a table, and which one the run's model comes from."""
    if not evals:
        return
    print(f"validation on {n} held-out pairs (loss, perplexity, greedy exact match):",
          file=stream)
    shown = evals if len(evals) <= 12 else evals[::-(-len(evals) // 10)] + evals[-1:]
    for r in dict((r["step"], r) for r in shown).values():
        print(f"  step {r['step']:5d}  loss {r['valid_loss']:.3f}  perplexity "
              f"{r['valid_ppl']:7.1f}  exact {100 * (r['valid_exact'] or 0):.0f}%",
              file=stream)
    best = min(evals, key=lambda r: r["valid_loss"])
    print(f"the run's model: the last step's (step {evals[-1]['step']}), which shows what "
          f"the run learned; the validation loss was lowest at step {best['step']} "
          f"({best['valid_loss']:.3f}) and rose after, as the model learned the training "
          "replies by heart", file=stream)


def _pictures(run, history, out, stream):
    try:
        from ..plots import plot_history, plot_model_attention
    except ImportError as exc:
        print(f"\nno pictures: {exc}", file=stream)
        return
    try:
        loss = os.path.join(out, "loss.png")
        plot_history(history.records, loss)
        paths = plot_model_attention(run.model, run.src_tokenizer, run.tgt_tokenizer,
                                     SEED_PROMPT, SEED_REPLY,
                                     out_dir=os.path.join(out, "attention"))
    except ImportError as exc:
        print(f"\nno pictures: {exc}", file=stream)
        return
    print(f"\nwrote {loss} and {len(paths)} attention heatmaps of the seed pair in "
          f"{os.path.join(out, 'attention')}", file=stream)
