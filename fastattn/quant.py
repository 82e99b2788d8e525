"""Quantised linear weights for inference: int8 with per-row scales, bf16 weights (float32
compute), and the bfloat16 compute type (both operands of each product rounded to bf16).

The rules are reference.quantize_int8's and reference._linear_quantized's (and fastattn.h's):
these functions and their twins in fastattn.reference agree bit for bit on quantize_int8,
dequantize_int8, to_bfloat16 and from_bfloat16, and on linear with an int8 weight when the
activation is None or relu (gelu, gelu_tanh: to their kernels' accuracy, ~1e-6 relative); with
a bf16 weight, linear agrees with the twin as the float32 linear does (float32 sums); with a
bfloat16 weight, bit for bit (the sums' order is defined: reference.linear).
``fastattn.ops`` exports the public names (the twin API); the products that use a
QuantizedWeight are in fastattn._fast.
"""
import math

import numpy as np

from . import _checks, _convert, _kernels, reference
from ._runtime import get_num_threads, quant_tiles

__all__ = ["quantize_int8", "dequantize_int8", "to_bfloat16", "from_bfloat16", "round_bfloat16",
           "QuantizedWeight", "INT8_MAX_K"]


INT8_MAX_K = _kernels.int8_max_k()    # = reference.INT8_MAX_K: K * 127 * 127 fits an int32


# bf16 products of up to this many rows stream a packed copy; more rows widen the weight to
# float32 and run the fp32 GEMM
BF16_PACKED_MAX_ROWS = quant_tiles()["bf16_packed_max_rows"]


# "int8" and "bf16" (bf16 weights, float32 compute) are storage types for products in float32
# or int32 sums; "bfloat16" is the bf16 compute type: both operands of each product rounded to
# bfloat16 (reference._linear_bfloat16). bf16 and bfloat16 weights hold the same bits.
QUANT_DTYPES = ("int8", "bf16", "bfloat16")
BF16_KINDS = ("bf16", "bfloat16")

# bfloat16 compute: features per packed panel, K per group (pairs), for every bfloat16 path
BFLOAT16_PANEL, BFLOAT16_GROUP = quant_tiles()["bfloat16_panel"], 2


def quantize_int8(x):
    """Symmetric per-row int8 quantisation of the last axis: (q int8 (..., K), scale float32
    (...,)), with x ~= q * scale[..., None]; see reference.quantize_int8 for the exact rule
    (bit for bit the same here). A row with NaN or inf raises ValueError naming it."""
    op = "quantize_int8"
    x = _convert.f32c(_checks.rows(x, "x", op, "(..., K)"))
    lead, K = x.shape[:-1], x.shape[-1]
    N = math.prod(lead)
    q = np.empty((N, K), np.int8)
    scale = np.empty(N, np.float32)
    bad = _kernels.quantize_int8(q, scale, x.reshape(N, K), get_num_threads())
    if bad >= 0:
        raise ValueError(f"{op}: x row {reference._row_name(bad, lead)} is not finite (NaN or "
                         "inf); int8 quantisation needs finite values")
    return q.reshape(x.shape), scale.reshape(lead)


_int8_array = _checks.int8_array


_float32_exact = _checks.float32_exact


def dequantize_int8(q, scale):
    """q * scale[..., None] as float32: q (..., K) int8, scale (...,) float32 -> (..., K)."""
    return reference.dequantize_int8(q, scale)


def to_bfloat16(x):
    """bfloat16 bits (uint16, same shape) of x (converted to float32 first): round to nearest
    even; NaN stays a quiet NaN. See reference.to_bfloat16 (bit for bit the same)."""
    x = _convert.contig(x, "x", "to_bfloat16")
    bits = np.empty(x.shape, np.uint16)
    _kernels.to_bfloat16(bits.reshape(-1), x.reshape(-1), get_num_threads())
    return bits


def round_bfloat16(x):
    """The bfloat16 compute type's operand rounding (float32 values of x rounded to bf16 as
    vcvtneps2bf16 does: subnormals to zero); see reference.round_bfloat16."""
    return reference.round_bfloat16(x)


def from_bfloat16(bits):
    """float32 values of bfloat16 bits (a uint16 array), exact."""
    return reference.from_bfloat16(bits)


def _dtype_name(dtype, op):
    if not isinstance(dtype, str) or dtype not in QUANT_DTYPES:
        raise ValueError(f"{op}: dtype must be 'int8', 'bf16' or 'bfloat16', got {dtype!r}")
    return dtype


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


class QuantizedWeight:
    """A linear layer's (M, K) weight stored in int8 (with per-row float32 scales) or bf16, for
    inference: ``linear(x, qw, bias, activation=...)`` and ``ffn`` accept it in place of a
    float32 weight, in ops (the kernels) and reference (the same math in NumPy) alike.

    - ``QuantizedWeight.from_float(w, "int8" | "bf16" | "bfloat16")`` quantises (see
      reference.quantize_int8 and reference.to_bfloat16); a weight with NaN or inf raises
      ValueError naming the row, as does a bf16 value that rounds to inf. "bf16" and
      "bfloat16" store the same bits (bfloat16 flushes subnormal ones to zero, as its
      operand rounding does) and differ in the product: see below.
    - ``QuantizedWeight.from_stored(dtype, data, scale=None)`` wraps stored arrays (int8 data
      (M, K) + scale (M,) float32; bf16 data (M, K) uint16), validated, never requantised.
      Arrays that are already C-contiguous are used without a copy: do not change them after.
    - ``.dtype`` ("int8" | "bf16" | "bfloat16"), ``.shape`` (M, K), ``.data``, ``.scale`` ((M,) float32, or
      None for bf16), ``.nbytes`` (data + scale), ``.dequantize()`` -> float32 (M, K).
      ``data`` and ``scale`` are read-only.
    - ``w[lo:hi]`` is the QuantizedWeight of rows lo:hi (a view of scale; of data, or of the
      packed copy, see below), cached per (lo, hi): slicing an in-projection into q, k, v on
      every call costs a dict lookup.

    The products (reference.linear gives the exact rule): int8 quantises each row of x on the
    fly, symmetric as the weights but to int16 with as many levels as the int32 sums allow
    (32767 up to K = 516, 8256 at K = 2048), sums exactly in int32 and computes
    ``y = act(float32(acc) * (sx[n] * scale[m]) + bias[m])`` in float32 (bit for bit the
    twin's for activation None and relu; a row of x with NaN or inf gives a NaN row); bf16
    widens the weight to float32 and sums in float32 (x exact); bfloat16 rounds x to bf16 as
    well and sums the exact products in float32 in a defined order (reference.linear: bit for
    bit the twin's on every path, for activation None and relu).

    The kernels read a packed copy (a layout private to C, for the int8 path in use, see
    build_info()["int8_path"]) built on first use and never saved. The weight then lets go of
    ``data`` and keeps only the packed copy (M rounded up to the panel, K to the int8 group:
    no larger when M is a multiple of the panel, as in every Transformer-base weight), so a
    quantised model holds one byte per int8 weight and two per bf16 weight, not twice that;
    ``data`` still reads as before, unpacked into a new read-only array on each access (the
    reference backend, io.save and state_dict pay that copy, the kernels never do). A row
    slice starting on a panel edge (``build_info()["quant_tiles"]["int8_panel"]`` or
    ``["bf16_panel"]``, e.g. an in-projection's q / kv parts at d_model = 512) reads its
    parent's packed copy in place. Two threads using a new weight at
    once may both build the packed copy (one is kept); neither sees a partial one.
    """

    __slots__ = ("dtype", "_data", "scale", "shape", "_packed", "_slices", "_parent", "_lo")
    _fastattn_quantized = True       # how reference.linear recognises one (without importing ops)

    def __init__(self, dtype, data, scale, parent=None, lo=0, hi=0):
        """Private: use from_float or from_stored (which validate). A row slice has its
        parent and rows lo:hi (data: its rows, or None once the parent has let go of its
        own)."""
        self.dtype = dtype
        self.scale = None if scale is None else _readonly(scale)
        self._data = None if data is None else _readonly(data)
        self.shape = (hi - lo, parent.shape[1]) if data is None else \
            tuple(int(s) for s in self._data.shape)
        self._packed = None
        self._slices = {}
        self._parent = parent
        self._lo = lo

    @property
    def data(self):
        """The stored values: int8 (M, K) or bf16 bits (M, K) uint16, read-only. Once the
        packed copy is built, unpacked from it on each access (see above)."""
        data = self._data
        if data is not None:
            return data
        packed, parent = self._packed, self._parent     # threads may pack meanwhile
        if packed is None and parent is not None:      # a slice made after its parent packed
            return _readonly(parent.data[self._lo:self._lo + self.shape[0]])
        # read again: if another thread packed between the two reads above, packed was None
        # and parent already cleared; _packed is set before _data and _parent are cleared
        return _unpack(self._packed, self.shape)

    @classmethod
    def from_float(cls, w, dtype):
        op = "QuantizedWeight.from_float"
        dtype = _dtype_name(dtype, op)
        w = _convert.f32c(_checks.weight(w, "w", op, "(out_features, in_features)"))
        M, K = w.shape
        if dtype == "int8":
            _check_int8_k(K, op)
            q = np.empty((M, K), np.int8)
            scale = np.empty(M, np.float32)
            bad = _kernels.quantize_int8(q, scale, w, get_num_threads())
            if bad >= 0:
                raise ValueError(f"{op}: weight row {bad} is not finite (NaN or inf)")
            return cls("int8", q, scale)
        finite = np.isfinite(w).all(axis=1) if K else np.ones(M, bool)
        if not finite.all():
            raise ValueError(f"{op}: weight row {_first_bad_row(~finite)} is not finite "
                             "(NaN or inf)")
        bits = to_bfloat16(w)
        row = _first_bad_row(_bf16_nonfinite_rows(bits))
        if row >= 0:
            raise ValueError(f"{op}: weight row {row} has a value beyond the bfloat16 range "
                             "(it rounds to inf)")
        return cls(dtype, _flush_if(dtype, bits), None)

    @classmethod
    def from_stored(cls, dtype, data, scale=None):
        op = "QuantizedWeight.from_stored"
        dtype = _dtype_name(dtype, op)
        if dtype == "int8":
            data = _int8_array(data, "data", op)
            _checks.ndim(data, 2, "data", op, "(out_features, in_features)")
            M, K = data.shape
            _check_int8_k(K, op)
            if scale is None:
                raise ValueError(f"{op}: int8 data needs its scale (M,) = ({M},) float32")
            scale = _float32_exact(scale, "scale", op)
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
            return cls("int8", data, scale)
        if scale is not None:
            raise ValueError(f"{op}: {dtype} weights have no scale (got one)")
        data = np.asarray(data)
        if data.dtype != np.uint16:
            raise TypeError(f"{op}: {dtype} data must be uint16 (bfloat16 bit patterns), got "
                            f"dtype {data.dtype}")
        _checks.ndim(data, 2, "data", op, "(out_features, in_features)")
        row = _first_bad_row(_bf16_nonfinite_rows(data))
        if row >= 0:
            raise ValueError(f"{op}: data row {row} holds a bfloat16 NaN or inf")
        return cls(dtype, _flush_if(dtype, data), None)

    @property
    def nbytes(self):
        """Bytes of the stored values and scales (what io.save writes)."""
        M, K = self.shape
        return M * K * (1 if self.dtype == "int8" else 2) + \
            (0 if self.scale is None else self.scale.nbytes)

    def dequantize(self):
        """The float32 (M, K) weight the kernels compute with."""
        if self.dtype == "int8":
            return reference.dequantize_int8(self.data, self.scale)
        return reference.from_bfloat16(self.data)

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"QuantizedWeight: only row slices w[lo:hi] are supported, got "
                            f"{key!r}")
        lo, hi, _ = key.indices(self.shape[0])
        hi = max(lo, hi)
        if (lo, hi) == (0, self.shape[0]):
            return self
        sub = self._slices.get((lo, hi))
        if sub is None:
            data = self._data
            sub = QuantizedWeight(self.dtype, None if data is None else data[lo:hi],
                                  None if self.scale is None else self.scale[lo:hi],
                                  parent=self, lo=lo, hi=hi)
            self._slices[(lo, hi)] = sub
        return sub

    def __repr__(self):
        return f"QuantizedWeight(dtype={self.dtype!r}, shape={self.shape})"

    def _kernel_arrays(self):
        """The packed copy for the kernels, built on the first product (once per int8 path;
        see the class doc): (path, wp, panel, group), group 1 for bf16 (the int8 layout with
        K in groups of 1), wp a view of the parent's for a slice on a panel edge."""
        compute = self.dtype == "bfloat16"        # one layout for every bfloat16 path
        path = -1 if compute else _kernels.int8_path()
        packed = self._packed
        if packed is None or packed[0] != path:
            M, K = self.shape
            int8 = self.dtype == "int8"
            tiles = _kernels.quant_tiles()
            panel, group = (tiles[0], tiles[1]) if int8 else \
                (BFLOAT16_PANEL, BFLOAT16_GROUP) if compute else (tiles[5], 1)
            size = (_kernels.int8_packed_size if int8 else _kernels.bfloat16_packed_size
                    if compute else _kernels.bf16_packed_size)(M, K)
            parent, lo = self._parent, self._lo
            if parent is not None and lo % panel == 0 and M > 0:
                # rows lo.. of the parent's panels, in place (a panel past hi, if any, is
                # computed and dropped by the kernel like a padded one)
                start = lo * (-(-K // group) * group)
                wp = parent._kernel_arrays()[1][start:start + size]
            else:
                data = self.data
                wp = np.empty(size, data.dtype)
                (_kernels.int8_pack if int8 else _kernels.bfloat16_pack if compute
                 else _kernels.bf16_pack)(wp, data, get_num_threads())
            packed = (path, wp, panel, group)
            self._packed = packed
            self._parent = None             # the packed copy is all a slice needs now
            self._data = None               # data now unpacks from the packed copy
        return packed


def _unpack(packed, shape):
    """The (M, K) weight of a packed copy (path, wp, panel, group), read-only:
    wp[p][kg][f][j] = w[p panel + f][kg group + j], zero padded (fa_int8_pack; fa_bf16_pack's
    layout is the same with group 1)."""
    M, K = shape
    wp, panel, group = packed[1:]
    P, Kg = -(-M // panel), -(-K // group)
    q = wp[:P * Kg * panel * group].reshape(P, Kg, panel, group).transpose(0, 2, 1, 3)
    return _readonly(np.ascontiguousarray(q.reshape(P * panel, Kg * group)[:M, :K]))


def _flush_if(dtype, bits):
    """bfloat16 (compute) weights hold the operand rounding's values: subnormal bits become a
    zero of their sign, as vcvtneps2bf16 gives (reference.round_bfloat16); bf16 keeps them."""
    if dtype != "bfloat16":
        return bits
    tiny = (bits & 0x7F80) == 0
    return np.where(tiny, bits & 0x8000, bits).astype(np.uint16) if tiny.any() else bits


def _check_int8_k(K, op):
    if K > INT8_MAX_K:
        raise ValueError(f"{op}: in_features K = {K} is above the int8 limit of {INT8_MAX_K} "
                         "(K * 127 * 127 must fit the int32 sums)")


def _bf16_nonfinite_rows(bits):
    """(M,) bool: rows of bf16 bits (M, K) holding an inf or NaN (exponent all ones)."""
    if bits.shape[1] == 0:
        return np.zeros(bits.shape[0], bool)
    return ((bits & 0x7F80) == 0x7F80).any(axis=1)
