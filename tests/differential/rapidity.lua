-- A reference model of Rapidity's fixed windows (the Ruby gem in
-- /work/shared/seeds/rapidity-redis-windows.txt), run by a real
-- redis-server for tests/differential.rs. Written for the test from the
-- article's description: a counter per window created with SET NX at the
-- window's threshold, taken down with DECRBY, never below zero.
--
-- Two things differ from the gem on purpose:
--  * the time is the caller's (ARGV[3], UTC seconds), not Redis's TIME,
--    and windows are aligned to UTC (the gem's window starts at the first
--    request, `SET ... EX interval NX`); the window's index is part of the
--    key instead, and nothing expires (an expiry on Redis's clock would
--    fire on the wrong clock);
--  * besides the gem's sequential Composer ("compose"), a ladder can be
--    taken atomically ("obtain", "check"): every window of the ladder is
--    charged the same amount, the most all of them allow.
--
-- KEYS[i]  base name of ladder level i (the window index is appended)
-- ARGV[1]  "check" (all or nothing), "obtain" (partial grant over the
--          whole ladder) or "compose" (the gem's Composer#obtain)
-- ARGV[2]  the weight or the amount wanted (a non-negative integer)
-- ARGV[3]  now, whole UTC seconds since the Unix epoch
-- ARGV[4 + 2(i-1)], ARGV[5 + 2(i-1)]  level i's window ("1s", "10s",
--          "1m", "1h", "1d", "7d", "month", "epoch_week", "30d", "365d")
--          and threshold
-- Returns the units counted (check: the weight, or -1 when rejected).

-- Fixed lengths from the epoch: envoyproxy/ratelimit's week (a
-- Thursday start), 30-day month and 365-day year among them.
local FIXED = {
    ["1s"] = 1, ["10s"] = 10, ["1m"] = 60, ["1h"] = 3600, ["1d"] = 86400,
    ["epoch_week"] = 604800, ["30d"] = 2592000, ["365d"] = 31536000,
}

local function leap(y)
    return (y % 4 == 0 and y % 100 ~= 0) or y % 400 == 0
end

local MONTH_DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }

-- The index of the window holding `secs`: consecutive windows have
-- consecutive indices. Months are counted by walking the calendar from
-- 1970 (slow and obvious; the model has no other clock).
local function window_index(window, secs)
    local len = FIXED[window]
    if len then
        return math.floor(secs / len)
    end
    local days = math.floor(secs / 86400)
    if window == "7d" then
        -- 1970-01-01 was a Thursday; weeks start on Monday.
        return math.floor((days + 3) / 7)
    end
    if window ~= "month" then
        error("unknown window " .. tostring(window))
    end
    local year = 1970
    while true do
        local in_year = leap(year) and 366 or 365
        if days < in_year then break end
        days = days - in_year
        year = year + 1
    end
    local month = 1
    while true do
        local in_month = MONTH_DAYS[month]
        if month == 2 and leap(year) then in_month = 29 end
        if days < in_month then break end
        days = days - in_month
        month = month + 1
    end
    return (year - 1970) * 12 + month - 1
end

local op = ARGV[1]
local amount = tonumber(ARGV[2])
local now = tonumber(ARGV[3])

-- This window's counter of each level, created full (SET NX) as the gem
-- does, and what is left in it.
local keys, left = {}, {}
for i = 1, #KEYS do
    local window = ARGV[4 + 2 * (i - 1)]
    local threshold = ARGV[5 + 2 * (i - 1)]
    keys[i] = KEYS[i] .. ":" .. window .. ":" .. window_index(window, now)
    redis.call("SET", keys[i], threshold, "NX")
    left[i] = tonumber(redis.call("GET", keys[i]))
end

if op == "compose" then
    -- Composer#obtain: each limiter in turn grants what it can of what
    -- the one before granted, and keeps what it took.
    local count = amount
    for i = 1, #keys do
        local current = redis.call("DECRBY", keys[i], count)
        if current < 0 then
            count = count - math.min(count, -current)
            redis.call("SET", keys[i], 0)
        end
        if count == 0 then break end
    end
    return count
end

local least = math.huge
for i = 1, #keys do
    least = math.min(least, left[i])
end

local take
if op == "obtain" then
    take = math.max(0, math.min(amount, least))
elseif op == "check" then
    -- A weight of 0 asks whether anything is left at all.
    local fits = (amount == 0 and least > 0) or (amount > 0 and least >= amount)
    if not fits then return -1 end
    take = amount
else
    error("unknown op " .. tostring(op))
end
if take > 0 then
    for i = 1, #keys do
        redis.call("DECRBY", keys[i], take)
    end
end
return take
