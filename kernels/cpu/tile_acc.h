/* kernels/cpu/tile_acc.h: the 16 named accumulators of the 4-weight-row x up-to-4-input-row
 * matmul tiles (matmul_f32.c, matmul_bf16.c), and 8 more for input rows 4 and 5 of the
 * AVX-512 bf16 tiles (32 vector registers hold 24 accumulators and the 4 weight vectors).
 *
 * a<t><r> holds input row t times weight row r (t in 0..5, r in 0..3), one SIMD vector of partial sums
 * each.  They are named variables, not an array `acc[4 * t + r]`: GCC splits an array into
 * registers only before it unrolls the loops that index it, so the array stayed in memory and
 * every FMA of the tile's inner loop stored its accumulator to the stack.  With 2 or more input
 * rows that store traffic, not the weight stream, bounded the tile (a 1536 x 8960 bf16 product
 * at 9 input rows ran at a quarter of the FMA rate).  The sums are the same products in the same
 * order either way.
 *
 * Use inside a function: KVL__TILE_ACC_DECL(type, zero) once, KVL__TILE_FMA_ROW per input row
 * and step (or KVL__TILE_FMA_ROWS for all of them), then KVL__TILE_ACC_LIST to gather them
 * (t-major) for the reduction. */
#ifndef KVL_KERNELS_CPU_TILE_ACC_H
#define KVL_KERNELS_CPU_TILE_ACC_H


#define KVL__TILE_ACC_DECL(type, zero)                                                      \
    type a00 = (zero), a01 = (zero), a02 = (zero), a03 = (zero), a10 = (zero), a11 = (zero), \
         a12 = (zero), a13 = (zero), a20 = (zero), a21 = (zero), a22 = (zero), a23 = (zero), \
         a30 = (zero), a31 = (zero), a32 = (zero), a33 = (zero)

#define KVL__TILE_ACC_LIST a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33

/* Input row t (a literal 0..3) times the 4 weight vectors w0..w3: a<t>0..a<t>3 += x * w<r>
 * with `fma(a, b, c)` = a * b + c. */
#define KVL__TILE_FMA_ROW(fma, t, x, w0, w1, w2, w3) \
    do {                                             \
        a##t##0 = fma((x), (w0), a##t##0);           \
        a##t##1 = fma((x), (w1), a##t##1);           \
        a##t##2 = fma((x), (w2), a##t##2);           \
        a##t##3 = fma((x), (w3), a##t##3);           \
    } while (0)

/* The TT (1..4) input rows x0..x3 (pointers of those names in the caller; rows from TT on are
 * not read), each loaded at offset k by `load(m, p)`, times w0..w3. */
#define KVL__TILE_FMA_ROWS(TT, fma, load, m, k, w0, w1, w2, w3)                           \
    do {                                                                                  \
        KVL__TILE_FMA_ROW(fma, 0, load((m), x0 + (k)), w0, w1, w2, w3);                   \
        if ((TT) > 1) KVL__TILE_FMA_ROW(fma, 1, load((m), x1 + (k)), w0, w1, w2, w3);     \
        if ((TT) > 2) KVL__TILE_FMA_ROW(fma, 2, load((m), x2 + (k)), w0, w1, w2, w3);     \
        if ((TT) > 3) KVL__TILE_FMA_ROW(fma, 3, load((m), x3 + (k)), w0, w1, w2, w3);     \
    } while (0)

/* Input rows 4 and 5: KVL__TILE_ACC_DECL_HI once beside KVL__TILE_ACC_DECL, then
 * KVL__TILE_FMA_ROWS_HI after KVL__TILE_FMA_ROWS each step (rows x4, x5; TT up to 6), and
 * KVL__TILE_ACC_LIST_HI (t-major) for their reduction. */
#define KVL__TILE_ACC_DECL_HI(type, zero)                                                   \
    type a40 = (zero), a41 = (zero), a42 = (zero), a43 = (zero), a50 = (zero), a51 = (zero), \
         a52 = (zero), a53 = (zero)

#define KVL__TILE_ACC_LIST_HI a40, a41, a42, a43, a50, a51, a52, a53

#define KVL__TILE_FMA_ROWS_HI(TT, fma, load, m, k, w0, w1, w2, w3)                        \
    do {                                                                                  \
        if ((TT) > 4) KVL__TILE_FMA_ROW(fma, 4, load((m), x4 + (k)), w0, w1, w2, w3);     \
        if ((TT) > 5) KVL__TILE_FMA_ROW(fma, 5, load((m), x5 + (k)), w0, w1, w2, w3);     \
    } while (0)

#endif
