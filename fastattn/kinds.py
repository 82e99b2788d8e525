"""Weight kinds: a linear layer's weight as an object that owns its derived forms and makes its
own products.

Every product of a linear layer or a feed-forward, in inference, in training and in the public
``fastattn.ops.linear`` / ``ffn``, goes through the weight's kind:

```text
=====================  ===============================================  =======================
kind                   what it owns                                     products
=====================  ===============================================  =======================
Float32Weight          a float32 (M, K) array (a parameter, a slice)   the GEMM engine, the
                                                                        weight packed per call;
                                                                        fp32 training's products
PackedFloat32Weight    that array and its panels, packed once           every product streams
                       (inference: eval(), load, quantize('float32'))   the panels (any rows)
Int8Weight             int8 values, per-row scales, their packed copy  the int8 kernels
Bf16Weight             bf16 bits, their packed copy                    bf16 storage, float32
                                                                        compute
Bfloat16Weight         bf16 bits, their packed copy                    the bfloat16 compute
                                                                        type
Bf16TrainingWeight     a float32 parameter's bf16-rounded copy and     bf16 mixed-precision
                       its packs for the bf16 tiles                     training's products
=====================  ===============================================  =======================
```

Int8Weight, Bf16Weight and Bfloat16Weight are the public ``QuantizedWeight``
(``QuantizedWeight.from_float(w, dtype)`` makes the one of its dtype). Each kind has
``shape``, ``rows(lo, hi)`` (the kind of a row slice, sharing what can be shared) and
``product(bias, act, rows=0) -> f(x, y)``: the product for x of ``rows`` rows (0: any),
chosen now. The kinds that train (Float32Weight, Bf16TrainingWeight) also have
``train_forward`` and ``train_backward``; the feed-forward is its first weight's
``ffn_product``, ``ffn_train`` and ``ffn_backward`` (the functions of the same names below,
over two kinds). The reference backend's kind (fastattn.nn.backends.TwinWeight) answers the
same calls with the NumPy twin, so the model layer calls the kinds alone. Every derived form
is made when its kind is made (nothing is packed on first use); the modules of fastattn.nn
make the kinds at known points (train(), eval(), set_precision(), quantize(), load, an
optimizer step; an edit is seen at the next use, by the parameter's version) and drop them
when the mode that needs them ends.

Arguments are trusted (float32, C-contiguous, shapes consistent): the callers check them.
Activations are FA_ACT codes (fastattn._checks.ACTIVATIONS). This module sits below both
twins: it imports only the kernel calls (fastattn._fast), the binding and the shared checks,
so fastattn.reference can name QuantizedWeight without reaching up.
"""
import math
import threading

import numpy as np

from . import _checks, _convert, _fast, _kernels
from ._fast import round_bf16
from ._runtime import tiles
from ._runtime import get_num_threads, quant_tiles

__all__ = ["WeightKind", "Float32Weight", "PackedFloat32Weight", "QuantizedWeight",
           "Int8Weight", "Bf16Weight", "Bfloat16Weight", "Bf16TrainingWeight", "of",
           "weight_kind", "decode_kind",
           "ffn_product", "ffn_train", "ffn_backward", "INT8_MAX_K"]

PANEL = tiles()["packed_panel"]      # output features per packed float32 panel
INT8_MAX_K = _kernels.int8_max_k()    # = reference.INT8_MAX_K: K * 127 * 127 fits an int32

# bf16 products of up to this many rows stream a packed copy; more rows widen the weight to
# float32 and run the fp32 GEMM
BF16_PACKED_MAX_ROWS = quant_tiles()["bf16_packed_max_rows"]

# "int8" and "bf16" (bf16 weights, float32 compute) are storage types for products in float32
# or int32 sums; "bfloat16" is the bf16 compute type: both operands of each product rounded to
# bfloat16 (reference._linear_bfloat16). bf16 and bfloat16 weights hold the same bits.
QUANT_DTYPES = ("int8", "bf16", "bfloat16")

# bfloat16 compute: features per packed panel, K per group (pairs), for every bfloat16 path
BFLOAT16_PANEL, BFLOAT16_GROUP = quant_tiles()["bfloat16_panel"], 2


class WeightKind:
    """The base of the kinds (see the module docstring): what every kind answers."""

    __slots__ = ()
    kind = None           # its name (the docs' table of kinds)
    bf16 = False          # its training products take bf16-rounded operands

    def rows(self, lo, hi):
        """The kind of rows lo:hi of this weight, sharing what can be shared.

        Args:
            lo: the first row.
            hi: the end row (excluded).

        Returns:
            A kind.
        """
        raise NotImplementedError

    def __getitem__(self, key):
        """w[lo:hi]: rows(lo, hi) (row slices only)."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            name = "QuantizedWeight" if isinstance(self, QuantizedWeight) else type(self).__name__
            raise TypeError(f"{name}: only row slices w[lo:hi] are supported, got {key!r}")
        lo, hi, _ = key.indices(self.shape[0])
        return self.rows(lo, max(lo, hi))

    def refresh(self):
        """Make the derived forms again from the weight's current values (a kind without any:
        nothing to do)."""

    def product(self, bias, act, rows=0):
        """The product of this weight, chosen now: f(x, y) writes y = act(x @ w.T + bias).

        Args:
            bias: (M,) float32 bias, or None.
            act: the activation's code (fastattn._checks.ACTIVATIONS: 0 none, 1 relu, ...).
            rows: the rows x will have, or 0 (the default) for any.

        Returns:
            `f(x, y)`: x (N, K) float32 in, y (N, M) float32 out.
        """
        raise NotImplementedError

    def fused_operand(self, rows):
        """The float32 (M, K) array the fused FFN kernel reads, if this kind has one.

        Args:
            rows: the rows x will have (0: any).

        Returns:
            The array, or None where this kind's own product is the one to run (see
                ffn_product).
        """
        return None

    # the feed-forward, as this kind (its first weight's) makes it: see the functions below
    def ffn_product(self, b1, w2, b2, act, rows=0):
        """The module function `ffn_product` with this kind as w1.

        Args:
            b1: as `ffn_product`'s.
            w2: as `ffn_product`'s.
            b2: as `ffn_product`'s.
            act: as `ffn_product`'s.
            rows: as `ffn_product`'s (default 0: any).

        Returns:
            As `ffn_product`.
        """
        return ffn_product(self, b1, w2, b2, act, rows)

    def ffn_train(self, x, b1, w2, b2, act, dropout_p, seed, y, pre):
        """The module function `ffn_train` with this kind as w1.

        Args:
            x: as `ffn_train`'s.
            b1: as `ffn_train`'s.
            w2: as `ffn_train`'s.
            b2: as `ffn_train`'s.
            act: as `ffn_train`'s.
            dropout_p: as `ffn_train`'s.
            seed: as `ffn_train`'s.
            y: as `ffn_train`'s.
            pre: as `ffn_train`'s.

        Returns:
            y.
        """
        return ffn_train(x, self, b1, w2, b2, act, dropout_p, seed, y, pre)

    def ffn_backward(self, dy, x, b1, w2, b2, pre, act, dropout_p, seed, grads, dx, h):
        """The module function `ffn_backward` with this kind as w1.

        Args:
            dy: as `ffn_backward`'s.
            x: as `ffn_backward`'s.
            b1: unused (the bias gradient needs no bias).
            w2: as `ffn_backward`'s.
            b2: unused.
            pre: as `ffn_backward`'s.
            act: as `ffn_backward`'s.
            dropout_p: as `ffn_backward`'s.
            seed: as `ffn_backward`'s.
            grads: as `ffn_backward`'s.
            dx: as `ffn_backward`'s.
            h: as `ffn_backward`'s.

        Returns:
            dx.
        """
        return ffn_backward(dy, x, self, w2, pre, act, dropout_p, seed, grads, dx, h)


def of(weight):
    """A weight as a kind: a kind as it is, a float32 array wrapped in Float32Weight.

    Args:
        weight: a kind, or a float32 (M, K) array.

    Returns:
        The kind.
    """
    return weight if isinstance(weight, WeightKind) else Float32Weight(weight)


# ---- which kind a weight takes: the one place that chooses (the model layer asks here) -------

def weight_kind(weight, precision=None):
    """The kind of a parameter for a module's products: the one place that chooses.

    Args:
        weight: a float32 parameter, or a kind (returned as it is: a QuantizedWeight).
        precision: "fp32" (training: a Float32Weight, packed per call since the weight changes
            every step), "bf16" (training: a Bf16TrainingWeight, its bf16 copy and packs made
            now) or None (the default, inference: a PackedFloat32Weight, its panels packed now,
            once).

    Returns:
        The kind.
    """
    if isinstance(weight, WeightKind):
        return weight
    if precision == "bf16":
        return Bf16TrainingWeight(weight)
    if precision is None:
        return PackedFloat32Weight(weight)
    return Float32Weight(weight)


def decode_kind(weight):
    """The kind decode steps multiply a weight by.

    Args:
        weight: a float32 array (its panels packed: PackedFloat32Weight, the inference kind)
            or a QuantizedWeight (its own kind).

    Returns:
        The kind.
    """
    if isinstance(weight, WeightKind):
        return weight
    return PackedFloat32Weight(weight)


# ---- float32 ---------------------------------------------------------------------------------

class Float32Weight(WeightKind):
    """A float32 (M, K) weight as it is: the GEMM engine (the weight packed by each call) with a
    fused epilogue, and fp32 training's products (the forward
    keeps the pre-activation; the backward accumulates dW and db).

    Args:
        data: the float32 (M, K) array (a parameter, a slice), used as it is.
    """

    __slots__ = ("data", "shape")
    kind = "float32"

    def __init__(self, data):
        self.data, self.shape = data, data.shape

    def rows(self, lo, hi):
        return Float32Weight(self.data[lo:hi])

    def product(self, bias, act, rows=0):
        w, linear_into = self.data, _fast.linear_into
        return lambda x, y: linear_into(y, x, w, bias, act)

    def fused_operand(self, rows):
        return self.data

    def fused_panels(self):
        """The packed form the fused FFN kernel reads (None: it packs per call)."""
        return None

    # training: the operands the training kernels read (bf16 kinds round and pack them)
    def train_input(self, x, slot):
        """x as the training products read it (this kind: x itself).

        Args:
            x: the input, float32.
            slot: the thread's scratch buffer a rounding kind writes into.

        Returns:
            The operand.
        """
        return x

    def train_operand(self, trans):
        """The weight as the training kernels read it.

        Args:
            trans: 1 for the forwards' w.T, 0 for the input gradients' w.

        Returns:
            `(array, pack)`: the weight array and its pack for the bf16 tiles, or None.
        """
        return self.data, None

    def train_forward(self, x, bias, act, y, pre):
        """The training forward y = act(x w^T + bias), keeping the pre-activation.

        Args:
            x: (N, K) input.
            bias: (M,) bias, or None.
            act: the activation's code.
            y: (N, M) output, written.
            pre: (N, M) pre-activation, written (None without an activation).

        Returns:
            y.
        """
        w, packed = self.train_operand(1)
        return _fast.linear_into(y, self.train_input(x, "x"), w, bias, act,
                                 pre if act else None, self.bf16, packed)

    def train_backward(self, dy, x, pre, act, dw, db, dx):
        """The training backward: dx = dZ w, dw += dZ^T x, db += the column sums of dZ.

        `pre` may be overwritten (it is not needed after).

        Args:
            dy: (N, M) the output gradient.
            x: (N, K) the forward's input.
            pre: the forward's pre-activation (None without an activation).
            act: the activation's code.
            dw: (M, K) accumulated.
            db: (M,) accumulated, or None.
            dx: (N, K) overwritten, or None when not wanted.

        Returns:
            dx.
        """
        w, packed = self.train_operand(0 if dx is not None else None)
        dz = pre if act else (scratch(dy.shape, "dz") if self.bf16 else None)
        _fast.linear_backward_into(dx, dw, db, dy, self.train_input(x, "x"), w, pre, act, True,
                                   dz=dz, bf16=self.bf16, packed=packed)
        return dx


class PackedFloat32Weight(Float32Weight):
    """A float32 (M, K) weight with its panels packed for the GEMM engine (fa_pack_panels'
    layout: panels of PANEL output features, all of K): every product streams the panels, none
    packs, whatever its rows (a decode step's one row reads each panel once, in order). Made
    in inference (eval(), load, quantize('float32')); ``refresh()`` repacks in place, so the
    kinds of its row slices that share the panels see the new values too.

    Args:
        data: the float32 (M, K) array.
        panels: its packed panels, or None (the default) to pack them now.
    """

    __slots__ = ("panels",)
    kind = "float32-packed"

    def __init__(self, data, panels=None):
        super().__init__(data)
        self.panels = panels if panels is not None or not data.size else pack_panels(data)

    def refresh(self):
        if self.panels is not None:
            _kernels.pack_panels(self.panels, self.data, get_num_threads())

    def rows(self, lo, hi):
        """Rows lo:hi: a view of the panels when lo starts a panel, else packed anew.

        A view for a prefix (the in-projection of queries); other rows are packed anew from
        the data's rows.

        Args:
            lo: the first row.
            hi: the end row (excluded).

        Returns:
            A PackedFloat32Weight.
        """
        if self.panels is None or hi <= lo or lo % PANEL:
            return PackedFloat32Weight(self.data[lo:hi])
        K = self.shape[1]
        start = lo // PANEL * PANEL * K
        size = _kernels.packed_size(hi - lo, K)
        return PackedFloat32Weight(self.data[lo:hi], self.panels[start:start + size])

    def product(self, bias, act, rows=0):
        if self.panels is None:
            return super().product(bias, act, rows)
        wp, kernel = self.panels, _kernels.linear_packed_forward

        def packed(x, y):               # the kernel call itself: a decode step's hot path
            kernel(y, x, wp, bias, act, get_num_threads())
            return y
        return packed

    def fused_panels(self):
        return self.panels


def pack_panels(weight):
    """A float32 (M, K) weight's panels for the few-row kernel (fa_pack_panels' layout), as a
    new float32 array."""
    w = _convert.contig(weight, "weight", "PackedWeight")
    _checks.ndim(w, 2, "weight", "PackedWeight", "(out_features, in_features)")
    panels = np.empty(_kernels.packed_size(*w.shape), np.float32)
    _kernels.pack_panels(panels, w, get_num_threads())
    return panels


# ---- bf16 mixed-precision training -------------------------------------------------------------

_SCRATCH = threading.local()     # this thread's buffers for rounded activations, by slot


def scratch(shape, slot):
    """A float32 array of `shape` in this thread's scratch buffer `slot`, reused from call to
    call: valid until the next call with that slot on this thread (an op fills it, uses it and
    returns)."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    n = math.prod(shape)
    buf = bufs.get(slot)
    if buf is None or buf.size < n:
        buf = bufs[slot] = np.empty(n, np.float32)
    return buf[:n].reshape(shape)


def rounded(x, slot):
    """x rounded to bf16 (as float32 values) into this thread's scratch buffer `slot`."""
    return round_bf16(x, scratch(x.shape, slot))


class Bf16TrainingWeight(Float32Weight):
    """bf16 mixed-precision training's form of a float32 parameter (precision "bf16"): its
    values rounded to bf16 (held as float32s, ``data``) and that copy packed for the bf16
    tiles' products (the forwards' w^T and the input gradients' w; None where the CPU's bf16
    path is not the tiles), all made when the kind is made. The training products round their
    activations the same way and sum in float32 (ops' compute_type "bfloat16").

    ``refresh()`` makes it again from the parameter's new values (after an optimizer step),
    rounding into the same array (no fresh pages every step) and packing again; the kinds of
    its row slices (``rows``) follow. About four bytes per weight element (the copy and its
    packs); the module that owns the parameter drops it when training in bf16 ends.

    Args:
        source: the float32 parameter (or a row slice of one).
        data: the rounded copy to use (a row slice's: a view of its parent's); None (the
            default) rounds it now.
    """

    __slots__ = ("source", "_packs", "_slices")
    kind = "bf16-training"
    bf16 = True

    def __init__(self, source, data=None):
        """Round and pack now (the class documents the arguments)."""
        super().__init__(round_bf16(source) if data is None else data)
        self.source = source
        self._slices = {}
        self._pack()

    def _pack(self):
        self._packs = {trans: _fast.bf16_weight_pack(self.data, trans) for trans in (1, 0)}

    def refresh(self):
        """The parameter's current values rounded into the same copy, packed again (and every
        row slice's packs)."""
        round_bf16(self.source, self.data)
        self._pack()
        for sub in self._slices.values():
            sub._pack()

    def rows(self, lo, hi):
        if (lo, hi) == (0, self.shape[0]):
            return self
        sub = self._slices.get((lo, hi))
        if sub is None:
            sub = self._slices[(lo, hi)] = Bf16TrainingWeight(self.source[lo:hi],
                                                              self.data[lo:hi])
        return sub

    def train_input(self, x, slot):
        return rounded(x, slot)

    def train_operand(self, trans):
        return self.data, (None if trans is None else self._packs[trans])

    def product(self, bias, act, rows=0):
        raise RuntimeError("a bf16 training copy has no inference product (eval() uses the "
                           "float32 weights)")


# ---- the feed-forward over two kinds -----------------------------------------------------------

def ffn_product(w1, b1, w2, b2, act, rows=0):
    """The FFN y (rows, C) = act(x @ w1.T + b1) @ w2.T + b2 for x of `rows` rows (0: any),
    chosen now: f(x, y) -> y. Two kinds whose fused operands are float32 arrays run the fused
    kernel (the hidden (N, F) made in row blocks, never whole); otherwise two products (each
    kind's own, the activation in the first one's epilogue) through a hidden buffer of `rows`
    rows kept by the function (or made per call when rows is 0). A float32 array counts as
    its Float32Weight. Two bfloat16 weights and any number of rows (rows = 0: a pass, not a
    decode step's few rows) run as one call whose hidden is held as bf16 bits, which the second
    product would round it to anyway: the same bits, with a quarter of the hidden's memory
    traffic (fa_ffn_bfloat16_forward).

    Args:
        w1: the first weight, a kind or a float32 (F, C) array.
        b1: (F,) bias, or None.
        w2: the second weight, a kind or a float32 (C, F) array.
        b2: (C,) bias, or None.
        act: the activation's code.
        rows: the rows x will have, or 0 (the default) for any.

    Returns:
        `f(x, y)`: x (N, C) in, y (N, C) out.
    """
    w1, w2 = of(w1), of(w2)
    d1, d2 = w1.fused_operand(rows), w2.fused_operand(rows)
    if d1 is not None and d2 is not None:
        p1, p2 = w1.fused_panels(), w2.fused_panels()
        return lambda x, y: _fast.ffn_into(y, x, d1, b1, d2, b2, act, p1, p2)
    if rows == 0 and isinstance(w1, Bfloat16Weight) and isinstance(w2, Bfloat16Weight):
        return lambda x, y: _ffn_bfloat16(x, y, w1, b1, w2, b2, act)
    first, second = w1.product(b1, act, rows), w2.product(b2, 0, rows)
    F = w1.shape[0]
    hidden = np.empty((rows, F), np.float32) if rows > 0 else None

    def two(x, y):
        h = hidden if hidden is not None else np.empty((x.shape[0], F), np.float32)
        return second(first(x, h), y)
    return two


def _ffn_bfloat16(x, y, w1, b1, w2, b2, act):
    """ffn_product's one call for two bfloat16 weights (any rows, an empty sum or hidden
    included: the kernel answers them as the two products would)."""
    F = w1.shape[0]
    _kernels.ffn_bfloat16_forward(y, x, w1._kernel_arrays()[1], b1, w2._kernel_arrays()[1], b2,
                                  F, act, get_num_threads())
    return y


def ffn_train(x, w1, b1, w2, b2, act, dropout_p, seed, y, pre):
    """y (N, C) = drop(act(x @ w1.T + b1)) @ w2.T + b2, pre (N, F) = x @ w1.T + b1, with two
    training kinds (both float32 or both bf16: bf16 rounds the hidden before the second
    product).

    Args:
        x: (N, C) input.
        w1: the first training kind (F, C).
        b1: (F,) bias, or None.
        w2: the second training kind (C, F).
        b2: (C,) bias, or None.
        act: the activation's code.
        dropout_p: in [0, 1) (checked by the caller).
        seed: an int in [0, 2^64) (checked by the caller).
        y: (N, C) output, written.
        pre: (N, F) pre-activation, written.

    Returns:
        y.
    """
    (a1, p1), (a2, p2) = w1.train_operand(1), w2.train_operand(1)
    return _fast.ffn_forward_into(y, pre, w1.train_input(x, "x"), a1, b1, a2, b2, act,
                                  dropout_p, seed, w1.bf16, (p1, p2))


def ffn_backward(dy, x, w1, w2, pre, act, dropout_p, seed, grads, dx, h):
    """The FFN's gradients with two training kinds: dx (N, C) overwritten (None: not wanted);
    grads = (dw1, db1, dw2, db2) accumulated (each may be None). pre (N, F): the forward's,
    overwritten (not needed after); h (N, F) scratch.

    Args:
        dy: (N, C) the output gradient.
        x: (N, C) the forward's input.
        w1: the first training kind.
        w2: the second training kind.
        pre: (N, F) the forward's pre-activation, overwritten.
        act: the activation's code.
        dropout_p: the forward's.
        seed: the forward's.
        grads: (dw1, db1, dw2, db2), accumulated (each may be None).
        dx: (N, C) overwritten, or None when not wanted.
        h: (N, F) scratch.

    Returns:
        dx.
    """
    (a1, p1) = w1.train_operand(0 if dx is not None else None)
    (a2, p2) = w2.train_operand(0)
    _fast.ffn_backward_into(dx, *grads, w1.train_input(dy, "dy"), w1.train_input(x, "x"), a1, a2,
                            pre, act, dropout_p, seed, True, h=h, dpre=pre, bf16=w1.bf16,
                            packed=(p1, p2))
    return dx


# ---- quantized weights for inference -----------------------------------------------------------

def _readonly(a):
    """a as a C-contiguous, aligned, read-only array: a view when it already is one (so a
    loaded weight is not copied; its owner must not change it afterwards), else a copy."""
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = a.copy(order="C")
    v = a.view()
    v.flags.writeable = False
    return v


def _first_bad_row(bad_rows):
    rows = np.flatnonzero(bad_rows)
    return int(rows[0]) if rows.size else -1


def _dtype_name(dtype, op):
    if not isinstance(dtype, str) or dtype not in QUANT_DTYPES:
        raise ValueError(f"{op}: dtype must be 'int8', 'bf16' or 'bfloat16', got {dtype!r}")
    return dtype


class QuantizedWeight(WeightKind):
    """A linear layer's (M, K) weight stored in int8 (with per-row float32 scales) or bf16, for
    inference: ``linear(x, qw, bias, activation=...)`` and ``ffn`` accept it in place of a
    float32 weight, in ops (the kernels) and reference (the same math in NumPy) alike. One
    class per stored type: Int8Weight ("int8"), Bf16Weight ("bf16"), Bfloat16Weight
    ("bfloat16"); QuantizedWeight is what they share.

    - ``QuantizedWeight.from_float(w, "int8" | "bf16" | "bfloat16")`` quantises (see
      reference.quantize_int8 and reference.to_bfloat16); a weight with NaN or inf raises
      ValueError naming the row, as does a bf16 value that rounds to inf. "bf16" and
      "bfloat16" store the same bits (bfloat16 flushes subnormal ones to zero, as its
      operand rounding does) and differ in the product: see below.
    - ``QuantizedWeight.from_stored(dtype, data, scale=None)`` wraps stored arrays (int8 data
      (M, K) + scale (M,) float32; bf16 data (M, K) uint16), validated, never requantised;
      the data is read into the packed copy then (an edit of the array given afterwards
      changes nothing), a C-contiguous scale used without a copy.
    - ``.dtype`` ("int8" | "bf16" | "bfloat16"), ``.shape`` (M, K), ``.data``, ``.scale`` ((M,)
      float32, or None for bf16), ``.nbytes`` (data + scale), ``.dequantize()`` -> float32
      (M, K). ``data`` and ``scale`` are read-only.
    - ``w[lo:hi]`` (or ``w.rows(lo, hi)``) is the weight of rows lo:hi (a view of scale; of
      the packed copy, see below), cached per (lo, hi): slicing an in-projection into q, k, v
      on every call costs a dict lookup.

    The products (reference.linear gives the exact rule): int8 quantises each row of x on the
    fly, symmetric as the weights but to int16 with as many levels as the int32 sums allow
    (32767 up to K = 516, 8256 at K = 2048), sums exactly in int32 and computes
    ``y = act(float32(acc) * (sx[n] * scale[m]) + bias[m])`` in float32 (bit for bit the
    twin's for activation None and relu; a row of x with NaN or inf gives a NaN row); bf16
    widens the weight to float32 and sums in float32 (x exact); bfloat16 rounds x to bf16 as
    well and sums the exact products in float32 in a defined order (reference.linear: bit for
    bit the twin's on every path, for activation None and relu).

    The kernels read a packed copy (a layout private to C; for int8, the int8 path's in use,
    see build_info()["int8_path"]), made when the weight is made and never saved; the weight
    keeps only that copy (M rounded up to the panel, K to the int8 group: no larger when M is
    a multiple of the panel, as in every Transformer-base weight), so a quantised model holds
    one byte per int8 weight and two per bf16 weight, not twice that. ``data`` unpacks it into
    a new read-only array on each access (the reference backend, io.save and state_dict pay
    that copy, the kernels never do). A row slice starting on a panel edge
    (``build_info()["quant_tiles"]["int8_panel"]`` or ``["bf16_panel"]``, e.g. an
    in-projection's q / kv parts at d_model = 512) reads its parent's packed copy in place.

    Args:
        data: the stored values (private constructor: use `from_float` or `from_stored`,
            which validate), or None for a row slice: read from the parent's packed copy
            where the slice starts on a panel edge, else its rows unpacked from it.
        scale: (M,) float32 per-row scales (int8), or None (bf16).
        parent: the weight a row slice is taken from, or None (the default).
        lo: a row slice's first row in its parent (default 0).
        hi: a row slice's end row in its parent (default 0).
    """

    __slots__ = ("scale", "shape", "_packed", "_slices")
    _fastattn_quantized = True       # how reference.linear recognises one (without importing it)
    dtype = None

    def __init__(self, data, scale, parent=None, lo=0, hi=0):
        """Private: use from_float or from_stored (which validate); the class documents it."""
        self.scale = None if scale is None else _readonly(scale)
        self._slices = {}
        if parent is None:
            data = _readonly(data)
            self.shape = tuple(int(s) for s in data.shape)
            self._packed = self._pack(data)
            return
        self.shape = (hi - lo, parent.shape[1])
        if lo % parent._packed[2] == 0 and self.shape[0] > 0 and \
                parent._packed[0] == self._path():
            # rows lo.. of the parent's panels, in place (a panel past hi, if any, is computed
            # and dropped by the kernel like a padded one)
            path, wp, panel, group = parent._packed
            start = lo * (-(-self.shape[1] // group) * group)
            self._packed = (path, wp[start:start + self._packed_size(*self.shape)], panel, group)
        else:
            self._packed = self._pack(parent.data[lo:hi])

    # what a stored type defines
    def _layout(self):
        """(features per packed panel, K per group) of this type's packed copy."""
        raise NotImplementedError

    def _packed_size(self, M, K):
        raise NotImplementedError

    def _pack_into(self, wp, data):
        raise NotImplementedError

    def _path(self):
        """The kernel path the packed copy is laid out for (-1: one layout for every path)."""
        return -1

    def _kernel(self, wp, bias, act):
        """f(x, y) -> y: the kernel call for x of at least one row, with packed copy wp."""
        raise NotImplementedError

    def _pack(self, data):
        """(path, wp, panel, group): data (M, K) packed for the kernels of the path in use
        (wp[p][kg][f][j] = w[p panel + f][kg group + j], zero padded: fa_int8_pack's layout,
        the bf16 ones' the same with their own panel and group)."""
        wp = np.empty(self._packed_size(*data.shape), data.dtype)
        if data.size:
            self._pack_into(wp, np.ascontiguousarray(data))
        return (self._path(), wp) + self._layout()

    def _kernel_arrays(self):
        """(path, wp, panel, group): the packed copy (wp a view of the parent's for a slice on a
        panel edge), packed again first if the kernel path changed since."""
        if self._packed[0] != self._path():
            self._packed = self._pack(self.data)
        return self._packed

    @property
    def data(self):
        """The stored values: int8 (M, K) or bf16 bits (M, K) uint16, read-only, unpacked from
        the packed copy (see the class doc)."""
        M, K = self.shape
        _, wp, panel, group = self._packed
        P, Kg = -(-M // panel), -(-K // group)
        q = wp[:P * Kg * panel * group].reshape(P, Kg, panel, group).transpose(0, 2, 1, 3)
        return _readonly(np.ascontiguousarray(q.reshape(P * panel, Kg * group)[:M, :K]))

    @classmethod
    def from_float(cls, w, dtype):
        """Quantize a float32 weight.

        Args:
            w: (M, K) float weight, torch layout (out_features, in_features); must be finite.
            dtype: "int8", "bf16" or "bfloat16".

        Returns:
            The QuantizedWeight of that type.

        Raises:
            ValueError: a row with NaN or inf (named), a bf16 value that rounds to inf, or an
                unknown dtype.
        """
        op = "QuantizedWeight.from_float"
        kind = _CLASSES[_dtype_name(dtype, op)]
        w = _convert.f32c(_checks.weight(w, "w", op, "(out_features, in_features)"))
        return kind._from_float(w, op)

    @classmethod
    def from_stored(cls, dtype, data, scale=None):
        """Wrap stored values, validated and never requantized.

        The data is read into the packed copy (an edit of the array afterwards changes
        nothing); a C-contiguous scale is used without a copy.

        Args:
            dtype: "int8", "bf16" or "bfloat16".
            data: (M, K) int8 values, or (M, K) uint16 bf16 bits.
            scale: (M,) float32 per-row scales for int8; None (the default) for bf16.

        Returns:
            The QuantizedWeight of that type.

        Raises:
            ValueError: shapes, dtypes or scales that do not fit `dtype`.
        """
        op = "QuantizedWeight.from_stored"
        return _CLASSES[_dtype_name(dtype, op)]._from_stored(data, scale, op)

    @property
    def nbytes(self):
        """Bytes of the stored values and scales (what io.save writes)."""
        M, K = self.shape
        return M * K * (1 if self.dtype == "int8" else 2) + \
            (0 if self.scale is None else self.scale.nbytes)

    def rows(self, lo, hi):
        """The weight of rows lo:hi (also `w[lo:hi]`), cached per (lo, hi).

        Args:
            lo: the first row.
            hi: the end row (excluded).

        Returns:
            A QuantizedWeight of the same type sharing this one's storage where it can.
        """
        if (lo, hi) == (0, self.shape[0]):
            return self
        sub = self._slices.get((lo, hi))
        if sub is None:
            sub = type(self)(None, None if self.scale is None else self.scale[lo:hi],
                             parent=self, lo=lo, hi=hi)
            self._slices[(lo, hi)] = sub
        return sub

    def __repr__(self):
        return f"QuantizedWeight(dtype={self.dtype!r}, shape={self.shape})"

    def product(self, bias, act, rows=0):
        """The product function of this weight: `f(x, y)` writes y = act(x @ w.T + bias).

        Any number of rows (the kernels split few rows by panels and run the blocked GEMM for
        many); an empty sum (K = 0) leaves the bias and activation.

        Args:
            bias: (M,) float32 bias, or None.
            act: the activation's kernel code (0: none, 1: relu, 2: gelu, 3: gelu_tanh, 4: silu).
            rows: the number of rows x will have, or 0 (the default) for any.

        Returns:
            `f(x, y)`: x (N, K) float32 in, y (N, M) float32 out.
        """
        M, K = self.shape
        if rows > 0 and M and K:
            return self._kernel(self._kernel_arrays()[1], bias, act)
        return lambda x, y: self._product_any(x, y, bias, act)

    def _product_any(self, x, y, bias, act):
        N, K = x.shape
        if N == 0 or y.shape[1] == 0:
            return y
        if K == 0:
            return _bias_only(y, bias, act)
        return self._kernel(self._kernel_arrays()[1], bias, act)(x, y)


def _bias_only(y, bias, act):
    """y (N, M) = act(bias) on every row (0 without a bias): an empty sum's product, computed
    by the float32 kernel on one zero row (0 * 0 + bias is bias exactly)."""
    N, M = y.shape
    row = np.empty((1, M), np.float32)
    _kernels.linear_forward(row, None, np.zeros((1, 1), np.float32), np.zeros((M, 1), np.float32),
                            bias, act, 1)
    y[...] = row
    return y


class Int8Weight(QuantizedWeight):
    """int8 values with per-row scales (QuantizedWeight "int8"), packed for the int8 path in use.

    Args:
        data: as `QuantizedWeight`'s (made by `QuantizedWeight.from_float` or `from_stored`).
        scale: as `QuantizedWeight`'s.
        parent: as `QuantizedWeight`'s.
        lo: as `QuantizedWeight`'s.
        hi: as `QuantizedWeight`'s.
    """

    __slots__ = ()
    dtype = kind = "int8"

    def _layout(self):
        t = _kernels.quant_tiles()
        return t[0], t[1]

    def _packed_size(self, M, K):
        return _kernels.int8_packed_size(M, K)

    def _pack_into(self, wp, data):
        _kernels.int8_pack(wp, data, get_num_threads())

    def _path(self):
        return _kernels.int8_path()

    def _kernel(self, wp, bias, act):
        scale, kernel = self.scale, _kernels.linear_int8_forward

        def product(x, y):
            kernel(y, x, wp, scale, bias, act, get_num_threads())
            return y
        return product

    def dequantize(self):
        """The float32 (M, K) weight the kernels compute with."""
        return (self.data.astype(np.float32) * self.scale[:, None]).astype(np.float32)

    @classmethod
    def _from_float(cls, w, op):
        M, K = w.shape
        _check_int8_k(K, op)
        q = np.empty((M, K), np.int8)
        scale = np.empty(M, np.float32)
        bad = _kernels.quantize_int8(q, scale, w, get_num_threads())
        if bad >= 0:
            raise ValueError(f"{op}: weight row {bad} is not finite (NaN or inf)")
        return cls(q, scale)

    @classmethod
    def _from_stored(cls, data, scale, op):
        data = _checks.int8_array(data, "data", op)
        _checks.ndim(data, 2, "data", op, "(out_features, in_features)")
        M, K = data.shape
        _check_int8_k(K, op)
        if scale is None:
            raise ValueError(f"{op}: int8 data needs its scale (M,) = ({M},) float32")
        scale = _checks.float32_exact(scale, "scale", op)
        if scale.shape != (M,):
            raise ValueError(f"{op}: scale must have shape ({M},) (one per row of data "
                             f"{data.shape}), got {scale.shape}")
        ok = np.isfinite(scale) & (scale >= 0)
        if not ok.all():
            row = _first_bad_row(~ok)
            raise ValueError(f"{op}: scale[{row}] = {scale[row]!r}; scales must be finite "
                             "and >= 0")
        low = (data == -128).any(axis=1) if K else np.zeros(M, bool)
        if low.any():
            raise ValueError(f"{op}: data row {_first_bad_row(low)} holds -128; int8 "
                             "weights are symmetric, in [-127, 127]")
        return cls(data, scale)


class Bf16Weight(QuantizedWeight):
    """bf16 bits widened to float32 in the kernels, float32 compute (QuantizedWeight "bf16").

    Args:
        data: as `QuantizedWeight`'s (made by `QuantizedWeight.from_float` or `from_stored`).
        scale: as `QuantizedWeight`'s.
        parent: as `QuantizedWeight`'s.
        lo: as `QuantizedWeight`'s.
        hi: as `QuantizedWeight`'s.
    """

    __slots__ = ()
    dtype = kind = "bf16"

    def _layout(self):
        return _kernels.quant_tiles()[5], 1

    def _path(self):
        return _kernels.int8_path()     # the panel follows the int8 path's tiles

    def _packed_size(self, M, K):
        return _kernels.bf16_packed_size(M, K)

    def _pack_into(self, wp, data):
        _kernels.bf16_pack(wp, data, get_num_threads())

    def _kernel(self, wp, bias, act):
        kernel = self._forward_kernel()

        def product(x, y):
            kernel(y, x, wp, bias, act, get_num_threads())
            return y
        return product

    @staticmethod
    def _forward_kernel():
        return _kernels.linear_bf16_forward

    def dequantize(self):
        """The float32 (M, K) weight the kernels compute with."""
        return (self.data.astype(np.uint32) << 16).view(np.float32)

    @classmethod
    def _from_float(cls, w, op):
        M, K = w.shape
        finite = np.isfinite(w).all(axis=1) if K else np.ones(M, bool)
        if not finite.all():
            raise ValueError(f"{op}: weight row {_first_bad_row(~finite)} is not finite "
                             "(NaN or inf)")
        bits = np.empty(w.shape, np.uint16)
        _kernels.to_bfloat16(bits.reshape(-1), w.reshape(-1), get_num_threads())
        row = _first_bad_row(_bf16_nonfinite_rows(bits))
        if row >= 0:
            raise ValueError(f"{op}: weight row {row} has a value beyond the bfloat16 range "
                             "(it rounds to inf)")
        return cls(cls._stored_bits(bits), None)

    @classmethod
    def _from_stored(cls, data, scale, op):
        if scale is not None:
            raise ValueError(f"{op}: {cls.dtype} weights have no scale (got one)")
        data = np.asarray(data)
        if data.dtype != np.uint16:
            raise TypeError(f"{op}: {cls.dtype} data must be uint16 (bfloat16 bit patterns), "
                            f"got dtype {data.dtype}")
        _checks.ndim(data, 2, "data", op, "(out_features, in_features)")
        row = _first_bad_row(_bf16_nonfinite_rows(data))
        if row >= 0:
            raise ValueError(f"{op}: data row {row} holds a bfloat16 NaN or inf")
        return cls(cls._stored_bits(data), None)

    @staticmethod
    def _stored_bits(bits):
        """The bits this type stores: bf16 keeps subnormal ones."""
        return bits


class Bfloat16Weight(Bf16Weight):
    """The bfloat16 compute type (QuantizedWeight "bfloat16"): x rounded to bf16 as well, exact
    products, float32 sums; one packed layout (pairs of K) for every bfloat16 path.

    Args:
        data: as `QuantizedWeight`'s (made by `QuantizedWeight.from_float` or `from_stored`).
        scale: as `QuantizedWeight`'s.
        parent: as `QuantizedWeight`'s.
        lo: as `QuantizedWeight`'s.
        hi: as `QuantizedWeight`'s.
    """

    __slots__ = ()
    dtype = kind = "bfloat16"

    def _layout(self):
        return BFLOAT16_PANEL, BFLOAT16_GROUP

    def _path(self):
        return -1                       # one layout for every bfloat16 path

    def _packed_size(self, M, K):
        return _kernels.bfloat16_packed_size(M, K)

    def _pack_into(self, wp, data):
        _kernels.bfloat16_pack(wp, data, get_num_threads())

    @staticmethod
    def _forward_kernel():
        return _kernels.linear_bfloat16_forward

    @staticmethod
    def _stored_bits(bits):
        """bfloat16 (compute) weights hold the operand rounding's values: subnormal bits become
        a zero of their sign, as vcvtneps2bf16 gives (reference.round_bfloat16)."""
        tiny = (bits & 0x7F80) == 0
        return np.where(tiny, bits & 0x8000, bits).astype(np.uint16) if tiny.any() else bits


_CLASSES = {"int8": Int8Weight, "bf16": Bf16Weight, "bfloat16": Bfloat16Weight}


def _check_int8_k(K, op):
    if K > INT8_MAX_K:
        raise ValueError(f"{op}: in_features K = {K} is above the int8 limit of {INT8_MAX_K} "
                         "(K * 127 * 127 must fit the int32 sums)")


def _bf16_nonfinite_rows(bits):
    """(M,) bool: rows of bf16 bits (M, K) holding an inf or NaN (exponent all ones)."""
    if bits.shape[1] == 0:
        return np.zeros(bits.shape[0], bool)
    return ((bits & 0x7F80) == 0x7F80).any(axis=1)
