/* Per-call cost of a check through the C ABI, for the bindings'
 * comparison (benches/bindings/run.sh): one hot quota, standalone, never
 * full. Prints "<call>\t<ns per check>" for the median of ROUNDS rounds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sluice.h"

#define ROUNDS 7

static const char *QUOTAS =
    "{\"quotas\": [{\"name\": \"bench_hot\", \"limit\": 1e12,"
    " \"low_burst\": 1e15, \"high_burst\": 1e15},"
    " {\"name\": \"bench_key\", \"limit\": 1e12, \"low_burst\": 1e15,"
    " \"high_burst\": 1e15, \"per_key\": true}]}";

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* volatile: the compiler must not drop or merge the calls. */
static volatile int sink;

static double round_by_name(long n) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) sink = check_by_name("bench_hot", 1);
    return (now_ns() - t0) / (double)n;
}

static double round_with_len(long n) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) sink = sluice_check("bench_hot", 9, 1);
    return (now_ns() - t0) / (double)n;
}

static double round_key(long n) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) sink = sluice_check_key("bench_key", 9, "user-1", 6, 1);
    return (now_ns() - t0) / (double)n;
}

static uint64_t out;

static double round_obtain(long n) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) sink = sluice_obtain("bench_hot", 9, 1, &out);
    return (now_ns() - t0) / (double)n;
}

static double round_reserve(long n) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) sink = sluice_reserve("bench_hot", 9, 1, 1000, &out);
    return (now_ns() - t0) / (double)n;
}

static double median(double (*round)(long), long n) {
    double r[ROUNDS];
    round(n / 10); /* warm up */
    for (int i = 0; i < ROUNDS; i++) r[i] = round(n);
    qsort(r, ROUNDS, sizeof r[0], cmp);
    return r[ROUNDS / 2];
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    if (sluice_init("{\"capacity\": 1000}") != SLUICE_PASS ||
        sluice_load_quotas_json(QUOTAS) != SLUICE_PASS ||
        check_by_name("bench_hot", 1) != SLUICE_PASS) {
        fprintf(stderr, "bench: %s\n", sluice_last_error());
        return 1;
    }
    printf("check_by_name(name, 1)\t%.1f\n", median(round_by_name, n));
    printf("sluice_check(name, len, 1)\t%.1f\n", median(round_with_len, n));
    printf("sluice_check_key(name, len, key, len, 1)\t%.1f\n", median(round_key, n));
    printf("sluice_obtain(name, len, 1, &granted)\t%.1f\n", median(round_obtain, n));
    printf("sluice_reserve(name, len, 1, 1000, &wait_ns)\t%.1f\n", median(round_reserve, n));
    sluice_shutdown();
    return 0;
}
