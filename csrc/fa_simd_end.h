/* fa_simd_end.h -- undo fa_simd.h and the per-ISA knobs after one instantiation of a body. */
#undef VF
#undef VI
#undef VU
#undef vmax
#undef hsum
#undef hmax
#undef vexp2
#undef vexp2_poly
#undef vexp
#undef FA_SFX
#undef FA_VL
#undef ATT_NR
#undef ATT_MR_S
#undef ATT_MR_P
#undef SK_NV
#undef SK_RB
