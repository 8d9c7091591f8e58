/* The C ABI as a C program sees it: compiled against include/sluice.h and
 * linked with libsluice.so by `make test` (target capi-test).
 *
 * Each check prints one line; the program exits non-zero on the first
 * failed expectation. */
#include <stdint.h>
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
    "  \"low_burst\": 1000, \"high_burst\": 1000},"
    " {\"name\": \"per_user\", \"limit\": 1, \"low_burst\": 3, \"high_burst\": 3,"
    "  \"per_key\": true},"
    " {\"name\": \"batch\", \"limit\": 0.001, \"low_burst\": 10, \"high_burst\": 10},"
    " {\"name\": \"paced\", \"limit\": 10, \"low_burst\": 1, \"high_burst\": 5},"
    " {\"name\": \"daily\", \"limit\": 4, \"window\": \"1d\"},"
    " {\"name\": \"per_user_day\", \"limit\": 2, \"window\": \"1d\", \"per_key\": true},"
    " {\"name\": \"tokens\", \"limit\": 0.001, \"low_burst\": 1000, \"high_burst\": 1000},"
    " {\"name\": \"tokens_key\", \"limit\": 0.001, \"low_burst\": 1000, \"high_burst\": 1000,"
    "  \"per_key\": true}"
    "]}";

/* A missing key is a choice (`no_key`), and overrides are held (a
 * table has room for them unless `override_capacity` is 0); its own
 * limiter. The key "stolen" hashes to 7e4ad326f01febd5 with the built-in
 * secret (`sluice quota hash --key stolen`). */
static void no_key_and_override_tests(void) {
    EXPECT(sluice_init("{\"no_key\": \"reject\"}") == SLUICE_PASS, "no_key reject: init");
    EXPECT(sluice_load_quotas_json(
               "{\"quotas\": [{\"name\": \"per_user\", \"limit\": 1, \"low_burst\": 3,"
               " \"per_key\": true, \"overrides\": [{\"key_hash\": \"7e4ad326f01febd5\","
               " \"deny\": true}]}]}") == SLUICE_PASS,
           "a template with a deny override loads");
    EXPECT(sluice_check_key("per_user", 8, "", 0, 1) == SLUICE_REJECT &&
               sluice_check_key("per_user", 8, NULL, 0, 1) == SLUICE_REJECT &&
               check_by_name("per_user", 1) == SLUICE_REJECT,
           "a check without a key is rejected");
    uint64_t granted = 9, wait_ns = 0;
    EXPECT(sluice_obtain_key("per_user", 8, "", 0, 2, &granted) == SLUICE_REJECT && granted == 0,
           "so is a grant");
    EXPECT(sluice_reserve_key("per_user", 8, "", 0, 1, 1000, &wait_ns) == SLUICE_REJECT,
           "and a reservation");
    EXPECT(sluice_charge_key("per_user", 8, "", 0, 1) == SLUICE_NO_KEY,
           "a charge is no decision: still SLUICE_NO_KEY, nothing counted");
    EXPECT(sluice_check_key("per_user", 8, "alice", 5, 1) == SLUICE_PASS, "a key passes");
    EXPECT(sluice_check_key("per_user", 8, "stolen", 6, 1) == SLUICE_REJECT,
           "the override denies its key: the table has room for overrides");
    sluice_shutdown();
    EXPECT(sluice_init("{\"no_key\": \"pass\"}") == SLUICE_PASS, "no_key pass: init");
    EXPECT(sluice_load_quotas_json("[{\"name\": \"per_user\", \"limit\": 1, \"per_key\": true}]") ==
               SLUICE_PASS,
           "a template loads");
    EXPECT(sluice_check_key("per_user", 8, "", 0, 1) == SLUICE_NO_KEY,
           "a check without a key passes uncounted, as by default");
    sluice_shutdown();
}

/* In-flight quotas: a slot acquired, held, released; self-contained (its
 * own limiter), so it runs last. */
static void in_flight_tests(void) {
    EXPECT(sluice_init(NULL) == SLUICE_PASS, "in-flight: init");
    EXPECT(sluice_load_quotas_json(
               "{\"quotas\": [{\"name\": \"uploads\", \"limit\": 2, \"in_flight\": true},"
               " {\"name\": \"per_client\", \"limit\": 1, \"in_flight\": true,"
               " \"per_key\": true},"
               " {\"name\": \"rate\", \"limit\": 10}]}") == SLUICE_PASS,
           "in-flight quotas load");
    SluiceSlot *a = NULL, *b = NULL, *c = (SluiceSlot *)1;
    EXPECT(sluice_acquire("uploads", 7, &a) == SLUICE_PASS && a != NULL, "a first slot");
    EXPECT(sluice_acquire("uploads", 7, &b) == SLUICE_PASS && b != NULL, "a second slot");
    EXPECT(sluice_acquire("uploads", 7, &c) == SLUICE_REJECT && c == NULL,
           "a third is rejected, and *slot is NULL");
    EXPECT(sluice_release(a) == SLUICE_PASS, "a slot released");
    EXPECT(sluice_acquire("uploads", 7, &c) == SLUICE_PASS && c != NULL,
           "so a third request gets one");
    EXPECT(sluice_release(b) == SLUICE_PASS && sluice_release(c) == SLUICE_PASS,
           "the others released");
    EXPECT(sluice_release(NULL) == SLUICE_PASS, "releasing NULL does nothing");

    SluiceSlot *alice = NULL, *bob = NULL, *again = NULL;
    EXPECT(sluice_acquire_key("per_client", 10, "alice", 5, &alice) == SLUICE_PASS,
           "alice's slot");
    EXPECT(sluice_acquire_key("per_client", 10, "alice", 5, &again) == SLUICE_REJECT,
           "alice has one slot only");
    EXPECT(sluice_acquire_key("per_client", 10, "bob", 3, &bob) == SLUICE_PASS,
           "bob has his own");
    EXPECT(sluice_acquire_key("per_client", 10, NULL, 0, &again) == SLUICE_NO_KEY &&
               again == NULL,
           "no key: passes, no slot");
    sluice_release(alice);
    sluice_release(bob);

    SluiceSlot *none = NULL;
    EXPECT(sluice_acquire("nobody", 6, &none) == SLUICE_UNKNOWN && none == NULL,
           "an unknown name passes without a slot");
    EXPECT(sluice_acquire("rate", 4, &none) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "not an in-flight quota") != NULL,
           "a quota that is not in-flight is refused: %s", sluice_last_error());
    EXPECT(sluice_acquire("uploads", 7, NULL) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "slot is NULL") != NULL,
           "a NULL slot pointer is refused: %s", sluice_last_error());
    EXPECT(sluice_acquire(NULL, 3, &none) == SLUICE_ERROR, "a NULL name is refused");
    EXPECT(sluice_charge("uploads", 7, 5) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "is an in-flight quota") != NULL,
           "an in-flight quota is not charged: %s", sluice_last_error());
    EXPECT(sluice_settle("uploads", 7, 1, 0) == SLUICE_ERROR,
           "nor settled (that would free a held slot)");

    /* A slot outlives a shutdown: released after it, it frees cleanly. */
    SluiceSlot *late = NULL;
    EXPECT(sluice_acquire("uploads", 7, &late) == SLUICE_PASS, "a slot before shutdown");
    sluice_shutdown();
    EXPECT(sluice_release(late) == SLUICE_PASS, "released after shutdown");
    EXPECT(sluice_acquire("uploads", 7, &none) == SLUICE_ERROR, "acquire needs a limiter");
}

int main(void) {
    EXPECT(check_by_name("api", 1) == SLUICE_ERROR, "a check before init is an error");
    EXPECT(strstr(sluice_last_error(), "not initialised") != NULL,
           "and the error says why: %s", sluice_last_error());

    /* The limiter configuration rules are nginx's: each bad field is
     * refused, named, and leaves the library uninitialised. */
    static const char *BAD_CONFIGS[][2] = {
        {"{\"sync_interval_ms\": 50}", "sync_interval_ms"},
        {"{\"sync_interval_ms\": 1000, \"sync_timeout_ms\": 1000}", "sync_timeout_ms"},
        {"{\"limiter_id\": \"web 1\"}", "limiter_id"},
        {"{\"roots\": [\"http://root:7070/v1/sync\"]}", "roots"},
        {"{\"early_sync\": {\"fraction\": 0, \"max_per_second\": 4}}", "early_sync"},
        {"{\"capacity\": 0}", "capacity"},
        {"{\"capacity\": 16777215}", "capacity"},
        {"{\"avg_name_bytes\": 0}", "avg_name_bytes"},
        {"{\"sync_token\": \"two words\"}", "sync_token"},
        {"{\"extrapolation\": {\"mode\": \"constant_ratio\", \"ratio\": -1}}",
         "extrapolation.ratio"},
        {"{\"no_key\": \"deny\"}", "no_key"},
        {"{\"override_capacity\": 1000000000000}", "override_capacity"},
        /* An object only: an array is never read field by field. */
        {"[1, 2]", "expected a JSON object"},
    };
    for (size_t i = 0; i < sizeof BAD_CONFIGS / sizeof BAD_CONFIGS[0]; i++) {
        EXPECT(sluice_init(BAD_CONFIGS[i][0]) == SLUICE_ERROR &&
                   strstr(sluice_last_error(), BAD_CONFIGS[i][1]) != NULL,
               "config %s is refused: %s", BAD_CONFIGS[i][0], sluice_last_error());
    }
    EXPECT(check_by_name("api", 1) == SLUICE_ERROR, "and nothing was initialised");

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
    EXPECT(sluice_quota_count() == 11, "eleven quotas loaded (%d)", sluice_quota_count());

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

    /* A per-key quota: each key its own counter of 3; keys are any bytes. */
    const char binary_key[] = {'a', 0, 'b'};
    int alice = 0, bob = 0, binary = 0;
    for (int i = 0; i < 10; i++) {
        alice += sluice_check_key("per_user", 8, "alice", 5, 1) == SLUICE_PASS;
        bob += sluice_check_key("per_user", 8, "bob", 3, 1) == SLUICE_PASS;
        binary += sluice_check_key("per_user", 8, binary_key, 3, 1) == SLUICE_PASS;
    }
    EXPECT(alice == 3 && bob == 3 && binary == 3,
           "every key gets its own 3 (alice %d, bob %d, a binary key %d)", alice, bob, binary);
    EXPECT(sluice_check_key("per_user", 8, "", 0, 1) == SLUICE_NO_KEY,
           "an empty key is not checked");
    EXPECT(sluice_check_key("per_user", 8, NULL, 0, 1) == SLUICE_NO_KEY,
           "nor is a NULL key of length 0");
    EXPECT(check_by_name("per_user", 1) == SLUICE_NO_KEY, "nor a per-key quota without a key");
    EXPECT(sluice_check_key("per_user", 8, NULL, 4, 1) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "key") != NULL,
           "a NULL key with a length is an error: %s", sluice_last_error());
    EXPECT(sluice_check_key("api", 3, "alice", 5, 0) != SLUICE_ERROR,
           "a key on a plain quota is ignored");

    /* Partial grants: as many as allowed now, counted. */
    uint64_t granted = 99;
    EXPECT(sluice_obtain("batch", 5, 7, &granted) == SLUICE_PASS && granted == 7,
           "obtain 7 of a burst of 10 grants 7 (%llu)", (unsigned long long)granted);
    EXPECT(sluice_obtain("batch", 5, 7, &granted) == SLUICE_PASS && granted == 3,
           "obtain 7 more grants the 3 left (%llu)", (unsigned long long)granted);
    EXPECT(sluice_obtain("batch", 5, 1, &granted) == SLUICE_REJECT && granted == 0,
           "then nothing is granted: a reject");
    EXPECT(sluice_obtain("nothing", 7, 1, &granted) == SLUICE_UNKNOWN && granted == 0,
           "an unknown quota grants nothing and says so");
    EXPECT(sluice_obtain("batch", 5, 0, &granted) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "want") != NULL,
           "want 0 is an error: %s", sluice_last_error());
    EXPECT(sluice_obtain("batch", 5, 1, NULL) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "granted") != NULL,
           "a NULL out-pointer is an error: %s", sluice_last_error());
    EXPECT(sluice_obtain_key("per_user_day", 12, "carol", 5, 5, &granted) == SLUICE_PASS &&
               granted == 2,
           "a key of a daily per-key quota gets its 2 (%llu)", (unsigned long long)granted);
    EXPECT(sluice_obtain_key("per_user_day", 12, "", 0, 5, &granted) == SLUICE_NO_KEY,
           "an empty key is not checked");
    EXPECT(sluice_obtain("daily", 5, 10, &granted) == SLUICE_PASS && granted == 4,
           "a day window grants its limit (%llu)", (unsigned long long)granted);
    EXPECT(check_by_name("daily", 1) == SLUICE_REJECT, "and is full for the day");

    /* Pacing: counted now, spaced at the limit (10/s, a burst of 1). */
    uint64_t waits[4];
    int paced_ok = 1;
    for (int i = 0; i < 4; i++) {
        paced_ok &= sluice_reserve("paced", 5, 1, 1000, &waits[i]) == SLUICE_PASS;
    }
    EXPECT(paced_ok && waits[0] == 0 && waits[1] > 90000000ull && waits[1] <= 100000000ull &&
               waits[3] > 290000000ull && waits[3] <= 300000000ull,
           "reservations are spaced 100 ms apart (%llu, %llu, %llu ns)",
           (unsigned long long)waits[0], (unsigned long long)waits[1],
           (unsigned long long)waits[3]);
    uint64_t wait_ns = 0;
    EXPECT(sluice_reserve("paced", 5, 1, 100, &wait_ns) == SLUICE_REJECT &&
               wait_ns > 390000000ull && wait_ns <= 400000000ull,
           "one that would wait past max_wait is refused, saying the wait (%llu ns)",
           (unsigned long long)wait_ns);
    EXPECT(sluice_reserve("paced", 5, 6, 60000, &wait_ns) == SLUICE_REJECT &&
               wait_ns == UINT64_MAX,
           "a weight above high_burst can never be paced");
    EXPECT(sluice_reserve_key("per_user", 8, "dave", 4, 1, 0, &wait_ns) == SLUICE_PASS &&
               wait_ns == 0,
           "a key with room reserves without waiting");
    EXPECT(sluice_reserve("daily", 5, 1, 60000, &wait_ns) == SLUICE_REJECT &&
               wait_ns > 0 && wait_ns <= 86400000000000ull,
           "a full day window is refused with the time to its end (%llu ns)",
           (unsigned long long)wait_ns);
    EXPECT(sluice_reserve("paced", 5, 1, 100, NULL) == SLUICE_ERROR,
           "a NULL wait pointer is an error");

    /* Charges after the fact: counted whatever the level (a debt), and an
     * estimate settled against the actual cost in both directions. */
    EXPECT(sluice_check("tokens", 6, 600) == SLUICE_PASS, "an estimate of 600 passes");
    EXPECT(sluice_settle("tokens", 6, 600, 100) == SLUICE_PASS,
           "it cost 100: 500 are given back");
    EXPECT(sluice_check("tokens", 6, 800) == SLUICE_PASS,
           "so an estimate of 800 fits the 1000 (100 + 800)");
    EXPECT(sluice_settle("tokens", 6, 800, 1500) == SLUICE_PASS,
           "it cost 1500: 700 more are charged, past the limit");
    EXPECT(sluice_check("tokens", 6, 0) == SLUICE_REJECT,
           "the quota is in debt: even a check of weight 0 is rejected");
    EXPECT(sluice_charge("tokens", 6, 5000) == SLUICE_PASS,
           "a charge is never rejected, even in debt");
    EXPECT(sluice_charge("nothing", 7, 5) == SLUICE_UNKNOWN &&
               sluice_settle("nothing", 7, 5, 1) == SLUICE_UNKNOWN,
           "a charge or settle of an unknown name counts nothing");
    EXPECT(sluice_charge_key("tokens_key", 10, "alice", 5, 2000) == SLUICE_PASS &&
               sluice_check_key("tokens_key", 10, "alice", 5, 0) == SLUICE_REJECT &&
               sluice_check_key("tokens_key", 10, "bob", 3, 1) == SLUICE_PASS,
           "a keyed charge puts only its key in debt");
    EXPECT(sluice_check_key("tokens_key", 10, "bob", 3, 900) == SLUICE_PASS &&
               sluice_settle_key("tokens_key", 10, "bob", 3, 900, 1) == SLUICE_PASS &&
               sluice_check_key("tokens_key", 10, "bob", 3, 900) == SLUICE_PASS,
           "a keyed settle gives the key's units back");
    EXPECT(sluice_charge_key("tokens_key", 10, "", 0, 1) == SLUICE_NO_KEY &&
               sluice_settle_key("tokens_key", 10, NULL, 0, 1, 2) == SLUICE_NO_KEY,
           "an empty key charges nothing");
    EXPECT(sluice_charge(NULL, 3, 1) == SLUICE_ERROR, "a NULL name is an error");

    EXPECT(check_by_name(NULL, 1) == SLUICE_ERROR, "a NULL name is an error, not a crash");

    /* Lengths beyond the limits are refused before anything is read: each
     * buffer is 3 bytes long, so reading it for these lengths would crash. */
    size_t huge = (size_t)1 << 40;
    EXPECT(sluice_check("api", huge, 1) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "name is 1099511627776 bytes long") != NULL,
           "a name length of 2^40 is refused, not read: %s", sluice_last_error());
    EXPECT(sluice_check("api", SLUICE_MAX_NAME_LEN + 1, 1) == SLUICE_ERROR,
           "and so is one byte past SLUICE_MAX_NAME_LEN");
    EXPECT(sluice_check_key("per_user", 8, "key", (size_t)-1, 1) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "key is") != NULL,
           "a key length of (size_t)-1 is refused: %s", sluice_last_error());
    EXPECT(sluice_check_key("api", huge, "key", 3, 1) == SLUICE_ERROR,
           "a keyed check's name length too");
    EXPECT(sluice_obtain("api", huge, 1, &granted) == SLUICE_ERROR &&
               sluice_obtain_key("per_user", 8, "key", huge, 1, &granted) == SLUICE_ERROR,
           "obtain refuses them: %s", sluice_last_error());
    EXPECT(sluice_reserve("api", huge, 1, 0, &wait_ns) == SLUICE_ERROR &&
               sluice_reserve_key("per_user", 8, "key", huge, 1, 0, &wait_ns) == SLUICE_ERROR,
           "reserve refuses them: %s", sluice_last_error());
    EXPECT(sluice_charge("api", huge, 1) == SLUICE_ERROR &&
               sluice_charge_key("per_user", 8, "key", huge, 1) == SLUICE_ERROR &&
               sluice_settle("api", huge, 1, 2) == SLUICE_ERROR &&
               sluice_settle_key("per_user", 8, "key", huge, 1, 2) == SLUICE_ERROR,
           "charge and settle refuse them: %s", sluice_last_error());
    char longest[SLUICE_MAX_NAME_LEN + 2];
    memset(longest, 'a', sizeof longest);
    longest[SLUICE_MAX_NAME_LEN] = 0;
    EXPECT(check_by_name(longest, 1) == SLUICE_UNKNOWN,
           "a name of SLUICE_MAX_NAME_LEN bytes is checked (no such quota)");
    longest[SLUICE_MAX_NAME_LEN] = 'a';
    longest[SLUICE_MAX_NAME_LEN + 1] = 0;
    EXPECT(check_by_name(longest, 1) == SLUICE_ERROR &&
               strstr(sluice_last_error(), "longer than 255") != NULL,
           "one byte longer is refused: %s", sluice_last_error());
    EXPECT(sluice_load_quotas_file("/nonexistent/quotas.json") == SLUICE_ERROR,
           "a missing file is an error: %s", sluice_last_error());
    EXPECT(sluice_load_quotas_file("/etc/sluice/quotas.yaml") == SLUICE_ERROR &&
               strstr(sluice_last_error(), "YAML quota files are not read") != NULL,
           "a YAML file is refused by its name, before it is read: %s", sluice_last_error());
    EXPECT(sluice_load_quotas_json("quotas:\n  - name: a\n    limit: 1\n") == SLUICE_ERROR &&
               strstr(sluice_last_error(), "looks like YAML") != NULL,
           "and YAML text by its look: %s", sluice_last_error());

    /* A limiter without roots has its quotas: ready at once. */
    EXPECT(sluice_wait_ready(0) == SLUICE_PASS, "a standalone limiter is ready at once");
    char *metrics = sluice_sync_metrics_json();
    EXPECT(metrics != NULL && strstr(metrics, "\"ready\":true") != NULL &&
               strstr(metrics, "\"roots\":[]") != NULL,
           "its sync metrics say so: %s", metrics ? metrics : sluice_last_error());
    sluice_free_string(metrics);

    EXPECT(sluice_shutdown() == SLUICE_PASS, "shutdown");
    EXPECT(sluice_wait_ready(0) == SLUICE_ERROR, "waiting needs a limiter: %s",
           sluice_last_error());
    EXPECT(check_by_name("api", 1) == SLUICE_ERROR, "checks after shutdown are errors");
    EXPECT(sluice_shutdown() == SLUICE_PASS, "a second shutdown is harmless");
    EXPECT(sluice_init(NULL) == SLUICE_PASS, "init again after shutdown");
    EXPECT(sluice_quota_count() == 0, "with an empty table");
    sluice_shutdown();

    /* With a root that never answers (nothing listens on port 1) the
     * quota set never arrives: checks are SLUICE_UNKNOWN (pass), and
     * sluice_wait_ready says so when its time runs out. The bindings'
     * tests wait for a real root's set. */
    EXPECT(sluice_init("{\"roots\": [\"http://127.0.0.1:1\"], \"sync_interval_ms\": 100}") ==
               SLUICE_PASS,
           "init with a root that does not answer");
    EXPECT(check_by_name("api", 1) == SLUICE_UNKNOWN, "a check before the quota set is UNKNOWN");
    EXPECT(sluice_wait_ready(0) == SLUICE_NOT_READY, "not ready at once");
    EXPECT(sluice_wait_ready(300) == SLUICE_NOT_READY, "nor within 300 ms");
    metrics = sluice_sync_metrics_json();
    EXPECT(metrics != NULL && strstr(metrics, "\"ready\":false") != NULL &&
               strstr(metrics, "\"last_success_seconds_ago\":null") != NULL &&
               strstr(metrics, "\"round_trip_ms\":") != NULL,
           "the sync metrics: %s", metrics ? metrics : sluice_last_error());
    sluice_free_string(metrics);
    sluice_shutdown();

    no_key_and_override_tests();
    in_flight_tests();

    printf("capi: %d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
