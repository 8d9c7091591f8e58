/*
 * Latency of one dependent DRAM miss on this machine, for reading the
 * check-path numbers in BENCHMARKS.md: 256 MiB of 64-byte cells (huge
 * pages asked for), linked in one random cycle, then 10 million loads
 * that each need the previous one's result.
 *
 *   cc -O2 benches/memlat.c -o build/memlat && build/memlat
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int main(void) {
    const size_t bytes = (size_t)256 << 20, cells = bytes / 64;
    char *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t *order = malloc(cells * sizeof *order);
    if (mem == MAP_FAILED || order == NULL) {
        perror("memlat");
        return 1;
    }
    madvise(mem, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < cells; i++) order[i] = i;
    srand(1);
    for (size_t i = cells - 1; i > 0; i--) {
        size_t j = ((size_t)rand() * RAND_MAX + (size_t)rand()) % (i + 1);
        size_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < cells; i++) *(size_t *)(mem + order[i] * 64) = order[(i + 1) % cells] * 64;
    const long loads = 10000000;
    struct timespec a, b;
    size_t at = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < loads; i++) at = *(volatile size_t *)(mem + at);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("%.1f ns per dependent miss (end %zu)\n", ns / (double)loads, at);
    return 0;
}
