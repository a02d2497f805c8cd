/* A cblas_sgemm for thin products: the ones a decode step makes.
 *
 * MLX's CPU backend calls only cblas_sgemm, also for a decode step's products of one or a
 * few rows of activations with every weight matrix. OpenBLAS (0.3.21, Debian 12) runs those
 * far below the memory bandwidth: an M=1 GEMM packs the whole weight matrix on every call,
 * and even its GEMV streams the weights well below what the memory delivers (figures in
 * docs/speed.md). So:
 *   - 1..THIN_ROWS rows of activations times a weight matrix stored N x K (how MLX passes
 *     `x @ W.T`): thin_gemm below, which streams each weight row once, prefetched into L2,
 *     against all rows (AVX2 + FMA on x86-64, checked at init; GCC's generic vectors
 *     elsewhere), split across cores by the shim's own worker threads (the pool below). Each
 *     output is summed in the same order whatever M is, so a row's numbers do not depend on
 *     which rows share its batch;
 *   - the attention's tiny products (a decode step's, per row and KV head: up to TINY_ROWS
 *     queries): on the calling thread, q k^T through the same tiles, p v through tiny_nn,
 *     so that a row's numbers depend neither on its padding nor on its number of keys;
 *   - other single-row or single-column products (and every one when thin_gemm cannot run):
 *     OpenBLAS's cblas_sgemv;
 *   - anything else (long prompts, column-major, a prompt's attention products): OpenBLAS, on
 *     one thread, the big products split over the same worker threads (split_sgemm).
 * blas.py (through build.py) compiles this file once, hands it OpenBLAS's functions, and puts
 * it first in the process's global symbol scope, so MLX's cblas_sgemm calls land here.
 */
#if !defined(ENTROPIX_NO_THREADS)
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

enum { RowMajor = 101, NoTrans = 111, Trans = 112 };
/* Up to 64 rows: a joining prompt's tokens ride with the decode rows (decode/group.py), so a
   step's weight products reach a few dozen rows, where streaming the weights still beats
   OpenBLAS's packed GEMM; with more rows its packing pays for itself and OpenBLAS is faster. */
enum { THIN_ROWS = 64, THIN_MIN_WEIGHTS = 16384 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);

static sgemm_fn real_sgemm;
static sgemv_fn real_sgemv;
static int thin_ok;   /* thin_gemm runs: built with threads, on a CPU with its instructions */
static int own_threads;   /* OpenBLAS runs on one thread; split_sgemm spreads the big products */
static long thin_calls;

#if defined(__x86_64__)
#define VECTOR __attribute__((target("avx2,fma")))
#else
#define VECTOR
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef float v8_unaligned __attribute__((vector_size(32), aligned(4), may_alias));
#define LOAD8(p) (*(const v8_unaligned *)(p))

/* Lanes of two vectors picked by index. GCC has __builtin_shufflevector only from GCC 12 (Ubuntu
   22.04 ships GCC 11); its older __builtin_shuffle takes the same indices as a vector, and Clang
   has only the former. Both just move lanes, so the sums below are the same bit for bit.
   -DENTROPIX_SHUFFLE_MASKS forces the older form, to test it with a newer GCC. */
#if defined(__clang__) || (__GNUC__ >= 12 && !defined(ENTROPIX_SHUFFLE_MASKS))
#define SHUFFLE8(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
typedef int v8i __attribute__((vector_size(32)));
#define SHUFFLE8(x, y, ...) __builtin_shuffle(x, y, (v8i){__VA_ARGS__})
#endif

/* Eight sums of eight lanes in one vector: out[j] = the sum of v_j's lanes, always in the order
   ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)), whichever tile the vectors come from: a row's
   numbers must not depend on the rows sharing its product (tested bit for bit across batch sizes).
   Three rounds of pairwise adds across the eight vectors share each shuffle among the outputs:
   about 12 instructions for eight outputs, where reducing each vector alone takes about 8 each. */
VECTOR static inline __attribute__((always_inline)) v8 sum8(v8 a, v8 b, v8 c, v8 d, v8 e, v8 f, v8 g, v8 h) {
#define EVENS(x, y) SHUFFLE8(x, y, 0, 2, 8, 10, 4, 6, 12, 14)
#define ODDS(x, y) SHUFFLE8(x, y, 1, 3, 9, 11, 5, 7, 13, 15)
    /* neighbours: t0 = [a01 a23 b01 b23 | a45 a67 b45 b67] */
    v8 t0 = EVENS(a, b) + ODDS(a, b), t1 = EVENS(c, d) + ODDS(c, d);
    v8 t2 = EVENS(e, f) + ODDS(e, f), t3 = EVENS(g, h) + ODDS(g, h);
    /* pairs of those: u0 = [a0123 b0123 c0123 d0123 | a4567 b4567 c4567 d4567] */
    v8 u0 = EVENS(t0, t1) + ODDS(t0, t1), u1 = EVENS(t2, t3) + ODDS(t2, t3);
#undef EVENS
#undef ODDS
    /* low halves + high halves: [a b c d e f g h] */
    return SHUFFLE8(u0, u1, 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE8(u0, u1, 4, 5, 6, 7, 12, 13, 14, 15);
}

/* C[0..R) x [0..COLS) = alpha A[0..R) . B[0..COLS)^T + beta C, over K: R activation rows
   against COLS weight rows, R x COLS accumulators kept in registers (4 x 3 = 12 of AVX2's 16).
   While it runs, the next tile's weight rows are prefetched into L2 (prefetcht2), once per
   cache line: the weights come from memory once per step, and without the prefetch the loads
   and the arithmetic take turns. Not into L1 (prefetcht0): that fills the core's few L1 miss
   buffers, which the tile's own loads need. */
#define TILE(R, COLS) TILE_FOR(VECTOR, R, COLS)
#define TILE_FOR(TARGET, R, COLS)                                                                  \
    TARGET static inline __attribute__((always_inline)) void tile_##R##x##COLS(                   \
        int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta,         \
        float *C, int ldc) {                                                                       \
        v8 acc[16]; /* acc[r * COLS + c]; the ones past R x COLS stay 0, for sum8 */               \
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i] = (v8){0};                    \
        int k = 0;                                                                                 \
        for (; k + 8 <= K; k += 8) {                                                               \
            v8 w[COLS];                                                                            \
            _Pragma("GCC unroll 4") for (int c = 0; c < COLS; c++) {                               \
                if (!(k & 8)) /* once per 64-byte line, into L2 (prefetcht2) */                    \
                    __builtin_prefetch(B + (long)(c + COLS) * ldb + k, 0, 1);                      \
                w[c] = LOAD8(B + (long)c * ldb + k);                                               \
            }                                                                                      \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                  \
                v8 a = LOAD8(A + (long)r * lda + k);                                               \
                _Pragma("GCC unroll 4") for (int c = 0; c < COLS; c++) acc[r * COLS + c] += a * w[c]; \
            }                                                                                      \
        }                                                                                          \
        float sums[16];                                                                            \
        *(v8_unaligned *)sums = sum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]); \
        if (R * COLS > 8)                                                                          \
            *(v8_unaligned *)(sums + 8) =                                                          \
                sum8(acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15]);        \
        for (int r = 0; r < R; r++)                                                                \
            for (int c = 0; c < COLS; c++) {                                                       \
                float s = sums[r * COLS + c];                                                      \
                for (int kk = k; kk < K; kk++) s += A[(long)r * lda + kk] * B[(long)c * ldb + kk]; \
                float *out = C + (long)r * ldc + c;                                                \
                *out = beta == 0 ? alpha * s : alpha * s + beta * *out;                            \
            }                                                                                      \
    }
TILE(4, 3)
TILE(2, 3)
TILE(1, 3)
TILE(4, 1)
TILE(1, 1)

/* Output columns [n0, n1): every activation row against weight rows n0..n1, COLS at a time. */
#define THIN_COLUMNS(NAME, TARGET, COLS)                                                           \
    TARGET static void NAME(int M, int n0, int n1, int K, float alpha, const float *A, int lda,    \
                            const float *B, int ldb, float beta, float *C, int ldc) {              \
        int n = n0;                                                                                \
        for (; n + COLS <= n1; n += COLS) {                                                        \
            const float *b = B + (long)n * ldb;                                                    \
            float *c = C + n;                                                                      \
            int m = 0;                                                                             \
            for (; m + 4 <= M; m += 4)                                                             \
                tile_4x##COLS(K, alpha, A + (long)m * lda, lda, b, ldb, beta, c + (long)m * ldc, ldc); \
            for (; m + 2 <= M; m += 2)                                                             \
                tile_2x##COLS(K, alpha, A + (long)m * lda, lda, b, ldb, beta, c + (long)m * ldc, ldc); \
            for (; m < M; m++)                                                                     \
                tile_1x##COLS(K, alpha, A + (long)m * lda, lda, b, ldb, beta, c + (long)m * ldc, ldc); \
        }                                                                                          \
        for (; n < n1; n++) {                                                                      \
            const float *b = B + (long)n * ldb;                                                    \
            float *c = C + n;                                                                      \
            int m = 0;                                                                             \
            for (; m + 4 <= M; m += 4)                                                             \
                tile_4x1(K, alpha, A + (long)m * lda, lda, b, ldb, beta, c + (long)m * ldc, ldc);  \
            for (; m < M; m++)                                                                     \
                tile_1x1(K, alpha, A + (long)m * lda, lda, b, ldb, beta, c + (long)m * ldc, ldc);  \
        }                                                                                          \
    }
THIN_COLUMNS(thin_columns, VECTOR, 3)

/* The attention's tiny products: in a decode step, per row and KV head, its few queries against
   the row's keys (q k^T, B stored N x K: K the head's dimension) and then its probabilities
   against the row's values (p v, B stored K x N: K the keys, N the head's dimension). A step
   makes rows x KV heads x 2 x layers of them, each small, and OpenBLAS packs both operands on
   every call, which dominates products this small. Here they run on the calling thread:
   - q k^T through thin_columns: the tiles, so the very sums, of thin_gemm, which takes these
     products itself once N x K reaches THIN_MIN_WEIGHTS (256 keys of 64 dimensions);
   - p v through tiny_nn: each output is one multiply-add per key (fused where the CPU has FMA,
     as in the tiles), in key order from the first. Keys of probability 0 in front of a row's
     own (a batch's left padding) add +0 to 0, so a row's numbers are exactly those it gets
     without them, whatever its batch. */
enum { TINY_ROWS = 16, TINY_DIMS = 256 };

VECTOR static void tiny_nn(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                           float beta, float *C, int ldc) {
    for (int m = 0; m < M; m++) {
        const float *a = A + (long)m * lda;
        float *c = C + (long)m * ldc;
        for (int n = 0; n < N;) {
            int width = N - n >= 64 ? 64 : N - n >= 8 ? 8 : 1;   /* columns in this block */
            float sums[64];
            if (width > 1) {
                v8 acc[8];
                for (int j = 0; j < 8; j++) acc[j] = (v8){0};
                for (int k = 0; k < K; k++) {
                    v8 x = (v8){0} + a[k];   /* a[k] in every lane */
                    const float *b = B + (long)k * ldb + n;
                    if (width == 64) {
                        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                            acc[j] += x * LOAD8(b + 8 * j);
                    } else {
                        acc[0] += x * LOAD8(b);
                    }
                }
                for (int j = 0; j < width / 8; j++) *(v8_unaligned *)(sums + 8 * j) = acc[j];
            } else {
                float s = 0;
                for (int k = 0; k < K; k++) s += a[k] * B[(long)k * ldb + n];
                sums[0] = s;
            }
            for (int j = 0; j < width; j++)
                c[n + j] = beta == 0 ? alpha * sums[j] : alpha * sums[j] + beta * c[n + j];
            n += width;
        }
    }
}

/* With AVX-512VL, 32 vector registers instead of 16: tiles of 4 x 4 (16 accumulators, 4 weight
   vectors, one activation vector), still of 256-bit vectors. Each activation vector loaded then
   serves 4 weight rows instead of 3, which pays on products of many rows (a prompt riding with
   the decode rows) but not on a few, so they take products of more than 8 rows. The same sums,
   in the same order, as the 4 x 3 tiles: a product's numbers do not depend on which of the two
   runs (tested bit for bit, tests/test_backend.py). */
#if defined(__x86_64__)
#define WIDE __attribute__((target("avx2,fma,avx512f,avx512vl")))
TILE_FOR(WIDE, 4, 4)
TILE_FOR(WIDE, 2, 4)
TILE_FOR(WIDE, 1, 4)
THIN_COLUMNS(thin_columns_wide, WIDE, 4)
#endif
static int wide_cpu;  /* the CPU has AVX-512VL (and thin_gemm runs) */
static int wide_ok;   /* thin_columns_wide runs: wide_cpu, unless a test turned it off */
static long wide_calls;

/* The worker threads. A product is cut into chunks; the calling thread and the workers claim
   them one at a time from a shared ticket, and the caller waits only for the chunks a worker has
   claimed, never for a worker to turn up. An OpenMP team waits at each product's barrier for
   every thread of the team: on a machine whose cores are busy with other work, a thread that had
   lost its core held up each of a decode step's ~200 products for a scheduler time slice. Here
   the caller does every chunk itself when no worker runs, so a product takes at most what it
   takes on one thread, plus the chunks a preempted worker holds. Idle workers spin for SPIN_NS
   (a step's products come microseconds apart), then sleep on a futex instead of taking CPU time
   from the work they wait for. A chunk's numbers do not depend on the thread that computes it. */
#if !defined(ENTROPIX_NO_THREADS)
typedef void (*chunk_fn)(const void *job, int chunk);
enum { MAX_WORKERS = 63, MAX_CHUNKS = 0xffff };
#define SPIN_NS 50000L

static struct {
    _Atomic unsigned long long ticket;   /* generation (32 bits) | chunks (16) | next unclaimed (16) */
    _Atomic unsigned int wake;           /* the futex word, bumped at every product */
    _Atomic int sleepers, done;          /* done: chunks the workers finished of this product */
    _Atomic(chunk_fn) fn;
    _Atomic(const void *) job;
    atomic_flag busy;                    /* one product at a time: another caller runs alone */
    int workers, started;
    pid_t pid;                           /* the process that started them: a fork has none */
    unsigned int generation;
} pool = {.busy = ATOMIC_FLAG_INIT};
static long pool_chunks_by_workers;

static inline void relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* The next unclaimed chunk of the product `*seen` belongs to; 0 when none is left or another
   product has begun. A claim succeeds only while its product still has unclaimed chunks, so the
   caller cannot have moved on: the fn and job read after `*seen` are that product's. */
static int claim(unsigned long long *seen, int *chunk) {
    unsigned long long t = *seen;
    for (;;) {
        if ((t >> 32) != (*seen >> 32))
            return 0;   /* `*seen` stays behind, so a waiting worker looks again at once */
        if ((t & 0xffff) >= ((t >> 16) & 0xffff)) {
            *seen = t;
            return 0;
        }
        if (atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) {
            *chunk = (int)(t & 0xffff);
            *seen = t + 1;
            return 1;
        }
    }
}

static void *pool_worker(void *unused) {
    (void)unused;
    for (;;) {
        unsigned long long t = atomic_load(&pool.ticket);
        chunk_fn fn = atomic_load(&pool.fn);
        const void *job = atomic_load(&pool.job);
        int chunk;
        while (claim(&t, &chunk)) {
            fn(job, chunk);
            atomic_fetch_add(&pool.done, 1);
            pool_chunks_by_workers++;   /* a statistic for tests: races only lose counts */
        }
        long until = now_ns() + SPIN_NS;
        for (int spins = 1; atomic_load(&pool.ticket) == t; spins++) {
            relax();
            if (spins % 64 == 0 && now_ns() > until) {
                unsigned int word = atomic_load(&pool.wake);
                atomic_fetch_add(&pool.sleepers, 1);
                if (atomic_load(&pool.ticket) == t)
                    syscall(SYS_futex, &pool.wake, FUTEX_WAIT_PRIVATE, word, NULL, NULL, 0);
                atomic_fetch_sub(&pool.sleepers, 1);
                until = now_ns() + SPIN_NS;
            }
        }
    }
    return NULL;
}

/* The workers, started at the first product of a process (again in a forked child). Signals
   stay with the other threads: Python handles them on its main thread. */
static void start_workers(void) {
    pid_t pid = getpid();
    if (pool.pid == pid)
        return;
    pool.pid = pid;
    pool.started = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (int i = 0; i < pool.workers; i++) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        pool.started += pthread_create(&thread, &attr, pool_worker, NULL) == 0;
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* A worker that holds a claimed chunk this long has lost its core (a chunk takes tens of
   microseconds): the cores are busy with other work. The caller then runs the next products
   alone for a while, SOLO_NS at first and twice as long after each stall in a row, so that on a
   machine that stays busy a product seldom waits for a thread the scheduler has put aside. */
#define STALL_NS 300000L
#define SOLO_NS 20000000L
#define MAX_SOLO_NS 640000000L
static long solo_until, solo_ns = SOLO_NS;
static long solo_products;

/* fn(job, 0..chunks), over the calling thread and whichever workers are free to help. */
static void run_chunks(chunk_fn fn, const void *job, int chunks) {
    int solo = pool.workers > 0 && solo_until && now_ns() < solo_until;
    solo_products += solo;
    if (chunks <= 1 || chunks > MAX_CHUNKS || pool.workers == 0 || solo || atomic_flag_test_and_set(&pool.busy)) {
        for (int i = 0; i < chunks; i++)
            fn(job, i);
        return;
    }
    start_workers();
    atomic_store(&pool.fn, fn);
    atomic_store(&pool.job, job);
    atomic_store(&pool.done, 0);
    unsigned long long t = ((unsigned long long)++pool.generation << 32) | ((unsigned long long)chunks << 16);
    atomic_store(&pool.ticket, t);
    atomic_fetch_add(&pool.wake, 1);
    if (atomic_load(&pool.sleepers))
        syscall(SYS_futex, &pool.wake, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    int chunk, mine = 0;
    while (claim(&t, &chunk)) {
        fn(job, chunk);
        mine++;
    }
    /* Only chunks a running worker claimed are left: it finishes them within microseconds, unless
       it lost its core, when yielding may hand it the core back. */
    long waited_from = 0;
    for (int spins = 1; atomic_load(&pool.done) + mine < chunks; spins++) {
        relax();
        if (spins == 64)
            waited_from = now_ns();
        if (spins % 256 == 0)
            sched_yield();
    }
    if (waited_from) {
        long now = now_ns();
        if (now - waited_from > STALL_NS) {
            solo_until = now + solo_ns;
            solo_ns = solo_ns * 2 > MAX_SOLO_NS ? MAX_SOLO_NS : solo_ns * 2;
        } else {
            solo_ns = SOLO_NS;
        }
    } else {
        solo_ns = SOLO_NS;
    }
    atomic_flag_clear(&pool.busy);
}
#endif

/* C (M x N) = alpha A (M x K) . B^T + beta C, B stored N x K; chunks of 48 columns
   (16 tiles, whole cache lines of C) shared out over the threads. */
struct thin_job {
    int M, N, K, lda, ldb, ldc, wide;
    float alpha, beta;
    const float *A, *B;
    float *C;
};
enum { CHUNK = 48 };   /* 16 tiles of 3 columns or 12 of 4 */

static void thin_chunk(const void *job, int i) {
    const struct thin_job *j = job;
    int n0 = i * CHUNK, n1 = n0 + CHUNK < j->N ? n0 + CHUNK : j->N;
#if defined(__x86_64__)
    if (j->wide) {
        thin_columns_wide(j->M, n0, n1, j->K, j->alpha, j->A, j->lda, j->B, j->ldb, j->beta, j->C, j->ldc);
        return;
    }
#endif
    thin_columns(j->M, n0, n1, j->K, j->alpha, j->A, j->lda, j->B, j->ldb, j->beta, j->C, j->ldc);
}

static void thin_gemm(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc) {
    struct thin_job job = {M, N, K, lda, ldb, ldc, wide_ok && M > 8, alpha, beta, A, B, C};
    wide_calls += job.wide;
    int chunks = (N + CHUNK - 1) / CHUNK;
#if !defined(ENTROPIX_NO_THREADS)
    run_chunks(thin_chunk, &job, chunks);
#else
    for (int i = 0; i < chunks; i++)
        thin_chunk(&job, i);
#endif
}

/* OpenBLAS's own threads are turned off (`set_threads`, its openblas_set_num_threads, called
   with 1) where the shim has its threads: two thread pools on few cores take turns badly. OpenBLAS
   splits any product above 262,144 multiply-adds over its threads, also a prompt's tiny attention
   products, and the shim's workers would then wait while OpenBLAS's threads wake. The products
   worth splitting are split here instead, on the same workers (split_sgemm). `threads`: how many
   threads a product may use, the calling one included. */
int entropix_blas_shim_init(void *sgemm, void *sgemv, void *set_threads, int threads) {
    real_sgemm = (sgemm_fn)sgemm;
    real_sgemv = (sgemv_fn)sgemv;
#if defined(ENTROPIX_NO_THREADS)
    thin_ok = 0;   /* one core would lose to OpenBLAS's threads */
    (void)threads;
#else
#if defined(__x86_64__)
    __builtin_cpu_init();
    thin_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    wide_ok = wide_cpu = thin_ok && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
#else
    thin_ok = 1;
#endif
    pool.workers = threads < 1 ? 0 : threads - 1 > MAX_WORKERS ? MAX_WORKERS : threads - 1;
    if (set_threads) {
        ((void (*)(int))set_threads)(1);
        own_threads = 1;
    }
#endif
    return real_sgemm != 0 && real_sgemv != 0;
}

/* Tests: how many threads a product may use (the caller's included), how many workers run in
   this process, and how many chunks they have computed. */
int entropix_threads(void) {
#if defined(ENTROPIX_NO_THREADS)
    return 1;
#else
    return pool.workers + 1;
#endif
}
long entropix_worker_chunks(void) {
#if defined(ENTROPIX_NO_THREADS)
    return 0;
#else
    return pool.started && pool.pid == getpid() ? pool_chunks_by_workers : 0;
#endif
}
long entropix_solo_products(void) {
#if defined(ENTROPIX_NO_THREADS)
    return 0;
#else
    return solo_products;
#endif
}

/* 1 when thin_gemm takes 2..THIN_ROWS-row products (for the header); how many it took (tests). */
int entropix_thin_gemm_active(void) { return thin_ok; }
long entropix_thin_gemm_calls(void) { return thin_calls; }

/* Tests: run the 4 x 3 tiles even where the 4 x 4 ones could (wide = 0), or the 4 x 4 ones again
   where the CPU has them (wide = 1). Returns whether the 4 x 4 tiles run now; and how many
   products they took. */
int entropix_thin_gemm_wide(int wide) {
    wide_ok = wide && wide_cpu;
    return wide_ok;
}
long entropix_thin_gemm_wide_calls(void) { return wide_calls; }

/* A product of at least SPLIT_MACS multiply-adds: one single-threaded OpenBLAS call per share of
   SPLIT_SHARE of C's columns (or rows, when it has more rows than columns), shared out over the
   threads. The shares are fixed by the product alone, not by the thread count or by the threads
   that turn up: OpenBLAS sums a narrower product in another order (its kernels depend on the
   sizes), so shares that followed the thread count gave other numbers on another machine. */
enum { SPLIT_MACS = 1 << 21, SPLIT_SHARE = 128 };
struct split_job {
    int order, trans_a, trans_b, M, N, K, lda, ldb, ldc, by_columns, share;
    float alpha, beta;
    const float *A, *B;
    float *C;
};

#if !defined(ENTROPIX_NO_THREADS)
static void split_chunk(const void *job, int t) {
    const struct split_job *j = job;
    int size = j->by_columns ? j->N : j->M;
    int lo = t * j->share, hi = lo + j->share < size ? lo + j->share : size;
    if (lo >= hi)
        return;
    if (j->by_columns)
        real_sgemm(j->order, j->trans_a, j->trans_b, j->M, hi - lo, j->K, j->alpha, j->A, j->lda,
                   j->trans_b == NoTrans ? j->B + lo : j->B + (long)lo * j->ldb, j->ldb, j->beta, j->C + lo, j->ldc);
    else
        real_sgemm(j->order, j->trans_a, j->trans_b, hi - lo, j->N, j->K, j->alpha,
                   j->trans_a == NoTrans ? j->A + (long)lo * j->lda : j->A + lo, j->lda, j->B, j->ldb, j->beta,
                   j->C + (long)lo * j->ldc, j->ldc);
}
#endif

static void split_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
#if !defined(ENTROPIX_NO_THREADS)
    if (own_threads && order == RowMajor && (double)M * N * K >= SPLIT_MACS) {
        int by_columns = N >= M, size = by_columns ? N : M;
        struct split_job job = {order, trans_a, trans_b, M, N, K, lda, ldb, ldc, by_columns, SPLIT_SHARE,
                                alpha, beta, A, B, C};
        run_chunks(split_chunk, &job, (size + SPLIT_SHARE - 1) / SPLIT_SHARE);
        return;
    }
#endif
    real_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* C = alpha op(A) op(B) + beta C, with op(A) M x K and op(B) K x N (row-major). */
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (thin_ok && order == RowMajor && trans_a == NoTrans && trans_b == Trans && M <= THIN_ROWS &&
        (long)N * K >= THIN_MIN_WEIGHTS) {
        thin_gemm(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        thin_calls++;
        return;
    }
    /* Below THIN_MIN_WEIGHTS (else thin_gemm took it just above). */
    if (thin_ok && order == RowMajor && trans_a == NoTrans && M <= TINY_ROWS) {
        if (trans_b == Trans && K <= TINY_DIMS) {
            thin_columns(M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        }
        if (trans_b == NoTrans && N <= TINY_DIMS) {
            tiny_nn(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        }
    }
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
    split_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
