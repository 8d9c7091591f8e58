-- Per-key templates (keyed quotas): 1 when every distinct key checked
-- against the quota gets a counter of its own.
ALTER TABLE quotas ADD COLUMN per_key INTEGER NOT NULL DEFAULT 0 CHECK (per_key IN (0, 1));
