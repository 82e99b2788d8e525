# cython: language_level=3
"""Binding of csrc/ (the C kernels): typed memoryviews in (the decode step's entries: ndarrays
checked through NumPy's C API, see below), `with nogil` calls out, no logic.

Shapes are validated by fastattn/ops.py; this module trusts its caller. Strides are passed to
C in elements (memoryview strides are bytes). An array that is None or has no elements is
passed as NULL (the kernels read nothing through it), so that no pointer is ever taken to the
first element of an empty view (an IndexError under the debug build's bounds checks).
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint16_t, uint64_t

cimport numpy as cnp

cnp.import_array()


cdef extern from "fastattn.h" nogil:
    int fa_cpu_init(int forced)
    int fa_cpu_supports(int level)
    int fa_cpu_level()
    int fa_openmp_enabled()
    int fa_max_threads()
    int fa_forked_after_team()
    const char *fa_build_compiler()
    int fa_build_native()
    int fa_build_debug()
    int fa_build_sanitize()
    enum: FA_TILE_COUNT
    int fa_build_tiles(int isa, int64_t *out)
    int fa_gemm_info(int isa, int64_t *out)
    ctypedef struct fa_attention_args:
        float *out
        float *lse
        float *weights
        const float *q
        const float *k
        const float *v
        const float *mask
        const float *key_bias
        int64_t B, H, Lq, Lk, D, Dv
        int64_t q_st[4]
        int64_t k_st[4]
        int64_t v_st[4]
        int64_t out_st[4]
        int64_t mask_st[4]
        float scale
        int causal
        double dropout_p
        uint64_t seed
        int bf16
    ctypedef struct fa_attention_grads:
        float *dq
        float *dk
        float *dv
        const float *dout
        int64_t dq_st[4]
        int64_t dk_st[4]
        int64_t dv_st[4]
        int64_t dout_st[4]
    int fa_attention_forward(const fa_attention_args *a, int nthreads)
    int fa_attention_bf16_supports(int path)
    int fa_attention_bf16_init(int forced)
    int fa_attention_bf16_path()
    int fa_attention_backward(const fa_attention_grads *g, const fa_attention_args *a,
                              int nthreads)
    void fa_softmax_forward(float *y, const float *x, int64_t N, int64_t C, int nthreads)
    void fa_layer_norm_forward(float *y, float *sum_out, float *mean, float *rstd,
                               const float *x, const float *residual,
                               const float *weight, const float *bias,
                               int64_t N, int64_t C, float eps, int nthreads)
    int fa_layer_norm_backward(float *dx, float *dweight, float *dbias,
                               const float *dy, const float *mean, const float *rstd,
                               const float *x, const float *residual, const float *weight,
                               int64_t N, int64_t C, int accumulate, int nthreads)
    ctypedef struct fa_bf16_b:
        pass
    fa_bf16_b *fa_bf16_weight_pack(const float *w, int64_t M, int64_t K, int trans)
    void fa_bf16_weight_free(fa_bf16_b *packed)
    int fa_linear_forward(float *y, float *pre, const float *x, const float *weight,
                           const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                           int bf16, const fa_bf16_b *wpack, int nthreads)
    int fa_linear_backward(float *dx, float *dweight, float *dbias, float *dz,
                            const float *dy, const float *pre, const float *x,
                            const float *weight, int64_t N, int64_t K, int64_t M,
                            int activation, int accumulate, int bf16, const fa_bf16_b *wpack,
                            int nthreads)
    int fa_ffn_forward(float *y, float *pre, const float *x, const float *w1, const float *b1,
                       const float *w2, const float *b2, int64_t N, int64_t C, int64_t F,
                       int activation, double dropout_p, uint64_t seed, int bf16,
                       const fa_bf16_b *pack1, const fa_bf16_b *pack2, const float *wp1,
                       const float *wp2, int nthreads)
    int fa_ffn_backward(float *dx, float *dw1, float *db1, float *dw2, float *db2,
                         float *h, float *dpre, const float *dy, const float *pre,
                         const float *x, const float *w1, const float *w2, int64_t N,
                         int64_t C, int64_t F, int activation, double dropout_p, uint64_t seed,
                         int accumulate, int bf16, const fa_bf16_b *pack1,
                         const fa_bf16_b *pack2, int nthreads)
    int64_t fa_packed_size(int64_t M, int64_t K)
    void fa_pack_panels(float *wp, const float *w, int64_t M, int64_t K, int nthreads)
    void fa_linear_packed_forward(float *y, const float *x, const float *wp, const float *bias,
                                  int64_t N, int64_t K, int64_t M, int activation,
                                  int nthreads)
    void fa_dropout_forward(float *y, const float *x, int64_t N, int64_t C, double p,
                            uint64_t seed, int nthreads)
    void fa_dropout_backward(float *dx, const float *dy, int64_t N, int64_t C, double p,
                             uint64_t seed, int nthreads)
    int fa_embedding_backward(float *dweight, const float *dout, const int64_t *ids, int64_t N,
                              int64_t C, int64_t V, int accumulate, int nthreads)
    enum: FA_INT8_MAX_K
    int fa_int8_init(int forced)
    int fa_int8_supports(int path)
    int fa_int8_path()
    int fa_int8_path_rows(int64_t rows)
    int fa_amx_status()
    int64_t fa_quantize_int8(int8_t *q, float *scale, const float *x, int64_t N, int64_t K,
                             int nthreads)
    int64_t fa_int8_packed_size(int64_t M, int64_t K)
    void fa_int8_pack(int8_t *wp, const int8_t *q, int64_t M, int64_t K, int nthreads)
    int fa_linear_int8_forward(float *y, const float *x, const int8_t *wp, const float *scale,
                               const float *bias, int64_t N, int64_t K, int64_t M,
                               int activation, int nthreads)
    void fa_to_bfloat16(uint16_t *bits, const float *x, int64_t n, int nthreads)
    void fa_round_bfloat16(float *dst, const float *src, int64_t n, int nthreads)
    void fa_round_bfloat16_bits(uint16_t *bits, const float *src, int64_t n, int nthreads)
    void fa_widen_bfloat16(float *dst, const uint16_t *bits, int64_t n, int nthreads)
    int64_t fa_bf16_packed_size(int64_t M, int64_t K)
    void fa_bf16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads)
    int fa_linear_bf16_forward(float *y, const float *x, const uint16_t *wp, const float *bias,
                               int64_t N, int64_t K, int64_t M, int activation, int nthreads)
    int fa_quant_tiles(int64_t *out)
    int fa_bfloat16_init(int forced)
    int fa_bfloat16_supports(int path)
    int fa_bfloat16_path()
    int fa_bfloat16_path_rows(int64_t N)
    int fa_bfloat16_cpu_has_avx512bf16()
    int64_t fa_bfloat16_packed_size(int64_t M, int64_t K)
    void fa_bfloat16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads)
    int fa_linear_bfloat16_forward(float *y, const float *x, const uint16_t *wp,
                                   const float *bias, int64_t N, int64_t K, int64_t M,
                                   int activation, int nthreads)
    int fa_ffn_bfloat16_forward(float *y, const float *x, const uint16_t *w1p, const float *b1,
                                const uint16_t *w2p, const float *b2, int64_t N, int64_t C,
                                int64_t F, int activation, int nthreads)
    double fa_peak(int64_t iters, int nthreads, int kind) nogil


def cpu_init(int forced):
    return fa_cpu_init(forced)


def attention_bf16_supports(int path):
    return fa_attention_bf16_supports(path)


def attention_bf16_init(int forced):
    return fa_attention_bf16_init(forced)


def attention_bf16_path():
    return fa_attention_bf16_path()


def cpu_supports(int level):
    return fa_cpu_supports(level)


def cpu_level():
    return fa_cpu_level()


def openmp_enabled():
    return fa_openmp_enabled()


def max_threads():
    return fa_max_threads()


def forked_after_team():
    return fa_forked_after_team()


def build_compiler():
    return fa_build_compiler().decode("ascii", "replace")


def build_native():
    return fa_build_native()


def build_debug():
    return fa_build_debug()


def build_sanitize():
    return fa_build_sanitize()


def tile_count():
    return FA_TILE_COUNT


def build_tiles(int isa, int64_t[::1] out not None):
    """out (tile_count(),) int64 receives level isa's tile sizes in fa_tile_t order; 0 or -1."""
    if out.shape[0] < FA_TILE_COUNT:
        raise ValueError(f"build_tiles: out must hold {FA_TILE_COUNT} sizes")
    return fa_build_tiles(isa, &out[0])


# ---- arrays to pointers: NULL for None or for an array without elements -----------------------

cdef inline float *_p1(float[::1] a):
    if a is None or a.shape[0] == 0:
        return NULL
    return &a[0]


cdef inline const float *_cp1(const float[::1] a):
    if a is None or a.shape[0] == 0:
        return NULL
    return &a[0]


cdef inline float *_p2(float[:, ::1] a):
    if a is None or a.shape[0] == 0 or a.shape[1] == 0:
        return NULL
    return &a[0, 0]


cdef inline const float *_cp2(const float[:, ::1] a):
    if a is None or a.shape[0] == 0 or a.shape[1] == 0:
        return NULL
    return &a[0, 0]


cdef inline float *_p4(float[:, :, :, :] a):
    if a is None or a.shape[0] == 0 or a.shape[1] == 0 or a.shape[2] == 0 or a.shape[3] == 0:
        return NULL
    return &a[0, 0, 0, 0]


cdef inline const float *_cp4(const float[:, :, :, :] a):
    if a is None or a.shape[0] == 0 or a.shape[1] == 0 or a.shape[2] == 0 or a.shape[3] == 0:
        return NULL
    return &a[0, 0, 0, 0]


# ---- the decode step's bindings: ndarrays checked by hand ----------------------------------------
# Acquiring a typed memoryview costs about ten times as much per argument as checking the
# ndarray by hand, and a decode step makes some 70 calls of linear / layer norm / attention with
# 5 to 9 arrays each, so these few entries check their ndarrays directly instead (the same
# checks: type, rank, C order or element strides, writeable outputs, plus alignment).

cdef inline cnp.ndarray _nd(object a, int typenum, int ndim, bint write, str name):
    """a as an ndarray of this dtype and rank, aligned (and writeable when written to)."""
    if not cnp.PyArray_Check(a):
        raise TypeError(f"{name}: expected a numpy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != typenum or cnp.PyArray_NDIM(arr) != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d {cnp.PyArray_DescrFromType(typenum)} "
                         f"array, got {arr.ndim}-d {arr.dtype}")
    if not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name}: the array's data is not aligned for its dtype")
    if not cnp.PyArray_ISNOTSWAPPED(arr):
        raise ValueError(f"{name}: the array's bytes are not in this machine's order "
                         f"({arr.dtype})")
    if write and not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name}: the array is read-only")
    return arr


cdef inline void *_cdata(object a, int typenum, int ndim, bint write, bint optional,
                         str name) except? NULL:
    """The data of a C-contiguous ndarray (_nd's checks), NULL for None (when optional) or for
    an array without elements."""
    if a is None:
        if optional:
            return NULL
        raise TypeError(f"{name}: expected a numpy array, got None")
    cdef cnp.ndarray arr = _nd(a, typenum, ndim, write, name)
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name}: the array is not C-contiguous")
    if cnp.PyArray_SIZE(arr) == 0:
        return NULL
    return cnp.PyArray_DATA(arr)


cdef inline float *_view4(object a, bint write, bint optional, bint last_contiguous,
                         int64_t *st, str name) except? NULL:
    """The data of a (B, H, L, D) float32 view read through its strides, NULL for None (when
    optional) or for no elements; st[0:4] receives the strides in elements (0 for None or no
    elements: nothing is read through them then). Every
    stride of an axis of more than one element is whole elements (0 is given for the others);
    with last_contiguous the last axis is contiguous (or has at most one element), as the
    attention kernels read q, k, v and out."""
    cdef int i
    for i in range(4):
        st[i] = 0
    if a is None:
        if optional:
            return NULL
        raise TypeError(f"{name}: expected a numpy array, got None")
    cdef cnp.ndarray arr = _nd(a, cnp.NPY_FLOAT32, 4, write, name)
    if cnp.PyArray_SIZE(arr) == 0:
        return NULL
    cdef cnp.npy_intp *s = cnp.PyArray_STRIDES(arr)
    cdef cnp.npy_intp *n = cnp.PyArray_DIMS(arr)
    for i in range(4):
        if n[i] <= 1:                   # one index (0): its stride is never used
            continue
        if s[i] % 4 != 0:
            raise ValueError(f"{name}: strides {(<object>arr).strides} are not whole "
                             "float32 elements")
        st[i] = s[i] // 4
    if last_contiguous and cnp.PyArray_DIMS(arr)[3] > 1 and s[3] != 4:
        raise ValueError(f"{name}: the last axis is not contiguous (strides "
                         f"{(<object>arr).strides})")
    return <float *>cnp.PyArray_DATA(arr)


cdef inline int64_t _dim(object a, int i):
    return cnp.PyArray_DIMS(<cnp.ndarray>a)[i]


def attention_forward(out, lse, weights, q, k, v, mask, key_bias, float scale, bint causal,
                      int nthreads, double dropout_p=0.0, uint64_t seed=0, bint bf16=False):
    """out (B,H,Lq,Dv), lse (B*H*Lq) or None, weights (B*H*Lq*Lk) or None, key_bias (B*Lk) or
    None. out, q, k, v may be strided views whose last axis is contiguous (ops.py checks that);
    mask is a broadcast view (B,H,Lq,Lk) with any strides, or None. dropout_p in [0, 1) (0: no
    dropout, seed unused). bf16: bf16 compute (the caller passes dropout_p = 0). Arrays checked
    by _cdata / _view4 (a decode step's entry)."""
    cdef fa_attention_args a
    a.out = _view4(out, True, False, True, a.out_st, "out")
    a.q = _view4(q, False, False, True, a.q_st, "q")
    a.k = _view4(k, False, False, True, a.k_st, "k")
    a.v = _view4(v, False, False, True, a.v_st, "v")
    a.mask = _view4(mask, False, True, False, a.mask_st, "mask")
    a.lse = <float *>_cdata(lse, cnp.NPY_FLOAT32, 1, True, True, "lse")
    a.weights = <float *>_cdata(weights, cnp.NPY_FLOAT32, 1, True, True, "weights")
    a.key_bias = <const float *>_cdata(key_bias, cnp.NPY_FLOAT32, 1, False, True, "key_bias")
    a.B = _dim(q, 0)
    a.H = _dim(q, 1)
    a.Lq = _dim(q, 2)
    a.Lk = _dim(k, 2)
    a.D = _dim(q, 3)
    a.Dv = _dim(v, 3)
    a.scale = scale
    a.causal = causal
    a.dropout_p = dropout_p
    a.seed = seed
    a.bf16 = bf16
    cdef int rc
    with nogil:
        rc = fa_attention_forward(&a, nthreads)
    if rc != 0:
        raise MemoryError("attention: could not allocate per-thread scratch")


cdef inline void _strides4(const float[:, :, :, :] a, int64_t *st):
    cdef int i
    for i in range(4):
        st[i] = a.strides[i] // 4 if a is not None else 0


def attention_backward(float[:, :, :, :] dq not None, float[:, :, :, :] dk not None,
                       float[:, :, :, :] dv not None, const float[:, :, :, :] dout not None,
                       const float[:, :, :, :] out not None, const float[::1] lse not None,
                       const float[:, :, :, :] q not None, const float[:, :, :, :] k not None,
                       const float[:, :, :, :] v not None, const float[:, :, :, :] mask,
                       const float[::1] key_bias, float scale, bint causal, double dropout_p,
                       uint64_t seed, int nthreads, bint bf16=False):
    """dq (B,H,Lq,D), dk (B,H,Lk,D), dv (B,H,Lk,Dv), dout and out (B,H,Lq,Dv), q, k, v: strided
    views whose last axis is contiguous (ops.py checks that); lse (B*H*Lq); mask a broadcast
    view (B,H,Lq,Lk) with any strides, or None; key_bias (B*Lk) or None. bf16: P' and dS are
    rounded to bf16 before their products (the caller passes q, k, v and dout rounded)."""
    cdef fa_attention_grads g
    cdef fa_attention_args a
    _strides4(dq, g.dq_st)
    _strides4(dk, g.dk_st)
    _strides4(dv, g.dv_st)
    _strides4(dout, g.dout_st)
    _strides4(out, a.out_st)
    _strides4(q, a.q_st)
    _strides4(k, a.k_st)
    _strides4(v, a.v_st)
    _strides4(mask, a.mask_st)
    g.dq = _p4(dq)
    g.dk = _p4(dk)
    g.dv = _p4(dv)
    g.dout = _cp4(dout)
    a.out = <float *>_cp4(out)      # the forward's out and lse: the backward only reads them
    a.lse = <float *>_cp1(lse)
    a.weights = NULL
    a.q = _cp4(q)
    a.k = _cp4(k)
    a.v = _cp4(v)
    a.mask = _cp4(mask)
    a.key_bias = _cp1(key_bias)
    a.B = q.shape[0]
    a.H = q.shape[1]
    a.Lq = q.shape[2]
    a.Lk = k.shape[2]
    a.D = q.shape[3]
    a.Dv = v.shape[3]
    a.scale = scale
    a.causal = causal
    a.dropout_p = dropout_p
    a.seed = seed
    a.bf16 = bf16
    cdef int rc
    with nogil:
        rc = fa_attention_backward(&g, &a, nthreads)
    if rc != 0:
        raise MemoryError("attention_backward: could not allocate per-thread scratch")


def softmax_forward(float[:, ::1] y not None, const float[:, ::1] x not None, int nthreads):
    cdef float *yp = _p2(y)
    cdef const float *xp = _cp2(x)
    with nogil:
        fa_softmax_forward(yp, xp, x.shape[0], x.shape[1], nthreads)


def layer_norm_forward(y, sum_out, mean, rstd, x, residual, weight, bias, float eps,
                       int nthreads):
    """y, x (N, C); sum_out, residual (N, C) or None; mean, rstd (N) or None; weight, bias (C)
    or None. Arrays checked by _cdata (a decode step's entry)."""
    cdef float *yp = <float *>_cdata(y, cnp.NPY_FLOAT32, 2, True, False, "y")
    cdef float *sp = <float *>_cdata(sum_out, cnp.NPY_FLOAT32, 2, True, True, "sum_out")
    cdef float *mp = <float *>_cdata(mean, cnp.NPY_FLOAT32, 1, True, True, "mean")
    cdef float *rsp = <float *>_cdata(rstd, cnp.NPY_FLOAT32, 1, True, True, "rstd")
    cdef const float *xp = <const float *>_cdata(x, cnp.NPY_FLOAT32, 2, False, False, "x")
    cdef const float *rp = <const float *>_cdata(residual, cnp.NPY_FLOAT32, 2, False, True,
                                                 "residual")
    cdef const float *wp = <const float *>_cdata(weight, cnp.NPY_FLOAT32, 1, False, True,
                                                 "weight")
    cdef const float *bp = <const float *>_cdata(bias, cnp.NPY_FLOAT32, 1, False, True, "bias")
    cdef int64_t N = _dim(x, 0), C = _dim(x, 1)
    with nogil:
        fa_layer_norm_forward(yp, sp, mp, rsp, xp, rp, wp, bp, N, C, eps, nthreads)


def layer_norm_backward(float[:, ::1] dx, float[::1] dweight, float[::1] dbias,
                        const float[:, ::1] dy not None, const float[::1] mean not None,
                        const float[::1] rstd not None, const float[:, ::1] x not None,
                        const float[:, ::1] residual, const float[::1] weight,
                        bint accumulate, int nthreads):
    """dx (N, C) or None, dweight (C) or None, dbias (C) or None; dy, x, residual (N, C)."""
    cdef float *dxp = _p2(dx)
    cdef float *dwp = _p1(dweight)
    cdef float *dbp = _p1(dbias)
    cdef const float *dyp = _cp2(dy)
    cdef const float *mp = _cp1(mean)
    cdef const float *rsp = _cp1(rstd)
    cdef const float *xp = _cp2(x)
    cdef const float *rp = _cp2(residual)
    cdef const float *wp = _cp1(weight)
    cdef int rc
    with nogil:
        rc = fa_layer_norm_backward(dxp, dwp, dbp, dyp, mp, rsp, xp, rp, wp, x.shape[0],
                                    x.shape[1], accumulate, nthreads)
    if rc != 0:
        raise MemoryError("layer_norm_backward: could not allocate the partial sums")


cdef class Bf16WeightPack:
    """A bf16 training weight (M, K) packed for the bf16 tiles' products (bf16_weight_pack): the
    forward's w^T (trans 1) or the input gradient's w (trans 0). Holds no reference to the
    weight: the caller passes it only with the values it was packed from."""
    cdef fa_bf16_b *p
    cdef readonly int64_t M, K
    cdef readonly int trans

    def __dealloc__(self):
        fa_bf16_weight_free(self.p)


def bf16_weight_pack(const float[:, ::1] w not None, int trans):
    """w (M, K), bf16 values held in float32s: a Bf16WeightPack for the products with bf16=True
    (trans 1: linear/ffn forwards; 0: their backwards), or None where the bf16 tiles are not
    the bfloat16 compute type's path (the products then need none)."""
    cdef fa_bf16_b *p
    if w.shape[0] == 0 or w.shape[1] == 0:
        return None
    cdef Bf16WeightPack out = Bf16WeightPack.__new__(Bf16WeightPack)    # before: nothing leaks
    with nogil:
        p = fa_bf16_weight_pack(&w[0, 0], w.shape[0], w.shape[1], trans != 0)
    if p == NULL:
        return None
    out.p, out.M, out.K, out.trans = p, w.shape[0], w.shape[1], trans != 0
    return out


cdef const fa_bf16_b *_packed(Bf16WeightPack packed, bint bf16, const float[:, ::1] w, int trans,
                              str what) except? NULL:
    """packed's handle after checking it was made for w's shape and this product (NULL for
    None)."""
    if packed is None:
        return NULL
    if not bf16 or packed.trans != trans or packed.M != w.shape[0] or packed.K != w.shape[1]:
        raise ValueError(f"{what}: a Bf16WeightPack of ({packed.M}, {packed.K}) trans "
                         f"{packed.trans} does not fit a bf16={bool(bf16)} product with a "
                         f"({w.shape[0]}, {w.shape[1]}) weight (trans {trans} wanted)")
    return packed.p


def linear_forward(float[:, ::1] y not None, float[:, ::1] pre, const float[:, ::1] x not None,
                   const float[:, ::1] weight not None,
                   const float[::1] bias, int activation, int nthreads, bint bf16=False,
                   Bf16WeightPack packed=None):
    """y (N, M), pre (N, M) or None, x (N, K), weight (M, K), bias (M) or None. bf16: x and
    weight hold bf16 values (bf16 training): the product may run on the bf16 tiles, with the
    weight's bf16_weight_pack(weight, 1) when given."""
    cdef const fa_bf16_b *pk = _packed(packed, bf16, weight, 1, "linear_forward")
    cdef float *yp = _p2(y)
    cdef float *pp = _p2(pre)
    cdef const float *xp = _cp2(x)
    cdef const float *wp = _cp2(weight)
    cdef const float *bp = _cp1(bias)
    cdef int rc
    with nogil:
        rc = fa_linear_forward(yp, pp, xp, wp, bp, x.shape[0], x.shape[1], weight.shape[0],
                               activation, bf16, pk, nthreads)
    if rc != 0:
        raise MemoryError("linear: could not allocate the packed weight")


def linear_backward(float[:, ::1] dx, float[:, ::1] dweight, float[::1] dbias,
                    float[:, ::1] dz, const float[:, ::1] dy not None, const float[:, ::1] pre,
                    const float[:, ::1] x not None, const float[:, ::1] weight not None,
                    int activation, bint accumulate, int nthreads, bint bf16=False,
                    Bf16WeightPack packed=None):
    """dx (N, K) or None, dweight (M, K) or None, dbias (M) or None, dz (N, M) scratch (None
    without an activation and without bf16), dy (N, M), pre (N, M) or None, x (N, K), weight
    (M, K). bf16: dz rounded to bf16 before the products (x and weight come rounded), with
    the weight's bf16_weight_pack(weight, 0) when given."""
    if bf16 and dz is None and x.shape[0] > 0 and weight.shape[0] > 0:
        raise ValueError("linear_backward: bf16 needs the dz scratch")
    cdef const fa_bf16_b *pk = _packed(packed, bf16, weight, 0, "linear_backward")
    cdef float *dxp = _p2(dx)
    cdef float *dwp = _p2(dweight)
    cdef float *dbp = _p1(dbias)
    cdef float *dzp = _p2(dz)
    cdef const float *dyp = _cp2(dy)
    cdef const float *pp = _cp2(pre)
    cdef const float *xp = _cp2(x)
    cdef const float *wp = _cp2(weight)
    cdef int rc
    with nogil:
        rc = fa_linear_backward(dxp, dwp, dbp, dzp, dyp, pp, xp, wp, x.shape[0], x.shape[1],
                                weight.shape[0], activation, accumulate, bf16, pk, nthreads)
    if rc != 0:
        raise MemoryError("linear_backward: could not allocate the packed operands")


def ffn_forward(float[:, ::1] y not None, float[:, ::1] pre, const float[:, ::1] x not None,
                const float[:, ::1] w1 not None, const float[::1] b1,
                const float[:, ::1] w2 not None, const float[::1] b2,
                int activation, double dropout_p, uint64_t seed, int nthreads, bint bf16=False,
                Bf16WeightPack packed1=None, Bf16WeightPack packed2=None,
                const float[::1] panels1=None, const float[::1] panels2=None):
    """y (N, C), pre (N, F) or None, x (N, C), w1 (F, C), w2 (C, F). bf16: the hidden rounded
    to bf16 before the second product (x, w1, w2 come rounded); packed1, packed2: bf16_weight_pack(w1,
    1), bf16_weight_pack(w2, 1) or None. panels1, panels2: pack_panels(w1), pack_panels(w2) (the
    same values), or None: packed here."""
    _panels_of(panels1, w1, "ffn_forward", "panels1")
    _panels_of(panels2, w2, "ffn_forward", "panels2")
    cdef const fa_bf16_b *pk1 = _packed(packed1, bf16, w1, 1, "ffn_forward")
    cdef const fa_bf16_b *pk2 = _packed(packed2, bf16, w2, 1, "ffn_forward")
    cdef float *yp = _p2(y)
    cdef float *pp = _p2(pre)
    cdef const float *xp = _cp2(x)
    cdef const float *w1p = _cp2(w1)
    cdef const float *b1p = _cp1(b1)
    cdef const float *w2p = _cp2(w2)
    cdef const float *b2p = _cp1(b2)
    cdef const float *q1 = _cp1(panels1)
    cdef const float *q2 = _cp1(panels2)
    cdef int rc
    with nogil:
        rc = fa_ffn_forward(yp, pp, xp, w1p, b1p, w2p, b2p, x.shape[0], x.shape[1], w1.shape[0],
                            activation, dropout_p, seed, bf16, pk1, pk2, q1, q2, nthreads)
    if rc != 0:
        raise MemoryError("ffn: could not allocate the hidden row blocks")


def ffn_backward(float[:, ::1] dx, float[:, ::1] dw1, float[::1] db1, float[:, ::1] dw2,
                 float[::1] db2, float[:, ::1] h not None, float[:, ::1] dpre not None,
                 const float[:, ::1] dy not None, const float[:, ::1] pre not None,
                 const float[:, ::1] x not None, const float[:, ::1] w1 not None,
                 const float[:, ::1] w2 not None, int activation, double dropout_p,
                 uint64_t seed, bint accumulate, int nthreads, bint bf16=False,
                 Bf16WeightPack packed1=None, Bf16WeightPack packed2=None):
    """dx (N, C), dw1 (F, C), db1 (F), dw2 (C, F), db2 (C): each may be None; h, dpre (N, F)
    scratch (dpre may be pre); dy, x (N, C); pre (N, F); w1 (F, C); w2 (C, F); packed1,
    packed2: bf16_weight_pack(w1, 0), bf16_weight_pack(w2, 0) or None (bf16)."""
    cdef const fa_bf16_b *pk1 = _packed(packed1, bf16, w1, 0, "ffn_backward")
    cdef const fa_bf16_b *pk2 = _packed(packed2, bf16, w2, 0, "ffn_backward")
    cdef float *dxp = _p2(dx)
    cdef float *dw1p = _p2(dw1)
    cdef float *db1p = _p1(db1)
    cdef float *dw2p = _p2(dw2)
    cdef float *db2p = _p1(db2)
    cdef float *hp = _p2(h)
    cdef float *dpp = _p2(dpre)
    cdef const float *dyp = _cp2(dy)
    cdef const float *pp = _cp2(pre)
    cdef const float *xp = _cp2(x)
    cdef const float *w1p = _cp2(w1)
    cdef const float *w2p = _cp2(w2)
    cdef int rc
    with nogil:
        rc = fa_ffn_backward(dxp, dw1p, db1p, dw2p, db2p, hp, dpp, dyp, pp, xp, w1p, w2p,
                             x.shape[0], x.shape[1], w1.shape[0], activation, dropout_p, seed,
                             accumulate, bf16, pk1, pk2, nthreads)
    if rc != 0:
        raise MemoryError("ffn_backward: could not allocate the packed operands")


cdef _panels_of(const float[::1] panels, const float[:, ::1] w, str fn, str name):
    """panels, when given, must be pack_panels(w)'s size (the kernel reads that many floats)"""
    if panels is not None and panels.shape[0] != fa_packed_size(w.shape[0], w.shape[1]):
        raise ValueError(f"{fn}: {name} has {panels.shape[0]} floats, the packed "
                         f"{w.shape[0]}x{w.shape[1]} weight {fa_packed_size(w.shape[0], w.shape[1])}")


def packed_size(int64_t M, int64_t K):
    return fa_packed_size(M, K)


def pack_panels(float[::1] wp not None, const float[:, ::1] w not None, int nthreads):
    cdef float *pp = _p1(wp)
    cdef const float *src = _cp2(w)
    with nogil:
        fa_pack_panels(pp, src, w.shape[0], w.shape[1], nthreads)


def linear_packed_forward(y, x, wp, bias, int activation, int nthreads):
    """y (N, M), x (N, K), wp from pack_panels of an (M, K) weight, bias (M) or None. Arrays
    checked by _cdata (a decode step's entry)."""
    cdef float *yp = <float *>_cdata(y, cnp.NPY_FLOAT32, 2, True, False, "y")
    cdef const float *xp = <const float *>_cdata(x, cnp.NPY_FLOAT32, 2, False, False, "x")
    cdef const float *pp = <const float *>_cdata(wp, cnp.NPY_FLOAT32, 1, False, False, "wp")
    cdef const float *bp = <const float *>_cdata(bias, cnp.NPY_FLOAT32, 1, False, True, "bias")
    cdef int64_t N = _dim(x, 0), K = _dim(x, 1), M = _dim(y, 1)
    if _dim(wp, 0) != fa_packed_size(M, K):
        raise ValueError(f"linear_packed_forward: wp has {_dim(wp, 0)} floats, a packed "
                         f"{M}x{K} weight {fa_packed_size(M, K)}")
    with nogil:
        fa_linear_packed_forward(yp, xp, pp, bp, N, K, M, activation, nthreads)


# ---- loss --------------------------------------------------------------------------------------

cdef extern from "fastattn.h" nogil:
    void fa_cross_entropy_forward(float *losses, float *dlogits, const float *logits,
                                  const int64_t *targets, int64_t N, int64_t V,
                                  int64_t ignore_index, float label_smoothing, float grad_scale,
                                  int nthreads)


def cross_entropy_forward(float[::1] losses not None, float[:, ::1] dlogits,
                          const float[:, ::1] logits not None,
                          const int64_t[::1] targets not None, int64_t ignore_index,
                          float label_smoothing, float grad_scale, int nthreads):
    """losses (N,), dlogits (N, V) or None (may be logits' own buffer), logits (N, V),
    targets (N,) int64, each in [0, V) or ignore_index (checked by ops.py)."""
    cdef float *lp = _p1(losses)
    cdef float *dp = _p2(dlogits)
    cdef const float *xp = _cp2(logits)
    cdef const int64_t *tp = NULL
    if targets.shape[0] > 0:
        tp = &targets[0]
    with nogil:
        fa_cross_entropy_forward(lp, dp, xp, tp, logits.shape[0], logits.shape[1],
                                 ignore_index, label_smoothing, grad_scale, nthreads)


# ---- optimiser ---------------------------------------------------------------------------------

from libc.stdlib cimport free, malloc


cdef extern from "fastattn.h" nogil:
    void fa_adam_step(float *const *params, float *const *exp_avgs, float *const *exp_avg_sqs,
                      const float *const *grads, const int64_t *sizes, int64_t count,
                      int64_t step, double lr, double beta1, double beta2, double eps,
                      double weight_decay, int decoupled, int nthreads)
    int64_t fa_sum_squares_blocks(const int64_t *sizes, int64_t count)
    double fa_sum_squares(double *partials, const float *const *xs, const int64_t *sizes,
                          int64_t count, int nthreads)
    void fa_scale_inplace(float *const *xs, const int64_t *sizes, int64_t count, float s,
                          int nthreads)


cdef class _Tensors:
    """The pointers and sizes of a list of flat float32 arrays, as the optimiser kernels take
    them (NULL for an array without elements). The list, which the caller keeps, owns the
    data; this object only holds the C arrays that point into it."""
    cdef float **ptrs
    cdef int64_t *sizes
    cdef int64_t count

    def __cinit__(self, list arrays, bint writable):
        cdef Py_ssize_t i
        cdef float[::1] w
        cdef const float[::1] r
        self.count = len(arrays)
        self.ptrs = <float **>malloc(max(1, self.count) * sizeof(float *))
        self.sizes = <int64_t *>malloc(max(1, self.count) * sizeof(int64_t))
        if self.ptrs == NULL or self.sizes == NULL:
            raise MemoryError()
        for i in range(self.count):
            if writable:
                w = arrays[i]
                self.ptrs[i] = _p1(w)
                self.sizes[i] = w.shape[0]
            else:
                r = arrays[i]
                self.ptrs[i] = <float *>_cp1(r)
                self.sizes[i] = r.shape[0]

    def __dealloc__(self):
        free(self.ptrs)
        free(self.sizes)


def adam_step(list params not None, list exp_avg not None, list exp_avg_sq not None,
              list grads not None, int64_t step, double lr, double beta1, double beta2,
              double eps, double weight_decay, bint decoupled, int nthreads):
    """One Adam (decoupled=False) or AdamW (decoupled=True) update, in place, of lists of flat
    float32 (n_i,) arrays: params[i], exp_avg[i], exp_avg_sq[i], grads[i] of one length n_i
    (checked by ops.py)."""
    cdef _Tensors p = _Tensors(params, True)
    cdef _Tensors m = _Tensors(exp_avg, True)
    cdef _Tensors v = _Tensors(exp_avg_sq, True)
    cdef _Tensors g = _Tensors(grads, False)
    with nogil:
        fa_adam_step(p.ptrs, m.ptrs, v.ptrs, <const float *const *>g.ptrs, p.sizes, p.count,
                     step, lr, beta1, beta2, eps, weight_decay, decoupled, nthreads)


def sum_squares(list xs not None, int nthreads):
    """sum of x**2 over a list of flat float32 arrays, in double."""
    cdef _Tensors t = _Tensors(xs, False)
    cdef int64_t nb = fa_sum_squares_blocks(t.sizes, t.count)
    cdef double *partials = <double *>malloc(max(1, nb) * sizeof(double))
    cdef double total
    if partials == NULL:
        raise MemoryError()
    try:
        with nogil:
            total = fa_sum_squares(partials, <const float *const *>t.ptrs, t.sizes, t.count,
                                   nthreads)
    finally:
        free(partials)
    return total


def scale_inplace(list xs not None, float s, int nthreads):
    """xs[i] *= s for a list of flat float32 arrays."""
    cdef _Tensors t = _Tensors(xs, True)
    with nogil:
        fa_scale_inplace(t.ptrs, t.sizes, t.count, s, nthreads)

def dropout_forward(float[:, ::1] y not None, const float[:, ::1] x not None, double p,
                    uint64_t seed, int nthreads):
    """y (N, C), may be x itself; x (N, C)."""
    cdef float *yp = _p2(y)
    cdef const float *xp = _cp2(x)
    with nogil:
        fa_dropout_forward(yp, xp, x.shape[0], x.shape[1], p, seed, nthreads)


def dropout_backward(float[:, ::1] dx not None, const float[:, ::1] dy not None, double p,
                     uint64_t seed, int nthreads):
    """dx (N, C), may be dy itself; dy (N, C)."""
    cdef float *dxp = _p2(dx)
    cdef const float *dyp = _cp2(dy)
    with nogil:
        fa_dropout_backward(dxp, dyp, dy.shape[0], dy.shape[1], p, seed, nthreads)


def embedding_backward(float[:, ::1] dweight not None, const float[:, ::1] dout not None,
                       const int64_t[::1] ids not None, bint accumulate, int nthreads):
    """dweight (V, C), dout (N, C), ids (N) int64 in [0, V)."""
    cdef float *dwp = _p2(dweight)
    cdef const float *dp = _cp2(dout)
    cdef const int64_t *ip = NULL
    if ids.shape[0] > 0:
        ip = &ids[0]
    cdef int rc
    with nogil:
        rc = fa_embedding_backward(dwp, dp, ip, dout.shape[0], dweight.shape[1],
                                   dweight.shape[0], accumulate, nthreads)
    if rc != 0:
        raise MemoryError("embedding_backward: could not allocate the sort")


# ---- quantised weights (int8, bf16) ----------------------------------------------------------

def int8_max_k():
    return FA_INT8_MAX_K


def int8_init(int forced):
    return fa_int8_init(forced)


def int8_supports(int path):
    return fa_int8_supports(path)


def int8_path():
    return fa_int8_path()


def int8_path_rows(int64_t rows):
    return fa_int8_path_rows(rows)


def amx_status():
    return fa_amx_status()


def quantize_int8(int8_t[:, ::1] q not None, float[::1] scale not None,
                  const float[:, ::1] x not None, int nthreads):
    """q (N, K) int8, scale (N), x (N, K) -> -1, or the first row that is not finite."""
    cdef int8_t *qp = NULL
    cdef const float *xp = NULL
    cdef float *sp = _p1(scale)
    cdef int64_t rc
    if x.shape[0] > 0 and x.shape[1] > 0:
        qp = &q[0, 0]
        xp = &x[0, 0]
    with nogil:
        rc = fa_quantize_int8(qp, sp, xp, x.shape[0], x.shape[1], nthreads)
    return rc


def int8_packed_size(int64_t M, int64_t K):
    return fa_int8_packed_size(M, K)


def int8_pack(int8_t[::1] wp not None, const int8_t[:, ::1] q not None, int nthreads):
    """wp (int8_packed_size(M, K)), q (M, K) int8."""
    cdef int8_t *pp = NULL
    cdef const int8_t *src = NULL
    if wp.shape[0] > 0:
        pp = &wp[0]
    if q.shape[0] > 0 and q.shape[1] > 0:
        src = &q[0, 0]
    with nogil:
        fa_int8_pack(pp, src, q.shape[0], q.shape[1], nthreads)


def linear_int8_forward(y, x, wp, scale, bias, int activation, int nthreads):
    """y (N, M), x (N, K), wp from int8_pack of an (M, K) weight, scale (M), bias (M) or None.
    Arrays checked by _cdata (a decode step's entry)."""
    cdef float *yp = <float *>_cdata(y, cnp.NPY_FLOAT32, 2, True, False, "y")
    cdef const float *xp = <const float *>_cdata(x, cnp.NPY_FLOAT32, 2, False, False, "x")
    cdef const int8_t *pp = <const int8_t *>_cdata(wp, cnp.NPY_INT8, 1, False, False, "wp")
    cdef const float *scp = <const float *>_cdata(scale, cnp.NPY_FLOAT32, 1, False, False,
                                                  "scale")
    cdef const float *bp = <const float *>_cdata(bias, cnp.NPY_FLOAT32, 1, False, True, "bias")
    cdef int64_t N = _dim(x, 0), K = _dim(x, 1), M = _dim(y, 1)
    cdef int rc
    with nogil:
        rc = fa_linear_int8_forward(yp, xp, pp, scp, bp, N, K, M, activation, nthreads)
    if rc != 0:
        raise MemoryError("linear (int8): could not allocate the quantised activations")


def round_bfloat16(float[::1] dst not None, const float[::1] src not None, int nthreads):
    """dst = src rounded to bf16, as float32 (fa_round_bfloat16); dst may be src."""
    if dst.shape[0] != src.shape[0]:
        raise ValueError("round_bfloat16: dst and src differ in size")
    if src.shape[0] == 0:
        return
    cdef float *dp = &dst[0]
    cdef const float *sp = &src[0]
    with nogil:
        fa_round_bfloat16(dp, sp, src.shape[0], nthreads)


def round_bfloat16_bits(uint16_t[::1] bits not None, const float[::1] src not None,
                        int nthreads):
    """bits = src rounded to bf16 as round_bfloat16 rounds it, kept as bits."""
    if bits.shape[0] != src.shape[0]:
        raise ValueError("round_bfloat16_bits: bits and src differ in size")
    if src.shape[0] == 0:
        return
    cdef uint16_t *bp = &bits[0]
    cdef const float *sp = &src[0]
    with nogil:
        fa_round_bfloat16_bits(bp, sp, src.shape[0], nthreads)


def widen_bfloat16(float[::1] dst not None, const uint16_t[::1] bits not None, int nthreads):
    """dst = the float32 values of bf16 bits."""
    if bits.shape[0] != dst.shape[0]:
        raise ValueError("widen_bfloat16: dst and bits differ in size")
    if dst.shape[0] == 0:
        return
    cdef float *dp = &dst[0]
    cdef const uint16_t *bp = &bits[0]
    with nogil:
        fa_widen_bfloat16(dp, bp, dst.shape[0], nthreads)


def to_bfloat16(uint16_t[::1] bits not None, const float[::1] x not None, int nthreads):
    cdef uint16_t *bp = NULL
    cdef const float *xp = _cp1(x)
    if bits.shape[0] > 0:
        bp = &bits[0]
    with nogil:
        fa_to_bfloat16(bp, xp, x.shape[0], nthreads)


def bf16_packed_size(int64_t M, int64_t K):
    return fa_bf16_packed_size(M, K)


def bf16_pack(uint16_t[::1] wp not None, const uint16_t[:, ::1] w not None, int nthreads):
    """wp (bf16_packed_size(M, K)), w (M, K) bf16 bits."""
    _pack_bf16_bits(wp, w, nthreads, False)


cdef _pack_bf16_bits(uint16_t[::1] wp, const uint16_t[:, ::1] w, int nthreads, bint compute):
    """The bf16 storage layout (compute False) or the bfloat16 compute layout (True)."""
    cdef uint16_t *pp = NULL
    cdef const uint16_t *src = NULL
    if wp.shape[0] > 0:
        pp = &wp[0]
    if w.shape[0] > 0 and w.shape[1] > 0:
        src = &w[0, 0]
    with nogil:
        if compute:
            fa_bfloat16_pack(pp, src, w.shape[0], w.shape[1], nthreads)
        else:
            fa_bf16_pack(pp, src, w.shape[0], w.shape[1], nthreads)


def linear_bf16_forward(y, x, wp, bias, int activation, int nthreads):
    """y (N, M), x (N, K), wp (bf16_packed_size(M, K)) from bf16_pack, bias (M) or None.
    Arrays checked by _cdata (a decode step's entry)."""
    _linear_bf16_bits(y, x, wp, bias, activation, nthreads, False)


cdef _linear_bf16_bits(y, x, wp, bias, int activation, int nthreads, bint compute):
    """bf16 weights (packed by bf16_pack, or by bfloat16_pack when compute) times x."""
    cdef float *yp = <float *>_cdata(y, cnp.NPY_FLOAT32, 2, True, False, "y")
    cdef const float *xp = <const float *>_cdata(x, cnp.NPY_FLOAT32, 2, False, False, "x")
    cdef const uint16_t *pp = <const uint16_t *>_cdata(wp, cnp.NPY_UINT16, 1, False, False,
                                                       "wp")
    cdef const float *bp = <const float *>_cdata(bias, cnp.NPY_FLOAT32, 1, False, True, "bias")
    cdef int64_t N = _dim(x, 0), K = _dim(x, 1), M = _dim(y, 1)
    cdef int rc
    with nogil:
        if compute:
            rc = fa_linear_bfloat16_forward(yp, xp, pp, bp, N, K, M, activation, nthreads)
        else:
            rc = fa_linear_bf16_forward(yp, xp, pp, bp, N, K, M, activation, nthreads)
    if rc != 0:
        raise MemoryError("linear (bfloat16): could not allocate the rounded activations"
                          if compute else "linear (bf16): could not allocate the widened weight")


def bfloat16_init(int forced):
    return fa_bfloat16_init(forced)


def bfloat16_supports(int path):
    return fa_bfloat16_supports(path)


def bfloat16_path():
    return fa_bfloat16_path()


def bfloat16_path_rows(int64_t N):
    return fa_bfloat16_path_rows(N)


def bfloat16_cpu_has_avx512bf16():
    return fa_bfloat16_cpu_has_avx512bf16()


def bfloat16_packed_size(int64_t M, int64_t K):
    return fa_bfloat16_packed_size(M, K)


def bfloat16_pack(uint16_t[::1] wp not None, const uint16_t[:, ::1] w not None, int nthreads):
    """wp (bfloat16_packed_size(M, K)), w (M, K) bf16 bits."""
    _pack_bf16_bits(wp, w, nthreads, True)


def linear_bfloat16_forward(y, x, wp, bias, int activation, int nthreads):
    """y (N, M), x (N, K), wp from bfloat16_pack, bias (M) or None (bfloat16 compute).
    Arrays checked by _cdata (a decode step's entry)."""
    _linear_bf16_bits(y, x, wp, bias, activation, nthreads, True)


def ffn_bfloat16_forward(y, x, w1p, b1, w2p, b2, int64_t F, int activation, int nthreads):
    """y (N, C) = act(x w1^T + b1) w2^T + b2 in the bfloat16 compute type, the hidden (N, F)
    kept as bf16 bits where that pays (fa_ffn_bfloat16_forward); x (N, C); w1p, w2p from
    bfloat16_pack of the (F, C) and (C, F) weights; b1 (F), b2 (C) or None."""
    cdef float *yp = <float *>_cdata(y, cnp.NPY_FLOAT32, 2, True, False, "y")
    cdef const float *xp = <const float *>_cdata(x, cnp.NPY_FLOAT32, 2, False, False, "x")
    cdef const uint16_t *p1 = <const uint16_t *>_cdata(w1p, cnp.NPY_UINT16, 1, False, False,
                                                       "w1p")
    cdef const uint16_t *p2 = <const uint16_t *>_cdata(w2p, cnp.NPY_UINT16, 1, False, False,
                                                       "w2p")
    cdef const float *bp1 = <const float *>_cdata(b1, cnp.NPY_FLOAT32, 1, False, True, "b1")
    cdef const float *bp2 = <const float *>_cdata(b2, cnp.NPY_FLOAT32, 1, False, True, "b2")
    cdef int64_t N = _dim(x, 0), C = _dim(x, 1)
    if _dim(y, 0) != N or _dim(y, 1) != C:
        raise ValueError(f"ffn_bfloat16_forward: y {y.shape} is not x's {x.shape}")
    if _dim(w1p, 0) != fa_bfloat16_packed_size(F, C) or \
            _dim(w2p, 0) != fa_bfloat16_packed_size(C, F):
        raise ValueError(f"ffn_bfloat16_forward: w1p ({_dim(w1p, 0)}) and w2p ({_dim(w2p, 0)}) "
                         f"are not packed {F}x{C} and {C}x{F} weights")
    if (b1 is not None and _dim(b1, 0) != F) or (b2 is not None and _dim(b2, 0) != C):
        raise ValueError(f"ffn_bfloat16_forward: b1 must hold {F} values and b2 {C}")
    cdef int rc
    with nogil:
        rc = fa_ffn_bfloat16_forward(yp, xp, p1, bp1, p2, bp2, N, C, F, activation, nthreads)
    if rc != 0:
        raise MemoryError("ffn (bfloat16): could not allocate the hidden")


PEAK_KINDS = ("vdpbf16ps", "fma", "amx_bf16", "amx_int8")


def peak(int64_t iters, int nthreads, kind):
    """Flops of the register-only loop of `kind` (PEAK_KINDS: vdpbf16ps, vfmadd231ps,
    TDPBF16PS, TDPBSSD; fa_peak; time the call), or -1 where it cannot run."""
    if kind not in PEAK_KINDS:
        raise ValueError(f"peak: kind must be one of {', '.join(PEAK_KINDS)}, got {kind!r}")
    cdef int k = PEAK_KINDS.index(kind)
    cdef double r
    with nogil:
        r = fa_peak(iters, nthreads, k)
    return r


def gemm_info(int isa):
    """The GEMM engine's cache sizes and K block at level isa (fa_gemm_info), or None."""
    cdef int64_t out[8]
    cdef int n = fa_gemm_info(isa, out)
    return None if n < 0 else [out[i] for i in range(n)]


def quant_tiles():
    """The quantised kernels' sizes (fa_quant_tiles), as a list of ints."""
    cdef int64_t out[16]
    cdef int n = fa_quant_tiles(out)
    return [out[i] for i in range(n)]
