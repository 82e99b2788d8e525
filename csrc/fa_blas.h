/* fa_blas.h -- the only way the kernels reach BLAS.
 *
 * Every call goes through FA_CBLAS(name) / FA_OPENBLAS(name), which paste BLAS_SYMBOL_PREFIX
 * (scipy_ for the scipy-openblas32 package; empty for a system OpenBLAS) onto the name. */
#ifndef FA_BLAS_H
#define FA_BLAS_H

#include <stdint.h>

#include <cblas.h>

#ifndef BLAS_SYMBOL_PREFIX
#define BLAS_SYMBOL_PREFIX
#endif
#define FA_BLAS_PASTE_(a, b) a##b
#define FA_BLAS_PASTE(a, b) FA_BLAS_PASTE_(a, b)
#define FA_CBLAS(name) FA_BLAS_PASTE(BLAS_SYMBOL_PREFIX, FA_BLAS_PASTE(cblas_, name))
#define FA_OPENBLAS(name) FA_BLAS_PASTE(BLAS_SYMBOL_PREFIX, FA_BLAS_PASTE(openblas_, name))

/* C (M, N) = alpha * op(A) op(B) + beta * C, all row-major; op = transpose when trans_* != 0.
 * A is (M, K) or (K, M) if transposed; B is (K, N) or (N, K) if transposed. */
void fa_sgemm_rowmajor(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc);

/* Threads: every GEMM is issued from inside an OpenMP region (one call per thread, on that
 * thread's block), so BLAS must run single-threaded. The packaged OpenBLAS is a pthreads build
 * whose thread count is one process-wide setting, not per call: fastattn sets it to 1 once, at
 * import and again in set_num_threads() (fa_blas_set_num_threads), and never toggles it around
 * a call, which could not be atomic across Python threads calling kernels at the same time. */

#endif /* FA_BLAS_H */
