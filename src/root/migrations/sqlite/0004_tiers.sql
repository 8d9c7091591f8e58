-- Tiers per key. Keep in step with ../postgres/.

-- A quota's penalty: a request rejected at its high burst bars the quota
-- (a per-key template: the key) for this many seconds; NULL for none.
ALTER TABLE quotas ADD COLUMN penalty_secs INTEGER CHECK (penalty_secs > 0);

-- Overrides of a per-key template for one key hash (16 hex digits):
-- other numbers (kind 'limit'), never limited ('allow') or always
-- rejected ('deny'). Epochs come from meta like the quotas', tombstones
-- (deleted = 1) carry removals and expiries to the limiters. expires_at
-- is Unix milliseconds, NULL for never.
CREATE TABLE overrides (
    id INTEGER PRIMARY KEY,
    quota INTEGER NOT NULL REFERENCES quotas (id),
    key_hash TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('limit', 'allow', 'deny')),
    "limit" REAL,
    low_burst REAL,
    high_burst REAL,
    note TEXT,
    expires_at INTEGER,
    epoch INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0 CHECK (deleted IN (0, 1)),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    UNIQUE (quota, key_hash)
);
CREATE INDEX overrides_by_epoch ON overrides (epoch, id);
CREATE INDEX overrides_by_expiry ON overrides (expires_at);
