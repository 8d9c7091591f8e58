/* The C ABI as a C program sees it: compiled against include/sluice.h and
 * linked with libsluice.so by `make test` (target capi-test).
 *
 * Each check prints one line; the program exits non-zero on the first
 * failed expectation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"

static int failures = 0;
static int passes = 0;

#define EXPECT(cond, ...)                                   \
    do {                                                    \
        if (cond) {                                         \
            printf("ok - ");                                \
            passes++;                                       \
        } else {                                            \
            printf("not ok - ");                            \
            failures++;                                     \
        }                                                   \
        printf(__VA_ARGS__);                                \
        printf("\n");                                       \
    } while (0)

static const char *QUOTAS =
    "{\"quotas\": ["
    " {\"name\": \"api\", \"limit\": 100, \"low_burst\": 100, \"high_burst\": 100},"
    " {\"name\": \"guarded\", \"limit\": 100, \"low_burst\": 100, \"high_burst\": 100},"
    " {\"name\": \"bucket\", \"limit\": 10, \"low_burst\": 10, \"high_burst\": 10},"
    " {\"name\": \"bucket_read\", \"parent\": \"bucket\", \"limit\": 1000,"
    "  \"low_burst\": 1000, \"high_burst\": 1000}"
    "]}";

int main(void) {
    EXPECT(check_by_name("api", 1) == SLUICE_ERROR, "a check before init is an error");
    EXPECT(strstr(sluice_last_error(), "not initialised") != NULL,
           "and the error says why: %s", sluice_last_error());

    EXPECT(sluice_init("{\"capacity\": 1000, \"sync_interval_ms\": 1000}") == SLUICE_PASS,
           "init with a JSON config");
    EXPECT(sluice_init(NULL) == SLUICE_ERROR, "a second init is refused: %s",
           sluice_last_error());
    EXPECT(sluice_load_quotas_json("{\"quotas\": [{\"name\": \"a b\", \"limit\": 1}]}") ==
               SLUICE_ERROR,
           "an invalid quota set is refused: %s", sluice_last_error());
    EXPECT(strstr(sluice_last_error(), "name") != NULL, "naming the field");
    EXPECT(sluice_load_quotas_json(QUOTAS) == SLUICE_PASS, "load quotas: %s",
           sluice_last_error());
    EXPECT(sluice_quota_count() == 4, "four quotas loaded (%d)", sluice_quota_count());

    int passed = 0, rejected = 0;
    for (int i = 0; i < 1000; i++) {
        int r = check_by_name("api", 1);
        if (r == SLUICE_PASS) passed++;
        if (r == SLUICE_REJECT) rejected++;
    }
    EXPECT(passed >= 100 && passed <= 103 && passed + rejected == 1000,
           "1000 checks at limit 100/s, burst 100: %d passed, %d rejected", passed, rejected);

    int zero_ok = 1;
    for (int i = 0; i < 1000; i++) zero_ok &= check_by_name("guarded", 0) == SLUICE_PASS;
    EXPECT(zero_ok, "weight 0 always passes an empty quota");
    passed = 0;
    for (int i = 0; i < 200; i++) passed += check_by_name("guarded", 1) == SLUICE_PASS;
    EXPECT(passed >= 100 && passed <= 102,
           "and counted nothing: the full burst (%d of 200) is still there", passed);
    EXPECT(check_by_name("guarded", 0) == SLUICE_REJECT, "weight 0 sees a full quota");

    EXPECT(check_by_name("no_such_quota", 1) == SLUICE_UNKNOWN, "an unknown name passes");
    EXPECT(sluice_check("bucket_read_and_more", 11, 1) == SLUICE_PASS,
           "sluice_check takes a length instead of a NUL");

    passed = 0;
    for (int i = 0; i < 50; i++) passed += check_by_name("bucket_read", 1) == SLUICE_PASS;
    EXPECT(passed >= 9 && passed <= 12, "a child stops at its parent's limit (%d of 50)",
           passed);

    EXPECT(check_by_name(NULL, 1) == SLUICE_ERROR, "a NULL name is an error, not a crash");
    EXPECT(sluice_load_quotas_file("/nonexistent/quotas.json") == SLUICE_ERROR,
           "a missing file is an error: %s", sluice_last_error());

    EXPECT(sluice_shutdown() == SLUICE_PASS, "shutdown");
    EXPECT(check_by_name("api", 1) == SLUICE_ERROR, "checks after shutdown are errors");
    EXPECT(sluice_shutdown() == SLUICE_PASS, "a second shutdown is harmless");
    EXPECT(sluice_init(NULL) == SLUICE_PASS, "init again after shutdown");
    EXPECT(sluice_quota_count() == 0, "with an empty table");
    sluice_shutdown();

    printf("capi: %d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
