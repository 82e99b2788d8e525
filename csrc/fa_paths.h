/* fa_paths.h -- the paths a call runs on, as paths.c chose them (internal to csrc/; the
 * binding's fa_*_init, fa_*_supports and fa_*_path are in fastattn.h). The family files ask
 * here at each entry point and pass the answer down to their kernels. A call that may run on
 * the AMX tiles settles a pending grant first (paths.c), so these are called outside parallel
 * regions, before the threads start. */
#ifndef FA_PATHS_H
#define FA_PATHS_H

#include "fa_kernels.h"

/* the int8 path's kernels for a product of `rows` rows (fa_int8_path_rows): every rows' kernels
 * share one packed layout (np, g), so fa_int8_pack's layout is any rows' */
const fa_q8_kernels *fa_paths_int8(int64_t rows);

/* bf16 storage's many-row products (fa_linear_bf16_forward): the tiles where the int8 path is
 * amx or amx-emulated, else NULL (the widened weight and the float32 engine) */
const fa_amx_kernels *fa_paths_bf16_storage(void);

/* the bfloat16 compute type's path for a product of `rows` rows (fa_bfloat16_path_rows) in
 * *path, and the tiles it runs on where that is amx or amx-emulated (else NULL) */
const fa_amx_kernels *fa_paths_bfloat16(int64_t rows, fa_bf16_path_t *path);

/* the real tiles (fa_amx) where the CPU has AMX-INT8 and AMX-BF16 and Linux grants them (asked
 * for here), whatever the paths chosen; else NULL (fa_peak's tile loops) */
const fa_amx_kernels *fa_paths_amx_tiles(void);

/* bf16 attention's units (fa_att_units), from its path */
fa_att_units fa_paths_attention_bf16(void);

#endif /* FA_PATHS_H */
