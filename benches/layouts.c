/*
 * What finding one quota among 1M costs under different table layouts on
 * this machine: the study behind the "random among 1M" row of
 * BENCHMARKS.md. Each layout is modelled with the memory it would really
 * use (128-byte slots, 16-byte name cells or granules, its index), the
 * table is full unless a load is given, and every step's address depends
 * on the previous step's result, as in one isolated check. A locked add on
 * the slot's second line stands for the commit, and the next key depends
 * on its result, so checks do not overlap.
 *
 *   cc -O2 benches/layouts.c -o build/layouts && build/layouts
 *
 * Layouts:
 *   slot known        the slot id is given (Table::check_slot): the floor
 *   index8            sluice's layout: 8-byte index entries (1.5 per slot)
 *                     naming the slot and the name's granule, fetched in
 *                     parallel after the index
 *   tags16            one 64-byte line of 2-byte tags per 31 slots, tags
 *                     placed by hash (linear overflow to the next line), the
 *                     name's first 16 bytes in a cell beside each slot
 *   homes:d           no index: a quota lives at one of d slots chosen by
 *                     its hash, or further along from the first; all d
 *                     slots and cells are fetched at once
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define QUOTAS 1000000u
#define KEYS (1u << 16) /* distinct names the loop cycles through, as in benches/check.rs */
#define CHECKS 4000000L

typedef struct {
    uint64_t a[8]; /* line A: a[0] = key + 1, a[1] = longest walk from here */
    uint64_t b[8]; /* line B: b[0] = pending */
} slot_t;

static void *region(size_t bytes) {
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        perror("layouts: mmap");
        exit(1);
    }
    madvise(m, bytes, MADV_HUGEPAGE);
    memset(m, 0, bytes);
    return m;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The j-th independent position in [0, n) for hash h. */
static uint32_t pick(uint64_t h, unsigned j, uint32_t n) {
    uint64_t x = h + j * 0x9e3779b97f4a7c15ull;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint32_t)(((unsigned __int128)(uint32_t)x * n) >> 32);
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* One table under test. */
struct table {
    uint32_t positions;   /* slots */
    slot_t *slots;
    uint64_t *names;      /* 16 bytes per slot (cell) or per granule (arena) */
    uint64_t *index;      /* index8 entries, or tags16 lines */
    size_t index_len;     /* entries (index8) or lines (tags16) */
    unsigned homes;       /* homes:d */
};

static uint64_t hashes[QUOTAS];
/* The names checked in turn: quota, its hash, its slot (slot known only).
 * Sequential arrays, like the bench's list of names. */
static uint32_t keys[KEYS], key_slot[KEYS];
static uint64_t key_hash[KEYS];

static double run(struct table *t, int layout) {
    long next = 0;
    double t0 = now_ns();
    for (long i = 0; i < CHECKS; i++) {
        uint32_t k = keys[next & (KEYS - 1)];
        uint64_t h = key_hash[next & (KEYS - 1)], name;
        uint32_t s = UINT32_MAX;
        if (layout == 0) {
            s = key_slot[next & (KEYS - 1)];
            name = t->names[2 * s];
        } else if (layout == 1) {
            size_t p = (h >> 24) % t->index_len;
            uint64_t e;
            for (;;) {
                e = t->index[p];
                if (e >> 56 == h >> 56 && t->names[2 * (uint32_t)e] == k) break;
                p = p + 1 == t->index_len ? 0 : p + 1;
            }
            s = (uint32_t)(e >> 32 & 0xffffff);
            name = t->names[2 * (uint32_t)e];
        } else if (layout == 2) {
            size_t g = (h >> 24) % t->index_len;
            uint16_t want = (uint16_t)(h | 0x8000);
            while (s == UINT32_MAX) {
                const uint16_t *tags = (const uint16_t *)(t->index + 8 * g);
                for (unsigned j = 0; j < 31; j++)
                    if (tags[j] == want && t->names[2 * (g * 31 + j)] == k) {
                        s = (uint32_t)(g * 31 + j);
                        break;
                    }
                g = g + 1 == t->index_len ? 0 : g + 1;
            }
            name = t->names[2 * s];
        } else {
            uint32_t at[8];
            for (unsigned j = 0; j < t->homes; j++) {
                at[j] = pick(h, j, t->positions);
                __builtin_prefetch(&t->slots[at[j]].a[0]);
                __builtin_prefetch(&t->names[2 * at[j]]);
            }
            for (unsigned j = 0; j < t->homes && s == UINT32_MAX; j++)
                if (t->slots[at[j]].a[0] == k + 1ull && t->names[2 * at[j]] == k) s = at[j];
            for (uint64_t d = 1; s == UINT32_MAX && d <= t->slots[at[0]].a[1]; d++) {
                uint32_t p = (uint32_t)((at[0] + d) % t->positions);
                if (t->slots[p].a[0] == k + 1ull && t->names[2 * p] == k) s = p;
            }
            name = t->names[2 * s];
        }
        slot_t *x = &t->slots[s];
        uint64_t v = x->a[2] + x->a[3] + x->a[5] + name;
        uint64_t old = __atomic_fetch_add(&x->b[0], 1 + (v & 1), __ATOMIC_RELAXED);
        next += 1 + (long)(old >> 62); /* old < 2^62: the next key waits for the add */
    }
    return (now_ns() - t0) / (double)CHECKS;
}

static void report(const char *name, double load, double bytes_per_quota, double ns, const char *note) {
    printf("%-12s load %.2f  %6.1f B/quota  %6.1f ns/check  %s\n", name, load, bytes_per_quota, ns, note);
}

int main(void) {
    uint64_t seed = 88172645463325252ull;
    static uint32_t slot_of[QUOTAS];
    for (uint32_t k = 0; k < QUOTAS; k++) hashes[k] = xorshift(&seed);
    for (uint32_t i = 0; i < KEYS; i++) {
        keys[i] = (uint32_t)(xorshift(&seed) % QUOTAS);
        key_hash[i] = hashes[keys[i]];
    }
    printf("%u quotas, %u distinct names checked in turn, %ld checks per layout\n", QUOTAS, KEYS, CHECKS);

    /* slot known and index8: slots filled in a random order, names in an
     * arena in another random order, as after churn. */
    {
        struct table t = {.positions = QUOTAS};
        t.slots = region(sizeof(slot_t) * QUOTAS);
        t.names = region(16ull * QUOTAS);
        t.index_len = QUOTAS * 3ull / 2;
        t.index = region(8 * t.index_len);
        uint32_t *granule = malloc(4ull * QUOTAS);
        for (uint32_t i = 0; i < QUOTAS; i++) slot_of[i] = granule[i] = i;
        for (uint32_t i = QUOTAS - 1; i > 0; i--) {
            uint32_t j = (uint32_t)(xorshift(&seed) % (i + 1)), x = slot_of[i];
            slot_of[i] = slot_of[j];
            slot_of[j] = x;
            j = (uint32_t)(xorshift(&seed) % (i + 1));
            x = granule[i];
            granule[i] = granule[j];
            granule[j] = x;
        }
        for (uint32_t k = 0; k < QUOTAS; k++) {
            size_t p = (hashes[k] >> 24) % t.index_len;
            while (t.index[p]) p = p + 1 == t.index_len ? 0 : p + 1;
            t.index[p] = (hashes[k] >> 56 << 56) | (uint64_t)slot_of[k] << 32 | granule[k];
            t.names[2 * granule[k]] = k;
            t.slots[slot_of[k]].a[0] = k + 1;
        }
        for (uint32_t i = 0; i < KEYS; i++) key_slot[i] = slot_of[keys[i]];
        report("slot known", 1.0, 128 + 16, run(&t, 0), "(no lookup)");
        report("index8", 1.0, 128 + 16 + 12, run(&t, 1), "");
        free(granule);
        munmap(t.slots, sizeof(slot_t) * QUOTAS);
        munmap(t.names, 16ull * QUOTAS);
        munmap(t.index, 8 * t.index_len);
    }

    const double loads[] = {0.9, 1.0};
    for (unsigned li = 0; li < 2; li++) {
        struct table t;
        t.index_len = (size_t)(QUOTAS / loads[li] / 31) + 1;
        t.positions = (uint32_t)(t.index_len * 31);
        t.slots = region(sizeof(slot_t) * t.positions);
        t.names = region(16ull * t.positions);
        t.index = region(64 * t.index_len);
        double walked = 0;
        for (uint32_t k = 0; k < QUOTAS; k++) {
            size_t g = (hashes[k] >> 24) % t.index_len;
            for (;;) {
                uint16_t *tags = (uint16_t *)(t.index + 8 * g);
                unsigned j = 0;
                while (j < 31 && tags[j]) j++;
                if (j < 31) {
                    tags[j] = (uint16_t)(hashes[k] | 0x8000);
                    t.names[2 * (g * 31 + j)] = k;
                    t.slots[g * 31 + j].a[0] = k + 1;
                    break;
                }
                g = g + 1 == t.index_len ? 0 : g + 1;
                walked++;
            }
        }
        char note[64];
        snprintf(note, sizeof note, "(%.1f lines past home on average)", walked / QUOTAS);
        double bytes = (double)(sizeof(slot_t) + 16) * t.positions / QUOTAS + 64.0 * t.index_len / QUOTAS;
        report("tags16", loads[li], bytes, run(&t, 2), note);
        munmap(t.slots, sizeof(slot_t) * t.positions);
        munmap(t.names, 16ull * t.positions);
        munmap(t.index, 64 * t.index_len);
    }

    for (unsigned homes = 1; homes <= 4; homes++)
        for (unsigned li = 0; li < 2; li++) {
            struct table t = {.homes = homes};
            t.positions = (uint32_t)(QUOTAS / loads[li]);
            t.slots = region(sizeof(slot_t) * t.positions);
            t.names = region(16ull * t.positions);
            uint32_t at_home = 0;
            for (uint32_t k = 0; k < QUOTAS; k++) {
                uint32_t p = UINT32_MAX;
                for (unsigned j = 0; j < homes && p == UINT32_MAX; j++)
                    if (!t.slots[pick(hashes[k], j, t.positions)].a[0]) p = pick(hashes[k], j, t.positions);
                if (p != UINT32_MAX) {
                    at_home++;
                } else {
                    uint32_t first = pick(hashes[k], 0, t.positions);
                    uint64_t d = 0;
                    for (p = first; t.slots[p].a[0]; p = (p + 1) % t.positions) d++;
                    if (d > t.slots[first].a[1]) t.slots[first].a[1] = d;
                }
                t.slots[p].a[0] = k + 1;
                t.names[2 * p] = k;
            }
            char name[16], note[64];
            snprintf(name, sizeof name, "homes:%u", homes);
            snprintf(note, sizeof note, "(%.0f%% at a home)", 100.0 * at_home / QUOTAS);
            report(name, loads[li], (double)(sizeof(slot_t) + 16) / loads[li], run(&t, 3), note);
            munmap(t.slots, sizeof(slot_t) * t.positions);
            munmap(t.names, 16ull * t.positions);
        }
    return 0;
}
