/* A cblas_sgemm that sends single-row and single-column products to cblas_sgemv.
 *
 * MLX's CPU backend calls only cblas_sgemm, also for a decode step's matrix-vector
 * products (one row of activations times every weight matrix). OpenBLAS 0.3.21
 * (Debian 12) runs those through its GEMM kernels at about half the memory
 * bandwidth its GEMV reaches: on a 2-core x86-64 VM, the 211 weight products of a
 * SmolLM2-135M decode step took 38 ms as M=1 GEMMs and 23 ms as GEMVs. backend.py
 * compiles this file once, hands it the real OpenBLAS functions, and puts it first
 * in the process's global symbol scope, so MLX's cblas_sgemm calls land here.
 * Every other shape (and column-major calls) goes to OpenBLAS's cblas_sgemm as is.
 */
enum { RowMajor = 101, NoTrans = 111, Trans = 112 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);

static sgemm_fn real_sgemm;
static sgemv_fn real_sgemv;

int entropix_gemv_shim_init(void *sgemm, void *sgemv) {
    real_sgemm = (sgemm_fn)sgemm;
    real_sgemv = (sgemv_fn)sgemv;
    return real_sgemm != 0 && real_sgemv != 0;
}

/* C = alpha op(A) op(B) + beta C, with op(A) M x K and op(B) K x N (row-major). */
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (order == RowMajor && K > 0 && M == 1) {
        /* c (1 x N) = a (1 x K) op(B): y = op(B)^T a. a's elements are lda apart when A is
           stored transposed (K x 1). B stored N x K (Trans) is op(B)^T itself. */
        int inc_a = trans_a == NoTrans ? 1 : lda;
        if (trans_b == Trans)
            real_sgemv(RowMajor, NoTrans, N, K, alpha, B, ldb, A, inc_a, beta, C, 1);
        else
            real_sgemv(RowMajor, Trans, K, N, alpha, B, ldb, A, inc_a, beta, C, 1);
        return;
    }
    if (order == RowMajor && K > 0 && N == 1) {
        /* c (M x 1, rows ldc apart) = op(A) b (K x 1). */
        int inc_b = trans_b == NoTrans ? ldb : 1;
        if (trans_a == NoTrans)
            real_sgemv(RowMajor, NoTrans, M, K, alpha, A, lda, B, inc_b, beta, C, ldc);
        else
            real_sgemv(RowMajor, Trans, K, M, alpha, A, lda, B, inc_b, beta, C, ldc);
        return;
    }
    real_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
