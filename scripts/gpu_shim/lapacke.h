/* scripts/gpu_shim/lapacke.h: the LAPACKE subset kvlingo calls, for the GPU machine's build only
 * (see cblas.h beside this).  Implemented in minblas.c. */
#ifndef KVL_GPU_SHIM_LAPACKE_H
#define KVL_GPU_SHIM_LAPACKE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef int lapack_int;
#define LAPACK_ROW_MAJOR 101
#define LAPACK_COL_MAJOR 102

/* Solve A X = B for symmetric positive definite A [n, n] (triangle `uplo` referenced) by
 * Cholesky; B [n, nrhs] is overwritten by X, A by the factor.  Returns 0, or i > 0 when the
 * leading minor of order i is not positive definite, or < 0 for a bad argument. */
lapack_int LAPACKE_dposv(int layout, char uplo, lapack_int n, lapack_int nrhs, double *a,
                         lapack_int lda, double *b, lapack_int ldb);

#ifdef __cplusplus
}
#endif
#endif
