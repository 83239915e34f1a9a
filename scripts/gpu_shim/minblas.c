/* scripts/gpu_shim/minblas.c: naive reference implementations of the CBLAS / LAPACKE subset in
 * cblas.h and lapacke.h, linked only in the GPU machine's build (scripts/gpu_check.sh) where no
 * BLAS package exists.  Straight loops after the netlib reference semantics: correct, slow. */
#include <math.h>
#include <stdlib.h>

#include "cblas.h"
#include "lapacke.h"

/* Row-major core: C[M,N] = alpha op(A) op(B) + beta C. */
#define GEMM_BODY(T)                                                                          \
    for (int i = 0; i < M; i++) {                                                             \
        T *c = C + (size_t)i * ldc;                                                           \
        for (int j = 0; j < N; j++) c[j] = beta == 0 ? (T)0 : beta * c[j];                    \
        if (alpha == 0) continue;                                                             \
        if (!tb) {                                                                            \
            for (int k = 0; k < K; k++) {                                                     \
                T a = alpha * (ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);         \
                const T *b = B + (size_t)k * ldb;                                             \
                for (int j = 0; j < N; j++) c[j] += a * b[j];                                 \
            }                                                                                 \
        } else {                                                                              \
            for (int j = 0; j < N; j++) {                                                     \
                const T *b = B + (size_t)j * ldb;                                             \
                T s = 0;                                                                      \
                for (int k = 0; k < K; k++)                                                   \
                    s += (ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) * b[k];       \
                c[j] += alpha * s;                                                            \
            }                                                                                 \
        }                                                                                     \
    }

static void sgemm_rm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
    GEMM_BODY(float)
}

static void dgemm_rm(int ta, int tb, int M, int N, int K, double alpha, const double *A, int lda,
                     const double *B, int ldb, double beta, double *C, int ldc) {
    GEMM_BODY(double)
}

void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                 int ldc) {
    if (order == CblasRowMajor)
        sgemm_rm(ta != CblasNoTrans, tb != CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else   /* column-major C = A B  <=>  row-major C^T = B^T A^T */
        sgemm_rm(tb != CblasNoTrans, ta != CblasNoTrans, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
}

void cblas_dgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K,
                 double alpha, const double *A, int lda, const double *B, int ldb, double beta,
                 double *C, int ldc) {
    if (order == CblasRowMajor)
        dgemm_rm(ta != CblasNoTrans, tb != CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        dgemm_rm(tb != CblasNoTrans, ta != CblasNoTrans, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
}

/* y = alpha op(A) x + beta y with A [M, N] in `order`. */
#define GEMV_BODY(T)                                                                          \
    int trans = (ta != CblasNoTrans) ^ (order == CblasColMajor);                              \
    int rows = ta != CblasNoTrans ? N : M, cols = ta != CblasNoTrans ? M : N;                 \
    for (int i = 0; i < rows; i++) {                                                          \
        T s = 0;                                                                              \
        for (int j = 0; j < cols; j++) {                                                      \
            /* element (i, j) of op(A) as stored: row-major no-trans -> A[i*lda + j] */       \
            T a = trans ? A[(size_t)j * lda + i] : A[(size_t)i * lda + j];                    \
            s += a * x[(size_t)j * incx];                                                     \
        }                                                                                     \
        T *yi = y + (size_t)i * incy;                                                         \
        *yi = alpha * s + (beta == 0 ? (T)0 : beta * *yi);                                    \
    }

void cblas_sgemv(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, int M, int N, float alpha, const float *A,
                 int lda, const float *x, int incx, float beta, float *y, int incy) {
    GEMV_BODY(float)
}

void cblas_dgemv(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, int M, int N, double alpha, const double *A,
                 int lda, const double *x, int incx, double beta, double *y, int incy) {
    GEMV_BODY(double)
}

void cblas_ssyrk(CBLAS_ORDER order, CBLAS_UPLO uplo, CBLAS_TRANSPOSE trans, int N, int K, float alpha,
                 const float *A, int lda, float beta, float *C, int ldc) {
    /* C = alpha op(A) op(A)^T + beta C on the `uplo` triangle; op(A) is [N, K] */
    int t = trans != CblasNoTrans;
    int upper = uplo == CblasUpper;
    if (order == CblasColMajor) { t = !t; upper = !upper; }   /* transposed view of the same data */
    for (int i = 0; i < N; i++) {
        int j0 = upper ? i : 0, j1 = upper ? N : i + 1;
        for (int j = j0; j < j1; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) {
                float a = t ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = t ? A[(size_t)k * lda + j] : A[(size_t)j * lda + k];
                s += a * b;
            }
            float *c = C + (size_t)i * ldc + j;
            *c = alpha * s + (beta == 0 ? 0.0f : beta * *c);
        }
    }
}

void openblas_set_num_threads(int n) { (void)n; }
int openblas_get_num_threads(void) { return 1; }
char *openblas_get_corename(void) { return (char *)"minblas"; }

lapack_int LAPACKE_dposv(int layout, char uplo, lapack_int n, lapack_int nrhs, double *a,
                         lapack_int lda, double *b, lapack_int ldb) {
    if (n < 0 || nrhs < 0 || (layout != LAPACK_ROW_MAJOR && layout != LAPACK_COL_MAJOR)) return -1;
    int rm = layout == LAPACK_ROW_MAJOR;
    int up = uplo == 'U' || uplo == 'u';
#define AE(i, j) a[rm ? (size_t)(i) * lda + (j) : (size_t)(j) * lda + (i)]
#define BE(i, r) b[rm ? (size_t)(i) * ldb + (r) : (size_t)(r) * ldb + (i)]
    double *L = calloc((size_t)n * n + 1, sizeof(double));
    if (!L) return -1;
    for (int i = 0; i < n; i++)   /* symmetric matrix from the referenced triangle */
        for (int j = 0; j <= i; j++) L[(size_t)i * n + j] = up ? AE(j, i) : AE(i, j);
    for (int j = 0; j < n; j++) {   /* Cholesky A = L L^T, lower, in place */
        double d = L[(size_t)j * n + j];
        for (int k = 0; k < j; k++) d -= L[(size_t)j * n + k] * L[(size_t)j * n + k];
        if (!(d > 0)) { free(L); return j + 1; }
        d = sqrt(d);
        L[(size_t)j * n + j] = d;
        for (int i = j + 1; i < n; i++) {
            double s = L[(size_t)i * n + j];
            for (int k = 0; k < j; k++) s -= L[(size_t)i * n + k] * L[(size_t)j * n + k];
            L[(size_t)i * n + j] = s / d;
        }
    }
    for (int r = 0; r < nrhs; r++) {
        for (int i = 0; i < n; i++) {   /* L y = b */
            double s = BE(i, r);
            for (int k = 0; k < i; k++) s -= L[(size_t)i * n + k] * BE(k, r);
            BE(i, r) = s / L[(size_t)i * n + i];
        }
        for (int i = n - 1; i >= 0; i--) {   /* L^T x = y */
            double s = BE(i, r);
            for (int k = i + 1; k < n; k++) s -= L[(size_t)k * n + i] * BE(k, r);
            BE(i, r) = s / L[(size_t)i * n + i];
        }
    }
    for (int i = 0; i < n; i++)   /* the factor back into A's triangle (U = L^T for 'U') */
        for (int j = 0; j <= i; j++) {
            if (up) AE(j, i) = L[(size_t)i * n + j];
            else AE(i, j) = L[(size_t)i * n + j];
        }
    free(L);
    return 0;
#undef AE
#undef BE
}
