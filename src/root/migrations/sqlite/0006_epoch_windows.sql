-- envoyproxy/ratelimit's week, month and year as windows: 'epoch_week'
-- (604,800 s from the epoch), '30d' and '365d' from the epoch. Keep in
-- step with ../postgres/.
--
-- SQLite cannot change a column's CHECK, so the quotas table is built
-- again with the wider one, inside the migration's transaction. The
-- foreign keys stay on: the new table names itself as its rows' parent
-- (renamed with it), and the overrides wait in a temporary table while
-- the old quotas table goes, so no row ever points at a missing quota.
CREATE TEMP TABLE overrides_kept AS SELECT * FROM overrides;
DELETE FROM overrides;

CREATE TABLE quotas_rebuilt (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    parent INTEGER REFERENCES quotas_rebuilt (id),
    "limit" REAL NOT NULL,
    low_burst REAL NOT NULL,
    high_burst REAL NOT NULL,
    epoch INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0 CHECK (deleted IN (0, 1)),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    per_key INTEGER NOT NULL DEFAULT 0 CHECK (per_key IN (0, 1)),
    count_window TEXT
        CHECK (count_window IN ('1s', '10s', '1m', '1h', '1d', '7d', 'month',
                                'epoch_week', '30d', '365d')),
    sliding INTEGER NOT NULL DEFAULT 0 CHECK (sliding IN (0, 1)),
    penalty_secs INTEGER CHECK (penalty_secs > 0),
    in_flight INTEGER NOT NULL DEFAULT 0 CHECK (in_flight IN (0, 1))
);
INSERT INTO quotas_rebuilt (id, name, parent, "limit", low_burst, high_burst, epoch,
                            deleted, created_at, updated_at, per_key, count_window,
                            sliding, penalty_secs, in_flight)
    SELECT id, name, parent, "limit", low_burst, high_burst, epoch,
           deleted, created_at, updated_at, per_key, count_window,
           sliding, penalty_secs, in_flight
    FROM quotas;
DROP TABLE quotas;
ALTER TABLE quotas_rebuilt RENAME TO quotas;
CREATE INDEX quotas_by_epoch ON quotas (epoch, id);
CREATE INDEX quotas_by_parent ON quotas (parent);

INSERT INTO overrides SELECT * FROM overrides_kept;
DROP TABLE overrides_kept;
