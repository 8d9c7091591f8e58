-- sluice for LuaJIT and OpenResty: the limiter of libsluice.so (sluice's
-- C ABI, include/sluice.h) through the FFI. The semantics are the
-- library's; this module converts arguments and results only.
--
--   local sluice = require "sluice"
--   assert(sluice.init({ roots = { "http://127.0.0.1:7070" } }))
--   local res, err = sluice.check("api_acme", 1)  -- "PASS", "REJECT", "UNKNOWN"
--   if res == "REJECT" then return ngx.exit(429) end
--   sluice.check_key("per_token", token, 1)       -- a per-key quota's key
--   local n = sluice.obtain("sms", 100)           -- as many as allowed, up to 100
--   local res, wait = sluice.reserve("sends", 1, 2) -- pace: sleep `wait` s, then act
--   local res, slot = sluice.acquire("uploads")    -- an in-flight slot...
--   if slot then ...; slot:release() end           -- ...given back when done
--
-- Errors come back the Lua way: nil and the library's message
-- (sluice_last_error). The library is loaded from $SLUICE_LIBRARY (a full
-- path; in nginx.conf add `env SLUICE_LIBRARY;`) or as "libsluice.so"
-- through the dynamic loader. Configuration and quotas are JSON text, or
-- Lua tables when lua-cjson is there (OpenResty bundles it).
--
-- One limiter per process: under OpenResty each worker is a process with
-- its own limiter, so call init in init_worker_by_lua with a limiter_id per
-- worker; the nginx module (one table shared by all workers) is the better
-- fit inside nginx itself, this module for code that must decide in Lua.

local ffi = require "ffi"

-- The C declarations, as in include/sluice.h. A new C function is one line
-- here and a small wrapper below.
ffi.cdef [[
int sluice_init(const char *config_json);
int sluice_load_quotas_json(const char *json);
int sluice_load_quotas_file(const char *path);
int sluice_check(const char *name, size_t len, uint64_t weight);
int sluice_check_key(const char *name, size_t name_len, const char *key, size_t key_len,
                     uint64_t weight);
int sluice_obtain(const char *name, size_t name_len, uint64_t want, uint64_t *granted);
int sluice_obtain_key(const char *name, size_t name_len, const char *key, size_t key_len,
                      uint64_t want, uint64_t *granted);
int sluice_reserve(const char *name, size_t name_len, uint64_t weight, uint64_t max_wait_ms,
                   uint64_t *wait_ns);
int sluice_reserve_key(const char *name, size_t name_len, const char *key, size_t key_len,
                       uint64_t weight, uint64_t max_wait_ms, uint64_t *wait_ns);
int sluice_charge(const char *name, size_t len, uint64_t weight);
int sluice_charge_key(const char *name, size_t name_len, const char *key, size_t key_len,
                      uint64_t weight);
int sluice_settle(const char *name, size_t len, uint64_t reserved, uint64_t actual);
int sluice_settle_key(const char *name, size_t name_len, const char *key, size_t key_len,
                      uint64_t reserved, uint64_t actual);
typedef struct SluiceSlot SluiceSlot;
int sluice_acquire(const char *name, size_t name_len, SluiceSlot **slot);
int sluice_acquire_key(const char *name, size_t name_len, const char *key, size_t key_len,
                       SluiceSlot **slot);
int sluice_release(SluiceSlot *slot);
int sluice_wait_ready(uint64_t timeout_ms);
int sluice_quota_count(void);
char *sluice_sync_metrics_json(void);
void sluice_free_string(char *s);
int sluice_shutdown(void);
const char *sluice_last_error(void);
]]

local SLUICE_PASS = 0
local SLUICE_NOT_READY = 5
local SLUICE_ERROR = -1
-- Larger numbers do not convert to uint64_t exactly (or at all); the
-- library counts anything above 2^40 as 2^40 anyway.
local MAX_WEIGHT = 2 ^ 53

local library = os.getenv("SLUICE_LIBRARY") or "sluice"
local ok, C = pcall(ffi.load, library)
if not ok then
    error("sluice: cannot load " .. library .. " (" .. tostring(C)
        .. "); build it with `make lib` and set SLUICE_LIBRARY to its path", 2)
end

local has_cjson, cjson = pcall(require, "cjson.safe")

local _M = {
    _VERSION = "0.1.0",
    -- The library that was loaded (a path or "sluice").
    library = library,
}

-- Result codes to names, so a check returns a string without allocating.
local RESULTS = {
    [0] = "PASS", [1] = "REJECT", [2] = "UNKNOWN", [3] = "NO_KEY", [4] = "KEY_OVERFLOW",
}

-- One out-parameter for obtain and reserve, allocated once: a call fills
-- it and it is read before anything else can run (LuaJIT code on one
-- state is not preempted between the two).
local out = ffi.new("uint64_t[1]")
-- The C ABI's UINT64_MAX wait: waiting cannot help.
local NEVER = 0xffffffffffffffffULL

local function last_error()
    return ffi.string(C.sluice_last_error())
end

-- JSON text from a string (taken as it is), a table (lua-cjson) or nil.
local function json_text(value, what)
    if value == nil or type(value) == "string" then
        return value
    end
    if type(value) ~= "table" then
        return nil, what .. " must be JSON text or a table, got " .. type(value)
    end
    if not has_cjson then
        return nil, what .. " as a table needs lua-cjson; pass JSON text instead"
    end
    return cjson.encode(value)
end

-- Turns a status-returning C call into true or nil, err.
local function status(code)
    if code == SLUICE_ERROR then
        return nil, last_error()
    end
    return true
end

-- Starts the process-wide limiter. `config` (JSON text or a table; nil for
-- defaults) has the keys sluice_init takes: roots, sync_interval_ms,
-- sync_timeout_ms, sync_token, limiter_id, capacity, no_key,
-- override_capacity, ... (include/sluice.h). no_key = "reject" makes a
-- check of a per-key quota without a key "REJECT" (the default, "pass",
-- is "NO_KEY", uncounted, as nginx's limit_req).
function _M.init(config)
    local text, err = json_text(config, "config")
    if err then
        return nil, err
    end
    return status(C.sluice_init(text))
end

-- Replaces the quota set: {"quotas": [...]} or a bare array, as JSON text
-- or a table. An invalid set changes nothing. With roots the set only seeds
-- the table until a root's quotas arrive; the roots' quotas stay.
function _M.load_quotas(quotas)
    local text, err = json_text(quotas, "quotas")
    if err then
        return nil, err
    end
    if text == nil then
        return nil, "quotas must be given"
    end
    return status(C.sluice_load_quotas_json(text))
end

-- Like load_quotas, from a JSON file.
function _M.load_quotas_file(path)
    if type(path) ~= "string" then
        return nil, "path must be a string"
    end
    return status(C.sluice_load_quotas_file(path))
end

-- Checks quota `name` (and its ancestors) for `weight` units (default 1;
-- 0 checks without counting). Returns "PASS", "REJECT" or "UNKNOWN" (no
-- such quota: pass), or nil and the error (not initialised: let the
-- request pass). Never blocks.
function _M.check(name, weight)
    if type(name) ~= "string" then
        return nil, "name must be a string"
    end
    weight = weight or 1
    if type(weight) ~= "number" or weight < 0 or weight ~= weight then
        return nil, "weight must be a number >= 0"
    end
    if weight > MAX_WEIGHT then
        weight = MAX_WEIGHT
    end
    local code = C.sluice_check(name, #name, weight)
    local result = RESULTS[code]
    if result == nil then
        return nil, last_error()
    end
    return result
end

-- A count for a uint64_t argument: nil and an error for anything but a
-- number >= 0; above 2^53 the most there is.
local function count(value, what)
    if type(value) ~= "number" or value < 0 or value ~= value then
        return nil, what .. " must be a number >= 0"
    end
    if value > MAX_WEIGHT then
        return MAX_WEIGHT
    end
    return value
end

-- Whether `name` is a string and `key` nil or a string: true, or nil and
-- what is wrong.
local function name_and_key(name, key)
    if type(name) ~= "string" then
        return nil, "name must be a string"
    end
    if key ~= nil and type(key) ~= "string" then
        return nil, "key must be a string"
    end
    return true
end

-- The result a code stands for, or nil and the library's error.
local function result_of(code)
    local result = RESULTS[code]
    if result == nil then
        return nil, last_error()
    end
    return result
end

-- Checks the key `key` (a string of any bytes) of the per-key quota
-- `name`: the key's own counter, with the quota's ancestors. Returns
-- "PASS", "REJECT", "UNKNOWN" or "NO_KEY" (an empty key: pass, uncounted),
-- or nil and the error. The key is hashed at once and never kept.
function _M.check_key(name, key, weight)
    if type(name) ~= "string" then
        return nil, "name must be a string"
    end
    if type(key) ~= "string" then
        return nil, "key must be a string"
    end
    local w, err = count(weight or 1, "weight")
    if not w then
        return nil, err
    end
    local result = RESULTS[C.sluice_check_key(name, #name, key, #key, w)]
    if result == nil then
        return nil, last_error()
    end
    return result
end

-- A partial grant: counts and returns the most units, up to `want` (at
-- least 1), that quota `name` and all its ancestors allow with certainty
-- now, and the result ("PASS" when something was granted, "REJECT" when
-- nothing can be now, "UNKNOWN", "NO_KEY"): `local n = sluice.obtain("sms",
-- #batch)`, then send n. With `key`, the key's own counter of a per-key
-- quota. nil and the error on failure (want 0, not initialised).
function _M.obtain(name, want, key)
    local valid, why = name_and_key(name, key)
    if not valid then
        return nil, why
    end
    local n, err = count(want, "want")
    if not n then
        return nil, err
    end
    out[0] = 0
    local code
    if key == nil then
        code = C.sluice_obtain(name, #name, n, out)
    else
        code = C.sluice_obtain_key(name, #name, key, #key, n, out)
    end
    local result = RESULTS[code]
    if result == nil then
        return nil, last_error()
    end
    return tonumber(out[0]), result
end

-- Pacing: counts `weight` on quota `name` now and returns the result and
-- how many seconds to wait before acting so the fleet stays at the
-- quota's rate ("PASS", wait: sleep, then act, e.g. `ngx.sleep(wait)`).
-- When the wait would exceed `max_wait` seconds (whole milliseconds;
-- default 1) nothing is counted: "REJECT" and the wait it would have
-- needed (math.huge when waiting cannot help). With `key`, the key's own
-- counter of a per-key quota. nil and the error on failure.
function _M.reserve(name, weight, max_wait, key)
    local valid, why = name_and_key(name, key)
    if not valid then
        return nil, why
    end
    local w, err = count(weight or 1, "weight")
    if not w then
        return nil, err
    end
    local max_s
    max_s, err = count(max_wait or 1, "max_wait")
    if not max_s then
        return nil, err
    end
    local max_ms = math.floor(max_s * 1000)
    out[0] = 0
    local code
    if key == nil then
        code = C.sluice_reserve(name, #name, w, max_ms, out)
    else
        code = C.sluice_reserve_key(name, #name, key, #key, w, max_ms, out)
    end
    local result = RESULTS[code]
    if result == nil then
        return nil, last_error()
    end
    if out[0] == NEVER then
        return result, math.huge
    end
    return result, tonumber(out[0]) / 1e9
end

-- Counts `weight` units on quota `name` (and its ancestors) whatever its
-- level: a cost known only after the work is done (bytes sent, tokens
-- used, a failed login; in OpenResty, from log_by_lua). Never rejects:
-- past the limit it is a debt, and later checks are rejected until it has
-- drained. With `key`, the key's own counter of a per-key quota. Returns
-- "PASS" (counted), "UNKNOWN" or "NO_KEY" (nothing counted),
-- "KEY_OVERFLOW", or nil and the error.
function _M.charge(name, weight, key)
    local valid, why = name_and_key(name, key)
    if not valid then
        return nil, why
    end
    local w, err = count(weight, "weight")
    if not w then
        return nil, err
    end
    local code
    if key == nil then
        code = C.sluice_charge(name, #name, w)
    else
        code = C.sluice_charge_key(name, #name, key, #key, w)
    end
    return result_of(code)
end

-- Settles an estimate: a passed check of `reserved` units on quota `name`
-- cost `actual` in the end. Above the estimate the difference is charged
-- (whatever the level); below it, it is given back (uncounted if not sent
-- to the roots yet, else returned to them with the next sync). With
-- `key`, the key's counter. Returns a result as `charge` does.
function _M.settle(name, reserved, actual, key)
    local valid, why = name_and_key(name, key)
    if not valid then
        return nil, why
    end
    local r, err = count(reserved, "reserved")
    if not r then
        return nil, err
    end
    local a
    a, err = count(actual, "actual")
    if not a then
        return nil, err
    end
    local code
    if key == nil then
        code = C.sluice_settle(name, #name, r, a)
    else
        code = C.sluice_settle_key(name, #name, key, #key, r, a)
    end
    return result_of(code)
end

-- The out-parameter of acquire (filled and read before anything else runs,
-- as `out`).
local slot_out = ffi.new("SluiceSlot *[1]")

-- A held slot: `slot:release()` gives it back, once (later calls do
-- nothing); a slot dropped unreleased goes back when it is collected.
local Slot = {}
Slot.__index = Slot

function Slot:release()
    local p = self.ptr
    if p ~= nil then
        self.ptr = nil
        ffi.gc(p, nil)
        C.sluice_release(p)
    end
    return true
end

-- Takes a slot of the in-flight quota `name` (with `key`, of that key of a
-- per-key one): at most the quota's limit are held at once across the
-- fleet. Returns the result ("PASS", "REJECT", "UNKNOWN", "NO_KEY",
-- "KEY_OVERFLOW") and, when a slot was taken, the slot to release when
-- the work ends; nil and the error on failure (a quota that is not
-- in-flight is one).
function _M.acquire(name, key)
    local valid, why = name_and_key(name, key)
    if not valid then
        return nil, why
    end
    slot_out[0] = nil
    local code
    if key == nil then
        code = C.sluice_acquire(name, #name, slot_out)
    else
        code = C.sluice_acquire_key(name, #name, key, #key, slot_out)
    end
    local result, err = result_of(code)
    if result == nil then
        return nil, err
    end
    local p = slot_out[0]
    if p == nil then
        return result
    end
    return result, setmetatable({ ptr = ffi.gc(p, C.sluice_release) }, Slot)
end

-- Waits until the limiter holds the roots' quota set, at most `timeout`
-- seconds (nil: as long as it takes; 0: only look). Until then a check of
-- a name the limiter does not hold is "UNKNOWN" (passes, uncounted).
-- Returns true once the set is in (at once without roots), false when the
-- time ran out first, or nil and an error. It sleeps the whole thread:
-- under OpenResty call it from init_worker_by_lua, never in a request.
function _M.wait_ready(timeout)
    local ms = NEVER
    if timeout ~= nil then
        local t, err = count(timeout, "timeout")
        if not t then
            return nil, err
        end
        ms = math.ceil(t * 1000)
    end
    local code = C.sluice_wait_ready(ms)
    if code == SLUICE_PASS then
        return true
    elseif code == SLUICE_NOT_READY then
        return false
    end
    return nil, last_error()
end

-- The number of quotas loaded.
function _M.quota_count()
    local n = C.sluice_quota_count()
    if n == SLUICE_ERROR then
        return nil, last_error()
    end
    return n
end

-- The sync thread's state as JSON text (cycles, ready, all_roots_down,
-- roots: per root url, up, last_success_seconds_ago, syncs, errors,
-- last_error, round_trip_ms, ...; include/sluice.h has them all).
function _M.sync_metrics_json()
    local p = C.sluice_sync_metrics_json()
    if p == nil then
        return nil, last_error()
    end
    local text = ffi.string(p)
    C.sluice_free_string(p)
    return text
end

-- Stops the limiter; later checks fail until init is called again.
function _M.shutdown()
    return status(C.sluice_shutdown())
end

return _M
