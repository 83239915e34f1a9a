/* tests/unit/test_pool.c: the CPU backend's thread pool (kernels/cpu/pool.h).
 *   once      every part of every job runs exactly once, on 1-, 2-, 3- and 5-thread pools,
 *             with spinning and with sleeping workers, over many back-to-back jobs;
 *   claimed   a part goes to whichever thread claims it first: with workers that sleep between
 *             jobs (spin 0), the caller, done with an empty part 0 long before a worker wakes,
 *             runs the other parts itself in some of the jobs, so a worker the kernel has not
 *             run yet (descheduled, or woken onto the caller's core) does not hold the job;
 *   rejoin    after jobs the caller finished alone, the workers still take parts of later jobs. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "pool.h"

#define MAX_PARTS 8

typedef struct count_job {
    int runs[MAX_PARTS];          /* times each part ran (each written by one thread per job) */
    pthread_t by[MAX_PARTS];      /* the thread that ran each part */
    int n_parts_seen;
} count_job;

static void count_part(void *ctx, int part, int n_parts) {
    count_job *j = ctx;
    j->runs[part]++;
    j->by[part] = pthread_self();
    j->n_parts_seen = n_parts;
}

static void test_once(void **state) {
    (void)state;
    const int sizes[] = {1, 2, 3, 5};
    for (int si = 0; si < 4; si++)
        for (int spin = 0; spin <= 100; spin += 100) {
            kvl__pool *p = NULL;
            assert_int_equal(kvl__pool_create_spin(sizes[si], spin, &p), KVL_OK);
            assert_int_equal(kvl__pool_threads(p), sizes[si]);
            for (int rep = 0; rep < 2000; rep++) {
                count_job j;
                memset(&j, 0, sizeof j);
                kvl__pool_run(p, count_part, &j);
                assert_int_equal(j.n_parts_seen, sizes[si]);
                for (int i = 0; i < MAX_PARTS; i++) assert_int_equal(j.runs[i], i < sizes[si] ? 1 : 0);
                assert_true(pthread_equal(j.by[0], pthread_self()));   /* part 0 on the caller */
            }
            kvl__pool_free(p);
        }
}

/* part 0 returns at once; the others take ~20 us, long enough that a worker woken from sleep
 * finds parts left in some jobs */
static void busy_wait_ns(long ns) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < ns);
}

static void busy_part(void *ctx, int part, int n_parts) {
    if (part > 0) busy_wait_ns(20000L);
    count_part(ctx, part, n_parts);
}

static void test_claimed(void **state) {
    (void)state;
    kvl__pool *p = NULL;
    assert_int_equal(kvl__pool_create_spin(3, 0, &p), KVL_OK);
    int by_caller = 0, by_worker = 0;
    for (int rep = 0; rep < 500; rep++) {
        count_job j;
        memset(&j, 0, sizeof j);
        kvl__pool_run(p, busy_part, &j);
        for (int i = 0; i < 3; i++) assert_int_equal(j.runs[i], 1);
        for (int i = 1; i < 3; i++) {
            if (pthread_equal(j.by[i], pthread_self())) by_caller++;
            else by_worker++;
        }
    }
    /* before parts were claimed, part i always ran on worker i and by_caller stayed 0 */
    print_message("parts 1-2 of 500 jobs: %d on the caller, %d on workers\n", by_caller, by_worker);
    assert_true(by_caller > 0);
    kvl__pool_free(p);
}

/* part 0 (the caller's) takes ~200 us, the others nothing: a worker, woken or spinning, claims
 * part 1 meanwhile unless the kernel does not run it for the whole 200 us */
static void busy0_part(void *ctx, int part, int n_parts) {
    if (part == 0) busy_wait_ns(200000L);
    count_part(ctx, part, n_parts);
}

static void test_rejoin(void **state) {
    (void)state;
    kvl__pool *p = NULL;
    assert_int_equal(kvl__pool_create_spin(2, 0, &p), KVL_OK);
    for (int rep = 0; rep < 200; rep++) {   /* jobs the caller mostly finishes alone */
        count_job j;
        memset(&j, 0, sizeof j);
        kvl__pool_run(p, busy_part, &j);
        assert_int_equal(j.runs[0] + j.runs[1], 2);
    }
    int by_worker = 0, rep;
    for (rep = 0; rep < 5000 && by_worker < 10; rep++) {
        count_job j;
        memset(&j, 0, sizeof j);
        kvl__pool_run(p, busy0_part, &j);
        assert_int_equal(j.runs[0] + j.runs[1], 2);
        if (!pthread_equal(j.by[1], pthread_self())) by_worker++;
    }
    print_message("part 1 on the worker in %d of %d jobs\n", by_worker, rep);
    assert_int_equal(by_worker, 10);
    kvl__pool_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_once),
        cmocka_unit_test(test_claimed),
        cmocka_unit_test(test_rejoin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
