"""The benchmark cases: inputs built once (seeded), one zero-argument callable per implementation.

- ``fastattn``: ``fastattn.ops`` (the C kernels), or a model on the fast backend;
- ``numpy``: ``fastattn.reference`` (the float64 NumPy twin; for ``sgemm``, ``np.matmul``), or
  the model on the reference backend;
- ``torch``: the equivalent ``torch.nn.functional`` ops on ``torch.from_numpy`` tensors, or the
  torch twins of torch_models, under ``torch.inference_mode()`` with
  ``torch.set_num_threads(fastattn.get_num_threads())`` (the bfloat16 compute type's rows:
  torch's model converted with ``.to(torch.bfloat16)``; its greedy generation with a KV cache
  of its own).

Op cases (OP_CASES): attention (causal, full, and the memory of a long causal call), layer norm
with the residual add, the FFN (relu, and the tanh GELU: ffn_gelu_tanh), and the sgemm
roofline; the attention backward (causal and full, the backward alone against torch's SDPA
backward, and the memory of a long causal forward + backward). Model cases (MODEL_CASES): the
Transformer-base encoder and encoder-decoder forwards, generation (greedy and beam, B = 1 and 8)
and the decode step.

Work counted (useful FLOPs): attention 4*B*H*Lq*Lk*D, half of that when causal (its backward
10*B*H*Lq*Lk*D: five products of the forward's size); FFN 4*N*C*F;
sgemm 2*M*N*K; the model forwards count their GEMMs. Layer norm is memory-bound: its bytes (x
and residual read, y written) give GB/s.
"""
import functools
import math

import numpy as np

from .. import get_num_threads, nn, ops, reference
from .base import IMPLEMENTATIONS, Case, Unavailable, _normal, _torch_backward, _torch_impl
from .torch_models import require_torch, torch_generate, torch_seq2seq, torch_transformer

__all__ = ["IMPLEMENTATIONS", "Case", "Unavailable", "CASES", "OP_CASES", "MODEL_CASES",
           "DEFAULT_CASES", "DecodeCase", "BASE", "GEN", "seq2seq_model", "decoder_weight_bytes",
           "decode_metrics"]

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


def _attention_backward_case(name, title, B, H, L, D, causal):
    """attention_backward alone (the forward's out and lse are inputs, computed once while
    building them) vs torch's backward of scaled_dot_product_attention on the same q, k, v and
    dout (its forward run once, untimed; each call is torch.autograd.grad with the graph kept)
    vs the float64 twin. Output: (dq, dk, dv)."""
    def build(rng):
        inputs = {t: _normal(rng, (B, H, L, D)) for t in ("q", "k", "v", "dout")}
        out, cache = ops.attention_forward(inputs["q"], inputs["k"], inputs["v"], causal=causal)
        inputs.update(out=out, lse=cache["lse"])
        return inputs

    def impl(fn):
        return lambda i: functools.partial(fn, i["dout"], i["q"], i["k"], i["v"], i["out"],
                                           i["lse"], causal=causal)

    impls = {"fastattn": impl(ops.attention_backward), "numpy": impl(reference.attention_backward),
             "torch": _torch_backward(causal)}
    flops = 10 * B * H * L * L * D // (2 if causal else 1)   # five products of the forward's size
    return Case(name, f"{title} (B={B} H={H} L={L} D={D})", build, impls, flops=flops)




def _attention_backward_memory_case(B=1, H=4, L=16384, D=64):
    """One training step of a long causal attention: forward then backward. Peak RSS growth
    counts out, lse, dq, dk, dv (64 MiB here) and the scratch; returns dq (for the check
    against torch)."""
    def build(rng):
        return {t: _normal(rng, (B, H, L, D)) for t in ("q", "k", "v", "dout")}

    def fast(i):
        def step():
            out, cache = ops.attention_forward(i["q"], i["k"], i["v"], causal=True)
            return ops.attention_backward(i["dout"], i["q"], i["k"], i["v"], out, cache["lse"],
                                          causal=True)[0]
        return step

    def torch_step(i):
        run = _torch_backward(True, train_step=True)(i)
        return lambda: run()[0]

    case = Case("attention_backward_memory", f"attention forward + backward memory, causal "
                f"(B={B} H={H} L={L} D={D})", build, {"fastattn": fast, "torch": torch_step},
                kind="memory", slow=(), flops=14 * B * H * L * L * D // 2)
    case.matrix_mib = L * L * 4 / 2 ** 20  # one (L, L) float32 matrix, for comparison
    return case


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


def _ffn_case(activation="relu", N=2048, C=512, F_=2048):
    """The FFN forward, relu ("ffn") or the tanh GELU ("ffn_gelu_tanh": torch's
    F.gelu(approximate="tanh"), fused in fastattn's epilogue like relu)."""
    name = "ffn" if activation == "relu" else f"ffn_{activation}"

    def torch_act(F, h):
        return F.relu(h) if activation == "relu" else F.gelu(h, approximate="tanh")

    def build(rng):
        return {"x": _normal(rng, (N, C)),
                "w1": _normal(rng, (F_, C), 1 / math.sqrt(C)), "b1": _normal(rng, F_, 0.1),
                "w2": _normal(rng, (C, F_), 1 / math.sqrt(F_)), "b2": _normal(rng, C, 0.1)}

    def impl(fn):
        return lambda i: functools.partial(fn, i["x"], i["w1"], i["b1"], i["w2"], i["b2"],
                                           activation=activation)

    impls = {
        "fastattn": impl(ops.ffn),
        "numpy": impl(reference.ffn),
        "torch": _torch_impl(lambda F, t: lambda: F.linear(
            torch_act(F, F.linear(t["x"], t["w1"], t["b1"])), t["w2"], t["b2"])),
    }
    return Case(name, f"FFN {activation} ({N}, {C}) -> {F_} -> {C}", build, impls,
                flops=4 * N * C * F_)


def _layer_norm_backward_case(N=2048, C=512):
    """Layer norm backward (dx, dweight, dbias) from the forward's mean and rstd, without a
    residual, against torch's own LayerNorm backward kernel (aten.native_layer_norm_backward,
    what autograd runs for F.layer_norm) on its own saved statistics. Bytes: dy and x read, dx
    written. Each implementation returns dx (the runner compares one array)."""
    def build(rng):
        x, w, b = _normal(rng, (N, C)), 1 + _normal(rng, C, 0.1), _normal(rng, C, 0.1)
        _, cache = ops.layer_norm_forward(x, w, b)
        return {"dy": _normal(rng, (N, C)), "x": x, "w": w, "b": b, "mean": cache["mean"],
                "rstd": cache["rstd"]}

    def impl(fn):
        return lambda i: lambda: fn(i["dy"], i["x"], i["mean"], i["rstd"], i["w"])[0]

    def torch_body(F, t):
        import torch
        _, mean, rstd = torch.ops.aten.native_layer_norm(t["x"], [C], t["w"], t["b"], 1e-5)
        return lambda: torch.ops.aten.native_layer_norm_backward(
            t["dy"], t["x"], [C], mean, rstd, t["w"], t["b"], [True, True, True])[0]

    impls = {"fastattn": impl(ops.layer_norm_backward),
             "numpy": impl(reference.layer_norm_backward), "torch": _torch_impl(torch_body)}
    return Case("layer_norm_backward", f"layer norm backward ({N}, {C})", build, impls,
                nbytes=3 * N * C * 4)


def _ffn_backward_case(N=2048, C=512, F_=2048):
    """FFN backward (dx, dw1, db1, dw2, db2; relu, no dropout) from the saved pre-activation,
    against torch autograd's backward of linear2(relu(linear1(x))) (its graph built once, its
    grad called with retain_graph). Work: the four GEMMs, 8*N*C*F. Each implementation returns
    dx."""
    def build(rng):
        inputs = {"x": _normal(rng, (N, C)), "dy": _normal(rng, (N, C)),
                  "w1": _normal(rng, (F_, C), 1 / math.sqrt(C)), "b1": _normal(rng, F_, 0.1),
                  "w2": _normal(rng, (C, F_), 1 / math.sqrt(F_)), "b2": _normal(rng, C, 0.1)}
        _, cache = ops.ffn_forward(*(inputs[k] for k in ("x", "w1", "b1", "w2", "b2")))
        inputs["pre"] = cache["pre"]
        return inputs

    def impl(fn):
        return lambda i: lambda: fn(i["dy"], i["x"], i["w1"], i["b1"], i["w2"], i["b2"],
                                    i["pre"], activation="relu")[0]

    def torch_factory(inputs):
        torch = require_torch()
        torch.set_num_threads(get_num_threads())
        params = [torch.from_numpy(inputs[k]).requires_grad_()
                  for k in ("x", "w1", "b1", "w2", "b2")]
        x, w1, b1, w2, b2 = params
        fl = torch.nn.functional.linear
        y = fl(torch.relu(fl(x, w1, b1)), w2, b2)                # autograd keeps what it needs
        dy = torch.from_numpy(inputs["dy"])
        return lambda: torch.autograd.grad(y, params, dy, retain_graph=True)[0]

    impls = {"fastattn": impl(ops.ffn_backward), "numpy": impl(reference.ffn_backward),
             "torch": torch_factory}
    return Case("ffn_backward", f"FFN backward relu ({N}, {C}) -> {F_} -> {C}", build, impls,
                flops=8 * N * C * F_)


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
def _base_model(backend, compute_type="float32"):
    """Transformer-base with seeded random weights (the same weights for every backend),
    quantized to compute_type."""
    return nn.Transformer(**BASE, backend=backend, seed=0).quantize(compute_type)


@functools.lru_cache(maxsize=None)
def _torch_base_model():
    """torch's nn.Transformer (batch_first, eval) holding the weights of _base_model."""
    return torch_transformer(_base_model("fast"))


@functools.lru_cache(maxsize=None)
def _torch_base_model_bf16():
    """_torch_base_model's weights in a model converted with .to(torch.bfloat16)."""
    torch = require_torch()
    return torch_transformer(_base_model("fast")).to(torch.bfloat16)


def _model_case(name, B, S, T, compute_type="float32"):
    """Transformer-base forward: the encoder alone (T = 0), or encoder + decoder with a causal
    target; fastattn's fast backend vs its reference backend vs torch's nn.Transformer. With
    quantized weights (compute_type int8 / bf16) fastattn alone: the reference backend's exact
    integer products take minutes at this size, and torch has no such model (the float32
    row of the same run is the comparison: see targets)."""
    C = BASE["d_model"]

    def build(rng):
        inputs = {"src": _normal(rng, (B, S, C))}
        if T:
            inputs["tgt"] = _normal(rng, (B, T, C))
            inputs["tgt_mask"] = nn.generate_square_subsequent_mask(T)
        return inputs

    def impl(backend, ct=compute_type):
        def factory(i):
            m = _base_model(backend, ct)
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
    def torch_bf16_body(F, t):
        torch = require_torch()
        m = _torch_base_model_bf16()
        src = t["src"].to(torch.bfloat16)
        if not T:
            return lambda: m.encoder(src).float()
        tgt, mask = t["tgt"].to(torch.bfloat16), t["tgt_mask"].to(torch.bfloat16)
        return lambda: m(src, tgt, tgt_mask=mask, tgt_is_causal=True).float()

    what = f"encoder B={B} L={S}" if not T else f"encoder-decoder B={B} S={S} T={T} causal"
    impls = {"fastattn": impl("fast")}
    if compute_type == "float32":
        impls.update(numpy=impl("reference"), torch=_torch_impl(torch_body))
    elif compute_type == "bfloat16":
        # the peer: torch's model in bf16 (model.to(torch.bfloat16), same weights)
        impls.update(torch=_torch_impl(torch_bf16_body))
        what += ", bfloat16 compute (torch: model.to(torch.bfloat16))"
    else:
        what += f", {compute_type} weights"
    # quantized: the float32 model on the same inputs, timed between this case's calls, so
    # the speedup over float32 is measured side by side
    return Case(name, f"Transformer-base {what}", build, impls, flops=flops,
                numpy_label="reference backend",
                float32_impl=None if compute_type == "float32" else impl("fast", "float32"))


# ---- generation --------------------------------------------------------------------------------

GEN = dict(vocab=8000, src_len=128, new_tokens=64, beam_size=4, start_id=2)
GEN_REPEATS = {"fastattn": 3, "torch": 1, "numpy": 1,   # calls of seconds (torch: minutes)
               "ctranslate2": 3}


@functools.lru_cache(maxsize=None)
def seq2seq_model(backend, compute_type="float32"):
    """Transformer-base Seq2SeqTransformer, vocabularies of GEN["vocab"], seeded random weights
    (the same weights for every backend), quantized to compute_type."""
    V = GEN["vocab"]
    return nn.Seq2SeqTransformer(BASE["num_encoder_layers"], BASE["num_decoder_layers"],
                                 BASE["d_model"], BASE["nhead"], V, V,
                                 BASE["dim_feedforward"], backend=backend,
                                 seed=0).quantize(compute_type)


@functools.lru_cache(maxsize=None)
def _torch_seq2seq_base():
    return torch_seq2seq(seq2seq_model("fast"))


@functools.lru_cache(maxsize=None)
def _torch_seq2seq_base_bf16():
    """_torch_seq2seq_base's weights in a model converted with .to(torch.bfloat16)."""
    torch = require_torch()
    return torch_seq2seq(seq2seq_model("fast")).to(torch.bfloat16)


def _source_ids(B):
    def build(rng):
        return {"src": rng.integers(4, GEN["vocab"], size=(B, GEN["src_len"]))}
    return build


def _generate_case(name, B, method, compute_type="float32"):
    """Transformer-base generation of GEN["new_tokens"] tokens from B sources of
    GEN["src_len"] tokens, end_id=None (every run does the same work): fastattn's fast backend
    (KV cache) vs torch's nn.Transformer re-running its decoder on the prefix each step (the
    tutorial's loop, torch_models.TorchDecoder, searched by fastattn.generate's own loops) vs
    the reference backend (the same decode steps with the NumPy twin's ops; greedy only) vs
    CTranslate2 holding the same weights (ct2_models; when installed).

    Quantized weights (compute_type int8 / bf16): fastattn against CTranslate2's own int8
    quantization of the same float32 weights (CPU CTranslate2 has no bf16); torch (but for the
    bfloat16 greedy rows, below) and the reference backend only run float32. CTranslate2's int8 rounds differently, so its tokens
    are reported, not required to match.

    The bfloat16 compute type, greedy: the torch column is torch's model in bf16
    (model.to(torch.bfloat16), the same weights) decoding with a key/value cache of its own
    (torch_models.TorchCachedDecoder: encoder and cross-attention keys and values once, one
    position per step), the peer of fastattn's cached decoding; its tokens come from another
    rounding, so they are reported, not required to match. Its calls take seconds, as
    fastattn's: as many timed calls, after an untimed checking call."""
    n, k = GEN["new_tokens"], GEN["beam_size"]
    kw = dict(max_new_tokens=n, start_id=GEN["start_id"])
    if method == "beam":
        kw.update(method="beam", beam_size=k)

    def impl(backend):
        return lambda i: functools.partial(seq2seq_model(backend, compute_type).generate,
                                           i["src"], **kw)

    def torch_body(F, t):
        return functools.partial(torch_generate, _torch_seq2seq_base(), t["src"], **kw)

    def torch_bf16_body(F, t):
        return functools.partial(torch_generate, _torch_seq2seq_base_bf16(), t["src"],
                                 kv_cache=True, **kw)

    def ct2_impl(i):
        from .ct2_models import ct2_generate, ct2_translator
        translator = ct2_translator(seq2seq_model("fast"), ct2_type)
        return functools.partial(ct2_generate, translator, i["src"], **kw)

    impls = {"fastattn": impl("fast")}
    repeats, timed_first = GEN_REPEATS, ("torch", "numpy")
    exact = None if compute_type == "float32" else ("fastattn", "numpy", "torch")
    if compute_type == "float32":
        impls["torch"] = _torch_impl(torch_body)
        if method == "greedy":
            impls["numpy"] = impl("reference")
    elif compute_type == "bfloat16" and method == "greedy":
        # the peer: torch's model in bf16 with its own KV cache (same weights and sources)
        impls["torch"] = _torch_impl(torch_bf16_body)
        repeats = dict(GEN_REPEATS, torch=GEN_REPEATS["fastattn"])
        timed_first, exact = ("numpy",), ("fastattn", "numpy")
    ct2_type = {"float32": "float32", "int8": "int8"}.get(compute_type)
    if ct2_type is not None:
        impls["ctranslate2"] = ct2_impl
    what = "greedy" if method == "greedy" else f"beam {k}"
    weights = "" if compute_type == "float32" else f", {compute_type} weights"
    if "torch" in impls and compute_type == "bfloat16":
        weights += " (torch: model.to(torch.bfloat16), KV cache)"
    return Case(name, f"Transformer-base generate {what} B={B} S={GEN['src_len']} +{n} tokens "
                      f"V={GEN['vocab']}{weights}", _source_ids(B), impls, repeats=repeats,
                warm=False, timed_first=timed_first, tokens=B * n,
                numpy_label="reference backend", exact=exact)


def decoder_weight_bytes(model):
    """Bytes of the weights one decode step of `model` (a Seq2SeqTransformer) reads: per
    decoder layer the self-attention's in_proj and out_proj, the cross-attention's query rows
    (the first C rows of in_proj) and out_proj, linear1 and linear2; then the generator.
    (Biases, the KV caches and the cross-attention keys and values are not counted.)

    Args:
        model: the `Seq2SeqTransformer`.

    Returns:
        The bytes, an int."""
    C = model.transformer.d_model
    n = 0
    for layer in model.transformer.decoder.layers:          # bytes as stored: float32, or
        n += layer.self_attn.in_proj_weight.nbytes          # int8 + row scales, or bf16
        n += layer.self_attn.out_proj.weight.nbytes
        n += layer.multihead_attn.in_proj_weight[:C].nbytes
        n += layer.multihead_attn.out_proj.weight.nbytes
        n += layer.linear1.weight.nbytes + layer.linear2.weight.nbytes
    return n + model.generator.weight.nbytes


def decode_metrics(generate_ms, prefill_ms, copy_ms, weight_bytes, copy_bytes, steps):
    """Derived numbers of the decode case (times are medians in ms).

    Args:
        generate_ms: one generate call.
        prefill_ms: its prefill.
        copy_ms: the memory copy.
        weight_bytes: the bytes one step's weight reads move.
        copy_bytes: the bytes the copy moves.
        steps: the decode steps of one generate call.

    Returns:
        {"step_ms", "weight_gbps", "copy_gbps", "share_of_copy", "weight_mb"}.
    """
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

    Its `steps` attribute is the number of decode steps of one generate call.

    Args:
        B: the number of sources (default 1).
        compute_type: the model's compute type (default "float32").
    """

    def __init__(self, B=1, compute_type="float32"):
        self.B, self.steps, self.compute_type = B, GEN["new_tokens"], compute_type
        name = "decode_step" + ("" if compute_type == "float32" else f"_{compute_type}")
        weights = "" if compute_type == "float32" else f", {compute_type} weights"
        super().__init__(name, f"decode step, Transformer-base greedy B={B} "
                               f"S={GEN['src_len']} V={GEN['vocab']}{weights} (ms per step)",
                         _source_ids(B), {"fastattn": self._generate}, kind="decode", slow=(),
                         repeats={"fastattn": 5}, warm=False)

    def _model(self):
        return seq2seq_model("fast", self.compute_type)

    def _generate(self, inputs):
        return functools.partial(self._model().generate, inputs["src"],
                                 max_new_tokens=self.steps, start_id=GEN["start_id"])

    def prefill(self):
        """What generate does once before its steps: the model's own `init_cache`.

        Returns:
            A zero-argument callable running the encoder, then each decoder layer's
                cross-attention keys and values.
        """
        return functools.partial(self._model().init_cache, self.inputs()["src"],
                                 beams=1, max_len=self.steps)

    def weight_bytes(self):
        """The bytes one step's weight reads move (see `decoder_weight_bytes`)."""
        return decoder_weight_bytes(self._model())

    def float32_twin(self):
        """The float32 case of the same model and sources (None for a float32 case): a
        quantized case times its generate and prefill interleaved with its own, so the
        speedup over float32 does not move with the memory bandwidth between two cases."""
        if self.compute_type == "float32":
            return None
        return DecodeCase(self.B, "float32")


# ---- the registry ------------------------------------------------------------------------------

CASES = {c.name: c for c in (
    _attention_case("attention_causal", "attention causal", 4, 8, 512, 64, True),
    _attention_case("attention_full", "attention full", 4, 8, 512, 64, False),
    _attention_backward_case("attention_backward_causal", "attention backward causal", 4, 8,
                             512, 64, True),
    _attention_backward_case("attention_backward_full", "attention backward full", 4, 8, 512,
                             64, False),
    _attention_backward_memory_case(),
    _layer_norm_case(),
    _ffn_case(),
    _ffn_case("gelu_tanh"),
    _layer_norm_backward_case(),
    _ffn_backward_case(),
    _sgemm_case(),
    _memory_case(),
    _model_case("encoder", 8, 128, 0),
    _model_case("transformer", 8, 128, 128),
    _generate_case("generate_greedy_b1", 1, "greedy"),
    _generate_case("generate_greedy_b8", 8, "greedy"),
    _generate_case("generate_beam_b1", 1, "beam"),
    _generate_case("generate_beam_b8", 8, "beam"),
    DecodeCase(),
    *(c for t in ("int8", "bf16", "bfloat16") for c in (
        _model_case(f"encoder_{t}", 8, 128, 0, t),
        _model_case(f"transformer_{t}", 8, 128, 128, t),
        _generate_case(f"generate_greedy_b1_{t}", 1, "greedy", t),
        _generate_case(f"generate_greedy_b8_{t}", 8, "greedy", t),
        _generate_case(f"generate_beam_b8_{t}", 8, "beam", t),
        DecodeCase(compute_type=t))),
    # A tiny case for the command line's own tests; not run by default.
    _attention_case("smoke", "smoke: attention causal", 1, 2, 128, 32, True),
)}
OP_CASES = ("attention_causal", "attention_full", "layer_norm", "ffn", "ffn_gelu_tanh", "sgemm",
            "attention_memory",
            "layer_norm_backward", "ffn_backward")
OP_CASES += ("attention_backward_causal", "attention_backward_full", "attention_backward_memory")
MODEL_CASES = ("encoder", "transformer", "generate_greedy_b1", "generate_greedy_b8",
               "generate_beam_b1", "generate_beam_b8", "decode_step")
QUANT_MODEL_CASES = tuple(f"{c}_{t}" for t in ("int8", "bf16", "bfloat16") for c in (
    "encoder", "transformer", "generate_greedy_b1", "generate_greedy_b8", "generate_beam_b8",
    "decode_step"))
MODEL_CASES += QUANT_MODEL_CASES
DEFAULT_CASES = OP_CASES + MODEL_CASES


# ---- training: loss and optimiser ----------------------------------------------------------------

def _cross_entropy_case(N=4096, V=8000, eps=0.1):
    """Cross-entropy forward + backward (label smoothing eps) over N rows of V logits: fastattn
    and the twin return dlogits; torch runs F.cross_entropy and its backward on a leaf tensor
    sharing the logits (autograd on, so outside inference_mode). Outputs compared: dlogits."""
    def build(rng):
        return {"logits": _normal(rng, (N, V), 3.0), "targets": rng.integers(0, V, N)}

    def impl(fn):
        return lambda i: lambda: fn(i["logits"], i["targets"], label_smoothing=eps,
                                    return_grad=True)[1]

    def torch_factory(inputs):
        torch = require_torch()
        torch.set_num_threads(get_num_threads())
        x = torch.from_numpy(inputs["logits"]).requires_grad_(True)
        t = torch.from_numpy(inputs["targets"])

        def run_torch():
            x.grad = None
            torch.nn.functional.cross_entropy(x, t, label_smoothing=eps).backward()
            return x.grad
        return run_torch

    return Case("cross_entropy", f"cross-entropy fwd + bwd, label smoothing {eps} ({N}, {V})",
                build, {"fastattn": impl(ops.cross_entropy),
                        "numpy": impl(reference.cross_entropy), "torch": torch_factory},
                nbytes=2 * N * V * 4)


def transformer_base_shapes(vocab=37000):
    """The parameter shapes of Transformer-base: nn.Transformer()'s state_dict (BASE) plus one
    shared (vocab, d_model) embedding, the paper's 37000-token shared vocabulary (~63M floats
    in all)."""
    from ..io import state_dict_shapes
    config = dict(BASE, bias=True)
    return [shape for _, shape in state_dict_shapes("Transformer", config)] + \
        [(vocab, BASE["d_model"])]


def _adamw_case(lr=1e-4):
    """One AdamW step over Transformer-base's parameters (transformer_base_shapes). Each
    implementation updates its own copy of the parameters and moments (torch: its own
    tensors, the gradients shared); the output compared is the first parameter tensor after
    the checking call (one step). Bytes: 7 floats per parameter (p, g, m, v read; p, m, v
    written), against a memory copy timed in the same run (Case.copy_probe)."""
    shapes = transformer_base_shapes()
    n = sum(math.prod(s) for s in shapes)

    def build(rng):
        return {"params": [_normal(rng, s, 0.05) for s in shapes],
                "grads": [_normal(rng, s, 1e-2) for s in shapes]}

    def impl(fn):
        def factory(i):
            p = [a.copy() for a in i["params"]]
            m, v = [np.zeros_like(a) for a in p], [np.zeros_like(a) for a in p]
            step = [0]

            def run():
                step[0] += 1
                fn(p, i["grads"], m, v, step=step[0], lr=lr)
                return p[0]
            return run
        return factory

    def torch_factory(inputs):
        torch = require_torch()
        torch.set_num_threads(get_num_threads())
        params = [torch.from_numpy(a.copy()).requires_grad_(True) for a in inputs["params"]]
        for t, g in zip(params, inputs["grads"]):
            t.grad = torch.from_numpy(g)
        opt = torch.optim.AdamW(params, lr=lr)     # what torch picks on CPU

        def run_torch():
            opt.step()
            return params[0].detach()
        return run_torch

    case = Case("adamw", f"AdamW step, Transformer-base ({len(shapes)} tensors, {n / 1e6:.1f}M "
                         "floats)", build,
                {"fastattn": impl(ops.adamw_step), "numpy": impl(reference.adamw_step),
                 "torch": torch_factory}, nbytes=7 * 4 * n)
    case.copy_probe = True
    return case


CASES.update((c.name, c) for c in (_cross_entropy_case(), _adamw_case()))
OP_CASES += ("cross_entropy", "adamw")
DEFAULT_CASES = OP_CASES + MODEL_CASES

# ---- training steps (train_cases.py) ----------------------------------------------------------
from .train_cases import TRAIN_CASES  # noqa: E402

CASES.update((c.name, c) for c in TRAIN_CASES)
TRAIN_CASE_NAMES = tuple(c.name for c in TRAIN_CASES)
DEFAULT_CASES = DEFAULT_CASES + TRAIN_CASE_NAMES

# ---- corpus runners (runner_cases.py; not run by default: each trains its model first) -------
from .runner_cases import RUNNER_CASES  # noqa: E402

CASES.update((c.name, c) for c in RUNNER_CASES)
RUNNER_CASE_NAMES = tuple(c.name for c in RUNNER_CASES)

# ---- a pretrained model directory against CTranslate2's converter of it (pretrained_cases.py;
# not run by default: needs torch, transformers and ctranslate2, and makes the model first) ----
from .pretrained_cases import PRETRAINED_CASES  # noqa: E402

CASES.update((c.name, c) for c in PRETRAINED_CASES)
PRETRAINED_CASE_NAMES = tuple(c.name for c in PRETRAINED_CASES)

# ---- learning: held-out exact match against the torch tutorial (learning.py; not run by
# default: it trains models for minutes) --------------------------------------------------------
from .learning import LEARNING_CASES  # noqa: E402

CASES.update((c.name, c) for c in LEARNING_CASES)

# ---- data-parallel training over MPI (dp_cases.py; not run by default: it starts mpiexec
# runs of the small preset, and needs the mpi extra) ---------------------------------------------
from .dp_cases import DP_CASES  # noqa: E402

CASES.update((c.name, c) for c in DP_CASES)

# ---- quantized weights, op level (quant_cases.py) ----------------------------------------------
from .quant_cases import QUANT_CASES as QUANT_OP_CASES  # noqa: E402

CASES.update((c.name, c) for c in QUANT_OP_CASES)
QUANT_OP_CASE_NAMES = tuple(c.name for c in QUANT_OP_CASES)
OP_CASES += QUANT_OP_CASE_NAMES
DEFAULT_CASES = DEFAULT_CASES + QUANT_OP_CASE_NAMES

# ---- the float32 GEMM engine, op level (gemm_cases.py), read against peak_fma -------------------
from .gemm_cases import GEMM_CASES  # noqa: E402

CASES.update((c.name, c) for c in GEMM_CASES)
GEMM_CASE_NAMES = tuple(c.name for c in GEMM_CASES)
OP_CASES += GEMM_CASE_NAMES
DEFAULT_CASES = DEFAULT_CASES + GEMM_CASE_NAMES

# ---- bf16 attention, op level (attention_bf16_cases.py) ------------------------------------------
from .attention_bf16_cases import BF16_ATTENTION_CASES  # noqa: E402

CASES.update((c.name, c) for c in BF16_ATTENTION_CASES)
BF16_ATTENTION_CASE_NAMES = tuple(c.name for c in BF16_ATTENTION_CASES)
OP_CASES += BF16_ATTENTION_CASE_NAMES
DEFAULT_CASES = DEFAULT_CASES + BF16_ATTENTION_CASE_NAMES
