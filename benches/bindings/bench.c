/* Per-call cost of a check (and of a keyed check, a grant and a
 * reservation) through the C ABI, for the bindings' comparison
 * (benches/bindings/run.sh): hot quotas, standalone, never full. Prints
 * "<call>\t<ns per call>", the median of ROUNDS interleaved rounds, then
 * each call's paired difference to sluice_check. */
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

static double median_of(double *r) {
    qsort(r, ROUNDS, sizeof r[0], cmp);
    return r[ROUNDS / 2];
}

/* The calls, measured in interleaved rounds (one round of each, ROUNDS
 * times) so that a machine whose load drifts during the run weighs on
 * every call alike; the differences to sluice_check are taken per round
 * (paired), then their median. */
static const struct {
    const char *call;
    double (*round)(long);
} CALLS[] = {
    {"check_by_name(name, 1)", round_by_name},
    {"sluice_check(name, len, 1)", round_with_len},
    {"sluice_check_key(name, len, key, len, 1)", round_key},
    {"sluice_obtain(name, len, 1, &granted)", round_obtain},
    {"sluice_reserve(name, len, 1, 1000, &wait_ns)", round_reserve},
};
#define NCALLS (sizeof CALLS / sizeof CALLS[0])
/* Index of sluice_check in CALLS: what the others are compared with. */
#define BASE 1

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    if (sluice_init("{\"capacity\": 1000}") != SLUICE_PASS ||
        sluice_load_quotas_json(QUOTAS) != SLUICE_PASS ||
        check_by_name("bench_hot", 1) != SLUICE_PASS ||
        sluice_check_key("bench_key", 9, "user-1", 6, 1) != SLUICE_PASS) {
        fprintf(stderr, "bench: %s\n", sluice_last_error());
        return 1;
    }
    static double r[NCALLS][ROUNDS], diff[NCALLS][ROUNDS];
    for (size_t c = 0; c < NCALLS; c++) CALLS[c].round(n / 10); /* warm up */
    for (int i = 0; i < ROUNDS; i++)
        for (size_t c = 0; c < NCALLS; c++) r[c][i] = CALLS[c].round(n);
    for (size_t c = 0; c < NCALLS; c++)
        for (int i = 0; i < ROUNDS; i++) diff[c][i] = r[c][i] - r[BASE][i];
    for (size_t c = 0; c < NCALLS; c++) printf("%s\t%.1f\n", CALLS[c].call, median_of(r[c]));
    for (size_t c = 0; c < NCALLS; c++)
        if (c != BASE)
            printf("%s minus sluice_check, paired\t%+.1f\n", CALLS[c].call, median_of(diff[c]));
    sluice_shutdown();
    return 0;
}
