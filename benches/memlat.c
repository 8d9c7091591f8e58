/*
 * Latency of one dependent DRAM miss on this machine, for reading the
 * check-path numbers in BENCHMARKS.md: 256 MiB of 64-byte cells (huge
 * pages asked for), linked in one random cycle, then 10 million loads
 * that each need the previous one's result. An argument sets the size in
 * MiB instead: small sizes show how much the caches hold.
 *
 *   cc -O2 benches/memlat.c -o build/memlat && build/memlat [MiB]
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    if (mib == 0) {
        fprintf(stderr, "usage: memlat [MiB, at least 1]\n");
        return 2;
    }
    const size_t bytes = mib << 20, cells = bytes / 64;
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
    printf("%zu MiB: %.1f ns per dependent miss (end %zu)\n", mib, ns / (double)loads, at);
    return 0;
}
