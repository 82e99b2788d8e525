"""The feed-forward activation, given as torch allows it, and the math of those the kernels do
not fuse.

torch takes ``activation`` as the string "relu" or "gelu", or as any callable. fastattn
recognises torch's own callables by name, without importing torch: the functions
``torch.nn.functional.relu`` / ``gelu`` / ``silu`` (``gelu`` is the builtin
``torch._C._nn.gelu``; also ``torch.relu`` and ``functools.partial(F.gelu,
approximate="tanh")``) and the modules ``torch.nn.ReLU()`` / ``torch.nn.GELU(approximate="none"
| "tanh")`` / ``torch.nn.SiLU()``. Each becomes a name:

    "relu", "gelu"   fused into the FFN kernel (the exact, erf form of GELU)
    "gelu_tanh"      GELU's tanh approximation (torch's approximate="tanh"), fused likewise
    "silu"           x sigmoid(x) (torch's SiLU; the "swish" of Marian models), fused likewise
                     (ops.ACTIVATIONS), forward and backward, on both backends

Any other callable (not from torch) is a plain Python function applied to the (N, F) float32
NumPy array of linear1's output, between the two linear layers; it is not fused, and it has no
derivative here, so a layer holding one runs inference only (``train()`` refuses it).
"""
import functools

import numpy as np

from ..ops import ACTIVATIONS

NAMES = tuple(name for name in ACTIVATIONS if name)  # "relu", "gelu", "gelu_tanh", "silu"

# where torch's relu / gelu functions live (F.relu is Python; F.gelu a builtin of torch._C._nn)
_TORCH_FUNCTION_HOMES = ("torch.nn.functional", "torch._C._nn", "torch",
                         "torch._C._VariableFunctions")
_TORCH_MODULE_HOME = "torch.nn.modules.activation"
_GELU_APPROXIMATE = {"none": "gelu", "tanh": "gelu_tanh"}


def resolve(activation):
    """torch's ``activation`` argument -> one of NAMES, or the plain callable itself; a
    ValueError for an unknown string, a torch callable fastattn does not compute, or anything
    that is neither a string nor callable."""
    if isinstance(activation, str):
        if activation in NAMES:
            return activation
        raise ValueError(f"activation must be 'relu' or 'gelu' (or 'gelu_tanh', torch's "
                         f"GELU(approximate='tanh'), or 'silu'), or a callable; got "
                         f"{activation!r}")
    name = torch_name(activation)
    if name is not None:
        return name
    if not callable(activation):
        raise ValueError(f"activation must be 'relu', 'gelu' or a callable, got "
                         f"{activation!r}")
    if _from_torch(activation):
        raise ValueError(f"activation {_describe(activation)} is a torch callable fastattn does "
                         "not compute: it recognises torch.nn.functional.relu / gelu / silu and "
                         "torch.nn.ReLU() / GELU(approximate='none' | 'tanh') / SiLU(); any other "
                         "activation must be a Python function over a NumPy array")
    return activation


def torch_name(fn):
    """The NAMES entry of one of torch's relu / gelu callables (duck-typed), else None."""
    if isinstance(fn, functools.partial):
        base = torch_name(fn.func)
        kw = fn.keywords or {}
        if base == "gelu" and not fn.args and set(kw) <= {"approximate"}:
            return _gelu_name(kw.get("approximate", "none"))
        return None
    cls = type(fn)
    if cls.__module__ == _TORCH_MODULE_HOME:
        if cls.__name__ == "ReLU":
            return "relu"
        if cls.__name__ == "GELU":
            return _gelu_name(getattr(fn, "approximate", "none"))
        if cls.__name__ == "SiLU":
            return "silu"
        return None
    if getattr(fn, "__module__", None) in _TORCH_FUNCTION_HOMES:
        name = getattr(fn, "__name__", None)
        if name in ("relu", "gelu", "silu"):
            return name
    return None


def _gelu_name(approximate):
    if approximate not in _GELU_APPROXIMATE:
        raise ValueError(f"activation: GELU approximate must be 'none' or 'tanh', got "
                         f"{approximate!r}")
    return _GELU_APPROXIMATE[approximate]


def _from_torch(fn):
    homes = (getattr(fn, "__module__", None), type(fn).__module__)
    return any(isinstance(m, str) and m.split(".")[0] == "torch" for m in homes)


def _describe(fn):
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def describe(activation):
    """The activation as an error message names it."""
    return repr(activation) if isinstance(activation, str) else _describe(activation)


def fused(activation):
    """True when the FFN kernel computes `activation` itself (an ops.ACTIVATIONS name)."""
    return isinstance(activation, str) and activation in ACTIVATIONS


def trainable(activation):
    """True when fastattn has the activation's derivative (every name; no plain callable)."""
    return isinstance(activation, str)


# ---- plain callables ------------------------------------------------------------------------


def apply(activation, pre):
    """act(pre) for pre (N, F) float32, linear1's output, and a plain callable activation ->
    (N, F) float32 (a new array)."""
    if callable(activation):
        y = activation(pre)
        try:
            y = np.asarray(y, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"activation {_describe(activation)} returned "
                            f"{type(y).__name__}, not an array of numbers: {exc}") from None
        if y.shape != pre.shape:
            raise ValueError(f"activation {_describe(activation)} returned shape {y.shape} "
                             f"for an input of shape {pre.shape} (it must keep the shape)")
        return np.ascontiguousarray(y)
    raise ValueError(f"activation {activation!r} has no unfused form")       # fused names
