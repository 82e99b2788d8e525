/* fa_target.h -- compile the rest of a translation unit for the target FA_TARGET (a string such
 * as "arch=x86-64-v3"), which the unit defines before including this first: every function
 * after this point, the static inline helpers of the headers that follow included. The unit
 * ends with FA_TARGET_END. One unit per level keeps one flag set for the whole extension
 * (setuptools gives every source the same flags) and the baseline free of -march. */
#define FA_PRAGMA_(x) _Pragma(#x)
#define FA_PRAGMA(x) FA_PRAGMA_(x)
#if defined(__clang__)
FA_PRAGMA(clang attribute push(__attribute__((target(FA_TARGET))), apply_to = function))
#define FA_TARGET_END FA_PRAGMA(clang attribute pop)
#else
FA_PRAGMA(GCC target(FA_TARGET))
#define FA_TARGET_END
#endif
