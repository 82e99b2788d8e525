"""One process of the ``train_dp`` benchmark: fit() on the "small" preset, under
``mpiexec -n N`` (several ranks: data-parallel) or alone; rank 0 prints one JSON line.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m fastattn.bench.dp_worker --steps 4

Timed: the steps after ``--warmup`` untimed ones (the first allocates the training buffers).
Reported: target tokens/s of the timed steps (their tokens over their wall time), the median
step, the median time a step spent in its gradient all-reduce (waiting for the slowest rank
included), the all-reduce alone (``--allreduce`` back-to-back calls on the flat gradient
buffer after a barrier), the flat buffer's bytes, the optimiser moments' bytes and the
peak resident memory of rank 0.
"""
import argparse
import json
import resource
import statistics
import sys

import numpy as np


def small_pairs(n, words_per_text, vocab, seed=0):
    """n pairs of texts of `words_per_text` words drawn from vocab - 4 words, and a word
    tokenizer over them (vocabulary `vocab` with its four specials)."""
    from ..tokenizers import WordTokenizer

    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab - 4)]

    def text():
        return " ".join(words[i] for i in rng.integers(0, len(words), words_per_text))
    pairs = [(text(), text()) for _ in range(n)]
    tok = WordTokenizer().train([t for p in pairs for t in p] + [" ".join(words)],
                                vocab_size=vocab)
    return pairs, tok


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fastattn.bench.dp_worker")
    p.add_argument("--steps", type=int, default=4, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--words", type=int, default=30, help="words per text (+ <start> <end>)")
    p.add_argument("--model", default="small")
    p.add_argument("--allreduce", type=int, default=5, help="timed all-reduces alone")
    args = p.parse_args(argv)

    from .. import build_info, get_num_threads
    from ..train import distributed, fit
    from ..train.run import build_model

    comm = distributed.world()
    group = distributed.group(comm)
    vocab = 4000
    per_batch = max(1, args.batch_tokens // (args.words + 2))
    pairs, tok = small_pairs(per_batch * (args.steps + args.warmup), args.words, vocab)
    model = build_model(args.model, tok.vocab_size, tok.vocab_size, pad_id=tok.pad_id,
                        dropout=0.1, seed=0)
    history = fit(model, pairs, src_tokenizer=tok, tgt_tokenizer=tok,
                  max_steps=args.steps + args.warmup, batch_tokens=args.batch_tokens,
                  schedule="constant", lr=1e-5, label_smoothing=0.1, clip_norm=1.0,
                  progress=False, comm=comm)
    timed = history.steps[args.warmup:]
    seconds = sum(r["seconds"] for r in timed)
    out = dict(ranks=1 if group is None else group.size, threads=get_num_threads(),
               simd=build_info()["simd"], model=args.model, batch_tokens=args.batch_tokens,
               steps=len(timed), tokens_per_s=sum(r["tokens"] for r in timed) / seconds,
               step_ms=1e3 * statistics.median(r["seconds"] for r in timed),
               wait_ms=1e3 * statistics.median(r.get("allreduce_seconds", 0.0) for r in timed),
               grad_bytes=int(model.parameters_nbytes()),
               moment_bytes=2 * int(model.parameters_nbytes()))
    if group is not None:
        flat = model.flat_grads()
        times = []
        for _ in range(args.allreduce):
            group.comm.Barrier()
            times.append(group.allreduce(flat, "a timed all-reduce"))
        out.update(allreduce_ms=1e3 * statistics.median(times), flat_bytes=int(flat.nbytes))
    else:
        out.update(allreduce_ms=0.0, flat_bytes=0)
    # ru_maxrss: KiB on Linux
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if group is None or group.lead:
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
