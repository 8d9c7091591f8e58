-- sluice quota root schema (SQLite). Keep in step with ../postgres/.

-- The single row whose epoch every write increments first: the lock that
-- makes commit order equal epoch order.
CREATE TABLE meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
);
INSERT INTO meta (id, epoch) VALUES (1, 0);

-- Quotas, tombstones included (deleted = 1). Timestamps are Unix
-- milliseconds; booleans are 0/1 integers on both backends.
CREATE TABLE quotas (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    parent INTEGER REFERENCES quotas (id),
    "limit" REAL NOT NULL,
    low_burst REAL NOT NULL,
    high_burst REAL NOT NULL,
    epoch INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0 CHECK (deleted IN (0, 1)),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX quotas_by_epoch ON quotas (epoch, id);
CREATE INDEX quotas_by_parent ON quotas (parent);
