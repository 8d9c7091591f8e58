-- Per-call cost of a check from LuaJIT (benches/bindings/run.sh): one hot
-- quota, standalone, never full. Prints "<call>\t<ns per check>", the
-- median of ROUNDS rounds.
package.path = arg[1] .. "/?.lua;" .. package.path
local sluice = require "sluice"
local ffi = require "ffi"

ffi.cdef [[
struct bench_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct bench_timespec *ts);
]]
local ts = ffi.new("struct bench_timespec")
local function now_ns()
    ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
    return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
end

local ROUNDS = 7
local n = tonumber(arg[2]) or 2000000

assert(sluice.init('{"capacity": 1000}'))
assert(sluice.load_quotas('{"quotas": [{"name": "bench_hot", "limit": 1e12, "low_burst": 1e15, "high_burst": 1e15},'
    .. '{"name": "bench_key", "limit": 1e12, "low_burst": 1e15, "high_burst": 1e15, "per_key": true}]}'))
assert(sluice.check("bench_hot", 1) == "PASS")

local function measure(call, label)
    local function round(count)
        local t0 = now_ns()
        for _ = 1, count do
            call()
        end
        return (now_ns() - t0) / count
    end
    round(n / 10)
    local r = {}
    for i = 1, ROUNDS do
        r[i] = round(n)
    end
    table.sort(r)
    print(string.format("%s\t%.1f", label, r[math.ceil(ROUNDS / 2)]))
end

local check, check_key, obtain, reserve = sluice.check, sluice.check_key, sluice.obtain, sluice.reserve
measure(function() check("bench_hot", 1) end, "sluice.check(name, 1)")
measure(function() check_key("bench_key", "user-1", 1) end, "sluice.check_key(name, key, 1)")
measure(function() obtain("bench_hot", 1) end, "sluice.obtain(name, 1)")
measure(function() reserve("bench_hot", 1) end, "sluice.reserve(name, 1)")
sluice.shutdown()
