-- In-flight quotas: at most "limit" requests at once; in_flight = 1 makes
-- the quota's counter a count of held slots that never leaks.
ALTER TABLE quotas ADD COLUMN in_flight INTEGER NOT NULL DEFAULT 0 CHECK (in_flight IN (0, 1));
