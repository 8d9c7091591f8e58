-- Window quotas: count "limit" units per UTC-aligned window ('1s', '10s',
-- '1m', '1h', '1d', '7d', 'month') instead of leaking; NULL for a leaky
-- bucket. sliding = 1 weighs in the previous window too.
ALTER TABLE quotas ADD COLUMN count_window TEXT
    CHECK (count_window IN ('1s', '10s', '1m', '1h', '1d', '7d', 'month'));
ALTER TABLE quotas ADD COLUMN sliding INTEGER NOT NULL DEFAULT 0 CHECK (sliding IN (0, 1));
