-- envoyproxy/ratelimit's week, month and year as windows: 'epoch_week'
-- (604,800 s from the epoch), '30d' and '365d' from the epoch. Keep in
-- step with ../sqlite/.
ALTER TABLE quotas DROP CONSTRAINT quotas_count_window_check;
ALTER TABLE quotas ADD CONSTRAINT quotas_count_window_check
    CHECK (count_window IN ('1s', '10s', '1m', '1h', '1d', '7d', 'month',
                            'epoch_week', '30d', '365d'));
