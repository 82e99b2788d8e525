/* embedding.c -- the embedding's backward: a deterministic scatter-add of gradient rows.
 *
 * No atomics and no per-thread copies of dweight: a stable counting sort groups the positions
 * by id, then each thread owns a range of ids and writes only their rows. Each row is summed in
 * position order whatever the thread count. */
#include <stdlib.h>
#include <string.h>

#include "fastattn.h"

/* The first id v with cost(v) = start[v] + v >= target: ids [v(t), v(t + 1)) go to thread t,
 * so each thread gets about the same rows read (start[v]: positions before id v) plus rows
 * written (one per id). */
static int64_t first_id_at(const int64_t *start, int64_t V, int64_t target)
{
    int64_t lo = 0, hi = V;                               /* cost(V) = N + V >= any target */
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (start[mid] + mid >= target) hi = mid; else lo = mid + 1;
    }
    return lo;
}

int fa_embedding_backward(float *dweight, const float *dout, const int64_t *ids, int64_t N,
                          int64_t C, int64_t V, int accumulate, int nthreads)
{
    if (V <= 0 || C <= 0) return 0;
    /* scratch: start (V + 1): first sorted slot of each id; order (N): positions by id */
    int64_t *start = malloc((size_t)(V + 1 + (N > 0 ? N : 0)) * sizeof(int64_t));
    if (!start) return -1;
    int64_t *order = start + V + 1;
    memset(start, 0, (size_t)(V + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++) start[ids[i] + 1]++;           /* counts, shifted by one */
    for (int64_t v = 0; v < V; v++) start[v + 1] += start[v];       /* prefix sums */
    for (int64_t i = 0; i < N; i++) order[start[ids[i]]++] = i;     /* stable: i ascending */
    for (int64_t v = V; v > 0; v--) start[v] = start[v - 1];        /* undo the ++ above */
    start[0] = 0;

    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)(N + V) * (double)C, 1.3e5);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int64_t t = fa_thread_id(), T = fa_team(), total = N + V;
        const int64_t v0 = first_id_at(start, V, total * t / T);
        const int64_t v1 = t + 1 == T ? V : first_id_at(start, V, total * (t + 1) / T);
        for (int64_t v = v0; v < v1; v++) {
            float *FA_RESTRICT w_v = dweight + v * C;
            if (!accumulate) memset(w_v, 0, (size_t)C * sizeof(float));
            for (int64_t j = start[v]; j < start[v + 1]; j++) {  /* positions in order */
                const float *FA_RESTRICT d_i = dout + order[j] * C;
                for (int64_t c = 0; c < C; c++) w_v[c] += d_i[c];
            }
        }
    }
    free(start);
    return 0;
}
