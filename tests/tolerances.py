"""Every tolerance the suite's shared checks use: one table (TOL) and the functions that scale its
entries by the size of a problem. Tests compare with conftest.assert_close.

Float32 kernels are checked against the float64-evaluated twin (DESIGN: oracle (b)); float32
rounding grows with what a result sums, not with the result itself (which may cancel to ~0), so
most absolute tolerances here are a factor times a magnitude the test computes from its inputs.
Where an entry says "atol x <magnitude>", its atol is that factor and a function below (or the
one check using the entry) multiplies it by the magnitude named. rtol is relative to the
expected value, element by element.

A number passed as a tolerance anywhere else in the suite needs a comment on its line or the
line above saying where it comes from (test_tolerance_literals checks it); single checks get a
named entry here like the shared ones, with what it bounds and why that size.
"""
import math

import numpy as np

from fastattn import reference

EPS32 = float(np.finfo(np.float32).eps)   # 1.19e-7, float32's machine epsilon

# max |gelu'(x)| (at x ~ 2.4): an error in gelu's input grows by at most this
GELU_MAX_SLOPE = 1.13

TOL = {
    # ---- forward kernels against the twin -----------------------------------------------------
    # out: atol x max(1, max|v|) x growth (the output is a convex combination of the rows of v;
    # growth = max(1, largest |score| / 50), scores up to ~50 being the calibrated range)
    "attention": dict(rtol=1e-4, atol=2e-5),
    # weights: rtol and atol x growth (each weight is exp of a rounded score: relative error
    # ~ eps * |score|)
    "attention_weights": dict(rtol=1e-4, atol=1e-6),
    # lse: atol x max(1, largest |score|): an absolute error of ~eps * |largest score| is all
    # float32 can hold
    "attention_lse": dict(rtol=1e-5, atol=1e-5),
    # rtol x max(1, spread of the row's finite entries / 100): exp(x - max) carries a relative
    # error of about eps * |x - max| (softmax_tol)
    "softmax": dict(rtol=1e-5, atol=1e-7),
    # y: atol x (1 + max|weight| + max|bias|), the output being O(|weight|) + |bias|
    "layer_norm": dict(rtol=1e-4, atol=1e-5),
    "layer_norm_mean": dict(rtol=1e-6, atol=1e-6),   # atol x max|x + residual|
    "layer_norm_rstd": dict(rtol=1e-4, atol=0.0),
    # dot products: atol x EPS32 x sqrt(K) x max(|x| @ |w|^T + |b|), K terms summed in float32
    # by the GEMM engine in k order (dot_atol)
    "linear": dict(rtol=1e-5, atol=4.0),
    # both GEMMs, the first one's error carried through the activation and w2 (ffn_atol)
    "ffn": dict(rtol=1e-5, atol=4.0),
    # finite masks (test_attention_masks: values of size ~1, biases up to finfo(float32).min):
    # rtol and atol x max(1, max|expected|), for out and for dq, dk, dv, against the twin and
    # against torch's math backend
    "attention_masks": {k: dict(rtol=r, atol=r) for k, r in
                        dict(out=2e-5, grad=2e-4, out_torch=1e-5, grad_torch=1e-4).items()},
    # a row that averages v (masked throughout by one finite value, or a decode step over a
    # padded source): a float32 sum of Lk values of size ~1
    "attention_mean_row": dict(rtol=1e-5, atol=1e-6),
    # ---- backward kernels against the twin ----------------------------------------------------
    # dq, dk, dv: atol x EPS32 x (sqrt(terms) + largest |score|) x the largest sum of |terms| an
    # element adds up (attention_grad_atol): products of recomputed probabilities (relative
    # error ~ eps * |score|) with float32 data
    "attention_grad": dict(rtol=1e-4, atol=4.0),
    # the same against torch autograd, whose float32 gradients carry their own rounding
    "attention_grad_torch": dict(rtol=2e-4, atol=8.0),
    # an activation's derivative (relu', gelu' through float32 erf or tanh polynomials) against
    # the float64 twin's, at values of pre from -14 to 14 and the special values
    "activation_grad": {"relu": dict(rtol=1e-6, atol=2e-7), "gelu": dict(rtol=1e-6, atol=2e-7),
                        "gelu_tanh": dict(rtol=1e-5, atol=2e-7),
                        "silu": dict(rtol=1e-6, atol=2e-7)},
    # linear / ffn gradients: atol x EPS32 x sqrt(inner) x the same chain of products on
    # absolute values (chain_atol)
    "linear_grad": dict(rtol=1e-5, atol=4.0),
    # dx, dweight, dbias: atol x EPS32 x sqrt(terms summed) x their sizes, plus float32's own
    # conditioning of x + residual (layer_norm_grad_atols); rtol as the forward's
    "layer_norm_grad": dict(rtol=1e-4, atol=8.0),
    # ---- cross entropy ------------------------------------------------------------------------
    # loss: atol x EPS32 x max(1, max|x|) (lse - x_t in float32, terms of size max|x|), times the
    # row count for a sum (loss_atol)
    "cross_entropy": dict(rtol=1e-5, atol=8.0),
    # dlogits = (softmax - targets) x scale (1 / count for a mean): atol x EPS32 x scale, float32
    # and the exp polynomial
    "cross_entropy_grad": dict(rtol=1e-4, atol=4.0),
    # ---- the twins against hand-computed values and torch -------------------------------------
    # the twins compute in float64 and round to float32 once: a few float32 ulps
    "reference": dict(rtol=1e-6, atol=1e-7),
    # the attention twin against a row-by-row loop with math.exp (test_reference): both round
    # to float32 at the end, but sum exp in a different order, for outputs and lse of size ~1
    "reference_loop": dict(rtol=1e-6, atol=1e-6),
    # a float64 twin's backward against central differences of its forward (grad_util, step
    # 1e-6): truncation ~ h^2 and cancellation ~ eps64 / h, both far below these
    "finite_difference": dict(rtol=1e-6, atol=1e-7),
    # the twins against torch's float32 ops
    "reference_torch": dict(rtol=1e-5, atol=1e-6),
    # a kernel or the model against torch, both in float32 with their own rounding
    "torch": dict(rtol=1e-4, atol=1e-5),
    # ---- the model layer (fastattn.nn) --------------------------------------------------------
    # small models (d_model 32) against torch: max|diff| <= atol x max|torch's| (rel_atol)
    "nn_torch": dict(rtol=0.0, atol=1e-4),
    # the rest of torch.nn's surface (test_torch_surface), forward and autograd:
    # max|diff| <= atol x max|torch's|
    "nn_torch_surface": dict(rtol=0.0, atol=1e-5),
    # the fast backend against the reference backend: rtol, and atol x max|reference|
    "nn_backends": dict(rtol=1e-5, atol=1e-5),
    # a quantized weight, dequantized, against its float32 original, relative (max|diff| /
    # max|ref|): int8 keeps 127 levels a side of each row's largest |value|, bf16 8 bits of
    # mantissa (bfloat16 stores its weights as bf16 does)
    "quantized_weight": {"int8": 1 / 127, "bf16": 2.0**-8, "bfloat16": 2.0**-8},
    # a quantized model's outputs against its float32 original, relative (max|diff| / max|ref|):
    # int8 rounds weights to ~1/254 of their row's range (and a product's inputs to ~1/65534 of
    # theirs), bf16 to 2^-9
    "quantized_vs_float32": {"int8": 0.05, "bf16": 0.01, "bfloat16": 0.02},
    # the same quantized math computed two ways (fast and reference backends, decode steps and
    # the full forward): their float32 parts (attention, layer norm) differ by ~1e-7, which can
    # move an int8 product's input across a rounding boundary of its L levels (one level is
    # 1/32767 of the row's largest value at d_model 32), so int8 allows a few levels; bfloat16
    # the same across a bf16 rounding boundary of a product's input (2^-8 of one input)
    "quantized_same_math": {"int8": 2e-4, "bf16": 1e-5, "bfloat16": 5e-3},
    # an int8 or bfloat16 linear with gelu against the twin: the integer (or bf16) sums agree bit
    # for bit, so only the gelu kernel's accuracy against float64 gelu is left
    "quantized_gelu": dict(rtol=2e-6, atol=1e-6),
    # ---- optimisers (rtol, and atol x max(1, max|expected|): scaled(entry, expected, 1.0)) ------
    # one float32 step against torch's float32 step: FMA contraction and the order of a few
    # products move a value by a few ulps
    "optim_torch": dict(rtol=1e-6, atol=1e-6),
    # the kernel's step against the float64 twin's, rounded once
    "optim_twin": dict(rtol=5e-7, atol=5e-7),
    # grad_norm (and clip_grads' total): the kernel sums squares in float64 like the twin, so
    # only the order of the sum differs; torch sums float32 norms
    "grad_norm_twin": dict(rtol=1e-12, atol=1e-12),
    "grad_norm_torch": dict(rtol=1e-6, atol=0.0),
    # clipped gradients: each value times one float32-rounded factor, relative to each value
    "clip_grads": dict(rtol=1e-6, atol=0.0),
    # ---- data-parallel training ---------------------------------------------------------------
    # 2 ranks against one process with the same global batches (test_distributed, which says
    # which weights are left out): the gradients' rows are summed in two parts, then across
    # the ranks, so losses, weights and logits move by float32 rounding only
    "data_parallel": dict(loss=dict(rtol=1e-6, atol=0.0), weight_atol=1e-6,
                          logits=dict(rtol=0.0, atol=1e-5)),
    # ---- single checks of the twins (test_reference) --------------------------------------
    # the same values, bit for bit (-0.0 == 0.0, NaN where NaN is expected): one computation
    # spelled two ways, or a value float32 holds exactly
    "exact": dict(rtol=0.0, atol=0.0),
    # a twin's float32 value against the same value worked out in float64 by hand (math.sin,
    # math.erf): one float32 rounding of a value of size <= 1 is at most 6e-8
    "reference_by_hand": dict(rtol=0.0, atol=1e-7),
    # softmax weights against exp worked out by hand, relative to each weight (some are ~1e-12):
    # one float32 rounding of each is 6e-8, relative
    "reference_by_hand_rel": dict(rtol=1e-6, atol=0.0),
    # gelu(-10) = -7.6e-23 in float64: what the twin gives there stays that small (no cancellation
    # of 0.5 x (1 + erf) growing into float32's ulp at 1)
    "gelu_far_tail": dict(rtol=0.0, atol=1e-20),
    # softmax rows summing to 1: a float32 sum of <= 6 weights, each rounded once
    "reference_row_sums": dict(rtol=1e-6, atol=1e-6),
    # a twin against the same formula evaluated in float64 by numpy or torch (einsum, log-sum-exp,
    # the tutorials' positional encoding), values of size ~1: the twin's one rounding to float32
    "reference_float64": dict(rtol=1e-6, atol=1e-6),
    # the ffn twin against two linear twins: the hidden layer rounds to float32 between them
    "reference_ffn": dict(rtol=1e-5, atol=1e-6),
    # the linear, ffn and layer-norm twins against torch's float32 (outputs summing K products of
    # values ~1; torch rounds every partial sum)
    "reference_torch_sums": dict(rtol=1e-5, atol=1e-5),
    # ---- layer norm's single checks (test_ops_layernorm_scale, test_ops_layernorm) --------
    # the mean of rows of size ~1 (no weight, a NaN row beside them): an absolute floor for
    # means near 0
    "layer_norm_mean_small": dict(rtol=1e-6, atol=1e-5),
    # the backward on rows scaled to 1e36 (a residual of the same size): dx is ~1e-36, so its
    # floor is far below that; dweight and dbias sum N rows: their atol is x N
    "layer_norm_grad_at_scale": dict(dx=dict(rtol=1e-4, atol=1e-40),
                                     dweight=dict(rtol=1e-4, atol=1e-5),
                                     dbias=dict(rtol=1e-5, atol=1e-6)),
    # the backward on rows of size ~1 (no weight), beside a row that is NaN throughout
    "layer_norm_grad_small": dict(dx=dict(rtol=1e-4, atol=1e-5), dbias=dict(rtol=1e-5, atol=1e-5)),
    # rows of one value (var = 0, x up to 1e4): y = bias and dweight = 0, up to the rounding
    # of the float32 mean subtracted from each x
    "layer_norm_constant_rows": dict(rtol=0.0, atol=1e-6),
    # their rstd = 1 / sqrt(eps), relative
    "layer_norm_constant_rstd": dict(rtol=1e-5, atol=0.0),
    # weight None / bias None against explicit ones and zeros: the same normalised values,
    # times 1 and plus 0 (or a path that skips them)
    "layer_norm_none_weight": dict(rtol=1e-6, atol=1e-6),
    # the fused residual add against the residual added first (forward and backward): the same
    # float32 sum, then statistics in another order
    "layer_norm_fused_residual": dict(rtol=1e-5, atol=1e-5),
    # ---- attention's and dropout's single checks ------------------------------------------
    # dk, dv against the twin on problems of size ~1 with a NaN row or blind (fully masked) rows
    # beside them, where attention_grad_atol's magnitudes are not worked out: rtol, and atol
    # (x max|expected| where the check scales it)
    "attention_grad_plain": dict(rtol=1e-4, atol=1e-5),
    # the backward kernel on empty sizes (the elements that exist, of size ~1)
    "attention_grad_empty_sizes": dict(rtol=1e-5, atol=1e-6),
    # out with dropout against the twin's: atol x max|v| (kept weights scaled by 1 / (1 - p) <=
    # 1 / 0.7 add to the forward's rounding)
    "attention_dropout_out": dict(rtol=1e-4, atol=4e-5),
    # out with dropout against torch autograd's float64 forward on the twin's keep mask
    "attention_dropout_torch": dict(rtol=1e-4, atol=1e-5),
    # the share of dropped (or kept) elements against p, over >= 60000 draws: its standard
    # deviation is <= sqrt(0.25 / 60000) = 0.002, so 0.01 is 5 of them (fixed seeds: the check
    # is deterministic)
    "dropout_fraction": 0.01,
    # kept values x * (1 / (1 - p)) in float32 against the float64 twin (or x / (1 - p) rounded
    # once): within about an ulp, relative; dropped ones are 0 in both
    "dropout_scale": dict(rtol=2.5e-7, atol=0.0),
    # ---- linear's single checks (test_ops_linear, test_ops_linear_backward) ---------------
    # an activation applied by the linear kernel (to x @ I) at its special values (0, +-inf,
    # NaN, the extremes) against the float64 twin's
    "activation_special_values": dict(rtol=1e-6, atol=1e-7),
    # the activation kernels against float64 gelu over x in [-12, 12]: erf's polynomial is good to
    # a few float32 ulps; the tanh form carries float32's relative error of u = k0 (x + k1 x^3)
    # into e^(2|u|), so its left tail is good to ~1e-5 relative
    "activation": {"gelu": dict(rtol=1e-6, atol=2e-7), "gelu_tanh": dict(rtol=1e-5, atol=2e-7),
                   "silu": dict(rtol=1e-6, atol=2e-7)},
    # the packed-weight linear against the twin, weights ~ N(0, 1 / K): atol x sqrt(K)
    "linear_packed": dict(rtol=1e-5, atol=1e-5),
    # linear and ffn against torch autograd (forward and gradients): twice linear_grad's factor,
    # torch's float32 carrying rounding of its own; atol is chain_atol's factor
    "linear_grad_torch": dict(rtol=1e-4, atol=8.0),
    # a gradient accumulated into a buffer (+=) against the gradient plus the buffer: one more
    # float32 rounding of a value of size ~1
    "linear_grad_accumulate": dict(rtol=1e-6, atol=1e-6),
    # ---- sizes and views (test_binding, test_validation) ----------------------------------
    # the kernels on empty or degenerate sizes (a dimension of 0 or 1) against the twin: sums of
    # no or few terms (zeros, the bias-only values)
    "empty_sizes": dict(rtol=1e-6, atol=1e-6),
    # attention on a small problem (a few keys, values of size ~1: strided views, broadcast
    # masks, a masked NaN key) against the twin
    "attention_small": dict(rtol=1e-5, atol=1e-6),
    # ---- weights and softmax rows (test_ops_softmax, test_ops_attention, the model's weights) ---
    # rows of float32 weights exp(s - lse) summing to 1: an lse up to ~37 carries an ulp of
    # 3.8e-6 into every weight of its row
    "row_sums": dict(rtol=0.0, atol=1e-5),
    # softmax rows of small scores (half the columns masked) summing to 1
    "softmax_row_sums": dict(rtol=0.0, atol=1e-6),
    # rows of equal scores (and -inf) against 1 / C, relative
    "softmax_uniform": dict(rtol=1e-6, atol=0.0),
    # softmax(x) against softmax(x - 1e4) with x ~ 1e4: float32's ulp at 1e4 is 1e-3, an error
    # x - max carries into exp relative
    "softmax_shifted": dict(rtol=1e-3, atol=1e-7),
    # causal attention against non-causal for one query row (it sees every key either way)
    "attention_causal_one_row": dict(rtol=1e-6, atol=1e-6),
    # the kernel's weights against seed 002's row "I" worked out by hand (a weight of 3.5e-12
    # beside 1 - 3.5e-12): relative, and a floor far below the small weight
    "attention_seed002_by_hand": dict(rtol=1e-5, atol=1e-12),
    # ---- quantized and bf16 single checks (test_ops_quant, test_ops_bf16_training) --------
    # an int8 linear whose inputs sit on the quantization levels against the float64 product:
    # the integer sums are exact, the scales' product rounds once to float32
    "quantized_on_levels": dict(rtol=1e-6, atol=1e-6),
    # an ffn with quantized weights against its twin where they may differ (gelu, bf16): a
    # hidden value may round to a neighbouring level, moved through the second product
    "quantized_ffn": dict(rtol=1e-4, atol=1e-4),
    # bf16 compute on operands bf16 holds exactly (and a gradient rounded beforehand) against
    # float32's: the same products, summed in another order
    "bf16_exact_operands": dict(rtol=1e-6, atol=1e-6),
    # ... while the gradient's own rounding to bf16 moves some dx by more than this
    "bf16_gradient_rounded": dict(rtol=1e-6, atol=0.0),
    # the ffn's kept pre-activation against the same bf16 product by the linear kernel (another
    # order of the float32 sums): rtol, and atol x max|pre|
    "bf16_pre_two_orders": dict(rtol=1e-5, atol=1e-5),
    # bf16 mixed-precision training's products (test_ops_bf16_training), as norms relative to
    # the twin's result (|a - b| / |b|): twin: a value about to be rounded to bf16 may differ by
    # a float32 ulp from the twin's and round to the neighbouring bf16 (2^-8) in rare elements;
    # twin_blocks: attention over several key blocks rounds P at the running maximum (the twin:
    # at the row's), up to a bf16 ulp of P where the maximum moved; vs_fp32: both operands of
    # each product rounded to 8 significant bits (<= 2^-9 each) move a result by ~2^-8, bounded
    # from above by 2^-5; moves: and it must move by more than 2^-12 (bf16 really ran)
    "bf16_training": dict(twin=1e-4, twin_blocks=4e-3, vs_fp32=2.0 ** -5, moves=2.0 ** -12),
    # the whole model's gradients (test_bf16_training, norms relative as above): bf16 kernels
    # against the twin's bf16, a product's input a float32 ulp apart rounding to the neighbouring
    # bf16 and every later layer carrying it on (about 1e-3 to 2.5e-2 on that model, by SIMD
    # level); against float32: (at least, at most) moved
    "bf16_training_model": dict(twin=0.05, vs_fp32=(0.005, 0.1)),
    # ---- the seed walkthrough (test_examples), np.testing's default rtol of 1e-7 kept where only atol was given ---
    # its float32 steps against the same values in float64 (the seed's embeddings, sin and cos,
    # rows of weights summing to 1): one rounding, relative
    "walkthrough_float32": dict(rtol=1e-6, atol=0.0),
    # the attention output against its weights (v = I): float32 sums of 6 weights
    "walkthrough_attention": dict(rtol=1e-7, atol=1e-5),
    # against the seed's tables, printed to 2 decimals: half their last place, and float slack
    "walkthrough_seed_table": dict(rtol=1e-7, atol=0.005 + 1e-6),
    # the population's normalised values against ddof=1's times sqrt(5 / 4): eps in the
    # variance keeps the ratio from being exact
    "walkthrough_population": dict(rtol=1e-7, atol=2e-3),
    # its layer norm's float32 output against float64's (and the row means of an output with
    # weight 1 against 0)
    "walkthrough_layer_norm": dict(rtol=1e-7, atol=1e-5),
    # ---- embedding and the model's layers -------------------------------------------------
    # embedding's dweight against the twin: atol x max|dout| x the number of ids summed into the
    # row (in another order than the twin's)
    "embedding_grad": dict(rtol=1e-6, atol=4e-7),
    # the same against torch autograd: atol x the number of ids (dout of size ~1)
    "embedding_grad_torch": dict(rtol=1e-5, atol=1e-6),
    # the float64 embedding twin's backward against central differences: the loss is linear in
    # the weights, so the differences are exact to float64's cancellation
    "finite_difference_embedding": dict(rtol=1e-7, atol=1e-8),
    # the model's positional-encoding table (float32) against sin and cos in float64, positions
    # up to 50: values of size <= 1 and the angles rounded once
    "positional_encoding": dict(rtol=0.0, atol=1e-6),
    # ---- the model and the benchmarks -----------------------------------------------------
    # a fully masked (or blocked) query row through the attention module: zeros from attention,
    # then out_proj adds its bias (a product of zeros plus the bias)
    "masked_row_bias": dict(rtol=0.0, atol=1e-6),
    # CTranslate2's float32 log-probabilities against the model's: another engine, with its own
    # GEMMs and log-softmax, over up to 20 target tokens
    "ct2_scores": dict(rtol=0.0, atol=1e-3),
    # ---- the model layer's single checks (tests/nn) -----------------------------------------
    # the model's forward taken apart (encode, decode, then generator) against the whole forward:
    # the same kernels on the same values, in other calls (other rows around them):
    # max|diff| <= atol x max|whole forward's|
    "nn_split_forward": dict(rtol=0.0, atol=1e-6),
    # the fast backend's gradients against the reference backend's (loss with backward), relative
    # to each gradient's largest value: max|diff| <= atol x max|reference's|; they sum dweight's
    # rows in another order through a chain of layers
    "nn_backends_grad": dict(rtol=0.0, atol=1e-4),
    # ... and the two backends' losses, relative: a mean of log-probabilities of size ~1-10
    "nn_backends_loss": dict(rtol=1e-5, atol=0.0),
    # the model's loss against torch's CrossEntropyLoss on torch's twin of it (label smoothing,
    # padding ignored), relative: both in float32, over logits of a small model
    "nn_loss_torch": dict(rtol=1e-5, atol=0.0),
    # ... and after some optimiser steps on both sides (test_training): the weights drift apart
    # by float32 rounding step by step, so ten times the single step's
    "nn_training_loss_torch": dict(rtol=1e-4, atol=0.0),
    # gradients accumulated over two identical backward passes against twice the first: the
    # second pass adds into buffers that hold the first (another float32 rounding of every
    # partial sum): max|diff| <= atol x max|2 x first|
    "nn_grad_accumulate": dict(rtol=0.0, atol=1e-5),
    # attention weights recorded by the model (rows with no masked key, or all but one) summing
    # to 1: float32 weights of an lse of the scores' size, np.testing's default rtol of 1e-7 kept
    "nn_weight_row_sums": dict(rtol=1e-7, atol=1e-5),
    # the std of torch's N(0, 1) init of a 300 x 256 embedding against 1: the sample std's own
    # spread is 1 / sqrt(2 x 76800) = 0.0026, so 0.05 is ~20 of them (seeded: deterministic)
    "nn_init_std": dict(rtol=0.05, atol=0.0),
    # ---- the torch decoders of the benchmarks (test_bench_torch_cache, test_cli) ------------
    # a torch decoder's logits, stepped over a cache that grows or after a beam reorder, against
    # the same steps taken another way (the uncached decoder, the source decoded alone): torch's
    # float32 GEMMs on other shapes round otherwise
    "torch_decoder_steps": dict(rtol=1e-5, atol=1e-5),
    # ---- attention masks and bf16 attention ------------------------------------------------
    # rows of weights under finite biases down to finfo(float32).min (test_attention_masks)
    # summing to 1: numpy allclose's default rtol of 1e-5 kept beside its atol
    "attention_masks_row_sums": dict(rtol=1e-5, atol=1e-5),
    # the one key that wins its row by a bias near the float32 limit against a weight of 1:
    # pytest.approx's default rel of 1e-6 kept (its abs of 1e-12 is far below 1e-6 x 1)
    "attention_masks_winner": dict(rtol=1e-6, atol=0.0),
    # rows whose keys are all masked by finfo.min, key 0 twice: weights 0 for key 0 and 1 / 4
    # for the others; numpy allclose's defaults kept
    "attention_masks_masked_alike": dict(rtol=1e-5, atol=1e-8),
    # bf16 attention against its twin (test_ops_attention_bf16): out's bound is the absolute one
    # the module docstring derives (rtol 0); the weights' rtol is derived too, and their atol is
    # only a floor for weights that underflow to ~0 (2^-120: far below any weight the derived
    # rtol is about)
    "attention_bf16": dict(out_rtol=0.0, weights_atol=2.0 ** -120),
    # a decode step (one row over the KV cache) against the tiled pass's row, both bf16 against
    # the same twin: each within the bound, so within twice it of each other
    "attention_bf16_two_paths": 2.0,
    # ---- cross entropy's single checks (test_ops_loss) -------------------------------------
    # the float64 twin against torch.float64: loss to rtol and atol x loss_atol(x); dlogits to
    # rtol and atol x the gradient's scale (1 / count for a mean): rounding of float64 sums
    "cross_entropy_twin_torch64": dict(loss=dict(rtol=1e-6, atol=1e-6),
                                      grad=dict(rtol=1e-5, atol=1e-7)),
    # the kernel on logits up to ~5e4 (a row shifted by 5e4): atol x EPS32 x max|x|, lse - x_t
    # of float32 terms of size max|x|
    "cross_entropy_large": dict(rtol=1e-6, atol=8.0),
    # ---- optimisers' and training's single checks -------------------------------------------
    # Adam's first step (m_hat / sqrt(v_hat) = sign(g)) against lr, p ~ N(0, 1): p - lr rounded
    # to float32 moves by half an ulp of p (6e-8 below |p| = 2), i.e. 6e-6 of lr = 0.01, relative
    "adam_first_step": dict(rtol=1e-5, atol=0.0),
    # the gradients' norm after clipping against min(max_norm, total): each clipped value is
    # rounded to float32 once (~6e-8 relative); used with pytest.approx (rel=rtol, abs=atol),
    # which takes the larger of rel x |expected| and abs
    "clipped_norm": dict(rtol=1e-5, atol=1e-6),
    # a learning-rate schedule against its formula, both in float64 (pytest.approx's rel, with
    # its default abs of 1e-12 beside it): a few float64 ulps
    "schedule_float64": dict(rtol=1e-15),
    # the validation loss of a model evaluated again (the best kept, the last, a loaded run)
    # against the figure recorded during training: the same pairs through the same kernels,
    # float rounding only, relative
    "valid_loss_again": dict(rtol=1e-6, atol=0.0),
    # the validation loss (batched, padded) against one pair at a time without padding: other
    # batch shapes in float32, relative
    "valid_loss_unbatched": dict(rtol=1e-5, atol=0.0),
    # ... and its exp, the perplexity, against exp of the same mean (pytest.approx's default rel)
    "valid_ppl": dict(rtol=1e-6, atol=0.0),
    # bf16 training's losses after a resume against fp32's (test_bf16_training): bf16 products
    # move each step's loss by ~2^-8 relative and the runs drift apart over the steps; numpy
    # allclose's default atol of 1e-8 kept
    "bf16_vs_fp32_losses": dict(rtol=0.05, atol=1e-8),
    # ---- figures of the benchmarks and the training loop ------------------------------------
    # a figure the code works out in float64 (a rate, a share, a ratio, a learning rate, a
    # fraction) against the same arithmetic written in the test: pytest.approx's default rel of
    # 1e-6 kept (its abs of 1e-12 never matters: every expected value here is above 1e-6)
    "float64_figure": dict(rtol=1e-6, atol=0.0),
    # a cell of the benchmark table, printed to about three significant digits (report.py),
    # against the figure: the printing's rounding is at most 0.5% of it
    "table_three_digits": dict(rtol=1e-2, atol=0.0),
    # a test's hand-written table of next-token probabilities (generate/gen_util.table): its rows
    # are float64 sums of a few decimals that should make 1; numpy allclose's defaults kept
    "probability_table": dict(rtol=1e-5, atol=1e-8),
}


# ----------------------------------------------------------------------------------------------
# tolerances scaled by a problem's magnitudes


def rel_atol(expected, rel, floor=0.0):
    """rel x max|expected| over its finite entries, the scale at least `floor`: the absolute
    tolerance of a check whose error scales with the largest value (NaN and inf positions are
    assert_close's to check, element by element)."""
    e = np.abs(np.asarray(expected, np.float64))
    e = e[np.isfinite(e)]
    return rel * max(float(e.max(initial=0.0)), floor)


def scaled(entry, expected, floor=0.0):
    """A table entry whose atol is relative to the largest value: dict(rtol=entry's rtol,
    atol=rel_atol(expected, entry's atol, floor)), for assert_close(actual, expected, **...)."""
    return dict(rtol=entry["rtol"], atol=rel_atol(expected, entry["atol"], floor))


def max_rel(expected, rel=TOL["nn_torch"]["atol"]):
    """dict(rtol=0, atol=rel x max|expected|) for assert_close: the model layer's relative check,
    max|diff| <= rel x max|expected| (the scale at least 1e-30, so an all-zero expected is met
    by zeros and values below 1e-30 x rel)."""
    return dict(rtol=0.0, atol=rel_atol(expected, rel, floor=1e-30))


def dot_atol(x, w, *, bias=None, factor=TOL["linear"]["atol"]):
    """Absolute tolerance for act(x @ w.T + bias) computed in float32: factor * eps * sqrt(K) *
    max(|x| @ |w|.T + |bias|), the size of the terms each output sums (not of the result)."""
    x = np.abs(np.asarray(x, np.float64)).reshape(-1, np.shape(w)[1])
    w = np.abs(np.asarray(w, np.float64))
    if x.size == 0 or w.size == 0:
        return 0.0
    mag = x @ w.T
    if bias is not None:
        mag = mag + np.abs(np.asarray(bias, np.float64))
    return factor * EPS32 * np.sqrt(w.shape[1]) * float(mag.max())


def ffn_atol(x, w1, b1, w2, b2, activation, slope=GELU_MAX_SLOPE):
    """Error of the first GEMM carried through the activation (whose slope is at most `slope`)
    and the second GEMM, plus the second GEMM's own rounding."""
    h = reference.linear(x, w1, b1, activation=activation)          # float32 of the f64 hidden
    first = dot_atol(x, w1, bias=b1, factor=TOL["ffn"]["atol"]) * slope
    carried = first * float(np.abs(np.asarray(w2, np.float64)).sum(axis=1).max(initial=0.0))
    return carried + dot_atol(h, w2, bias=b2, factor=TOL["ffn"]["atol"])


def chain_atol(magnitude, inner, factor=TOL["linear_grad"]["atol"]):
    """Absolute tolerance of a float32 result whose terms have size `magnitude` (the same
    computation on absolute values, in float64) and which sums `inner` terms per element along
    its longest chain: factor * eps * sqrt(inner) * max(magnitude)."""
    m = np.asarray(magnitude, np.float64)
    if m.size == 0:
        return 0.0
    return factor * EPS32 * np.sqrt(max(inner, 1)) * float(np.max(m))


def softmax_tol(x):
    """exp(x - max) carries a relative error of about eps * |x - max|: scale rtol with the
    spread of the finite entries (calibrated for a spread up to 100)."""
    finite = np.asarray(x, np.float64)[np.isfinite(x)]
    spread = float(finite.max() - finite.min()) if finite.size else 0.0
    growth = max(1.0, spread / 100.0)
    return dict(rtol=TOL["softmax"]["rtol"] * growth, atol=TOL["softmax"]["atol"])


def layer_norm_atol(weight, bias):
    """y's absolute tolerance: TOL["layer_norm"]["atol"] x (1 + max|weight| + max|bias|)."""
    wmax = 1.0 if weight is None else float(np.abs(weight).max(initial=0.0))
    bmax = 0.0 if bias is None else float(np.abs(bias).max(initial=0.0))
    return TOL["layer_norm"]["atol"] * (1.0 + wmax + bmax)


def f32_ulp(a):
    """float32's spacing at |a| (float64 values), without overflowing at the float32 maximum
    (np.spacing of a float32 there is inf): 2^29 float64 ulps, at least the smallest denormal."""
    return np.maximum(np.spacing(np.abs(np.asarray(a, np.float64))) * 2.0**29, 2.0**-149)


def layer_norm_grad_atols(dy, x, mean, rstd, weight, residual):
    """(atol_dx, atol_dweight, atol_dbias) from the terms' sizes and float32's conditioning: the
    kernel recomputes s = x + residual in float32, so xhat moves by half an ulp of the row's
    largest |s| times rstd."""
    factor = TOL["layer_norm_grad"]["atol"]
    C = x.shape[-1]
    s = np.asarray(x, np.float64).reshape(-1, C)
    if residual is not None:
        s = s + np.asarray(residual, np.float64).reshape(-1, C)
    d = np.abs(np.asarray(dy, np.float64).reshape(-1, C))
    rs = np.asarray(rstd, np.float64)[:, None]
    xh = np.abs(s - np.asarray(mean, np.float64)[:, None]) * rs
    w = np.ones(C) if weight is None else np.abs(np.asarray(weight, np.float64))
    g = d * w
    # half an ulp of each row's largest |s| (and of the float32 mean), times rstd: xhat's error
    row_ulp = f32_ulp(np.abs(s).max(axis=1, initial=0.0))
    dxh = (row_ulp[:, None] * rs) if s.size else np.zeros_like(s)
    k = factor * EPS32 * np.sqrt(max(C, 1))
    mag_dx = rs * (g + g.mean(axis=1, keepdims=True) + (1.0 + xh) * (g * (1.0 + xh)).mean(
        axis=1, keepdims=True)) if s.size else s
    atol_dx = (k * float(mag_dx.max(initial=0.0))
               + 2.0 * float((rs * dxh * (g * (1.0 + xh)).mean(axis=1, keepdims=True)
                              + rs * dxh * g.mean(axis=1, keepdims=True)).max(initial=0.0)))
    n = max(len(s), 1)
    kn = factor * EPS32 * np.sqrt(n)
    atol_dw = kn * float((d * xh).sum(axis=0).max(initial=0.0)) \
        + 2.0 * float((d * dxh).sum(axis=0).max(initial=0.0))
    atol_db = kn * float(d.sum(axis=0).max(initial=0.0))
    return atol_dx, atol_dw, atol_db


# ---- attention


def attention_scale(q, scale):
    """The scale attention applies to q k^T: 1 / sqrt(D) unless given."""
    D = np.shape(q)[-1]
    return (1.0 / math.sqrt(D) if D else 1.0) if scale is None else scale


def max_score(q, k, scale, *, finite_only=False):
    """max |q k^T * scale| over the problem (masks aside), at least 1. With NaN or inf among the
    scores: finite_only leaves them out (the backward's tolerances); otherwise an inf gives inf
    and a NaN gives 1 (the forward's)."""
    if np.size(q) == 0 or np.size(k) == 0:
        return 1.0
    q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
    s = np.abs(q64 @ np.swapaxes(k64, -1, -2)) * abs(attention_scale(q, scale))
    if finite_only:
        s = np.nan_to_num(s, posinf=0.0)
    return max(1.0, float(s.max()))


def attention_tols(q, k, v, scale):
    """(out, weights, lse) tolerances for one forward problem."""
    smax = max_score(q, k, scale)
    growth = max(1.0, smax / 50.0)              # scores up to ~50 are the calibrated range
    vmax = max(1.0, float(np.abs(v).max())) if np.size(v) else 1.0
    t_out = dict(rtol=TOL["attention"]["rtol"], atol=TOL["attention"]["atol"] * vmax * growth)
    t_w = dict(rtol=TOL["attention_weights"]["rtol"] * growth,
               atol=TOL["attention_weights"]["atol"] * growth)
    t_lse = dict(rtol=TOL["attention_lse"]["rtol"], atol=TOL["attention_lse"]["atol"] * smax)
    return t_out, t_w, t_lse


def attention_grad_magnitudes(dout, q, k, v, out, **kwargs):
    """Per element of dq, dk, dv, the sum of |terms| it adds up (float64): with P the undropped
    weights scaled by 1 / (1 - p), |dS| <= P (|dout| |v|^T + sum |dout| |out|), then
    dq <- scale |dS| |k|, dk <- scale |dS|^T |q|, dv <- P^T |dout|."""
    p = kwargs.get("dropout_p", 0.0)
    plain = {n: a for n, a in kwargs.items() if n not in ("dropout_p", "seed")}
    _, P = reference.attention(q, k, v, return_weights=True, **plain)
    P = np.nan_to_num(P.astype(np.float64)) / (1.0 - p)
    ad, aq, ak, av, ao = (np.nan_to_num(np.abs(np.asarray(a, np.float64)), posinf=0.0)
                          for a in (dout, q, k, v, out))
    t = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    ds = P * (ad @ t(av) + np.sum(ad * ao, axis=-1, keepdims=True))
    sc = abs(attention_scale(q, kwargs.get("scale")))
    return sc * (ds @ ak), sc * (t(ds) @ aq), t(P) @ ad


def attention_grad_atol(magnitude, terms, smax, factor=TOL["attention_grad"]["atol"]):
    """factor x EPS32 x (sqrt(terms) + smax) x max(magnitude): the absolute tolerance of one of
    dq, dk, dv (magnitude from attention_grad_magnitudes, terms the longest sum, smax the
    largest |score|)."""
    big = float(np.max(magnitude, initial=0.0))
    return factor * EPS32 * (math.sqrt(terms) + smax) * max(big, 1e-30)


# ---- cross entropy


def loss_atol(x):
    """A loss is lse - x_t (and lse - mean x): float32 rounding of terms of size max|x|."""
    return TOL["cross_entropy"]["atol"] * EPS32 * max(1.0, float(np.abs(x).max(initial=0.0)))
