"""The benchmark harness behind ``fastattn bench`` and ``benchmarks/`` (pytest-benchmark).

Not part of the runtime: ``import fastattn`` (and ``fastattn info``) never import this package
or torch. It measures fastattn against the NumPy twin and torch through the library's public
API, and runs torch through the same generation search loops as fastattn.

```text
python -m fastattn.cli bench            # or: fastattn bench [--quick] [--case NAME ...]
```

Modules:

- ``base``: ``Case`` and the helpers the case modules share (they import it, never ``cases``);
- ``cases``: the Case objects (``CASES``; ``OP_CASES`` + ``MODEL_CASES`` = ``DEFAULT_CASES``),
  each with its seeded inputs and one callable per implementation (fastattn, numpy, torch),
  gathered from the case modules (train_cases, runner_cases, pretrained_cases, learning,
  dp_cases, quant_cases, attention_bf16_cases);
- ``torch_models``: the torch twins of the model cases (torch optional and imported lazily);
- ``timing``: thread control, idle waits, interleaved timing, peak memory, a memory copy;
- ``runner``: ``run()``, which validates then times each case, one row per case;
- ``report`` and ``targets``: the Markdown table, the environment line, the targets.

Generation cases (``generate_*``) run Transformer-base Seq2SeqTransformer.generate with end_id=None
(the same work every run): ``fastattn`` is the fast backend (KV cache), ``torch`` the translation
tutorial's loop on nn.Transformer holding the same weights (encode once, re-run the decoder on the
whole prefix each step) searched by fastattn.generate's own greedy and beam loops, ``numpy`` the
reference backend (the same decode steps with the NumPy twin's ops; greedy only); in the bfloat16
greedy cases ``torch`` is that model converted with ``.to(torch.bfloat16)`` decoding with a
key/value cache of its own (``TorchCachedDecoder``: as many timed calls as fastattn's, its tokens
reported, not required to match). Their calls take seconds, so each implementation gets a few
timed calls (``Case.repeats``), the uncached torch loop's and numpy's single one being the
checking call itself; outputs are token ids, which must agree exactly, and the
notes give tokens/s (B * new tokens / median). The ``decode_step`` case derives the time of one
decode step (generate minus its prefill, the model's ``init_cache``: encoder and cross-attention
K/V projections, over the new tokens) and the bandwidth of the decoder's and generator's weight
reads, against a memory copy on as many threads, all timed interleaved in the same run.

The pretrained cases (``marian_*``, pretrained_cases; not run by default) run an OPUS-MT-shaped
Marian directory (random weights, made with transformers) through ``fastattn.load_pretrained``
against CTranslate2 running its own conversion of the same directory, greedy and beam 4, float32
and int8, tokens/s counted on each side's output (up to and including the end token), with the
share of rows the two agree on; ``marian_step_breakdown`` splits a decode step into the output
projection and the rest.

The memory case reports the growth of the process's peak resident set during one call, without
subtracting the output's own size.
"""
from .cases import (BASE, CASES, DEFAULT_CASES, GEN, IMPLEMENTATIONS, MODEL_CASES, OP_CASES,
                    Case, DecodeCase, Unavailable, decode_metrics, decoder_weight_bytes,
                    seq2seq_model)
from .report import cpu_model, describe_environment, format_table, result_filename
from .runner import (DEFAULT_NUMPY_REPEAT, DEFAULT_REPEAT, QUICK_NUMPY_REPEAT, QUICK_REPEAT,
                     decode_probes, run)
from .targets import TARGETS, check_targets, format_targets
from .timing import memory_copy, peak_memory_growth, same_threads, settle
from .torch_models import (TorchCachedDecoder, TorchDecoder, torch_generate, torch_seq2seq,
                           torch_version)

__all__ = [
    "CASES", "DEFAULT_CASES", "OP_CASES", "MODEL_CASES", "IMPLEMENTATIONS", "TARGETS", "BASE",
    "GEN", "DEFAULT_REPEAT", "DEFAULT_NUMPY_REPEAT", "QUICK_REPEAT", "QUICK_NUMPY_REPEAT",
    "Case", "DecodeCase", "Unavailable", "run", "check_targets", "format_table",
    "format_targets", "describe_environment", "cpu_model", "result_filename", "torch_version", "peak_memory_growth",
    "memory_copy", "same_threads", "settle", "decode_metrics", "decode_probes",
    "decoder_weight_bytes", "seq2seq_model", "torch_seq2seq", "torch_generate", "TorchDecoder",
    "TorchCachedDecoder",
]
