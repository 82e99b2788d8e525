"""The benchmark cases: inputs built once (seeded), one zero-argument callable per implementation.

- ``fastattn``: ``fastattn.ops`` (the C kernels), or a model on the fast backend;
- ``numpy``: ``fastattn.reference`` (the float64 NumPy twin; for ``sgemm``, ``np.matmul``), or
  the model on the reference backend;
- ``torch``: the equivalent ``torch.nn.functional`` ops on ``torch.from_numpy`` tensors, or the
  torch twins of torch_models, under ``torch.inference_mode()`` with
  ``torch.set_num_threads(fastattn.get_num_threads())``.

Op cases (OP_CASES): attention (causal, full, and the memory of a long causal call), layer norm
with the residual add, the FFN, and the sgemm roofline. Model cases (MODEL_CASES): the
Transformer-base encoder and encoder-decoder forwards, generation (greedy and beam, B = 1 and 8)
and the decode step.

Work counted (useful FLOPs): attention 4*B*H*Lq*Lk*D, half of that when causal; FFN 4*N*C*F;
sgemm 2*M*N*K; the model forwards count their GEMMs. Layer norm is memory-bound: its bytes (x
and residual read, y written) give GB/s.
"""
import functools
import math

import numpy as np

from .. import get_num_threads, nn, ops, reference
from .torch_models import (Unavailable, require_torch, torch_generate, torch_seq2seq,
                           torch_transformer)

__all__ = ["IMPLEMENTATIONS", "Case", "Unavailable", "CASES", "OP_CASES", "MODEL_CASES",
           "DEFAULT_CASES", "DecodeCase", "BASE", "GEN", "seq2seq_model", "decoder_weight_bytes",
           "decode_metrics"]

IMPLEMENTATIONS = ("fastattn", "numpy", "torch")


class Case:
    """One benchmark: inputs built once from a seeded generator, one callable per implementation.

    name      registry key (``fastattn bench --case NAME``, the pytest-benchmark group)
    title     what the table's "case" column shows
    build     rng -> dict of arrays
    impls     {implementation: inputs -> zero-argument callable}
    flops     useful floating-point work of one call (0: not a FLOP-bound op)
    nbytes    bytes one call must move at least (memory-bound ops: reported as GB/s), or 0
    kind      "time" (medians of interleaved calls), "memory" (peak RSS growth of one call) or
              "decode" (time per decode step and weight bandwidth; see _decode_case)
    slow      implementations given fewer timed calls (the float64 twin)
    repeats   {implementation: most timed calls}, a cap on the run's counts (for calls of seconds)
    warm      False: no untimed calls before the timed ones (a call of seconds is its own warm-up)
    timed_first  implementations whose checking call is timed and counts as their first run
              (the calls of many seconds, run once)
    tokens    tokens one call generates (generation cases: outputs are token ids, compared
              exactly, and tokens/s is reported), or 0
    numpy_label  what the numpy implementation is, in the notes ("numpy twin" or the model's
              "reference backend")
    """

    def __init__(self, name, title, build, impls, *, flops=0, nbytes=0, kind="time",
                 slow=("numpy",), seed=0, repeats=None, warm=True, timed_first=(), tokens=0,
                 numpy_label="numpy twin"):
        self.name, self.title, self.kind = name, title, kind
        self.flops, self.nbytes, self.slow, self.seed = flops, nbytes, tuple(slow), seed
        self.repeats, self.warm = dict(repeats or {}), warm
        self.timed_first, self.tokens = tuple(timed_first), tokens
        self.numpy_label = numpy_label
        self._build, self._impls, self._inputs = build, dict(impls), None

    def __repr__(self):
        return f"Case({self.name!r})"

    @property
    def implementations(self):
        return tuple(i for i in IMPLEMENTATIONS if i in self._impls)

    def inputs(self):
        """The case's inputs, built on first use and kept."""
        if self._inputs is None:
            self._inputs = self._build(np.random.default_rng(self.seed))
        return self._inputs

    def release(self):
        """Drop the cached inputs (they are rebuilt, identically, when next needed)."""
        self._inputs = None

    def callable(self, impl):
        """A zero-argument callable running this case with `impl`; Unavailable if it cannot."""
        if impl not in self._impls:
            raise Unavailable(f"{self.name} has no {impl} implementation")
        return self._impls[impl](self.inputs())


def _torch_impl(body):
    """Wrap body(F, tensors) -> callable into an implementation factory for torch."""
    def factory(inputs):
        torch = require_torch()
        torch.set_num_threads(get_num_threads())
        tensors = {k: torch.from_numpy(a) for k, a in inputs.items()}  # zero-copy views
        call = body(torch.nn.functional, tensors)

        def run_torch():
            with torch.inference_mode():
                return call()
        return run_torch
    return factory


def _normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


# ---- ops ---------------------------------------------------------------------------------------

def _attention_case(name, title, B, H, L, D, causal, **kw):
    def build(rng):
        return {t: _normal(rng, (B, H, L, D)) for t in ("q", "k", "v")}

    def impl(fn):
        return lambda i: functools.partial(fn, i["q"], i["k"], i["v"], causal=causal)

    impls = {
        "fastattn": impl(ops.attention),
        "numpy": impl(reference.attention),
        "torch": _torch_impl(lambda F, t: functools.partial(
            F.scaled_dot_product_attention, t["q"], t["k"], t["v"], is_causal=causal)),
    }
    flops = 4 * B * H * L * L * D // (2 if causal else 1)
    return Case(name, f"{title} (B={B} H={H} L={L} D={D})", build, impls, flops=flops, **kw)


def _layer_norm_case(N=2048, C=512):
    def build(rng):
        return {"x": _normal(rng, (N, C)), "r": _normal(rng, (N, C)),
                "w": 1 + _normal(rng, C, 0.1), "b": _normal(rng, C, 0.1)}

    impls = {
        "fastattn": lambda i: functools.partial(ops.layer_norm, i["x"], i["w"], i["b"],
                                                residual=i["r"]),
        "numpy": lambda i: functools.partial(reference.layer_norm, i["x"], i["w"], i["b"],
                                             residual=i["r"]),
        "torch": _torch_impl(lambda F, t: lambda: F.layer_norm(t["x"] + t["r"], (C,), t["w"],
                                                               t["b"])),
    }
    return Case("layer_norm", f"layer norm + residual ({N}, {C})", build, impls,
                nbytes=3 * N * C * 4)


def _ffn_case(N=2048, C=512, F_=2048):
    def build(rng):
        return {"x": _normal(rng, (N, C)),
                "w1": _normal(rng, (F_, C), 1 / math.sqrt(C)), "b1": _normal(rng, F_, 0.1),
                "w2": _normal(rng, (C, F_), 1 / math.sqrt(F_)), "b2": _normal(rng, C, 0.1)}

    def impl(fn):
        return lambda i: functools.partial(fn, i["x"], i["w1"], i["b1"], i["w2"], i["b2"],
                                           activation="relu")

    impls = {
        "fastattn": impl(ops.ffn),
        "numpy": impl(reference.ffn),
        "torch": _torch_impl(lambda F, t: lambda: F.linear(
            F.relu(F.linear(t["x"], t["w1"], t["b1"])), t["w2"], t["b2"])),
    }
    return Case("ffn", f"FFN relu ({N}, {C}) -> {F_} -> {C}", build, impls,
                flops=4 * N * C * F_)


def _sgemm_case(n=2048):
    def build(rng):
        return {"a": _normal(rng, (n, n)), "b": _normal(rng, (n, n)),
                "c": np.empty((n, n), np.float32)}

    impls = {"numpy": lambda i: functools.partial(np.matmul, i["a"], i["b"], out=i["c"])}
    return Case("sgemm", f"sgemm roofline, np.matmul float32 {n}^3", build, impls,
                flops=2 * n ** 3, slow=())


def _memory_case(B=1, H=4, L=16384, D=64):
    case = _attention_case("attention_memory", "attention memory, causal", B, H, L, D, True,
                           kind="memory", slow=())
    del case._impls["numpy"]  # the twin would materialise B*H*L*L float64 scores (8 GiB)
    case.matrix_mib = L * L * 4 / 2 ** 20  # one (L, L) float32 matrix, for comparison
    return case


# ---- models ------------------------------------------------------------------------------------

BASE = dict(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
            dim_feedforward=2048)  # Transformer-base of "Attention Is All You Need"


@functools.lru_cache(maxsize=None)
def _base_model(backend):
    """Transformer-base with seeded random weights (the same weights for every backend)."""
    return nn.Transformer(**BASE, backend=backend, seed=0)


@functools.lru_cache(maxsize=None)
def _torch_base_model():
    """torch's nn.Transformer (batch_first, eval) holding the weights of _base_model."""
    return torch_transformer(_base_model("fast"))


def _model_case(name, B, S, T):
    """Transformer-base forward: the encoder alone (T = 0), or encoder + decoder with a causal
    target; fastattn's fast backend vs its reference backend vs torch's nn.Transformer."""
    C = BASE["d_model"]

    def build(rng):
        inputs = {"src": _normal(rng, (B, S, C))}
        if T:
            inputs["tgt"] = _normal(rng, (B, T, C))
            inputs["tgt_mask"] = nn.generate_square_subsequent_mask(T)
        return inputs

    def impl(backend):
        def factory(i):
            m = _base_model(backend)
            if not T:
                return functools.partial(m.encoder, i["src"])
            return functools.partial(m, i["src"], i["tgt"], tgt_mask=i["tgt_mask"],
                                     tgt_is_causal=True)
        return factory

    def torch_body(F, t):
        m = _torch_base_model()
        if not T:
            return functools.partial(m.encoder, t["src"])
        return functools.partial(m, t["src"], t["tgt"], tgt_mask=t["tgt_mask"],
                                 tgt_is_causal=True)

    L = lambda n: 2 * B * n * (4 * C * C + 2 * C * BASE["dim_feedforward"])  # noqa: E731
    flops = 6 * L(S)                                             # encoder layers (GEMMs only)
    if T:
        flops += 6 * (L(T) + 2 * B * T * 2 * C * C + 2 * B * S * 2 * C * C)  # + cross-attn
    what = f"encoder B={B} L={S}" if not T else f"encoder-decoder B={B} S={S} T={T} causal"
    return Case(name, f"Transformer-base {what}", build,
                {"fastattn": impl("fast"), "numpy": impl("reference"),
                 "torch": _torch_impl(torch_body)}, flops=flops,
                numpy_label="reference backend")


# ---- generation --------------------------------------------------------------------------------

GEN = dict(vocab=8000, src_len=128, new_tokens=64, beam_size=4, start_id=2)
GEN_REPEATS = {"fastattn": 3, "torch": 1, "numpy": 1}   # calls of seconds (torch: up to minutes)


@functools.lru_cache(maxsize=None)
def seq2seq_model(backend):
    """Transformer-base Seq2SeqTransformer, vocabularies of GEN["vocab"], seeded random weights
    (the same weights for every backend)."""
    V = GEN["vocab"]
    return nn.Seq2SeqTransformer(BASE["num_encoder_layers"], BASE["num_decoder_layers"],
                                 BASE["d_model"], BASE["nhead"], V, V,
                                 BASE["dim_feedforward"], backend=backend, seed=0)


@functools.lru_cache(maxsize=None)
def _torch_seq2seq_base():
    return torch_seq2seq(seq2seq_model("fast"))


def _source_ids(B):
    def build(rng):
        return {"src": rng.integers(4, GEN["vocab"], size=(B, GEN["src_len"]))}
    return build


def _generate_case(name, B, method):
    """Transformer-base generation of GEN["new_tokens"] tokens from B sources of
    GEN["src_len"] tokens, end_id=None (every run does the same work): fastattn's fast backend
    (KV cache) vs torch's nn.Transformer re-running its decoder on the prefix each step (the
    tutorial's loop, torch_models.TorchDecoder, searched by fastattn.generate's own loops) vs
    the reference backend (the same decode steps with the NumPy twin's ops; greedy only)."""
    n, k = GEN["new_tokens"], GEN["beam_size"]
    kw = dict(max_new_tokens=n, start_id=GEN["start_id"])
    if method == "beam":
        kw.update(method="beam", beam_size=k)

    def impl(backend):
        return lambda i: functools.partial(seq2seq_model(backend).generate, i["src"], **kw)

    def torch_body(F, t):
        return functools.partial(torch_generate, _torch_seq2seq_base(), t["src"], **kw)

    impls = {"fastattn": impl("fast"), "torch": _torch_impl(torch_body)}
    if method == "greedy":
        impls["numpy"] = impl("reference")
    what = "greedy" if method == "greedy" else f"beam {k}"
    return Case(name, f"Transformer-base generate {what} B={B} S={GEN['src_len']} +{n} tokens "
                      f"V={GEN['vocab']}", _source_ids(B), impls, repeats=GEN_REPEATS,
                warm=False, timed_first=("torch", "numpy"), tokens=B * n,
                numpy_label="reference backend")


def decoder_weight_bytes(model):
    """Bytes of the weights one decode step of `model` (a Seq2SeqTransformer) reads: per
    decoder layer the self-attention's in_proj and out_proj, the cross-attention's query rows
    (the first C rows of in_proj) and out_proj, linear1 and linear2; then the generator.
    (Biases, the KV caches and the cross-attention keys and values are not counted.)"""
    C = model.transformer.d_model
    n = 0
    for layer in model.transformer.decoder.layers:
        n += layer.self_attn.in_proj_weight.size + layer.self_attn.out_proj.weight.size
        n += layer.multihead_attn.in_proj_weight[:C].size
        n += layer.multihead_attn.out_proj.weight.size
        n += layer.linear1.weight.size + layer.linear2.weight.size
    return 4 * (n + model.generator.weight.size)


def decode_metrics(generate_ms, prefill_ms, copy_ms, weight_bytes, copy_bytes, steps):
    """Derived numbers of the decode case (times are medians in ms)."""
    step_ms = (generate_ms - prefill_ms) / steps
    gbps = weight_bytes / (step_ms * 1e6)
    copy_gbps = copy_bytes / (copy_ms * 1e6)
    return {"step_ms": step_ms, "weight_gbps": gbps, "copy_gbps": copy_gbps,
            "share_of_copy": gbps / copy_gbps, "weight_mb": weight_bytes / 1e6}


class DecodeCase(Case):
    """Greedy decoding of Transformer-base (end_id=None), B sources: the time of one decode
    step = (generate's time - the prefill's) / new tokens, and the bandwidth its weight reads
    reach (see decoder_weight_bytes), against a memory copy on as many threads
    (timing.memory_copy) timed in the same run.

    prefill()       a callable doing what generate does once before its steps: the model's own
                    ``init_cache`` (the encoder, then each decoder layer's cross-attention keys
                    and values)
    weight_bytes()  bytes one step's weight reads move
    steps           decode steps of one generate call
    """

    def __init__(self, B=1):
        self.steps = GEN["new_tokens"]
        super().__init__("decode_step", f"decode step, Transformer-base greedy B={B} "
                                        f"S={GEN['src_len']} V={GEN['vocab']} (ms per step)",
                         _source_ids(B), {"fastattn": self._generate}, kind="decode", slow=(),
                         repeats={"fastattn": 5}, warm=False)

    def _generate(self, inputs):
        return functools.partial(seq2seq_model("fast").generate, inputs["src"],
                                 max_new_tokens=self.steps, start_id=GEN["start_id"])

    def prefill(self):
        return functools.partial(seq2seq_model("fast").init_cache, self.inputs()["src"],
                                 beams=1, max_len=self.steps)

    def weight_bytes(self):
        return decoder_weight_bytes(seq2seq_model("fast"))


# ---- the registry ------------------------------------------------------------------------------

CASES = {c.name: c for c in (
    _attention_case("attention_causal", "attention causal", 4, 8, 512, 64, True),
    _attention_case("attention_full", "attention full", 4, 8, 512, 64, False),
    _layer_norm_case(),
    _ffn_case(),
    _sgemm_case(),
    _memory_case(),
    _model_case("encoder", 8, 128, 0),
    _model_case("transformer", 8, 128, 128),
    _generate_case("generate_greedy_b1", 1, "greedy"),
    _generate_case("generate_greedy_b8", 8, "greedy"),
    _generate_case("generate_beam_b1", 1, "beam"),
    _generate_case("generate_beam_b8", 8, "beam"),
    DecodeCase(),
    # A tiny case for the command line's own tests; not run by default.
    _attention_case("smoke", "smoke: attention causal", 1, 2, 128, 32, True),
)}
OP_CASES = ("attention_causal", "attention_full", "layer_norm", "ffn", "sgemm",
            "attention_memory")
MODEL_CASES = ("encoder", "transformer", "generate_greedy_b1", "generate_greedy_b8",
               "generate_beam_b1", "generate_beam_b8", "decode_step")
DEFAULT_CASES = OP_CASES + MODEL_CASES

# ---- training steps (train_cases.py; imported last: it builds on Case) ------------------------
from .train_cases import TRAIN_CASES  # noqa: E402

CASES.update((c.name, c) for c in TRAIN_CASES)
TRAIN_CASE_NAMES = tuple(c.name for c in TRAIN_CASES)
DEFAULT_CASES = DEFAULT_CASES + TRAIN_CASE_NAMES
