/* blas.c -- row-major GEMM wrapper and BLAS facts for build_info() (see fa_blas.h). */
#include "fa_blas.h"
#include "fastattn.h"

void fa_sgemm_rowmajor(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty sum, C = beta C (BLAS would refuse lda = 0) */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    FA_CBLAS(sgemm)(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K,
                    alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

void fa_blas_set_num_threads(int n) { FA_OPENBLAS(set_num_threads)(n); }

int fa_blas_get_num_threads(void) { return FA_OPENBLAS(get_num_threads)(); }

const char *fa_blas_config(void) { return FA_OPENBLAS(get_config)(); }

const char *fa_blas_corename(void) { return FA_OPENBLAS(get_corename)(); }
