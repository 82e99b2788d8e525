"""Case, the benchmark's unit, and the helpers the case modules share.

The case modules (cases.py and the families it gathers: train_cases, runner_cases,
pretrained_cases, learning, dp_cases, quant_cases, attention_bf16_cases) build on this module,
and cases.py imports them to fill its registry: Case lives here, below all of them, so that
none of them imports cases.py back.
"""
import numpy as np

from .. import get_num_threads
from .torch_models import Unavailable, require_torch

__all__ = ["IMPLEMENTATIONS", "Case", "Unavailable"]

IMPLEMENTATIONS = ("fastattn", "numpy", "torch", "ctranslate2")


class Case:
    """One benchmark: inputs built once from a seeded generator, one callable per implementation.

    Args:
        name: registry key (``fastattn bench --case NAME``, the pytest-benchmark group).
        title: what the table's "case" column shows.
        build: rng -> dict of arrays.
        impls: {implementation: inputs -> zero-argument callable}.
        flops: useful floating-point work of one call (0: not a FLOP-bound op).
        nbytes: bytes one call must move at least (memory-bound ops: reported as GB/s), or 0.
        kind: "time" (medians of interleaved calls), "memory" (peak RSS growth of one call) or
            "decode" (time per decode step and weight bandwidth; see _decode_case), or a family's
            own: "dp", "learning", "breakdown" (pretrained_cases).
        slow: implementations given fewer timed calls (the float64 twin).
        seed: the seed of the generator the inputs are built from (default 0).
        repeats: {implementation: most timed calls}, a cap on the run's counts (for calls of
            seconds).
        warm: False: no untimed calls before the timed ones (a call of seconds is its own warm-up).
        timed_first: implementations whose checking call is timed and counts as their first run
            (the calls of many seconds, run once).
        tokens: tokens one call generates (generation cases: outputs are token ids, compared
            exactly, and tokens/s is reported), or 0.
        numpy_label: what the numpy implementation is, in the notes ("numpy twin" or the model's
            "reference backend").
        exact: generation cases: the implementations whose tokens must equal the reference's (None:
            all); the others compute another function (CTranslate2's own int8 quantization), so
            their differing rows are reported, not flagged.
        float32_impl: quantized model cases: a factory like impls' of the float32 model, timed
            between the case's own calls (the row's float32_fastattn_ms), or None.
        float32_torch_impl: mixed-precision training cases (torch column: autocast bf16): a factory
            like impls' of torch in float32, timed between the case's own calls (the row's
            float32_torch_ms), or None.

    Set as attributes by the families that use them (read with getattr): ``check`` (False:
    outputs not compared), ``count_tokens`` (output -> tokens one call generated, per
    implementation, for rows that end early), ``agreement`` (note the share of rows equal to
    fastattn's), ``copy_probe``, ``matrix_mib``.
    """

    def __init__(self, name, title, build, impls, *, flops=0, nbytes=0, kind="time",
                 slow=("numpy",), seed=0, repeats=None, warm=True, timed_first=(), tokens=0,
                 numpy_label="numpy twin", exact=None, float32_impl=None,
                 float32_torch_impl=None):
        self.name, self.title, self.kind = name, title, kind
        self.flops, self.nbytes, self.slow, self.seed = flops, nbytes, tuple(slow), seed
        self.repeats, self.warm = dict(repeats or {}), warm
        self.timed_first, self.tokens = tuple(timed_first), tokens
        self.numpy_label, self.exact, self.float32_impl = numpy_label, exact, float32_impl
        self.float32_torch_impl = float32_torch_impl
        self._build, self._impls, self._inputs = build, dict(impls), None

    def __repr__(self):
        return f"Case({self.name!r})"

    @property
    def implementations(self):
        """The case's implementations, in the order of IMPLEMENTATIONS."""
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
        """A zero-argument callable running this case with one implementation.

        Args:
            impl: the implementation's name.

        Returns:
            The callable.

        Raises:
            Unavailable: the case has no such implementation, or it cannot run here.
        """
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


def _torch_backward(causal, train_step=False, bf16=False):
    """torch's SDPA backward on inputs q, k, v, dout: the forward once and autograd.grad per call
    (train_step: forward and backward per call, as a training step runs them); bf16: on bf16
    copies of them (torch's bf16 attention). -> (dq, dk, dv) as float32 NumPy arrays."""
    def factory(inputs):
        torch = require_torch()
        torch.set_num_threads(get_num_threads())
        dtype = torch.bfloat16 if bf16 else torch.float32
        q, k, v = (torch.from_numpy(inputs[t]).to(dtype).requires_grad_() for t in "qkv")
        dout = torch.from_numpy(inputs["dout"]).to(dtype)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        out = None if train_step else sdpa(q, k, v, is_causal=causal)

        def run_torch():
            o = sdpa(q, k, v, is_causal=causal) if train_step else out
            grads = torch.autograd.grad(o, (q, k, v), dout, retain_graph=not train_step)
            return tuple(g.float().numpy() for g in grads)
        return run_torch
    return factory


def _normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
