"""The module base (parameters, children, state_dict, backends, derived weights) and the
argument checks and initialisers the modules share."""
import math
import numbers

import numpy as np

from .. import _convert, ops
from ..ops import ACTIVATIONS
from . import activations
from .backends import Buffers, Workspace, backend_ops, precision_name
from .parameter import Parameter, note_write

GRAD_ALIGN = 16          # flat_grads(): each gradient starts at a multiple of 64 bytes


class _Built(type):
    """Marks a module built once its constructor returns: parameter assignments are checked
    from then on (a constructor may set a parameter more than once)."""

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        object.__setattr__(obj, "_built", True)
        return obj


class Module(metaclass=_Built):
    """The base of every fastattn module: parameters, state_dict, backends, training and quantizing.

    Parameters are float32 arrays named in ``_params``; submodules in ``_children`` (a list
    attribute holds numbered children, as torch's ModuleList). Parameters are nn.Parameter arrays
    (float32 ndarrays that count their writes, see fastattn.nn.parameter). What is derived from a
    weight (the packed panels decode steps stream, a decode plan) is made at known points (eval(),
    quantize(), load) and never outlives a change to it: an edit through any public view (the
    attribute, state_dict() values, named_parameters(), load_state_dict, an optimiser step,
    assignment, to_backend) takes effect in the next call of every path, forward, generate and
    decode step alike. Only a write the parameter cannot see (through a plain ndarray view or a
    buffer) needs ``invalidate_caches()``.

    Rebinding a parameter (``layer.linear1.weight = w``) is checked when it happens: the new
    value must have the parameter's shape (ValueError naming the parameter and both shapes)
    and a numeric dtype (TypeError). A Parameter is taken as it is, so weights tied by
    assignment (``model.generator.weight = model.tgt_tok_emb.embedding.weight``) are one
    object, as in torch, and an edit through either name reaches every path of both; it
    trains as one parameter (one gradient, the sum over its uses; one optimiser update),
    yielded once by parameters() and named_parameters(remove_duplicate=True). Another
    array becomes a Parameter over the same memory when it is float32 and C-contiguous
    (counting its writes with the parameter whose memory it views, if any), else over a
    float32 C-contiguous copy. A parameter the module was built without (None)
    cannot be set, nor can one be set to None: build the module with the parameter you want.
    The kernels read parameters without checking them, so these checks are what keeps a
    wrong-sized array from being read past its end.

    ``quantize("int8" | "bf16")`` converts the parameters named in ``_quantizable`` (the linear
    weights) to ``ops.QuantizedWeight`` for inference; ``quantize("float32")`` converts back.

    Args:
        backend: "fast" (the default: the C kernels) or "reference" (the NumPy twin).
    """

    _params = ()
    _children = ()
    _quantizable = ()    # parameters quantize() converts: the weights of linear products

    def __init__(self, backend="fast"):
        self.backend = backend
        self.precision = "fp32"      # of the training GEMMs (set_precision)
        self._ops = backend_ops(backend)
        self._kinds = {}             # weight kinds of the parameters (_kind, _decode_weight)
        self.training = False        # train() / eval()
        self._grads = {}             # parameter name -> accumulated gradient (same shape)
        self._saved = None           # what a training-mode forward keeps for backward()
        self._dropout_seed = 0       # dropout's base seed when this module is called directly
        self._dropout_calls = 0      # training forwards so far: each draws fresh masks
        self._buffers = None         # training buffers (backends.Buffers), kept between steps
        self._compute_type = "float32"   # of this module's _quantizable weights (quantize())

    def __setattr__(self, name, value):
        if name in self._params:
            if self.__dict__.get("_built"):
                value = self._checked_parameter(name, value)
                note_write()
                if value is not self.__dict__[name]:
                    # the old parameter's gradient is not the new one's (which, for a weight
                    # tied by assignment, is the one its other name accumulates: _grad)
                    self._grads.pop(name, None)
            elif value is not None and not isinstance(value, ops.QuantizedWeight):
                value = Parameter(value)
        elif name == "_saved":
            # a training forward's record: the settings and the parameters (each with its
            # write count) its backward needs are noted with it
            object.__setattr__(self, "_saved_settings",
                               None if value is None else self._settings())
            object.__setattr__(self, "_saved_params",
                               None if value is None else self._param_versions())
        elif name[0] != "_" and self.__dict__.get("_built"):
            note_write()          # a setting or submodule changed: decode plans are made again
        object.__setattr__(self, name, value)

    def _checked_parameter(self, name, value):
        """`value` as parameter `name` may hold it (see the class docstring), or the error."""
        old = self.__dict__[name]
        where = f"{type(self).__name__}.{name}"
        if old is None or value is None:
            if old is None and value is None:
                return None
            built = "without it" if old is None else f"with it, shape {old.shape}"
            raise ValueError(f"{where}: the module was built {built}; a parameter cannot be "
                             "added or removed by assignment (build the module with the "
                             "parameters you want)")
        if isinstance(value, ops.QuantizedWeight) or isinstance(old, ops.QuantizedWeight):
            if not isinstance(value, ops.QuantizedWeight):
                raise TypeError(f"{where} holds {old.dtype} quantized weights: assign an "
                                "ops.QuantizedWeight, or quantize('float32') the model first")
            if name not in self._quantizable:
                raise TypeError(f"{where} is not a linear weight; it cannot be quantized")
            if tuple(value.shape) != tuple(old.shape):
                raise ValueError(f"{where} must keep its shape {tuple(old.shape)}, got "
                                 f"{tuple(value.shape)}")
            return value
        # a Parameter is kept as it is (weights tied by assignment share one object, as in
        # torch); Parameter() of an array over a parameter's memory shares its write count
        arr = value if isinstance(value, Parameter) else to_numpy(where, value, "assignment")
        if arr.shape != old.shape:
            raise ValueError(f"{where} must keep its shape {old.shape}, got {arr.shape}")
        return Parameter(arr)

    # -- parameters and submodules -----------------------------------------------------------
    def named_parameters(self, prefix="", remove_duplicate=False):
        """Every parameter with its state_dict key, in torch's order.

        A parameter held under two names (weights tied by assignment) is yielded under both,
        as state_dict() keys it, unless `remove_duplicate` is true.

        Args:
            prefix: put before every key (default "").
            remove_duplicate: yield a parameter held under several names once, under its first
                name, as torch's named_parameters() does by default and as an optimiser steps
                it (default False: every name, as state_dict()).

        Yields:
            `(state_dict key, array)` pairs.
        """
        if remove_duplicate:
            for key, slots in self._unique_slots(prefix):
                m, name = slots[0]
                yield key, getattr(m, name)
            return
        for key, m, name in self._named_slots(prefix):
            yield key, getattr(m, name)

    def parameters(self):
        """Every parameter array once, in torch's order (torch's parameters()): a weight tied
        by assignment is one parameter."""
        for _, p in self.named_parameters(remove_duplicate=True):
            yield p

    def _unique_slots(self, prefix=""):
        """[(first state_dict key, [(owning module, attribute name), ...])], one entry per
        parameter object in the order of its first name: the names a tied parameter is held
        under, together."""
        groups = {}
        for key, m, name in self._named_slots(prefix):
            groups.setdefault(id(getattr(m, name)), (key, []))[1].append((m, name))
        return list(groups.values())

    def _named_slots(self, prefix=""):
        """(state_dict key, owning module, attribute name) of every parameter, in order."""
        for name in self._params:
            if getattr(self, name) is not None:
                yield prefix + name, self, name
        for cname in self._children:
            child = getattr(self, cname)
            if isinstance(child, list):
                for i, c in enumerate(child):
                    yield from c._named_slots(f"{prefix}{cname}.{i}.")
            elif isinstance(child, Module):      # not None, nor a custom part that is no module
                yield from child._named_slots(f"{prefix}{cname}.")

    def modules(self):
        """This module and every submodule (fastattn modules only), depth first."""
        yield self
        for cname in self._children:
            child = getattr(self, cname)
            for c in (child if isinstance(child, list) else [child]):
                if isinstance(c, Module):
                    yield from c.modules()

    def parameters_nbytes(self):
        """The bytes the parameters take, as stored (quantized weights at their own size; a
        tied parameter counted once)."""
        return sum(v.nbytes for v in self.parameters())

    # -- weights -------------------------------------------------------------------------------
    def state_dict(self):
        """{torch key: float32 array}, in torch's order and layouts: the parameter arrays
        themselves (an in-place edit changes the model; see invalidate_caches); a parameter
        tied by assignment is there under each of its names, as in torch. In a quantized
        model the converted weights are given dequantized (what the model multiplies by, as
        float32: loadable into torch) in read-only copies, so an edit of one raises instead of
        silently changing nothing; ``named_parameters()`` yields them as they are stored."""
        return {k: _read_only(v.dequantize()) if isinstance(v, ops.QuantizedWeight) else v
                for k, v in self.named_parameters()}

    def _ignored_keys(self):
        """Keys torch has that are recomputed here rather than loaded."""
        return ()

    def load_state_dict(self, state_dict, strict=True):
        """Copy parameters from a dict of NumPy arrays or torch tensors keyed as in torch.

        strict=True: every missing key, unexpected key and shape mismatch is named in one
        ValueError. strict=False: loads what matches and returns (missing, unexpected); shape
        mismatches are still an error. Tensors are converted without importing torch here.
        What was derived from the old weights (packed decode weights) is dropped.

        Args:
            state_dict: {torch key: NumPy array or torch tensor}.
            strict: True (the default) or False, as above.

        Returns:
            `(missing, unexpected)` key lists with strict=False.

        Raises:
            TypeError: not a mapping of name -> array.
            ValueError: missing or unexpected keys (strict), or a shape mismatch (all named).
        """
        if not hasattr(state_dict, "items"):
            raise TypeError(f"load_state_dict: expected a mapping of name -> array, got "
                            f"{type(state_dict).__name__}")
        if self.compute_type != "float32":
            raise RuntimeError(f"load_state_dict into {type(self).__name__}: the model is "
                               f"quantized ({self.compute_type}); load float32 weights into a "
                               "float32 model, then quantize() it (fastattn.io.load does this "
                               "with compute_type=)")
        own = dict(self.named_parameters())
        given = {k: to_numpy(k, v).astype(np.float32) for k, v in state_dict.items()}
        ignored = set(self._ignored_keys())
        missing = [k for k in own if k not in given]
        unexpected = [k for k in given if k not in own and k not in ignored]
        mismatched = [f"{k}: expected {own[k].shape}, got {given[k].shape}"
                      for k in own if k in given and given[k].shape != own[k].shape]
        problems = []
        if mismatched:
            problems.append("shape mismatch: " + "; ".join(mismatched))
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        if problems:
            raise ValueError(f"load_state_dict into {type(self).__name__}: "
                             + " | ".join(problems))
        for k, arr in own.items():
            if k in given:
                arr[...] = given[k]                  # in place: shared views stay valid
        self.invalidate_caches()
        return missing, unexpected

    def invalidate_caches(self):
        """Count every parameter of this module and its submodules as written and make what
        was derived from them again, now (the weight kinds: bf16 training's copies are
        rounded again into their arrays, decode weights packed again). Needed only after a
        write the parameters cannot see: through a plain ndarray view (np.asarray(p),
        p.view(np.ndarray)), a buffer or foreign C code; the optimizers call it after each
        step (a known point for the kinds). Returns self."""
        for m in self.modules():
            for name in m._params:
                p = getattr(m, name)
                if isinstance(p, Parameter):
                    p._touch()
        note_write()
        self._install_kinds()
        return self

    # -- quantized inference -----------------------------------------------------------------
    @property
    def compute_type(self):
        """"float32", "int8", "bf16" or "bfloat16": how the linear weights of this module and its
        submodules are stored (see quantize); "mixed" when submodules were quantized apart."""
        kinds = {m._compute_type for m in self.modules() if m._has_quantizable()}
        if not kinds:
            return self._compute_type
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def _has_quantizable(self):
        return any(getattr(self, name) is not None for name in self._quantizable)

    def quantize(self, compute_type):
        """Convert the linear weights for inference, in place; returns self.

        - "int8": each weight row gets a symmetric scale (max |w| / 127) and int8 values; the
          products quantize their input rows the same way on the fly (to int16, with as many
          levels as the int32 sums allow), accumulate exactly in int32 and apply scale, bias
          and activation in float32 (``ops.QuantizedWeight``).
        - "bf16": weights rounded to bfloat16 (to nearest even), widened to float32 in the
          kernels; inputs stay float32, products accumulate in float32 (bf16 storage).
        - "bfloat16": the bf16 compute type (as CTranslate2's): weights stored as for "bf16",
          and each product's input rows rounded to bfloat16 too; exact products, float32
          sums (vdpbf16ps where the CPU has AVX512_BF16). Layer norms, softmax, biases,
          activations and residuals stay float32; the attention's own products follow the
          attention op's compute setting (see ``attention_compute_type``).
        - "float32": back to float32 arrays (the dequantized values: quantizing is lossy).

        Converted: the attention projections (in_proj_weight, out_proj.weight), the feed-
        forward's linear1 / linear2 weights and a Seq2SeqTransformer's generator weight.
        Embeddings, positions, layer norms, biases, the attention itself and the softmax stay
        float32. Quantizing is for inference: a quantized model refuses train(); training keeps
        its float32 weights (quantize a copy, e.g. one loaded with fastattn.io.load(path,
        compute_type="int8")). A weight already int8 is not converted to bf16 or back the
        other way (that would quantize twice): go through the float32 original.

        Args:
            compute_type: "int8", "bf16", "bfloat16" or "float32", as above.

        Returns:
            self.

        Raises:
            RuntimeError: the model is in training mode.
            ValueError: an unknown compute type, or int8 <-> bf16 directly.
        """
        compute_type = check_compute_type(compute_type)
        if self.training:
            raise RuntimeError("quantize: the model is in training mode; quantized weights are "
                               "for inference (call eval() first; training keeps float32 "
                               "weights)")
        current = {m._compute_type for m in self.modules() if m._has_quantizable()}
        if compute_type != "float32" and current - {"float32", compute_type}:
            raise ValueError(f"quantize({compute_type!r}): the weights are already "
                             f"{'/'.join(sorted(current - {'float32'}))}; converting them "
                             "again would quantize twice: start from the float32 weights")
        for m in self.modules():
            for name in m._quantizable:
                w = getattr(m, name)
                if w is None:
                    continue
                # converted in place of the weight: same shape (no assignment check)
                if compute_type == "float32":
                    if isinstance(w, ops.QuantizedWeight):
                        object.__setattr__(m, name, Parameter(w.dequantize()))
                elif not isinstance(w, ops.QuantizedWeight):
                    object.__setattr__(m, name, ops.QuantizedWeight.from_float(w, compute_type))
                note_write()
            m._compute_type = compute_type
            m._grads.clear()
            for name in m._params:
                _keep_grad(getattr(m, name), None)
            m._saved, m._buffers = None, None
        return self.invalidate_caches()     # the new weights' kinds, made now

    def _set_quantized(self, weights):
        """Install stored quantized weights {state_dict key: ops.QuantizedWeight} (all of one
        compute type) into their slots, as they are: fastattn.io.load's path (no
        requantizing)."""
        slots = {key: (m, name) for key, m, name in self._named_slots()}
        for key, w in weights.items():
            m, name = slots[key]
            if name not in m._quantizable:
                raise ValueError(f"{key} is not a linear weight; it cannot be quantized")
            if tuple(w.shape) != getattr(m, name).shape:
                raise ValueError(f"{key}: expected {getattr(m, name).shape}, got {w.shape}")
            setattr(m, name, w)
            m._compute_type = w.dtype
        return self.invalidate_caches()     # the new weights' kinds, made now

    def _kind(self, name, lo=0, hi=None):
        """Parameter `name` (its rows lo:hi when hi is given) as the weight kind this module's
        products take now (fastattn.kinds): in training, the kind of the precision (float32,
        or bf16 training's rounded copy and packs); in inference, the float32 weight or the
        QuantizedWeight. Made at the known points (train(), eval(), set_precision(), load,
        quantize(): _install_kinds) and owned here; a parameter rebound since is made again,
        one whose version moved since (an optimizer step, an edit) refreshed."""
        param = getattr(self, name)
        hit = self._kinds.get(name)
        if hit is None or hit[0] is not param:
            precision = self.precision if self.training else None
            hit = self._kinds[name] = [param, getattr(param, "version", 0),
                                       self._ops.weight_kind(param, precision), {}]
        elif hit[1] != getattr(param, "version", 0):
            hit[2].refresh()                  # in place, for the views of it already handed out
            hit[1] = param.version
            hit[3].clear()                    # row slices made again (some pack their own)
        if hi is None:
            return hit[2]
        sub = hit[3].get((lo, hi))
        if sub is None:
            sub = hit[3][(lo, hi)] = hit[2][lo:hi]
        return sub

    @staticmethod
    def _linear(kind, x, bias, activation=None, out=None):
        """act(x (N, K) @ w.T + bias) -> (N, M), the product of the weight's kind, into `out`
        (a new array when None)."""
        if out is None:
            out = np.empty((x.shape[0], kind.shape[0]), np.float32)
        return kind.product(bias, ACTIVATIONS[activation])(x, out)

    def _decode_weight(self, name, rows=None):
        """Parameter `name` (its first `rows` rows when given) in the kind decode steps multiply
        by. In inference that is the inference kind itself (_kind: a float32 weight's packed
        panels, a prefix of rows a view of them), so the forwards and the steps share one
        packed copy. In training mode (a decode step run there), the ops table's decode_kind,
        kept while the parameter is the same array at the same version and made again here
        after a change."""
        if not self.training:                # the inference kind is the decode kind too
            return self._kind(name) if rows is None else self._kind(name, 0, rows)
        param = getattr(self, name)
        version = getattr(param, "version", 0)
        hit = self._kinds.get(("decode", name, rows))
        if hit is not None and hit[0] is param and hit[1] == version:
            return hit[2]
        kind = self._ops.decode_kind(param if rows is None else param[:rows])
        self._kinds[("decode", name, rows)] = (param, version, kind)
        return kind

    def _install_kinds(self):
        """Make the kinds of this module's and its submodules' linear weights for the current
        mode, precision and backend now (a known point), and, in inference, those decode steps
        stream. Returns self."""
        for m in self.modules():
            for name in m._quantizable:
                if getattr(m, name) is not None:
                    m._kind(name)
            if not m.training:
                m._prepare_decode()
        return self

    def _prepare_decode(self):
        """Make the decode kinds of the weights this module's decode steps use (eval()); a
        module without decode steps has none."""

    # -- training ------------------------------------------------------------------------------
    def train(self, mode=True):
        """Training mode for this module and its submodules.

        In training mode, forwards apply dropout and keep what backward() needs.

        Args:
            mode: True (the default) for training, False for inference (as `eval()`).

        Returns:
            self.

        Raises:
            RuntimeError: a module that cannot train (a quantized model, an activation without
                a derivative, a custom part without a backward), naming why; nothing changes.
        """
        if mode and self.compute_type != "float32":
            raise RuntimeError(f"train: the model is quantized ({self.compute_type}), which is "
                               "for inference only; train the float32 model (quantize("
                               "'float32') converts back, with the quantized values)")
        if mode:
            for m in self.modules():
                m._check_trainable()
        for m in self.modules():
            m.training = bool(mode)
            m._kinds.clear()                  # the other mode's kinds: not needed now
            if not mode:
                m._saved = None
                m._buffers = None
        return self._install_kinds()

    def _check_trainable(self):
        """Raise (RuntimeError naming the argument) when this module cannot run a training
        forward and backward; every module can unless it says otherwise."""

    def eval(self):
        """Inference mode (no dropout, nothing kept for backward). Returns self."""
        return self.train(False)

    def manual_seed(self, seed):
        """Set the base seed of the dropout masks of the training forwards called on this module.

        Each forward draws new masks from it: a pure function of the seed and the call count,
        so a run repeats exactly.

        Args:
            seed: a non-negative int.

        Returns:
            self.
        """
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"manual_seed: seed must be a non-negative int, got {seed!r}")
        self._dropout_seed, self._dropout_calls = int(seed) % 2 ** 64, 0
        return self

    def named_grads(self):
        """(state_dict key, gradient) of every parameter that has one, in named_parameters'
        order; gradients accumulate over backward() calls until zero_grad(). A parameter tied
        by assignment has one gradient, the sum over its uses (as torch's .grad), yielded
        once under its first name, as named_parameters(remove_duplicate=True) yields it."""
        for key, slots in self._unique_slots():
            g = next((m._grads[name] for m, name in slots if name in m._grads), None)
            if g is not None:
                yield key, g

    def zero_grad(self):
        """Zero every accumulated gradient in place (the arrays are kept for the next step)."""
        for m in self.modules():
            for g in m._grads.values():
                g.fill(0.0)

    def flat_grads(self):
        """Every parameter's gradient as a view of one float32 array, which is returned.

        The array holds the gradients in named_parameters' order, each at an offset that is a
        multiple of GRAD_ALIGN floats (the gaps stay zero); from the first call on, the views
        are the arrays that backward() accumulates into, that named_grads() yields (every
        parameter then has a gradient, zero until a backward reaches it) and that zero_grad()
        zeroes. A data-parallel step sums this one array across processes in one call instead
        of one call per parameter. Gradients accumulated before the call are copied in. Later
        calls return the same array while the views are still the gradients (quantize() drops
        them; a new array is then made)."""
        if self.compute_type != "float32":
            raise RuntimeError(f"flat_grads: the model is quantized ({self.compute_type}), "
                               "which is for inference only")
        flat = self.__dict__.get("_flat_grads")
        groups = [slots for _, slots in self._unique_slots()]   # a tied parameter: one view
        if flat is not None and all(
                name in m._grads and m._grads[name].base is flat and
                m._grads[name] is slots[0][0]._grads.get(slots[0][1])
                for slots in groups for m, name in slots):
            return flat
        offsets, size = [], 0
        for slots in groups:
            offsets.append(size)
            n = getattr(*slots[0]).size
            size += -(-n // GRAD_ALIGN) * GRAD_ALIGN
        flat = np.zeros(size, np.float32)
        for slots, at in zip(groups, offsets):
            p = getattr(*slots[0])
            view = flat[at:at + p.size].reshape(p.shape)
            olds = {id(g): g for g in (m._grads.get(name) for m, name in slots)
                    if g is not None}
            for old in olds.values():
                view += old
            for m, name in slots:
                m._grads[name] = view
            _keep_grad(p, view)
        object.__setattr__(self, "_flat_grads", flat)
        return flat

    def _grad(self, name):
        """The gradient buffer of parameter `name` (zeros, created on first use). It is the
        Parameter's (as torch's .grad), so a parameter tied by assignment has one buffer,
        whichever of its modules made it."""
        g = self._grads.get(name)
        if g is None:
            p = getattr(self, name)
            g = p.__dict__.get("_grad_buffer")
            if g is None:
                g = np.zeros_like(p)
                _keep_grad(p, g)
            self._grads[name] = g
        return g

    def _workspace(self):
        """The workspace of one public forward: a training one (dropout seeds drawn from this
        module's base seed and call count) in training mode."""
        if not self.training:
            return Workspace(self._ops)
        ws = Workspace(self._ops, training=True, seed=self._dropout_seed,
                       call=self._dropout_calls)
        self._dropout_calls += 1
        return ws

    def _bufs(self):
        """This module's training buffers (backends.Buffers): on the fast backend in training
        mode they are kept from step to step (a warmed-up step allocates no arrays; eval()
        frees them); otherwise every request is a new array."""
        if not self.training or not self._ops.reuses_buffers:
            return _FRESH
        if self._buffers is None:
            self._buffers = Buffers(reuse=True)
        return self._buffers

    def _dropout(self, x, p, ws):
        """Dropout of x in a training forward, in place (x is a buffer the caller owns) ->
        (x, seed for the backward or None)."""
        if not ws.training or p == 0.0:
            return x, None
        seed = ws.seed()
        return self._ops.dropout(x, p, seed, x), seed

    def _dropout_backward(self, dy, p, seed, out):
        """Dropout's backward of dy into out (dy itself when no dropout was applied)."""
        return dy if seed is None else self._ops.dropout_backward(dy, p, seed, out)

    def _check_saved(self, what="backward"):
        """The pending training forward's record, taken (a forward is differentiated once);
        a RuntimeError, with the record kept and nothing touched, when there is none, when
        the backend, precision or mode of this module or a submodule changed since it, or
        when a parameter was written in place or replaced since it (torch raises there too:
        the backward would pair the new weights with the old activations)."""
        if self._saved is None:
            raise RuntimeError(f"{type(self).__name__}.{what}: no training-mode forward to "
                               "differentiate (call model.train() and run a forward first; "
                               "each forward is differentiated once)")
        then, now = self._saved_settings, self._settings()
        if now != then:
            changed = [f"{name or type(self).__name__}: {_setting_text(a)} -> "
                       f"{_setting_text(b)}" for (name, _, *a), (_, _, *b) in zip(then, now)
                       if a != b]
            if len(changed) > 3:
                changed[3:] = [f"{len(changed) - 3} submodules more"]
            if [s[:2] for s in then] != [s[:2] for s in now] or not changed:
                changed = ["submodules were replaced"]
            raise RuntimeError(
                f"{type(self).__name__}.{what}: the backend, precision, mode or submodules "
                f"changed since the training forward ({'; '.join(changed)}); that forward's "
                "record is only valid for the settings it ran with, and no gradient was "
                "touched. Change them back, or run the forward again after the change")
        edited = [key for (key, p, version), (_, q, now) in
                  zip(self._saved_params, self._param_versions()) if p is not q or version != now]
        if edited:
            if len(edited) > 3:
                edited[3:] = [f"{len(edited) - 3} more"]
            raise RuntimeError(
                f"{type(self).__name__}.{what}: {', '.join(edited)} "
                f"{'was' if len(edited) == 1 else 'were'} modified since the training forward "
                "(written in place, e.g. by an optimizer step, load_state_dict or p[...] = ..., "
                "or replaced); the backward would use the new weights with the old "
                "activations. No gradient was touched: run the forward again")
        saved, self._saved = self._saved, None
        return saved

    def _param_versions(self):
        """(state_dict key, parameter, write count) of every parameter of this module and its
        submodules: what a training forward's record is valid for."""
        return tuple((key, p, getattr(p, "version", 0))
                     for key, p in self.named_parameters())

    def _settings(self, prefix=""):
        """(path, id, backend, precision, training) of this module (path "") and of each
        submodule, depth first: the modules and settings a training forward's record is valid
        for."""
        out = [(prefix.rstrip("."), id(self), self.backend, self.precision, self.training)]
        for cname in self._children:
            child = getattr(self, cname)
            if isinstance(child, list):
                for i, c in enumerate(child):
                    out.extend(c._settings(f"{prefix}{cname}.{i}."))
            elif isinstance(child, Module):
                out.extend(child._settings(f"{prefix}{cname}."))
        return tuple(out)

    # -- backends ------------------------------------------------------------------------------
    def to_backend(self, backend):
        """Switch this module and every submodule to another backend.

        Args:
            backend: "fast" (the C kernels) or "reference" (the NumPy twin).

        Returns:
            self.
        """
        ops_ = backend_ops(backend)
        for m in self.modules():
            m.backend, m._ops, m._buffers = backend, ops_, None
            m._kinds.clear()                    # made by (or refused by) the old backend
        note_write()                            # decode plans are made again
        return self._install_kinds()

    def set_precision(self, precision):
        """Set the precision of training on every submodule.

        "bf16" is mixed precision with torch autocast's meaning: the products of every
        training forward and backward (the linear layers' x W^T, dY W and dY^T x, the FFN's,
        attention's Q K^T, P V and their gradients) take operands rounded to bf16 and sum in
        float32. The parameters, their gradients, the optimizer and its update stay float32
        (the master weights); each weight's bf16 copy is made once per optimizer step. Layer
        norm, softmax, dropout, the residual stream, the embeddings and the loss stay float32.
        Inference (eval() forwards, generate) is not changed: that is quantize()'s compute
        type. A loop of your own: ``model.set_precision("bf16")`` once, then train as in
        float32 (see docs/training.md).

        Args:
            precision: "fp32" (the default, also "float32") or "bf16" (also "bfloat16").

        Returns:
            self.
        """
        name = precision_name(precision)
        for m in self.modules():
            if m.precision != name:
                m.precision = name
                m._kinds.clear()              # the other precision's kinds: dropped now
        return self._install_kinds()


def _keep_grad(param, grad):
    """Keep `grad` (None: drop it) as the gradient buffer of `param`, which every module
    holding `param` accumulates into (Module._grad)."""
    if isinstance(param, Parameter):
        if grad is None:
            param.__dict__.pop("_grad_buffer", None)
        else:
            param.__dict__["_grad_buffer"] = grad


def _setting_text(setting):
    backend, precision, training = setting
    return f"{backend}/{precision}/{'train' if training else 'eval'}"


_FRESH = Buffers(reuse=False)     # the buffers of inference and of the reference backend


# ---- conversions, checks and initialisers shared by the modules --------------------------------

def to_numpy(key, value, what="load_state_dict"):
    """A state_dict value or a parameter being set (NumPy array or torch tensor, duck-typed)
    as a NumPy array of its own dtype; TypeError for what is not numeric."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().float().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what}: {key} is not an array ({type(value).__name__}: {exc})") \
            from None
    if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
        raise TypeError(f"{what}: {key} has non-numeric dtype {arr.dtype}")
    return arr


def _read_only(arr):
    arr.flags.writeable = False
    return arr


def rng_from(seed):
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def uniform(rng, shape, bound):
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def xavier(rng, shape):
    """torch's xavier_uniform_: fans (out, in) of the first two axes times the rest."""
    field = math.prod(shape[2:])
    fan_out, fan_in = shape[0] * field, shape[1] * field
    return uniform(rng, shape, math.sqrt(6.0 / (fan_in + fan_out)))


def check_positive(name, value):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_dropout(p):
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1), got {p!r}")
    return float(p)


COMPUTE_TYPES = ("float32", "int8", "bf16", "bfloat16")


def check_compute_type(compute_type):
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type must be one of {', '.join(map(repr, COMPUTE_TYPES))}, "
                         f"got {compute_type!r}")
    return compute_type


def check_activation(activation):
    """torch's activation argument -> "relu" | "gelu" | "gelu_tanh" | "silu" | a plain callable
    (see activations.resolve)."""
    return activations.resolve(activation)


class Layout:
    """Where a public call's arrays sit in torch's layouts, and the way to fastattn's
    batch-first (B, L, C) and back: batch_first=False is (L, B, C); an unbatched input is (L, C)
    (torch decides by the rank of the first input: 2), its key padding mask (S,). Inside,
    every module runs batch-first; only the public calls (and backward) convert."""

    __slots__ = ("batch_first", "unbatched")

    def __init__(self, batch_first, first):
        self.batch_first = batch_first
        self.unbatched = np.ndim(first) == 2

    @property
    def identity(self):
        return self.batch_first and not self.unbatched

    def features_in(self, x, name="input"):
        """An input (or gradient) named `name` in the caller's layout -> (B, L, C) (a view),
        or a ValueError when its rank does not fit the layout."""
        if x is None or self.identity:
            return x
        a = np.asarray(x)
        if self.unbatched:
            if a.ndim != 2:
                raise ValueError(f"{name} must be unbatched (L, C) like the first input, got "
                                 f"shape {a.shape} (give every input a batch axis or none)")
            return a[None]
        if a.ndim != 3:
            raise ValueError(f"{name} must be (L, B, C) (batch_first=False) or unbatched "
                             f"(L, C), got shape {a.shape}")
        return a.swapaxes(0, 1)

    def padding_in(self, mask):
        """A key padding mask: (S,) -> (1, S) when unbatched."""
        if mask is None or not self.unbatched:
            return mask
        m = np.asarray(mask)
        return m[None] if m.ndim == 1 else m

    def features_out(self, y):
        """(B, L, C) -> the caller's layout (C-contiguous)."""
        if self.identity:
            return y
        return y[0] if self.unbatched else np.ascontiguousarray(y.swapaxes(0, 1))

    def weights_out(self, w):
        """Attention weights (B, ...) -> without the batch axis when unbatched (torch returns
        them batch-major whatever batch_first says)."""
        return w[0] if w is not None and self.unbatched else w


def check_batch_first(batch_first):
    """torch's batch_first flag as a bool (both layouts are taken; see Layout)."""
    return bool(batch_first)


def check_batch(name, x, B):
    if x.shape[0] != B:
        raise ValueError(f"{name} has batch {x.shape[0]} but the input has batch {B} "
                         f"(shapes {x.shape})")


def features(name, x, C, ndim=3):
    """x as float32 (B, L, C) C-contiguous (a copy only when needed); ndim=2: (R, C)."""
    x = _convert.array(x, name, "forward")
    if x.ndim != ndim or x.shape[-1] != C:
        shape = "(B, L, d_model) = (B, L, " if ndim == 3 else "(rows, d_model) = (rows, "
        raise ValueError(f"{name} must be {shape}{C}), got {x.shape}")
    return contiguous(x)


def contiguous(x):
    """x C-contiguous and aligned (the kernels read whole floats): a copy only when needed."""
    return np.require(x, requirements=("C", "A"))


def token_ids(name, ids, V):
    """Integer token ids in [0, V) as int64, or a TypeError / ValueError naming them."""
    a = np.asarray(ids)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer token ids, got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= V):
        bad = a[(a < 0) | (a >= V)].ravel()[0]
        raise ValueError(f"{name}: token id {int(bad)} is out of range for a vocabulary of "
                         f"{V} (ids must be in [0, {V - 1}])")
    return a.astype(np.int64, copy=False)
