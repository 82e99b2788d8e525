/* quant_body.h -- the int8 and bf16 weight kernels, per ISA (included by quant.c through
 * fa_instantiate.h). The activations come from linear_body.h (bias_act_rows_), so a quantised
 * product applies exactly the fp32 linear's relu and gelu. */
#include "linear_body.h"
