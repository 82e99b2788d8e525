"""Benchmark cases shared by ``fastattn bench`` and ``benchmarks/bench_ops.py`` (pytest-benchmark).

Each case builds its inputs once (seeded) and hands out one zero-argument callable per
implementation:

- ``fastattn``: ``fastattn.ops`` (the C kernels),
- ``numpy``: ``fastattn.reference`` (the float64 NumPy twin; for ``sgemm``, ``np.matmul``),
- ``torch``: the equivalent ``torch.nn.functional`` ops on ``torch.from_numpy`` tensors, under
  ``torch.inference_mode()`` with ``torch.set_num_threads(fastattn.get_num_threads())``. torch is
  optional: it is imported only here, lazily, and a missing torch shows as "n/a".

``run()`` times the implementations of a case interleaved (fastattn, numpy, torch, fastattn, ...),
so that machine noise hits all of them alike, and reports medians. Each timed call waits until
the previous implementation's thread pools have gone idle (``settle()``) and follows ~20 ms of
untimed calls of its own implementation, so each is timed in its steady state (threads awake,
allocations reused) rather than just after another one; the slow float64 twin is timed without
them. A row is flagged when other processes used a noticeable share of the CPUs meanwhile.
Before timing, one call of each implementation is checked against the NumPy twin (validate,
then benchmark). ``format_table()`` turns the rows into a Markdown table and ``check_targets()``
compares them with the performance targets:

    python -m fastattn.cli bench            # or: fastattn bench [--quick] [--case NAME ...]

Generation cases (``generate_*``) run Transformer-base Seq2SeqTransformer.generate with end_id=None
(the same work every run): ``fastattn`` is the fast backend (KV cache), ``torch`` the translation
tutorial's loop on nn.Transformer holding the same weights (encode once, re-run the decoder on the
whole prefix each step; beam search likewise, by fastattn.generate's rules), ``numpy`` the
reference backend (also re-runs; greedy only). Their calls take seconds, so each implementation
gets a few timed calls (``Case.repeats``), torch's and numpy's single one being the checking call
itself; outputs are token ids, which must agree exactly, and the notes give tokens/s (B * new
tokens / median). The ``decode_step`` case derives the time of one decode step (generate minus
the encoder and cross-attention K/V projections, over the new tokens) and the bandwidth of the
decoder's and generator's weight reads, against a memory copy on as many threads, all timed
interleaved in the same run.

Work counted (useful FLOPs): attention 4*B*H*Lq*Lk*D, half of that when causal; FFN 4*N*C*F;
sgemm 2*M*N*K. Layer norm is memory-bound: it is reported in GB/s (x and residual read, y
written). The memory case reports the growth of the process's peak resident set during one
call (VmHWM reset through /proc/self/clear_refs on Linux; elsewhere the ru_maxrss delta, a
lower bound), without subtracting the output's own size.
"""
import contextlib
import ctypes
import functools
import gc
import math
import os
import statistics
import time

import numpy as np

from . import _runtime, ops, reference

__all__ = [
    "CASES", "DEFAULT_CASES", "IMPLEMENTATIONS", "TARGETS", "Case", "Unavailable", "run",
    "format_table", "check_targets", "format_targets", "describe_environment", "torch_version",
    "peak_memory_growth", "settle",
]

IMPLEMENTATIONS = ("fastattn", "numpy", "torch")
DEFAULT_REPEAT = 20        # timed calls of fastattn and torch per case
DEFAULT_NUMPY_REPEAT = 3   # timed calls of the (slow, float64) NumPy twin per case
MISMATCH_ATOL = 1e-3       # max |fastattn - numpy twin| above which a row is flagged
WARM_SECONDS = 0.02        # untimed calls before each timed one (not for the slow twin)
NOISY_SHARE = 0.10         # share of the CPUs used by other processes above which a row is flagged


class Unavailable(RuntimeError):
    """An implementation that cannot run here (torch not installed)."""


# ---- torch, optional and lazy ------------------------------------------------------------------

_torch_cache = []


def _torch():
    """The torch module, or None when it is not installed (imported once, on first use)."""
    if not _torch_cache:
        try:
            import torch
        except ImportError:
            torch = None
        _torch_cache.append(torch)
    return _torch_cache[0]


def torch_version():
    torch = _torch()
    return None if torch is None else torch.__version__


# ---- cases -------------------------------------------------------------------------------------

class Case:
    """One benchmark: inputs built once from a seeded generator, one callable per implementation.

    name      registry key (``fastattn bench --case NAME``, the pytest-benchmark group)
    title     what the table's "case" column shows
    build     rng -> dict of float32 arrays
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
    """

    def __init__(self, name, title, build, impls, *, flops=0, nbytes=0, kind="time",
                 slow=("numpy",), seed=0, repeats=None, warm=True, timed_first=(), tokens=0):
        self.name, self.title, self.kind = name, title, kind
        self.flops, self.nbytes, self.slow, self.seed = flops, nbytes, tuple(slow), seed
        self.repeats, self.warm = dict(repeats or {}), warm
        self.timed_first, self.tokens = tuple(timed_first), tokens
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
        torch = _torch()
        if torch is None:
            raise Unavailable("torch is not installed")
        torch.set_num_threads(_runtime.get_num_threads())
        tensors = {k: torch.from_numpy(a) for k, a in inputs.items()}  # zero-copy views
        call = body(torch.nn.functional, tensors)

        def run_torch():
            with torch.inference_mode():
                return call()
        return run_torch
    return factory


def _normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


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


BASE = dict(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
            dim_feedforward=2048)  # Transformer-base of "Attention Is All You Need"


@functools.lru_cache(maxsize=None)
def _base_model(backend):
    """Transformer-base with seeded random weights (the same weights for every backend)."""
    from . import nn
    return nn.Transformer(**BASE, backend=backend, seed=0)


@functools.lru_cache(maxsize=None)
def _torch_base_model():
    """torch's nn.Transformer (batch_first, eval) holding the weights of _base_model."""
    torch = _torch()
    model = torch.nn.Transformer(**BASE, dropout=0.0, batch_first=True).eval()
    weights = {k: torch.from_numpy(v) for k, v in _base_model("fast").state_dict().items()}
    model.load_state_dict(weights)
    return model


def _model_case(name, B, S, T):
    """Transformer-base forward: the encoder alone (T = 0), or encoder + decoder with a causal
    target; fastattn's fast backend vs its reference backend vs torch's nn.Transformer."""
    C = BASE["d_model"]

    def build(rng):
        inputs = {"src": _normal(rng, (B, S, C))}
        if T:
            inputs["tgt"] = _normal(rng, (B, T, C))
            from . import nn
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
    case = Case(name, f"Transformer-base {what}", build,
                {"fastattn": impl("fast"), "numpy": impl("reference"),
                 "torch": _torch_impl(torch_body)}, flops=flops)
    case.numpy_label = "reference backend"
    return case


# ---- generation --------------------------------------------------------------------------------

GEN = dict(vocab=8000, src_len=128, new_tokens=64, beam_size=4, start_id=2)
GEN_REPEATS = {"fastattn": 3, "torch": 1, "numpy": 1}   # calls of seconds (torch, numpy: tens)


@functools.lru_cache(maxsize=None)
def _seq2seq_model(backend):
    """Transformer-base Seq2SeqTransformer, vocabularies of GEN["vocab"], seeded random weights
    (the same weights for every backend)."""
    from . import nn
    V = GEN["vocab"]
    return nn.Seq2SeqTransformer(BASE["num_encoder_layers"], BASE["num_decoder_layers"],
                                 BASE["d_model"], BASE["nhead"], V, V,
                                 BASE["dim_feedforward"], backend=backend, seed=0)


def torch_seq2seq(model):
    """The model of PyTorch's translation tutorial (batch-first nn.Transformer, token
    embeddings scaled by sqrt(d_model), the sinusoidal table, the generator Linear), eval, in
    inference, holding the weights of `model`, a fastattn Seq2SeqTransformer."""
    torch = _torch()
    if torch is None:
        raise Unavailable("torch is not installed")
    nn_, cfg = torch.nn, model.config
    C, V = cfg["emb_size"], cfg["tgt_vocab_size"]

    class TokenEmbedding(nn_.Module):
        def __init__(self, vocab):
            super().__init__()
            self.embedding = nn_.Embedding(vocab, C)

    class Seq2Seq(nn_.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn_.Transformer(
                C, cfg["nhead"], cfg["num_encoder_layers"], cfg["num_decoder_layers"],
                cfg["dim_feedforward"], dropout=0.0, activation=cfg["activation"],
                layer_norm_eps=cfg["layer_norm_eps"], norm_first=cfg["norm_first"],
                batch_first=True)
            self.generator = nn_.Linear(C, V)
            self.src_tok_emb = TokenEmbedding(cfg["src_vocab_size"])
            self.tgt_tok_emb = TokenEmbedding(V)
            den = torch.exp(-torch.arange(0, C, 2) * math.log(10000) / C)
            pos = torch.arange(0, cfg["max_len"]).reshape(-1, 1)
            table = torch.zeros((cfg["max_len"], C))
            table[:, 0::2] = torch.sin(pos * den)
            table[:, 1::2] = torch.cos(pos * den)
            self.register_buffer("pos_embedding", table, persistent=False)

        def embed(self, emb, ids):                              # (B, L) -> (B, L, C)
            return emb.embedding(ids) * math.sqrt(C) + self.pos_embedding[:ids.shape[1]]

    tm = Seq2Seq().eval()
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    return tm


@functools.lru_cache(maxsize=None)
def _torch_seq2seq_base():
    return torch_seq2seq(_seq2seq_model("fast"))


def _pad_rows(rows, pad_id=0):
    out = np.full((len(rows), max(map(len, rows))), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def torch_greedy(tm, src, max_new_tokens, start_id, end_id=None, pad_id=0):
    """The tutorial's greedy_decode, batched: encode once, then each step re-run the decoder
    on the whole prefix (square subsequent mask) and take the argmax of the last position;
    stops when every row has produced end_id. Returns int64 (B, T) laid out as
    fastattn.generate's (rows cut after their end token, padded with pad_id)."""
    torch = _torch()
    memory = tm.transformer.encoder(tm.embed(tm.src_tok_emb, src))          # (B, S, C)
    ys = torch.full((src.shape[0], 1), start_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(ys.shape[1])
        out = tm.transformer.decoder(tm.embed(tm.tgt_tok_emb, ys), memory, tgt_mask=mask)
        nxt = tm.generator(out[:, -1]).argmax(dim=-1)                       # (B,)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        if end_id is not None:
            done |= nxt == end_id
            if done.all():
                break
    rows = ys.tolist()
    if end_id is not None:
        rows = [r[:r.index(end_id, 1) + 1] if end_id in r[1:] else r for r in rows]
    return _pad_rows(rows, pad_id)


def torch_beam(tm, src, max_new_tokens, start_id, beam_size, end_id=None, length_penalty=1.0,
               pad_id=0):
    """Beam search under fastattn.generate's rules, written for torch the way the tutorial
    decodes: encode once, then each step re-run the decoder on every live beam's whole prefix.
    Scores are float64 sums of log-softmax; the k best continuations (a stable descending
    sort: ties to the lower slot, then the lower token) fill the k slots; one ending in end_id
    is set aside with score / (generated length) ** length_penalty and leaves its slot empty; a
    source stops when no slot is live; the best finished-or-live one wins (ties: first found).
    """
    torch = _torch()
    B, k = src.shape[0], beam_size
    memory = tm.transformer.encoder(tm.embed(tm.src_tok_emb, src))
    memory = memory.repeat_interleave(k, dim=0)                             # (B*k, S, C)
    ys = torch.full((B * k, 1), start_id, dtype=torch.long)                 # live sources' slots
    score = torch.full((B, k), -math.inf, dtype=torch.float64)
    score[:, 0] = 0.0                                                       # one live hypothesis
    live = torch.arange(B)                                                  # sources decoding
    finished = [[] for _ in range(B)]                                       # (score, tokens)
    for t in range(max_new_tokens):
        n = len(live)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(t + 1)
        out = tm.transformer.decoder(tm.embed(tm.tgt_tok_emb, ys), memory, tgt_mask=mask)
        logp = torch.log_softmax(tm.generator(out[:, -1]).double(), dim=-1)  # (n*k, V)
        V = logp.shape[1]
        flat = (score[live][:, :, None] + logp.view(n, k, V)).view(n, k * V)
        best = torch.sort(flat, dim=1, descending=True, stable=True).indices[:, :k]
        new = flat.gather(1, best)                                          # (n, k)
        parent, tok = best // V, best % V
        ys = torch.cat([ys[(torch.arange(n)[:, None] * k + parent).view(-1)],
                        tok.view(-1, 1)], dim=1)                            # (n*k, t+2)
        if end_id is not None:
            ended = (tok == end_id) & torch.isfinite(new)
            for i, j in ended.nonzero().tolist():
                finished[int(live[i])].append(
                    (float(new[i, j]) / (t + 1) ** length_penalty, ys[i * k + j].tolist()))
            new[ended] = -math.inf                                          # the slot stays empty
        score[live] = new
        keep = torch.isfinite(new).any(dim=1)
        if not keep.all():                                                  # sources done
            rows = keep.repeat_interleave(k)
            live, ys, memory = live[keep], ys[rows], memory[rows]
            if not len(live):
                break
    results = []
    slot_rows = {int(s): i for i, s in enumerate(live)}
    for b in range(B):
        cands = list(finished[b])
        if b in slot_rows:
            i = slot_rows[b]
            cands += [(float(score[b, j]) / (ys.shape[1] - 1) ** length_penalty,
                       ys[i * k + j].tolist()) for j in range(k) if math.isfinite(score[b, j])]
        best = max(range(len(cands)), key=lambda c: (cands[c][0], -c))
        results.append(cands[best][1])
    return _pad_rows(results, pad_id)


def _generate_case(name, B, method):
    """Transformer-base generation of GEN["new_tokens"] tokens from B sources of
    GEN["src_len"] tokens, end_id=None (every run does the same work): fastattn's fast backend
    (KV cache) vs torch's nn.Transformer re-running its decoder on the prefix each step (the
    tutorial's loop) vs the reference backend (re-runs too; greedy only: beam is 4x slower)."""
    n, k, start = GEN["new_tokens"], GEN["beam_size"], GEN["start_id"]
    kw = dict(max_new_tokens=n, start_id=start)
    if method == "beam":
        kw.update(method="beam", beam_size=k)

    def build(rng):
        return {"src": rng.integers(4, GEN["vocab"], size=(B, GEN["src_len"]))}

    def impl(backend):
        return lambda i: functools.partial(_seq2seq_model(backend).generate, i["src"], **kw)

    def torch_body(F, t):
        tm = _torch_seq2seq_base()
        if method == "beam":
            return functools.partial(torch_beam, tm, t["src"], n, start, k)
        return functools.partial(torch_greedy, tm, t["src"], n, start)

    impls = {"fastattn": impl("fast"), "torch": _torch_impl(torch_body)}
    if method == "greedy":
        impls["numpy"] = impl("reference")
    what = "greedy" if method == "greedy" else f"beam {k}"
    case = Case(name, f"Transformer-base generate {what} B={B} S={GEN['src_len']} +{n} tokens "
                      f"V={GEN['vocab']}", build, impls, repeats=GEN_REPEATS, warm=False,
                timed_first=("torch", "numpy"), tokens=B * n)
    case.numpy_label = "reference backend"
    return case


def _decoder_weight_bytes(model):
    """Bytes of the weights one decode step reads: per decoder layer the self-attention's
    in_proj and out_proj, the cross-attention's query rows (the first C rows of in_proj) and
    out_proj, linear1 and linear2; then the generator. (Biases, the KV caches and the
    cross-attention keys and values are not counted.)"""
    C = model.transformer.d_model
    n = 0
    for layer in model.transformer.decoder.layers:
        n += layer.self_attn.in_proj_weight.size + layer.self_attn.out_proj.weight.size
        n += layer.multihead_attn.in_proj_weight[:C].size
        n += layer.multihead_attn.out_proj.weight.size
        n += layer.linear1.weight.size + layer.linear2.weight.size
    return 4 * (n + model.generator.weight.size)


COPY_MIB = 256   # the memory-copy probe of the decode case: float32 array of this size


def memory_copy(nbytes=COPY_MIB * 2 ** 20, threads=None):
    """(callable, bytes moved per call): np.copyto of an nbytes float32 array into another,
    split into one slice per thread (NumPy releases the GIL while copying); bytes moved =
    read + write. The caller closes the pool with callable.close()."""
    import concurrent.futures

    n = threads or _runtime.get_num_threads()
    src = np.ones(nbytes // 4, np.float32)                    # written: no shared zero pages
    dst = np.zeros_like(src)
    dst[:: 1024] = 1.0                                        # touched
    bounds = np.linspace(0, src.size, n + 1).astype(np.int64)
    slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=n)

    def copy(sl):
        np.copyto(dst[sl], src[sl])

    def run_copy():
        list(pool.map(copy, slices))
    run_copy.close = pool.shutdown
    return run_copy, 2 * src.nbytes


def _decode_case(B=1):
    """Greedy decoding of Transformer-base (end_id=None): the time of one decode step =
    (generate's time - the encoder's and cross-attention K/V projections' time) / new tokens,
    and the bandwidth its weight reads reach (see _decoder_weight_bytes), against a memory copy
    on as many threads (memory_copy) timed in the same run."""
    n = GEN["new_tokens"]

    def build(rng):
        return {"src": rng.integers(4, GEN["vocab"], size=(B, GEN["src_len"]))}

    def impl(i):
        return functools.partial(_seq2seq_model("fast").generate, i["src"], max_new_tokens=n,
                                 start_id=GEN["start_id"])

    return Case("decode_step", f"decode step, Transformer-base greedy B={B} "
                               f"S={GEN['src_len']} V={GEN['vocab']} (ms per step)",
                build, {"fastattn": impl}, kind="decode", slow=(), repeats={"fastattn": 5},
                warm=False)


def _prefill(model, src):
    """What generate does once per source before decoding: encode, then each decoder layer's
    cross-attention keys and values."""
    memory = model.encode(src)                                               # (B, S, C)
    B, S_, C = memory.shape
    x = memory.reshape(B * S_, C)
    for layer in model.transformer.decoder.layers:
        mha = layer.multihead_attn
        ops.linear(x, mha.in_proj_weight[C:], mha.in_proj_bias[C:])
    return memory


def decode_metrics(generate_ms, prefill_ms, copy_ms, weight_bytes, copy_bytes, steps):
    """Derived numbers of the decode case (times are medians in ms)."""
    step_ms = (generate_ms - prefill_ms) / steps
    gbps = weight_bytes / (step_ms * 1e6)
    copy_gbps = copy_bytes / (copy_ms * 1e6)
    return {"step_ms": step_ms, "weight_gbps": gbps, "copy_gbps": copy_gbps,
            "share_of_copy": gbps / copy_gbps, "weight_mb": weight_bytes / 1e6}


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
    _decode_case(),
    # A tiny case for the command line's own tests; not run by default.
    _attention_case("smoke", "smoke: attention causal", 1, 2, 128, 32, True),
)}
DEFAULT_CASES = ("attention_causal", "attention_full", "layer_norm", "ffn", "sgemm",
                 "attention_memory", "encoder", "transformer", "generate_greedy_b1",
                 "generate_greedy_b8", "generate_beam_b1", "generate_beam_b8", "decode_step")


# ---- thread pools ------------------------------------------------------------------------------

_OPENBLAS_SET = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")


def _loaded_openblas():
    """(set, get) ctypes functions of every OpenBLAS loaded in this process (Linux only)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    found = []
    for path in sorted(p for p in paths if os.path.isfile(p)):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _OPENBLAS_SET:
            setter = getattr(lib, name, None)
            getter = getattr(lib, name.replace("_set_", "_get_"), None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype, getter.restype = [ctypes.c_int], None, ctypes.c_int
                found.append((setter, getter))
                break
    return found


@contextlib.contextmanager
def _threads(n):
    """fastattn, NumPy's BLAS and torch all at `n` threads (None: fastattn's current count)."""
    saved_fast = _runtime.get_num_threads()
    count = _runtime.set_num_threads(n) if n is not None else saved_fast
    blas = [(s, g, g()) for s, g in _loaded_openblas()]
    for setter, _, _ in blas:
        setter(count)
    torch = _torch()
    saved_torch = torch.get_num_threads() if torch is not None else None
    try:
        yield count
    finally:
        for setter, _, old in blas:
            setter(old)
        _runtime.set_num_threads(saved_fast)
        if torch is not None:
            torch.set_num_threads(saved_torch)


# ---- measurement -------------------------------------------------------------------------------

def _spread(i, n, rounds):
    """True on n of the rounds 0..rounds-1, spread evenly (the last round always included)."""
    return (i + 1) * n // rounds > i * n // rounds


def settle(max_wait=0.5, interval=0.01):
    """Wait until this process's threads are idle, at most max_wait seconds.

    A BLAS thread pool keeps spinning after a call (NumPy's OpenBLAS for about 0.1 s), which
    would take cores from whichever implementation is timed next; so each timed call starts
    once the process uses less than a quarter of a core.
    """
    deadline = time.perf_counter() + max_wait
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(interval)
        busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
        if busy < 0.25 or time.perf_counter() > deadline:
            return


def _machine_cpu():
    """(CPU seconds used by the whole machine, by this process, wall seconds) or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:9]]
        with open("/proc/self/stat") as f:
            mine = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    return busy / hz, (int(mine[11]) + int(mine[12])) / hz, time.perf_counter()


def _others_share(before, after):
    """Share of the machine's CPUs that other processes used between two _machine_cpu()s."""
    if before is None or after is None:
        return None
    wall = after[2] - before[2]
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others / (wall * (os.cpu_count() or 1))) if wall > 0 else None


def _warm(fn, seconds):
    """Untimed calls of fn for about `seconds` (at least one): threads awake, allocator reused."""
    end = time.perf_counter() + seconds
    fn()
    while time.perf_counter() < end:
        fn()


def _time_interleaved(fns, counts, warm=None):
    """Time each fn counts[name] times, round-robin across fns; returns seconds per call.

    Each turn: settle(), then warm[name] seconds of untimed calls (0 or missing: none), then
    the timed call; so every implementation is timed in its steady state, not just after
    another one's.
    """
    warm = warm or {}
    rounds = max(counts.values())
    times = {name: [] for name in fns}
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for i in range(rounds):
            for name, fn in fns.items():
                if _spread(i, counts[name], rounds):
                    settle()
                    if warm.get(name):
                        _warm(fn, warm[name])
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
    finally:
        if gc_was_on:
            gc.enable()
    return times


def _malloc_trim():
    """Give freed heap pages back to the OS (glibc), so reused pages do not hide a peak."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _vmhwm_kib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_memory_growth(fn):
    """(result, MiB, seconds, method): growth of the peak resident set during one call of fn,
    and the call's duration."""
    gc.collect()
    _malloc_trim()
    settle()
    method = "VmHWM"
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current resident set
        before = _vmhwm_kib()
    except OSError:
        before = None
    if before is None:
        import resource
        import sys
        unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, else KiB
        method = "ru_maxrss delta (lower bound)"
        peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit / 1024  # noqa
        before = peak()
    else:
        peak = _vmhwm_kib
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    return result, (peak() - before) / 1024, seconds, method


def _as_numpy(out):
    return out.numpy() if hasattr(out, "numpy") else np.asarray(out)


def _max_abs_diff(a, b):
    return float(np.max(np.abs(_as_numpy(a).astype(np.float64) - _as_numpy(b))))


def _empty_row(case, threads):
    row = {"case": case.name, "title": case.title, "kind": case.kind, "threads": threads,
           "flops": case.flops, "notes": []}
    for impl in IMPLEMENTATIONS:
        row.update({f"{impl}_ms": None, f"{impl}_runs": 0, f"{impl}_times_ms": [],
                    f"{impl}_gflops": None,
                    f"{impl}_status": "ok" if impl in case.implementations else "skipped"})
    return row


def _callables(case, row):
    fns = {}
    for impl in case.implementations:
        try:
            fns[impl] = case.callable(impl)
        except Unavailable as exc:
            row[f"{impl}_status"] = f"n/a: {exc}"
    return fns


def _finish_row(case, row):
    for impl in IMPLEMENTATIONS:
        ms = row[f"{impl}_times_ms"]
        if ms:
            row[f"{impl}_ms"] = statistics.median(ms)
            row[f"{impl}_runs"] = len(ms)
            if case.flops:
                row[f"{impl}_gflops"] = case.flops / (row[f"{impl}_ms"] * 1e6)
    fast = row["fastattn_ms"]
    for other in ("torch", "numpy"):
        ms = row[f"{other}_ms"]
        row[f"speedup_vs_{other}"] = ms / fast if ms and fast else None
    if case.nbytes and fast:
        row["fastattn_gbps"] = case.nbytes / (fast * 1e6)
        row["notes"].append(f"{row['fastattn_gbps']:.1f} GB/s")
    if case.tokens:
        rates = {impl: case.tokens / (row[f"{impl}_ms"] / 1e3)
                 for impl in ("fastattn", "torch", "numpy") if row[f"{impl}_ms"]}  # table order
        for impl, v in rates.items():
            row[f"{impl}_tokens_per_s"] = v
        if rates:
            row["notes"].insert(0, "tokens/s: " + ", ".join(
                f"{impl} {_fmt_ms(v)}" for impl, v in rates.items()))
    return row


def _counts(case, impls, repeat, numpy_repeat):
    """Timed calls per implementation: the run's counts, capped by case.repeats."""
    counts = {impl: numpy_repeat if impl in case.slow else repeat for impl in impls}
    return {impl: min(n, case.repeats.get(impl, n)) for impl, n in counts.items()}


def _check_calls(case, fns):
    """One call of each implementation, its output kept for validation; the calls of the
    implementations in case.timed_first are timed (after settle()), in seconds."""
    outs, first = {}, {}
    for impl, fn in fns.items():
        if impl not in case.timed_first:
            outs[impl] = fn()
            continue
        settle()
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            t0 = time.perf_counter()
            outs[impl] = fn()
            first[impl] = time.perf_counter() - t0
        finally:
            if gc_was_on:
                gc.enable()
    return outs, first


def _compare_tokens(row, outs):
    """Generation cases: token ids must agree exactly with the reference backend's (numpy),
    or with fastattn's where the reference backend does not run."""
    ref = "numpy" if "numpy" in outs else "fastattn"
    want = np.asarray(outs[ref])
    differ = {}
    for impl, out in outs.items():
        if impl == ref:
            continue
        got = _as_numpy(out)
        differ[impl] = (len(want) if got.shape != want.shape
                        else int((got != want).any(axis=1).sum()))
    row["rows_differ"], row["rows_compared_with"] = differ, ref
    bad = {i: n for i, n in differ.items() if n}
    if bad:
        row["notes"].append(f"MISMATCH: tokens differ from {ref}'s in " + ", ".join(
            f"{i} {n} of {len(want)} rows" for i, n in bad.items()))


def _run_time_case(case, threads, repeat, numpy_repeat):
    row = _empty_row(case, threads)
    fns = _callables(case, row)
    outs, first = _check_calls(case, fns)  # warm-up call, kept for validation
    if case.tokens:
        _compare_tokens(row, outs)
    elif "numpy" in outs and case.name != "sgemm":
        row["max_abs_diff_vs_numpy"] = diffs = {
            impl: _max_abs_diff(out, outs["numpy"]) for impl, out in outs.items()
            if impl != "numpy"}
        bad = {i: d for i, d in diffs.items() if not d <= MISMATCH_ATOL}
        if bad:
            row["notes"].append("MISMATCH vs numpy twin: " + ", ".join(
                f"{i} max|diff| {d:.2g}" for i, d in bad.items()))
    del outs
    counts = _counts(case, fns, repeat, numpy_repeat)
    left = {impl: n - (impl in first) for impl, n in counts.items()}
    warm = {impl: 0 if impl in case.slow or not case.warm else WARM_SECONDS for impl in fns}
    times = _time_interleaved({i: fn for i, fn in fns.items() if left[i] > 0},
                              {i: n for i, n in left.items() if n > 0}, warm)
    for impl in fns:
        ts = ([first[impl]] if impl in first else []) + times.get(impl, [])
        row[f"{impl}_times_ms"] = [t * 1e3 for t in ts]
    if case.tokens:
        label = getattr(case, "numpy_label", "numpy twin")
        row["notes"].append("runs: " + ", ".join(
            f"{impl} {len(row[f'{impl}_times_ms'])}" for impl in ("fastattn", "torch", "numpy")
            if impl in fns)
            + (f" (numpy = {label})" if "numpy" in fns else ""))
    elif "numpy" in fns and "numpy" in case.slow:
        n = counts["numpy"]
        row["notes"].append(f"numpy twin is float64: {n} run{'s' if n > 1 else ''}")
    if case.name == "sgemm":
        _finish_row(case, row)
        row["notes"].append(f"np.matmul {row['numpy_gflops']:.0f} GFLOP/s (FFN roofline)")
        return row
    return _finish_row(case, row)


def decode_probes(case, threads=None, rounds=5):
    """The decode case's other timings: (prefill ms, memory copy ms, bytes one copy moves),
    medians of `rounds` interleaved calls (fastattn's thread count when threads is None)."""
    times, copy_bytes = _decode_times(case, threads, {"prefill": rounds, "copy": rounds})
    return (statistics.median(times["prefill"]) * 1e3, statistics.median(times["copy"]) * 1e3,
            copy_bytes)


def _decode_times(case, threads, counts):
    """Seconds per call of the decode case's generate, prefill and memory copy (those named
    in counts), interleaved; returns (times, bytes one copy moves)."""
    model, src = _seq2seq_model("fast"), case.inputs()["src"]
    copy, copy_bytes = memory_copy(threads=threads)
    fns = {"generate": case.callable("fastattn"),
           "prefill": functools.partial(_prefill, model, src), "copy": copy}
    fns = {name: fn for name, fn in fns.items() if name in counts}
    try:
        for fn in fns.values():
            fn()                                   # weights packed, pages touched
        warm = {"prefill": WARM_SECONDS, "copy": WARM_SECONDS}
        return _time_interleaved(fns, counts, warm), copy_bytes
    finally:
        copy.close()


def _run_decode_case(case, threads, repeat):
    row = _empty_row(case, threads)
    n = min(repeat, case.repeats.get("fastattn", repeat))
    times, copy_bytes = _decode_times(case, threads,
                                      {"generate": n, "prefill": n, "copy": n})
    med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    steps = GEN["new_tokens"]
    m = decode_metrics(med["generate"], med["prefill"], med["copy"],
                       _decoder_weight_bytes(_seq2seq_model("fast")), copy_bytes, steps)
    row["fastattn_times_ms"] = [(t * 1e3 - med["prefill"]) / steps for t in times["generate"]]
    row.update(m, generate_ms=med["generate"], prefill_ms=med["prefill"], copy_ms=med["copy"],
               copy_threads=threads)
    _finish_row(case, row)
    row["notes"].append(
        f"{m['weight_mb']:.0f} MB of weights per step: {m['weight_gbps']:.1f} GB/s = "
        f"{100 * m['share_of_copy']:.0f}% of a {threads}-thread memory copy "
        f"({m['copy_gbps']:.1f} GB/s); generate {med['generate']:.0f} ms = encoder + cross K/V "
        f"{med['prefill']:.1f} ms + {steps} steps; {n} runs")
    return row


def _run_memory_case(case, threads):
    row = _empty_row(case, threads)
    fns = _callables(case, row)
    outs, method = {}, None
    for impl, fn in fns.items():
        outs[impl], mib, seconds, method = peak_memory_growth(fn)
        row[f"{impl}_times_ms"] = [seconds * 1e3]
        row[f"{impl}_peak_mib"] = mib
    if len(outs) > 1:
        row["max_abs_diff_fastattn_vs_torch"] = _max_abs_diff(outs["fastattn"], outs["torch"])
    row["output_mib"] = outs["fastattn"].nbytes / 2 ** 20 if "fastattn" in outs else None
    row["matrix_mib"] = case.matrix_mib
    row["memory_method"] = method
    del outs
    _finish_row(case, row)
    growth = ", ".join(f"{impl} {row[f'{impl}_peak_mib']:.0f} MiB" for impl in fns)
    row["notes"].append(f"peak RSS growth of one call: {growth} (output "
                        f"{row['output_mib']:.0f} MiB included); one L x L float32 matrix "
                        f"= {case.matrix_mib:.0f} MiB; numpy twin skipped")
    return row


def _select(cases):
    if cases is None:
        return [CASES[n] for n in DEFAULT_CASES]
    if isinstance(cases, str):
        cases = [cases]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(CASES)}")
    return [CASES[n] for n in dict.fromkeys(cases)]


def run(cases=None, repeat=DEFAULT_REPEAT, threads=None, *, numpy_repeat=DEFAULT_NUMPY_REPEAT,
        progress=None):
    """Benchmark `cases` (names; None = DEFAULT_CASES) and return one dict per case.

    repeat        timed calls of fastattn and torch per case (medians are reported)
    threads       threads for fastattn, torch and NumPy's BLAS during the run (None: fastattn's
                  current count); every count is restored afterwards
    numpy_repeat  timed calls of the float64 NumPy twin (slow), at most `repeat`
    progress      optional callable(str), told which case is starting

    Row keys: case, title, kind, threads, flops, notes, and per implementation (fastattn, numpy,
    torch) <impl>_ms (median), <impl>_runs, <impl>_times_ms, <impl>_gflops, <impl>_status
    ("ok", "skipped" or "n/a: why"); speedup_vs_torch, speedup_vs_numpy (= their ms / fastattn
    ms); max_abs_diff_vs_numpy; others_cpu (share of the CPUs other processes used meanwhile,
    Linux); memory case: <impl>_peak_mib, output_mib, matrix_mib; generation cases:
    <impl>_tokens_per_s, rows_differ ({impl: rows whose tokens differ from those of
    rows_compared_with}); decode case: step_ms (also its fastattn_ms), weight_mb, weight_gbps,
    copy_gbps, share_of_copy, generate_ms, prefill_ms, copy_ms, copy_threads.
    """
    selected = _select(cases)
    if repeat < 1 or numpy_repeat < 1:
        raise ValueError("repeat and numpy_repeat must be >= 1")
    numpy_repeat = min(numpy_repeat, repeat)
    rows = []
    with _threads(threads) as count:
        for case in selected:
            if progress is not None:
                progress(case.name)
            before = _machine_cpu()
            if case.kind == "memory":
                row = _run_memory_case(case, count)
            elif case.kind == "decode":
                row = _run_decode_case(case, count, repeat)
            else:
                row = _run_time_case(case, count, repeat, numpy_repeat)
            row["others_cpu"] = share = _others_share(before, _machine_cpu())
            if share is not None and share >= NOISY_SHARE:
                row["notes"].append(f"noisy: other processes used {100 * share:.0f}% of the "
                                    "CPUs")
            rows.append(row)
    return rows


# ---- reporting ---------------------------------------------------------------------------------

def _fmt_ms(v):
    """About three significant digits, never an exponent (also used for GFLOP/s)."""
    if v is None:
        return None
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 \
        else f"{v:.3f}"


def _cell(row, impl):
    status = row[f"{impl}_status"]
    if status.startswith("n/a"):
        return "n/a"
    return _fmt_ms(row[f"{impl}_ms"]) or "-"


def format_table(rows):
    """The rows as a Markdown table (speedups are the other's time over fastattn's)."""
    head = ["case", "fastattn ms", "torch ms", "numpy ms", "speedup vs torch",
            "speedup vs numpy", "GFLOP/s fastattn", "notes"]
    body = []
    for r in rows:
        body.append([
            r["title"], _cell(r, "fastattn"), _cell(r, "torch"), _cell(r, "numpy"),
            *(f"{r[k]:.2f}x" if r.get(k) else "-" for k in ("speedup_vs_torch",
                                                            "speedup_vs_numpy")),
            _fmt_ms(r["fastattn_gflops"]) if r.get("fastattn_gflops") else "-",
            "; ".join(r["notes"]),
        ])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]
    right = {1, 2, 3, 4, 5, 6}

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in right else "-" * (w + 2)
                          for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *(line(b) for b in body)])


def _row(rows, name):
    return next((r for r in rows if r["case"] == name), None)


def _speedup_target(case, other, threshold, field="ms", unit="ms"):
    """fastattn at least `threshold` times faster than `other` (times in ms, or tokens/s)."""
    def measure(rows):
        r = _row(rows, case)
        if r is None:
            return None, "not run"
        v = r.get(f"speedup_vs_{other}")
        if v is None:
            return None, f"{other} not measured ({r[f'{other}_status']})"
        return v, f"{v:.2f}x {other} (fastattn {_fmt_ms(r[f'fastattn_{field}'])} {unit}, " \
                  f"{other} {_fmt_ms(r[f'{other}_{field}'])} {unit})"
    text = f"speedup vs {other} >= {threshold}x" if field == "ms" else \
        f"{unit} >= {threshold}x {other}"
    return (case, text, measure, lambda v: v >= threshold)


def _memory_target(rows):
    r = _row(rows, "attention_memory")
    if r is None:
        return None, "not run"
    v = r.get("fastattn_peak_mib")
    return v, f"peak RSS growth {v:.1f} MiB (one L x L float32 matrix: {r['matrix_mib']:.0f} MiB)"


def _ffn_target(rows):
    f, s = _row(rows, "ffn"), _row(rows, "sgemm")
    if f is None:
        return None, "not run"
    if s is None or not s.get("numpy_gflops"):
        return None, "needs the sgemm case in the same run"
    v = f["fastattn_gflops"] / s["numpy_gflops"]
    return v, f"{100 * v:.1f}% of sgemm ({f['fastattn_gflops']:.0f} vs " \
              f"{s['numpy_gflops']:.0f} GFLOP/s)"


def _decode_target(rows):
    r = _row(rows, "decode_step")
    if r is None:
        return None, "not run"
    v = r.get("share_of_copy")
    if v is None:
        return None, "not measured"
    return v, f"{100 * v:.0f}% of the copy ({r['weight_gbps']:.1f} vs {r['copy_gbps']:.1f} " \
              f"GB/s; {r['step_ms']:.2f} ms per step)"


# (case, target text, measure(rows) -> (value or None, detail), passes(value) -> bool)
TARGETS = (
    _speedup_target("attention_causal", "torch", 1.8),
    _speedup_target("attention_causal", "numpy", 10),
    _speedup_target("attention_full", "torch", 1.2),
    ("attention_memory", "peak memory growth < 64 MiB", _memory_target, lambda v: v < 64),
    ("ffn", "GFLOP/s >= 90% of sgemm GFLOP/s", _ffn_target, lambda v: v >= 0.9),
    _speedup_target("layer_norm", "torch", 1.5),
    _speedup_target("encoder", "torch", 1.05),
    _speedup_target("transformer", "torch", 1.15),
    _speedup_target("transformer", "numpy", 2),
    _speedup_target("generate_greedy_b8", "torch", 10, field="tokens_per_s", unit="tokens/s"),
    ("decode_step", "decode weight GB/s >= 70% of memory copy GB/s", _decode_target,
     lambda v: v >= 0.7),
)


def check_targets(rows):
    """One dict per target: case, target, value, detail, status ("PASS", "MISS" or "SKIP")."""
    results = []
    for case, text, measure, passes in TARGETS:
        value, detail = measure(rows)
        status = "SKIP" if value is None else "PASS" if passes(value) else "MISS"
        results.append({"case": case, "target": text, "value": value, "detail": detail,
                        "status": status})
    return results


def format_targets(results, *, include_skipped=False):
    """One line per target: PASS/MISS, case, target, what was measured."""
    shown = [r for r in results if include_skipped or r["status"] != "SKIP"]
    if not shown:
        return ""
    wc = max(len(r["case"]) for r in shown)
    wt = max(len(r["target"]) for r in shown)
    return "\n".join(f"{r['status']:4}  {r['case']:{wc}}  {r['target']:{wt}}  {r['detail']}"
                     for r in shown)


def describe_environment(threads=None):
    """One line: version, SIMD level, threads, BLAS core, torch version."""
    info = _runtime.build_info()
    torch = torch_version()
    return (f"fastattn {info['version']}, simd {info['simd']}, "
            f"{threads or info['threads']} threads, OpenBLAS {info['blas_core']}, "
            f"numpy {np.__version__}, torch {torch or 'n/a'}")
