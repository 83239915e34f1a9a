/* tests/unit/test_block_pool.c: the KV block pool (kernels/cpu/block_pool.c): blocks carved from
 * huge-page slabs, distinct and aligned; slabs reused while free blocks stay under the idle
 * limit and given back whole above it, empty slabs kept earlier included; a pointer the pool
 * never handed out, a pointer inside a block or past a slab's last block, and a block given
 * back twice refused; concurrent takers never share a block. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kv_blocks.h"

/* qwen3-b's block: 6 layers x 3 planes x 16 tokens x 128 floats */
#define BLOCK ((size_t)6 * 3 * 16 * 128 * 4)

static void take_distinct_aligned(void **state) {
    (void)state;
    kvl__block_pool *p = NULL;
    assert_int_equal(kvl__block_pool_create(BLOCK, 0, &p), KVL_OK);
    int per = 0, slabs = 0;
    size_t free_blocks = 0;
    kvl__block_pool_stats(p, &slabs, &free_blocks, &per);
    assert_int_equal(slabs, 0);
    assert_true(per >= 1 && (size_t)per * BLOCK <= ((size_t)16 << 20));
    const int n = 3 * per + 1;   /* four slabs, the last with one block taken */
    char **b = calloc((size_t)n, sizeof *b);
    assert_non_null(b);
    for (int i = 0; i < n; i++) {
        b[i] = kvl__block_pool_take(p);
        assert_non_null(b[i]);
        assert_int_equal((uintptr_t)b[i] % 64, 0);
        memset(b[i], i & 0xFF, BLOCK);   /* the whole block is writable (ASan checks bounds) */
    }
    for (int i = 0; i < n; i++)   /* every block still holds its own bytes: no two overlap */
        assert_true(b[i][0] == (char)(i & 0xFF) && b[i][BLOCK - 1] == (char)(i & 0xFF));
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 4);
    assert_int_equal(free_blocks, (size_t)per - 1);
    /* idle limit 0: each slab goes back to the system as its last block comes back */
    for (int i = 0; i < n; i++) assert_int_equal(kvl__block_pool_give(p, b[i]), 1);
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 0);
    assert_int_equal(free_blocks, 0);
    free(b);
    kvl__block_pool_unref(p);
}

static void reuse_under_idle_limit(void **state) {
    (void)state;
    kvl__block_pool *p = NULL;
    assert_int_equal(kvl__block_pool_create(BLOCK, (size_t)64 << 20, &p), KVL_OK);
    int per = 0, slabs = 0;
    kvl__block_pool_stats(p, NULL, NULL, &per);
    void *b[64];
    const int n = per + 2 < 64 ? per + 2 : 64;
    for (int i = 0; i < n; i++) assert_non_null(b[i] = kvl__block_pool_take(p));
    for (int i = 0; i < n; i++) assert_int_equal(kvl__block_pool_give(p, b[i]), 1);
    size_t free_blocks = 0;
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 2);   /* kept: 2 slabs are under the 64 MB idle limit */
    assert_int_equal(free_blocks, (size_t)2 * per);
    for (int i = 0; i < n; i++) assert_non_null(b[i] = kvl__block_pool_take(p));
    kvl__block_pool_stats(p, &slabs, NULL, NULL);
    assert_int_equal(slabs, 2);   /* the same memory again, no new slab */
    /* not one of the pool's blocks: refused, the pool unchanged */
    char other[64];
    assert_int_equal(kvl__block_pool_give(p, other), 0);
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 2);
    assert_int_equal(free_blocks, (size_t)2 * per - (size_t)n);
    for (int i = 0; i < n; i++) kvl__block_pool_give(p, b[i]);
    kvl__block_pool_unref(p);   /* frees the kept slabs (ASan/LSan: nothing leaks) */
}

/* Pointers that are not a taken block's start are refused, the pool unchanged: inside a block,
 * in the slab's unused tail, and a block given back twice. */
static void refuse_bad_pointers(void **state) {
    (void)state;
    kvl__block_pool *p = NULL;
    assert_int_equal(kvl__block_pool_create(BLOCK, (size_t)64 << 20, &p), KVL_OK);
    int per = 0;
    kvl__block_pool_stats(p, NULL, NULL, &per);
    char *a = kvl__block_pool_take(p), *b = kvl__block_pool_take(p);
    assert_non_null(a);
    assert_non_null(b);
    size_t free0 = 0, free1 = 0;
    kvl__block_pool_stats(p, NULL, &free0, NULL);
    assert_int_equal(kvl__block_pool_give(p, a + 64), 0);                      /* inside a block */
    const size_t stride = (BLOCK + 63) & ~(size_t)63;
    char *lowest = a < b ? a : b;   /* blocks 0 and 1 of the first slab */
    assert_int_equal(kvl__block_pool_give(p, lowest + (size_t)per * stride), 0);   /* past the last block */
    kvl__block_pool_stats(p, NULL, &free1, NULL);
    assert_int_equal(free1, free0);
    assert_int_equal(kvl__block_pool_give(p, a), 1);
    assert_int_equal(kvl__block_pool_give(p, a), 0);                           /* twice */
    kvl__block_pool_stats(p, NULL, &free1, NULL);
    assert_int_equal(free1, free0 + 1);
    /* the stack was not corrupted: every block handed out again is distinct */
    char *again[64];
    const int n = per < 64 ? per : 64;
    for (int i = 0; i < n; i++) {
        again[i] = kvl__block_pool_take(p);
        assert_non_null(again[i]);
        assert_true(again[i] != b);
        for (int j = 0; j < i; j++) assert_true(again[i] != again[j]);
    }
    for (int i = 0; i < n; i++) assert_int_equal(kvl__block_pool_give(p, again[i]), 1);
    assert_int_equal(kvl__block_pool_give(p, b), 1);
    kvl__block_pool_unref(p);
}

/* Free memory above the idle limit goes back as empty slabs, those kept earlier included. */
static void idle_limit_releases_kept_slabs(void **state) {
    (void)state;
    kvl__block_pool *p = NULL;
    int per = 0;
    assert_int_equal(kvl__block_pool_create(BLOCK, 0, &p), KVL_OK);
    kvl__block_pool_stats(p, NULL, NULL, &per);
    kvl__block_pool_unref(p);
    assert_true(per <= 64);
    /* room for one slab's blocks */
    assert_int_equal(kvl__block_pool_create(BLOCK, (size_t)per * BLOCK, &p), KVL_OK);
    char *b[3][64];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < per; i++) assert_non_null(b[s][i] = kvl__block_pool_take(p));
    int slabs = 0;
    size_t free_blocks = 0;
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 3);
    assert_int_equal(free_blocks, 0);
    for (int i = 0; i < per; i++) kvl__block_pool_give(p, b[0][i]);   /* at the limit: kept */
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 3);
    assert_int_equal(free_blocks, (size_t)per);
    for (int i = 0; i < per; i++) kvl__block_pool_give(p, b[1][i]);   /* over it: one slab goes */
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 2);
    assert_int_equal(free_blocks, (size_t)per);
    for (int i = 0; i < per - 1; i++) kvl__block_pool_give(p, b[2][i]);   /* one block still in use */
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 1);   /* the kept empty slab went; the one in use stays */
    assert_int_equal(free_blocks, (size_t)per - 1);
    kvl__block_pool_give(p, b[2][per - 1]);
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    assert_int_equal(slabs, 1);   /* at the limit again: kept for reuse */
    kvl__block_pool_unref(p);
}

static void large_blocks(void **state) {
    (void)state;
    /* blocks above a huge page (Llama-3-8B's is 4 MB): whole slabs of one or more blocks */
    const size_t sizes[] = {(size_t)3 << 20, (size_t)4 << 20, ((size_t)17 << 20) + 4096, 100};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        kvl__block_pool *p = NULL;
        assert_int_equal(kvl__block_pool_create(sizes[k], 0, &p), KVL_OK);
        int per = 0;
        kvl__block_pool_stats(p, NULL, NULL, &per);
        assert_true(per >= 1);
        char *a = kvl__block_pool_take(p), *b = kvl__block_pool_take(p);
        assert_non_null(a);
        assert_non_null(b);
        memset(a, 1, sizes[k]);
        memset(b, 2, sizes[k]);
        assert_true(a[sizes[k] - 1] == 1 && b[0] == 2);
        assert_int_equal(kvl__block_pool_block_bytes(p), sizes[k]);
        kvl__block_pool_give(p, a);
        kvl__block_pool_give(p, b);
        kvl__block_pool_unref(p);
    }
    kvl__block_pool *p = NULL;
    assert_int_not_equal(kvl__block_pool_create(0, 0, &p), KVL_OK);
}

typedef struct {
    kvl__block_pool *p;
    int id, bad;
} churn_arg;

static void *churn(void *a_) {
    churn_arg *a = a_;
    char *held[8] = {0};
    for (int it = 0; it < 4000; it++) {
        const int s = it % 8;
        if (held[s]) {
            if (held[s][0] != (char)a->id || held[s][BLOCK - 1] != (char)a->id) a->bad++;
            kvl__block_pool_give(a->p, held[s]);
        }
        held[s] = kvl__block_pool_take(a->p);
        if (!held[s]) {
            a->bad++;
            break;
        }
        held[s][0] = held[s][BLOCK - 1] = (char)a->id;
    }
    for (int s = 0; s < 8; s++)
        if (held[s]) kvl__block_pool_give(a->p, held[s]);
    return NULL;
}

static void concurrent_takers(void **state) {
    (void)state;
    kvl__block_pool *p = NULL;
    assert_int_equal(kvl__block_pool_create(BLOCK, BLOCK * 4, &p), KVL_OK);
    pthread_t t[3];
    churn_arg a[3];
    for (int i = 0; i < 3; i++) {
        a[i] = (churn_arg){p, i + 1, 0};
        assert_int_equal(pthread_create(&t[i], NULL, churn, &a[i]), 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++) assert_int_equal(a[i].bad, 0);
    int slabs = 0;
    size_t free_blocks = 0;
    kvl__block_pool_stats(p, &slabs, &free_blocks, NULL);
    int per = 0;
    kvl__block_pool_stats(p, NULL, NULL, &per);
    assert_int_equal(free_blocks, (size_t)slabs * per);   /* every block came back */
    kvl__block_pool_unref(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(take_distinct_aligned),
        cmocka_unit_test(reuse_under_idle_limit),
        cmocka_unit_test(refuse_bad_pointers),
        cmocka_unit_test(idle_limit_releases_kept_slabs),
        cmocka_unit_test(large_blocks),
        cmocka_unit_test(concurrent_takers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
