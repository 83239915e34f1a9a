/* scripts/gpu_shim/cblas.h: the CBLAS subset kvlingo calls, for the GPU machine's build only
 * (scripts/gpu_check.sh), where no BLAS package can be installed.  Reference semantics of
 * netlib CBLAS; implemented naively in minblas.c (the GPU machine's CPU work is tiny: parity
 * references on the shipped test models).  Add a prototype here when the engine calls a new
 * CBLAS routine. */
#ifndef KVL_GPU_SHIM_CBLAS_H
#define KVL_GPU_SHIM_CBLAS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 } CBLAS_ORDER;
typedef enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 } CBLAS_TRANSPOSE;
typedef enum CBLAS_UPLO { CblasUpper = 121, CblasLower = 122 } CBLAS_UPLO;
typedef CBLAS_ORDER CBLAS_LAYOUT;

void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                 int ldc);
void cblas_dgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K,
                 double alpha, const double *A, int lda, const double *B, int ldb, double beta,
                 double *C, int ldc);
void cblas_sgemv(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, int M, int N, float alpha, const float *A,
                 int lda, const float *x, int incx, float beta, float *y, int incy);
void cblas_dgemv(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, int M, int N, double alpha, const double *A,
                 int lda, const double *x, int incx, double beta, double *y, int incy);
void cblas_ssyrk(CBLAS_ORDER order, CBLAS_UPLO uplo, CBLAS_TRANSPOSE trans, int N, int K, float alpha,
                 const float *A, int lda, float beta, float *C, int ldc);
void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);
char *openblas_get_corename(void);

#ifdef __cplusplus
}
#endif
#endif
