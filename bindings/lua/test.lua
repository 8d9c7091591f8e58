-- Tests of sluice.lua in plain LuaJIT (no nginx): run by `make
-- test-bindings` as `luajit bindings/lua/test.lua` with SLUICE_LIBRARY
-- set. TAP lines, then "N passed, N failed"; exits 1 on any failure.
--
-- Limits are 0.001/s, so next to nothing leaks while it runs.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path

local sluice = require "sluice"

local passed, failed, n = 0, 0, 0

local function ok(cond, what)
    n = n + 1
    if cond then
        passed = passed + 1
        print("ok " .. n .. " - " .. what)
    else
        failed = failed + 1
        print("not ok " .. n .. " - " .. what)
    end
end

local function is(got, want, what)
    ok(got == want, what .. " (got " .. tostring(got) .. ", want " .. tostring(want) .. ")")
end

local function checks(name, count, weight)
    local out = {}
    for i = 1, count do
        out[i] = sluice.check(name, weight)
    end
    return table.concat(out, " ")
end

local QUOTAS = [[{"quotas": [
  {"name": "three", "limit": 0.001, "low_burst": 3, "high_burst": 3},
  {"name": "frozen_ten", "limit": 0, "low_burst": 10, "high_burst": 10},
  {"name": "parent2", "limit": 0.001, "low_burst": 2, "high_burst": 2},
  {"name": "child", "parent": "parent2", "limit": 0.001, "low_burst": 100, "high_burst": 100},
  {"name": "roomy", "limit": 0.001, "low_burst": 100, "high_burst": 100}
]}]]

-- Before init
local res, err = sluice.check("three")
ok(res == nil and err:find("not initialised", 1, true), "a check before init fails: " .. tostring(err))

-- Bad configuration, named by key, and nothing started
for _, case in ipairs({
    { '{"sync_interval_ms": 50}', "sync_interval_ms" },
    { '{"limiter_id": "web 1"}', "limiter_id" },
    { '{"rootz": []}', "rootz" },
    { "not json", "invalid config JSON" },
}) do
    local good, why = sluice.init(case[1])
    ok(good == nil and why:find(case[2], 1, true), "config " .. case[1] .. " is refused: " .. tostring(why))
end
res, err = sluice.init(42)
ok(res == nil and err:find("config must be JSON text or a table", 1, true), "a config of the wrong type is refused")

-- Standalone limiting
ok(sluice.init('{"capacity": 1000}'), "init with JSON text")
res, err = sluice.init()
ok(res == nil and err:find("already initialised", 1, true), "a second init fails: " .. tostring(err))
ok(sluice.load_quotas(QUOTAS), "load quotas")
is(sluice.quota_count(), 5, "five quotas")
is(checks("three", 5), "PASS PASS PASS REJECT REJECT", "a quota passes its burst, then rejects")
is(checks("frozen_ten", 3, 0), "PASS PASS PASS", "weight 0 checks without counting")
is(sluice.check("frozen_ten", 7), "PASS", "a weight counts that many units")
is(sluice.check("frozen_ten", 4), "REJECT", "and the rest of the burst is 3")
is(sluice.check("frozen_ten", 0), "PASS", "weight 0 sees room left")
is(sluice.check("frozen_ten", 3), "PASS", "the last 3 units pass")
is(sluice.check("frozen_ten", 0), "REJECT", "weight 0 sees a full quota")
is(checks("child", 3), "PASS PASS REJECT", "a child stops at its parent's limit")
is(sluice.check("no_such_quota", 1e6), "UNKNOWN", "an unknown name passes")
is(sluice.check("roomy", 1e300), "REJECT", "a huge weight is the most there is, not wrapped around")
is(sluice.check("roomy", 100), "PASS", "and was not counted")

res, err = sluice.check(nil)
ok(res == nil and err == "name must be a string", "a nil name is refused")
res, err = sluice.check("three", -1)
ok(res == nil and err:find("weight", 1, true), "a negative weight is refused")

res, err = sluice.load_quotas('{"quotas": [{"name": "a b", "limit": 1}]}')
ok(res == nil and err:find("name", 1, true), "an invalid quota set is refused: " .. tostring(err))
is(sluice.quota_count(), 5, "and changes nothing")
res, err = sluice.load_quotas_file("/nonexistent/quotas.json")
ok(res == nil and err:find("/nonexistent/quotas.json", 1, true), "a missing file is reported: " .. tostring(err))

local path = os.tmpname()
local f = assert(io.open(path, "w"))
f:write('[{"name": "from_file", "limit": 0.001, "low_burst": 1}]')
f:close()
ok(sluice.load_quotas_file(path), "load quotas from a file")
os.remove(path)
is(sluice.quota_count(), 1, "which replaced the set")
is(checks("from_file", 2), "PASS REJECT", "and limits")

-- Keys, partial grants and pacing
ok(sluice.load_quotas([[{"quotas": [
  {"name": "per_user", "limit": 0.001, "low_burst": 2, "high_burst": 2, "per_key": true},
  {"name": "batch", "limit": 0, "low_burst": 10, "high_burst": 10},
  {"name": "slow", "limit": 0.01, "low_burst": 1, "high_burst": 1}
]}]]), "load per-key, batch and paced quotas")
local function key_checks(key, count)
    local out = {}
    for i = 1, count do
        out[i] = sluice.check_key("per_user", key, 1)
    end
    return table.concat(out, " ")
end
is(key_checks("alice", 3), "PASS PASS REJECT", "a key has its own counter")
is(key_checks("bob", 1), "PASS", "another key is not limited by the first")
is(key_checks("", 1), "NO_KEY", "an empty key is not checked")
is(sluice.check("per_user", 1), "NO_KEY", "nor is a per-key quota without a key")
is(sluice.check_key("batch", "ignored", 1), "PASS", "a key given for a plain quota is ignored")
res, err = sluice.check_key("per_user", nil)
ok(res == nil and err == "key must be a string", "a nil key is refused")

local granted, result = sluice.obtain("batch", 5)
is(granted, 5, "obtain grants what it asks when there is room")
granted, result = sluice.obtain("batch", 100)
ok(granted == 4 and result == "PASS", "then what is left (" .. tostring(granted) .. " " .. tostring(result) .. ")")
granted, result = sluice.obtain("batch", 1)
ok(granted == 0 and result == "REJECT", "then nothing")
granted, result = sluice.obtain("nothing_here", 3)
ok(granted == 0 and result == "UNKNOWN", "an unknown quota grants nothing and says so")
granted, result = sluice.obtain("per_user", 5, "carol")
ok(granted == 2 and result == "PASS", "a key's grant is out of the key's counter")
granted, err = sluice.obtain("batch", 0)
ok(granted == nil and err:find("want", 1, true), "asking for nothing is an error: " .. tostring(err))

-- 0.01/s: a unit takes 100 s to leak, so the waits barely move while
-- this runs.
local wait
result, wait = sluice.reserve("slow", 1, 1)
ok(result == "PASS" and wait == 0, "the first reservation waits for nothing")
result, wait = sluice.reserve("slow", 1, 1000)
ok(result == "PASS" and wait > 99 and wait <= 100, "the next waits a unit's worth, 100 s (" .. tostring(wait) .. ")")
result, wait = sluice.reserve("slow", 1, 10)
ok(result == "REJECT" and wait > 199 and wait <= 200, "one that would wait past max_wait is refused (" .. tostring(wait) .. ")")
result, wait = sluice.reserve("slow", 2, 1000)
ok(result == "REJECT" and wait == math.huge, "a weight above high_burst can never be reserved")
result, wait = sluice.reserve("per_user", 1, 1, "dave")
ok(result == "PASS" and wait == 0, "a key reserves on its own counter")
result, wait = sluice.reserve("nothing_here", 1, 1)
ok(result == "UNKNOWN" and wait == 0, "an unknown quota is not paced")

-- Charges after the fact, and estimates settled in both directions.
ok(sluice.load_quotas([[{"quotas": [
  {"name": "tokens", "limit": 0.001, "low_burst": 1000, "high_burst": 1000},
  {"name": "tokens_key", "limit": 0.001, "low_burst": 1000, "high_burst": 1000, "per_key": true}
]}]]), "load the token quotas")
for _ = 1, 4 do
    ok(sluice.check("tokens", 600) == "PASS" and sluice.settle("tokens", 600, 100) == "PASS",
        "an estimate of 600 passes and is settled at 100")
end
is(sluice.check("tokens", 700), "REJECT", "four settled estimates left 400: 700 does not fit")
is(sluice.settle("tokens", 100, 1000), "PASS", "a cost above the estimate is charged")
is(sluice.charge("tokens", 5000), "PASS", "a charge is never rejected, even in debt")
is(sluice.check("tokens", 0), "REJECT", "the debt rejects a check of weight 0")
is(sluice.charge("tokens_key", 2000, "alice"), "PASS", "a keyed charge")
is(sluice.check_key("tokens_key", "alice", 0), "REJECT", "puts its key in debt")
is(sluice.check_key("tokens_key", "bob", 1), "PASS", "and no other key")
is(sluice.settle("tokens_key", 1, 0, ""), "NO_KEY", "an empty key settles nothing")
is(sluice.charge("nothing_here", 1), "UNKNOWN", "an unknown name charges nothing")
res, err = sluice.charge("tokens", -1)
ok(res == nil and err:find("weight must be", 1, true), "a negative charge is refused")
res, err = sluice.settle("tokens", 1, "x")
ok(res == nil and err:find("actual must be", 1, true), "a settle of no number is refused")

local metrics = sluice.sync_metrics_json()
ok(metrics and metrics:find('"roots":[]', 1, true), "sync metrics of a standalone limiter: " .. tostring(metrics))

-- In-flight slots
ok(sluice.load_quotas([[{"quotas": [
  {"name": "uploads", "limit": 2, "in_flight": true},
  {"name": "per_client", "limit": 1, "in_flight": true, "per_key": true},
  {"name": "rate", "limit": 1}
]}]]), "load in-flight quotas")
local r1, s1 = sluice.acquire("uploads")
local r2, s2 = sluice.acquire("uploads")
local r3, s3 = sluice.acquire("uploads")
ok(r1 == "PASS" and r2 == "PASS" and s1 and s2, "two slots taken")
ok(r3 == "REJECT" and s3 == nil, "a third is rejected, without a slot")
s1:release()
s1:release()
r3, s3 = sluice.acquire("uploads")
ok(r3 == "PASS" and s3, "a released slot lets the third in")
local r4 = sluice.acquire("uploads")
is(r4, "REJECT", "and a second release gave back nothing more")
s2:release()
s3:release()
local ra, sa = sluice.acquire("per_client", "alice")
is(ra, "PASS", "a key's slot")
is(sluice.acquire("per_client", "alice"), "REJECT", "a key has its own limit")
local rb, sb = sluice.acquire("per_client", "bob")
is(rb, "PASS", "another key has its own slot")
sa:release()
sb:release()
is(sluice.acquire("nobody"), "UNKNOWN", "an unknown name passes without a slot")
res, err = sluice.acquire("rate")
ok(res == nil and err:find("not an in-flight quota", 1, true), "a quota that is not in-flight: " .. tostring(err))
do
    -- Dropped unreleased: the collector gives it back.
    local _, dropped = sluice.acquire("uploads")
    local _, dropped2 = sluice.acquire("uploads")
    ok(dropped and dropped2, "two slots held")
end
collectgarbage()
collectgarbage()
local r5, s5 = sluice.acquire("uploads")
ok(r5 == "PASS", "slots dropped unreleased came back when collected")
s5:release()

-- Tables, through lua-cjson
ok(sluice.shutdown(), "shutdown")
res, err = sluice.check("from_file")
ok(res == nil and err:find("not initialised", 1, true), "a check after shutdown fails")
ok(sluice.shutdown(), "a second shutdown is harmless")
ok(pcall(require, "cjson.safe"), "lua-cjson is installed (make test-bindings installs it)")
ok(sluice.init({ capacity = 1000, sync_interval_ms = 1000 }), "init with a table")
ok(sluice.load_quotas({ quotas = { { name = "t", limit = 0.001, low_burst = 1, high_burst = 1 } } }),
    "load quotas from a table")
is(checks("t", 2), "PASS REJECT", "which limit")
res, err = sluice.load_quotas({ quotas = { { name = "t", limit = -1 } } })
ok(res == nil and err:find("limit", 1, true), "a bad table is refused by the library: " .. tostring(err))
sluice.shutdown()

-- No key section: every key shares the per-key quota's own counter.
ok(sluice.init({ capacity = 1000, key_capacity = 0 }), "init without a key section")
ok(sluice.load_quotas({ quotas = { { name = "pk", limit = 0.001, low_burst = 2, high_burst = 2,
    per_key = true } } }), "load a per-key quota")
local overflows = {}
for i, key in ipairs({ "a", "b", "c" }) do
    overflows[i] = sluice.check_key("pk", key, 1)
end
is(table.concat(overflows, " "), "KEY_OVERFLOW KEY_OVERFLOW REJECT",
    "keys without room share the quota's counter, and say so")
sluice.shutdown()

-- A missing key is a choice: "pass" (the default) or "reject"; a deny
-- override of a quota file is held. The key "stolen" hashes to
-- 7e4ad326f01febd5 with the built-in secret.
local per_token = { quotas = { { name = "per_token", limit = 0.001, low_burst = 3, per_key = true,
    overrides = { { key_hash = "7e4ad326f01febd5", deny = true } } } } }
ok(sluice.init({ capacity = 100 }), "init with no_key left out")
ok(sluice.load_quotas(per_token), "load a per-key quota with an override")
is(sluice.check_key("per_token", "", 1), "NO_KEY", "an empty key passes uncounted by default")
is(sluice.check_key("per_token", "stolen", 1), "REJECT", "the deny override is held")
sluice.shutdown()
ok(sluice.init({ capacity = 100, no_key = "reject" }), "init with no_key = reject")
ok(sluice.load_quotas(per_token), "load it again")
is(sluice.check_key("per_token", "", 1), "REJECT", "an empty key is rejected")
is(sluice.check_key("per_token", "alice", 1), "PASS", "a key passes")
sluice.shutdown()
res, err = sluice.init({ no_key = "sometimes" })
ok(res == nil and err:find("no_key", 1, true), "a bad no_key is refused: " .. tostring(err))

-- A standalone limiter is ready at once.
ok(sluice.init({ capacity = 100 }), "init standalone")
is(sluice.wait_ready(0), true, "a standalone limiter is ready at once")
sluice.shutdown()
res, err = sluice.wait_ready(0)
ok(res == nil and err:find("not initialised", 1, true), "wait_ready needs a limiter")

-- With a real `sluice root` (SLUICE_BIN): a check before the roots' quota
-- set arrives is UNKNOWN, and wait_ready waits for the set.
local bin = os.getenv("SLUICE_BIN") or "target/release/sluice"
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir) == 0)
local function sh(command)
    return os.execute(command .. " >/dev/null 2>&1") == 0
end
local function pause()
    os.execute("sleep 0.05")
end
-- Starts a root at `listen` on the database in `dir`; its address once it
-- listens, and its pid.
local function start_root(listen)
    local log = dir .. "/root.log"
    local pipe = io.popen(string.format(
        "%s root --listen %s --db sqlite://%s/q.db --reload-interval 100ms --log-format json "
            .. ">%s 2>&1 & echo $!", bin, listen, dir, log))
    local pid = pipe:read("*l")
    pipe:close()
    for _ = 1, 400 do
        local f = io.open(log)
        local text = f and f:read("*a") or ""
        if f then f:close() end
        local address = text:match('"quota root listening","address":"([%d%.:]+)"')
        if address then
            return address, pid
        end
        pause()
    end
    error("the root did not start: see " .. log)
end
local function stop_root(pid)
    sh("kill " .. pid)
    for _ = 1, 200 do
        if not sh("kill -0 " .. pid) then
            return
        end
        pause()
    end
end
-- The quota goes into the database while the root runs (writes get 503
-- until it has read its database once)...
local address, pid = start_root("127.0.0.1:0")
local url = "http://" .. address
local put = false
for _ = 1, 200 do
    put = sh(string.format("%s quota --root %s set ready_q --create --limit 0.001 --low-burst 2 "
        .. "--high-burst 2", bin, url))
    if put then break end
    pause()
end
ok(put, "a quota at the root")
-- ...and the root is stopped before the limiter starts.
stop_root(pid)
ok(sluice.init({ roots = { url }, sync_interval_ms = 100, capacity = 100 }), "init with the root")
is(sluice.check("ready_q"), "UNKNOWN", "a check before the quota set arrives is UNKNOWN")
is(sluice.wait_ready(0.3), false, "not ready while the root is away")
ok(sluice.sync_metrics_json():find('"ready":false', 1, true), "the sync metrics say not ready")
address, pid = start_root(address)
is(sluice.wait_ready(15), true, "wait_ready returns once the root's quota set is in")
is(checks("ready_q", 3), "PASS PASS REJECT", "the quota counts from then on (the UNKNOWN counted nothing)")
local metrics = sluice.sync_metrics_json()
ok(metrics:find('"ready":true', 1, true) and metrics:find('"round_trip_ms":', 1, true)
    and metrics:find('"last_success_seconds_ago":', 1, true), "the sync metrics: " .. metrics)
sluice.shutdown()
stop_root(pid)
sh("rm -rf " .. dir)

print(string.format("lua: %d passed, %d failed", passed, failed))
os.exit(failed == 0 and 0 or 1)
