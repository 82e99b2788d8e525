/* fa_gemm.h -- the float32 GEMM engine (gemm.c; its tiles per ISA in gemm_body.h), for the
 * kernels' own products: linear.c. Every float32 product of the models runs here
 * (BLAS is not called).
 *
 * B is packed once into panels of FA_PANEL features holding all of K (fa_gemm_pack_panels):
 * a weight by its kind when a model enters eval() (fa_pack_panels), else per call. The block
 * sizes come from the CPU's cache sizes (fa_gemm_init), the tasks of a product (blocks of rows
 * x groups of panels) are handed to the team's threads as they come free, and every element
 * is one sum in k order (gemm_body.h), so no size, team or schedule changes a bit. */
#ifndef FA_GEMM_H
#define FA_GEMM_H

#include <stdint.h>

#include "fa_kernels.h"

/* How a product is cut: K blocks of kc, tasks of mb rows x nbp panels. */
typedef struct {
    int64_t kc, mb, nbp;
} fa_gemm_plan;

/* Read the cache sizes (sysconf; 32 KiB / 1 MiB / 8 MiB when the system does not say). Called
 * once by fa_cpu_init. */
void fa_gemm_init(void);
/* the L1d, L2 and L3 sizes in use, in bytes (for build_info) */
void fa_gemm_caches(int64_t out[3]);
fa_gemm_plan fa_gemm_plan_for(int64_t M, int64_t N, int64_t K, int trans_a, int nt);

/* floats of a packed B (K, N): ceil(N / FA_PANEL) panels of K x FA_PANEL */
int64_t fa_gemm_packed_size(int64_t K, int64_t N);
/* Panels [p0, p1) of op(B) (K, N) packed into bp: trans_b 0, B (K, N) row stride ldb; 1, B given
 * as (N, K) (a torch weight, out x in) row stride ldb. Features past N are zero. */
void fa_gemm_pack_panels(float *bp, int trans_b, int64_t K, int64_t N, const float *B,
                         int64_t ldb, int64_t p0, int64_t p1);
/* The same for every panel, by the calling team (an `omp for` over panels, then its barrier;
 * alone outside a parallel region). */
void fa_gemm_pack_team(float *bp, int trans_b, int64_t K, int64_t N, const float *B,
                       int64_t ldb);

/* g's whole product by the calling team: its tasks by an `omp for schedule(dynamic)` (each
 * thread takes the next when it is done), then the loop's barrier. Alone outside a region. */
void fa_gemm_team(const fa_gemm_t *g);
/* g's whole product by a team of up to nthreads (opened here) */
void fa_gemm_run(const fa_gemm_t *g, int nthreads);
/* rows [r0, r1) of g's product, every panel, on the calling thread */
void fa_gemm_rows(const fa_gemm_t *g, int64_t r0, int64_t r1);

/* c[i * ldc + j] += t[i * N + j] for rows [r0, r1), j < N: an accumulated product's add (the
 * product computed into t first, so C_old + sum is one rounding, as the twin adds) */
void fa_gemm_add_rows(float *c, int64_t ldc, const float *t, int64_t N, int64_t r0, int64_t r1);

#endif /* FA_GEMM_H */
