"""The C prelude every generated library starts with: headers, NaN-exact max/min, vectorizable
exp/erf/sigmoid, register transposes, floor and truncated modulo, saturating shifts, thread control."""


def _shuffle_rounds(lanes: int) -> tuple[list[str], str]:
    """C lines that transpose the rows ``a[0..lanes)`` in registers (``b`` the scratch rows), and the array that
    then holds the transposed rows. Round ``g`` (1, 2, 4, ...) pairs rows ``g`` apart and swaps their off-diagonal
    runs of ``g`` elements with one two-vector shuffle each (the indices must be constants, so every round is
    written out); after log2(lanes) rounds row k holds column k."""
    lines: list[str] = []
    cur, nxt, g = "a", "b", 1
    while g < lanes:
        lo = [i for grp in range(0, lanes, 2 * g) for i in (*range(grp, grp + g), *range(lanes + grp, lanes + grp + g))]
        hi = [i + g for i in lo]
        pair = f"{cur}[r + j], {cur}[r + j + {g}]"
        lines += [f"    for (int r = 0; r < {lanes}; r += {2 * g}) for (int j = 0; j < {g}; ++j) {{",
                  f"        {nxt}[r + j] = __builtin_shufflevector({pair}, {','.join(map(str, lo))});",
                  f"        {nxt}[r + j + {g}] = __builtin_shufflevector({pair}, {','.join(map(str, hi))});",
                  "    }"]
        cur, nxt, g = nxt, cur, 2 * g
    return lines, cur


def transpose_source(lanes: int) -> str:
    """C of ``so_transpose<lanes>(src, ss, dst, ds)``: the lanes x lanes block of floats at ``src`` (rows ``ss``
    apart) written transposed at ``dst`` (rows ``ds`` apart), through register shuffles (:func:`_shuffle_rounds`)."""
    rounds, out = _shuffle_rounds(lanes)
    lines = [f"static inline void so_transpose{lanes}(const float *restrict src, long ss, float *restrict dst, long ds) {{",
             f"    so_v{lanes} a[{lanes}], b[{lanes}];",
             f"    for (int i = 0; i < {lanes}; ++i) memcpy(&a[i], src + i * ss, sizeof a[i]);",
             *rounds,
             f"    for (int k = 0; k < {lanes}; ++k) memcpy(dst + k * ds, &{out}[k], sizeof {out}[k]);", "}"]
    return "\n".join(lines) + "\n"


# GCC's own names of the AVX-512 masked loads and stores and of the non-temporal store (immintrin.h, which
# wraps them, costs every translation unit a quarter of a second to parse): lanes -> (load, store, stream)
_MASKED = {16: ("__builtin_ia32_loadups512_mask", "__builtin_ia32_storeups512_mask", "__builtin_ia32_movntps512"),
           8: ("__builtin_ia32_loadups256_mask", "__builtin_ia32_storeups256_mask", "__builtin_ia32_movntps256")}
_MASKED_ISA = {16: "defined(__AVX512F__)", 8: "defined(__AVX512F__) && defined(__AVX512VL__)"}


def transpose_part_source(lanes: int) -> str:
    """C of ``so_transpose<lanes>p(src, ss, dst, ds, rows, cols)``: the first ``rows`` rows of ``cols`` floats of
    a block (a block a tail cuts short) written transposed, ``cols`` rows of ``rows`` floats. A whole block
    takes :func:`transpose_source`'s path; a partial one the same shuffles between masked loads (the rows past
    ``rows`` are zeros) and masked stores, where the target has them (AVX-512), else an element-wise copy."""
    load, store, _ = _MASKED[lanes]
    rounds, out = _shuffle_rounds(lanes)
    return "\n".join([
        f"static inline void so_transpose{lanes}p(const float *restrict src, long ss, float *restrict dst, long ds, "
        "int rows, int cols) {",
        f"    if (rows == {lanes} && cols == {lanes}) {{ so_transpose{lanes}(src, ss, dst, ds); return; }}",
        "#if " + _MASKED_ISA[lanes] + " && !defined(__clang__)",
        f"    so_v{lanes} a[{lanes}], b[{lanes}];",
        "    unsigned int in = (1u << cols) - 1u, out = (1u << rows) - 1u;",
        f"    for (int i = 0; i < {lanes}; ++i)",
        f"        a[i] = i < rows ? {load}(src + i * ss, (so_v{lanes}){{0}}, in) : (so_v{lanes}){{0}};",
        *rounds,
        f"    for (int k = 0; k < cols; ++k) {store}(dst + k * ds, {out}[k], out);",
        "#else",
        "    for (int k = 0; k < cols; ++k) for (int i = 0; i < rows; ++i) dst[k * ds + i] = src[i * ss + k];",
        "#endif",
        "}"]) + "\n"


def transpose_stream_source(lanes: int) -> str:
    """C of ``so_transpose<lanes>s(src, ss, dst, ds, rows, cols)``: :func:`transpose_part_source`'s copy whose
    whole blocks are written with non-temporal stores (to memory, past the caches: no read of each written line
    first), each row where it is aligned to its vector (the store's requirement). No fence here: a fence waits
    for the block's stores to reach memory, which a fence per block makes the whole copy wait on, block by
    block; the printer ends each iteration of the loop nest's outermost loop with one (:data:`STREAM_FENCE`)."""
    _, _, stream = _MASKED[lanes]
    rounds, out = _shuffle_rounds(lanes)
    return "\n".join([
        f"static inline void so_transpose{lanes}s(const float *restrict src, long ss, float *restrict dst, long ds, "
        "int rows, int cols) {",
        "#if " + _MASKED_ISA[lanes] + " && !defined(__clang__)",
        f"    if (rows == {lanes} && cols == {lanes}) {{",
        f"        so_v{lanes} a[{lanes}], b[{lanes}];",
        f"        for (int i = 0; i < {lanes}; ++i) memcpy(&a[i], src + i * ss, sizeof a[i]);",
        *["    " + line for line in rounds],
        f"        for (int k = 0; k < {lanes}; ++k) {{",
        f"            if (((uintptr_t)(dst + k * ds) & {4 * lanes - 1}) == 0) {stream}(dst + k * ds, {out}[k]);",
        f"            else memcpy(dst + k * ds, &{out}[k], sizeof {out}[k]);",
        "        }",
        "        return;",
        "    }",
        "#endif",
        f"    so_transpose{lanes}p(src, ss, dst, ds, rows, cols);",
        "}"]) + "\n"


# the store fence after streamed blocks (so_transposeLs): the non-temporal stores are weakly ordered, so each
# thread fences its own before the kernel's threads join and a reader may load what they wrote
STREAM_FENCE = ("static inline void so_stream_fence(void) {\n"
                "#if defined(__AVX512F__) && !defined(__clang__)\n"
                "    __builtin_ia32_sfence();\n"
                "#endif\n"
                "}\n")


def prefetch_rows_source(lanes: int) -> str:
    """C of ``so_prefetch_rows<lanes>(src, ss)``: a fetch into the cache of the lanes rows of ``lanes`` floats at
    ``src`` (rows ``ss`` apart), the first and the last float of each (a row off a line's start spans two): the
    next block's source rows of a prefetching TransposeBlock. A fetch never faults, so the rows past the
    source's end that the last block asks for cost nothing but the asking."""
    return (f"static inline void so_prefetch_rows{lanes}(const float *src, long ss) {{\n"
            f"    for (int i = 0; i < {lanes}; ++i) {{ __builtin_prefetch(src + i * ss); "
            f"__builtin_prefetch(src + i * ss + {lanes - 1}); }}\n"
            "}\n")


# float vectors of 16 and 8 lanes (GCC vector extensions), their int masks, unaligned loads and stores (through an
# under-aligned vector type: one vmovups, where a memcpy became vmovdqu8), ReLU as a bit mask (NaN kept: its lanes
# compare false), and a vector with its first lanes zeroed (the lanes an overlapping last vector shares with the one
# before, where both are added into the output): the spelling of register tiles held as vectors
# (superopt.codegen.c_vector_tile); and every other float from p (a stride-2 read: two loads, from p and p + n - 1,
# and one shuffle; no element past p[2n - 2] is read, so the read stays inside a row a stride-2 window reads whole);
# and register transposes of 16 and 8 floats (vpermt2ps on AVX-512), where element-wise copies make one side a
# gather or a scatter (a packed run-time operand, such as attention's keys, packed on every call)
VECTOR_LANES = (16, 8)  # the float vectors spelled below: so_v16, so_v8 (and their helpers)


def vector_op(op: str, args: list[str], lanes: int) -> str | None:
    """An element-wise op on ``lanes``-float vector operands (C text) as a vector expression of the types below,
    or None where it has no vector spelling here (the vector-tile and vector-loop printers spell the same ops)."""
    if op in ("+", "-", "*", "/") and len(args) == 2:
        return f"({args[0]} {op} {args[1]})"
    if op == "neg":
        return f"(-({args[0]}))"
    if op == "relu":  # (NaN kept, as the scalar spelling's)
        return f"so_relu{lanes}({args[0]})"
    return None
VECTOR_TYPES = "".join(
    f"typedef float so_v{n} __attribute__((vector_size({4 * n})));\n"
    f"typedef int so_vi{n} __attribute__((vector_size({4 * n})));\n"
    f"typedef float so_v{n}u __attribute__((vector_size({4 * n}), aligned(4), may_alias));\n"
    f"static inline so_v{n} so_ld{n}(const float *p) {{ return *(const so_v{n}u *)p; }}\n"
    f"static inline void so_st{n}(float *p, so_v{n} v) {{ *(so_v{n}u *)p = v; }}\n"
    f"static inline so_v{n} so_relu{n}(so_v{n} x) {{ return (so_v{n})((so_vi{n})x & ~(x < (so_v{n}){{0}})); }}\n"
    f"static inline so_v{n} so_from{n}(so_v{n} x, int first) {{ const so_vi{n} lane = {{{', '.join(map(str, range(n)))}}}; "
    f"return (so_v{n})((so_vi{n})x & (lane >= (so_vi{n}){{0}} + first)); }}\n"
    f"static inline so_v{n} so_ld{n}s2(const float *p) {{ return __builtin_shufflevector(so_ld{n}(p), "
    f"so_ld{n}(p + {n - 1}), {', '.join(str(2 * j if j < n // 2 else n + 1 + 2 * (j - n // 2)) for j in range(n))}); }}\n"
    for n in VECTOR_LANES)
TRANSPOSES = VECTOR_TYPES + STREAM_FENCE + "".join(transpose_source(n) + transpose_part_source(n) + transpose_stream_source(n)
                                                   + prefetch_rows_source(n)
                                     for n in VECTOR_LANES)


PRELUDE = r"""#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
extern int so_threads; /* the library's thread count (THREAD_CONTROL) */
#define SO_THREADS (so_threads > 0 ? so_threads : omp_get_max_threads())
#define SO_MAX(a, b) ((a) > (b) ? (a) : (b))
#define SO_MIN(a, b) ((a) < (b) ? (a) : (b))
static inline float so_maxf(float a, float b) { return a != a ? a : (a > b ? a : b); }
static inline float so_minf(float a, float b) { return a != a ? a : (a < b ? a : b); }
static inline double so_max(double a, double b) { return a != a ? a : (a > b ? a : b); }
static inline double so_min(double a, double b) { return a != a ? a : (a < b ? a : b); }
/* exp for float32 that GCC vectorizes (Cody-Waite reduction, a degree-6 polynomial, at most 1.04 ulp on
   [-80, 88.7]). Branch-free. n = round(x / ln 2) by adding 1.5 * 2^23 + 126 (floorf would block if-converted
   vectorization): the sum's low mantissa bits are then n + 126, so its bits shifted up by 23 are 2^(n-1), the
   exponent field and nothing else (memcpy, as a union pun blocks vectorization); the polynomial approximates
   2 e^r (a fit of least relative error, rounded to float) to make up the 2. 15 vector operations against the
   cvt-add-shift and 1 + r + r^2 P(r) form's 19, which matters where exp bounds a kernel (softmax).
   The range is fixed on the result, not on x: below -87 the result is 0 (exp(-87) = 1.6e-38, at the edge of
   the normal floats), above ln(FLT_MAX) it is +inf, and NaN flows through both tests. A clamp of x instead
   (x < -87 ? -87 : x) let GCC thread the constant paths: four compares and three blends per vector. */
static inline float so_expf(float x) {
    float t = x * 1.44269504088896341f + 12583038.0f;
    float n = t - 12583038.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 2.7673586737e-03f;
    p = p * r + 1.6749713570e-02f;
    p = p * r + 8.3336457610e-02f;
    p = p * r + 3.3332839608e-01f;
    p = p * r + 9.9999982119e-01f;
    p = p * r + 2.0f;
    p = p * r + 2.0f;
    int32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (int32_t)((uint32_t)bits << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = x < -87.0f ? 0.0f : p * scale;
    return x > 88.72283f ? INFINITY : y;
}
""" + TRANSPOSES + r"""/* erf for float32 that GCC vectorizes: odd/even rational approximation on [-4, 4] (the one of Eigen and
   XLA), max error 3.3e-7 against the exact erf; libm's erff is a scalar call */
static inline float so_erff(float a) {
    float x = a > 4.0f ? 4.0f : (a < -4.0f ? -4.0f : a);
    float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    p = p * x;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return a != a ? a : p / q;
}
/* powf(x, e) for the exponents the C printer spells by square roots (c_emit._POW_BY_ROOTS): within 2 ulp of
   the exact power and vectorizable, with powf's special values: NaN below 0 but +inf (e > 0) or +0 (e < 0) at
   -inf, +0 (e > 0) or +inf (e < 0) at -0 (the + 0.0f turns sqrtf's -0 into +0) */
static inline float so_squaref(float x) { return x * x; }
static inline float so_pow_halff(float x) { return x == -INFINITY ? INFINITY : sqrtf(x) + 0.0f; }
static inline float so_pow_quarterf(float x) { return x == -INFINITY ? INFINITY : sqrtf(sqrtf(x)) + 0.0f; }
static inline float so_pow_three_quartersf(float x) {
    float s = sqrtf(x);
    return x == -INFINITY ? INFINITY : s * sqrtf(s);
}
static inline float so_pow_three_halvesf(float x) { return x == -INFINITY ? INFINITY : x * sqrtf(x); }
static inline float so_pow_minus_halff(float x) { return x == -INFINITY ? 0.0f : 1.0f / (sqrtf(x) + 0.0f); }
static inline float so_pow_minus_three_quartersf(float x) {
    float s = sqrtf(x);
    return x == -INFINITY ? 0.0f : 1.0f / (s * sqrtf(s));
}
static inline float so_sigmoidf(float x) { return 1.0f / (1.0f + so_expf(-x)); }
static inline double so_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline float so_modf(float a, float b) { float r = fmodf(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline double so_mod(double a, double b) { double r = fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
/* integer remainders by 0 are 0 (as numpy's) instead of a SIGFPE that kills the process */
static inline int64_t so_modl(int64_t a, int64_t b) {
    if (b == 0) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t so_fmodl(int64_t a, int64_t b) { return b == 0 ? 0 : a % b; }
/* shifts by a count outside [0, width) saturate as numpy's and ONNX BitShift's: 0, or -1 for a negative value shifted
   right (C leaves them undefined and x86 masks the count); the left shift runs unsigned (no signed overflow) */
static inline int32_t so_shl32(int32_t a, int32_t b) { return (uint32_t)b < 32 ? (int32_t)((uint32_t)a << b) : 0; }
static inline int64_t so_shl64(int64_t a, int64_t b) { return (uint64_t)b < 64 ? (int64_t)((uint64_t)a << b) : 0; }
static inline int32_t so_shr32(int32_t a, int32_t b) { return (uint32_t)b < 32 ? a >> b : (a < 0 ? -1 : 0); }
static inline int64_t so_shr64(int64_t a, int64_t b) { return (uint64_t)b < 64 ? a >> b : (a < 0 ? -1 : 0); }
"""

# the library's thread control: defined once, in the first translation unit of a library. The count is the
# library's own (every parallel region says num_threads(SO_THREADS)), not the process's OpenMP setting:
# omp_set_num_threads would also set the thread count of torch, which shares libgomp (a program built on one
# thread made torch single-threaded, and a torch.compile backend build failed dynamo's check that tracing
# leaves the global thread count alone). 0 (unset): OpenMP's default.
THREAD_CONTROL = r"""int so_threads = 0;
void so_set_threads(int n) { so_threads = n; }
int so_get_threads(void) { return SO_THREADS; }
"""
