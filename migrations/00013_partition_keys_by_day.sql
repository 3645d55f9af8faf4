-- +goose Up
-- Retention without row-by-row deletes (issue 20): idempotency_keys is
-- partitioned by day of created_at (native declarative partitioning), and
-- retention drops a whole day once it is older than the key retention
-- (which exceeds the stream's and the DLQ's MaxAge: the key window plus the
-- message lifetime), instead of deleting its rows one by one.
--
-- Partitions (all UTC):
--   idempotency_keys_unpartitioned : the table as it was, attached for
--       (MINVALUE, the day after this migration ran): its rows stay where
--       they are, and the store still purges them row by row (they are the
--       old table's);
--   idempotency_keys_pYYYYMMDD : one per day, created ahead of time by
--       maintain_key_partitions (below), which the store's Purge runs (the
--       reconciler's purge step), and dropped whole by it;
--   idempotency_keys_default : anything no day partition covers (a test
--       clock, a skewed clock before the partition exists), purged row by
--       row like the old table's rows.
-- created_at never changes after the claim, so no row ever moves between
-- partitions, and the completion stays a HOT update (00012).
--
-- Uniqueness of (merchant_id, idempotency_key) across partitions. A unique
-- index of a partitioned table must contain the partition key, so
-- (merchant_id, idempotency_key, created_at) would let the same key live
-- in two days. Each partition has its own unique index on
-- (merchant_id, idempotency_key), which catches two claims that land on
-- the same day, and the claim (dedup/claim.go) guards the rest:
--   1. it inserts a key only when no partition holds it (one probe of each
--      live partition's unique index per key, bounded by the batch times
--      the three or four live partitions);
--   2. before that statement, in the same implicit transaction and round
--      trip, it takes a transaction advisory lock per key
--      (pg_advisory_xact_lock on a 64-bit hash of schema, merchant and
--      key, in hash order so that batches never deadlock). Two workers
--      racing one key at a day boundary are then serialised: the second
--      waits until the first's claim committed, and its claim statement,
--      which takes its snapshot after the lock, sees the first's row in
--      the earlier day and does not insert. Without the lock, the second's
--      snapshot could miss the first's uncommitted row in the other
--      partition, and the key would be claimed twice.
-- The ledger (payments) is not partitioned: unique per key and per charge,
-- never purged, checked by every claim.
-- +goose StatementBegin
DO $$
DECLARE
    s     text := current_schema();
    upper timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 day';
BEGIN
    ALTER TABLE idempotency_keys RENAME TO idempotency_keys_unpartitioned;
    -- A partition must hold every CHECK of its parent validated.
    ALTER TABLE idempotency_keys_unpartitioned VALIDATE CONSTRAINT pending_has_since;
    ALTER TABLE idempotency_keys_unpartitioned VALIDATE CONSTRAINT lookup_failures_non_negative;
    CREATE TABLE idempotency_keys (LIKE idempotency_keys_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)
        PARTITION BY RANGE (created_at);
    DROP TRIGGER idempotency_keys_notify_completed ON idempotency_keys_unpartitioned;
    EXECUTE format('ALTER TABLE idempotency_keys ATTACH PARTITION idempotency_keys_unpartitioned FOR VALUES FROM (MINVALUE) TO (%L)', upper);
    CREATE TABLE idempotency_keys_default PARTITION OF idempotency_keys DEFAULT WITH (fillfactor = 20);
    CREATE UNIQUE INDEX idempotency_keys_default_key ON idempotency_keys_default (merchant_id, idempotency_key);
    CREATE INDEX idempotency_keys_default_created ON idempotency_keys_default (created_at);

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I.idempotency_keys TO paydedup_worker', s);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT SELECT ON TABLE %I.idempotency_keys TO paydedup_gateway', s);
        EXECUTE format('REVOKE ALL ON TABLE %I.idempotency_keys_unpartitioned FROM paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- The completion notification (00003, 00005), now on the partitioned
-- table: PostgreSQL clones it onto every partition.
CREATE TRIGGER idempotency_keys_notify_completed
    AFTER UPDATE OF status ON idempotency_keys
    FOR EACH ROW WHEN (NEW.status = 'completed' AND OLD.status IS DISTINCT FROM 'completed'
                       AND current_setting('paydedup.completions_notified', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION paydedup_notify_completed();

-- maintain_key_partitions creates the day partitions of p_now's day and the
-- p_ahead days after it, when missing, and drops every day partition whose
-- last instant is more than p_retention before p_now and that holds no
-- pending row. A pending row is an unresolved payment: its partition is
-- kept (blocked) until the row is completed or failed and the partition is
-- checked again; rows are never moved (created_at, the partition key, is
-- when the key was first claimed and stays so). The check: first
-- pending_keys (00012, every pending key is named there), then one
-- sequential scan of the partition for pending rows without a lock (a day
-- is scanned once, when it is about to go), then, under an exclusive lock
-- on the table taken with a 2 s lock_timeout, pending_keys again (a
-- re-acquire of an old failed key may have made a row pending since), and
-- the drop. It returns how many day partitions it created, dropped and
-- kept because of pending rows, and how many rows the dropped ones held.
-- It runs with its owner's rights (the runtime roles have no DDL), its
-- search_path pinned to this schema, like settle_payment (00011).
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format($f$
CREATE FUNCTION %I.maintain_key_partitions(p_now timestamptz, p_retention interval, p_ahead integer,
        OUT created integer, OUT dropped integer, OUT blocked integer, OUT dropped_rows bigint)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    now_  timestamptz := coalesce(p_now, now());
    day0  timestamptz := date_trunc('day', coalesce(p_now, now()) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    lo    timestamptz;
    part  text;
    n     bigint;
BEGIN
    created := 0; dropped := 0; blocked := 0; dropped_rows := 0;
    IF p_retention IS NULL OR p_retention <= interval '0' OR p_ahead IS NULL OR p_ahead < 0 OR p_ahead > 31 THEN
        RAISE EXCEPTION 'paydedup: maintain_key_partitions needs a positive retention and 0..31 days ahead'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One maintenance at a time per schema. Two reconcilers that had each
    -- created a day (which locks the table) and then both asked for the
    -- exclusive lock to drop an old one would deadlock; the one that finds
    -- the maintenance under way leaves it to the other and returns zeros.
    IF NOT pg_try_advisory_xact_lock(hashtextextended('paydedup.maintain_key_partitions/' || current_schema(), 0)) THEN
        RETURN;
    END IF;
    FOR i IN 0..p_ahead LOOP
        lo := day0 + make_interval(days => i);
        part := 'idempotency_keys_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD');
        CONTINUE WHEN to_regclass(part) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE %%I PARTITION OF idempotency_keys FOR VALUES FROM (%%L) TO (%%L) WITH (fillfactor = 20)',
                part, lo, lo + interval '1 day');
            EXECUTE format('CREATE UNIQUE INDEX %%I ON %%I (merchant_id, idempotency_key)', part || '_key', part);
            created := created + 1;
        EXCEPTION
            -- The day overlaps the old table's range, or rows of it are in
            -- the default partition already: the day stays where it is.
            -- Or another reconciler created it at the same moment.
            WHEN invalid_object_definition OR check_violation OR duplicate_table OR unique_violation THEN NULL;
        END;
    END LOOP;

    FOR part, lo IN
        SELECT c.relname, to_date(substr(c.relname, 19), 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC'
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'idempotency_keys'::regclass AND c.relname ~ '^idempotency_keys_p[0-9]{8}$'
        ORDER BY 1
    LOOP
        CONTINUE WHEN lo + interval '1 day' + p_retention > now_;
        BEGIN
            EXECUTE format('SELECT count(*) FROM pending_keys p JOIN %%I k USING (merchant_id, idempotency_key) WHERE k.status = ''pending''', part) INTO n;
            IF n = 0 THEN
                EXECUTE format('SELECT count(*) FROM %%I WHERE status = ''pending''', part) INTO n;
            END IF;
            IF n > 0 THEN
                blocked := blocked + 1;
                CONTINUE;
            END IF;
            PERFORM set_config('lock_timeout', '2s', true);
            LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE;
            -- Another reconciler may have dropped it while we waited.
            CONTINUE WHEN to_regclass(part) IS NULL;
            EXECUTE format('SELECT count(*) FROM pending_keys p JOIN %%I k USING (merchant_id, idempotency_key) WHERE k.status = ''pending''', part) INTO n;
            IF n > 0 THEN
                blocked := blocked + 1;
            ELSE
                EXECUTE format('SELECT count(*) FROM %%I', part) INTO n;
                EXECUTE format('DROP TABLE %%I', part);
                dropped := dropped + 1;
                dropped_rows := dropped_rows + n;
            END IF;
        EXCEPTION
            WHEN lock_not_available THEN blocked := blocked + 1;
            -- Dropped by another reconciler between the list and the scan.
            WHEN undefined_table THEN NULL;
        END;
    END LOOP;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.maintain_key_partitions(timestamptz, interval, integer) FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.maintain_key_partitions(timestamptz, interval, integer) TO paydedup_worker', s);
        -- The old table's rows and the default partition's are purged row
        -- by row, through the partitions themselves (FOR UPDATE needs
        -- UPDATE).
        EXECUTE format('GRANT SELECT, UPDATE, DELETE ON TABLE %I.idempotency_keys_unpartitioned, %I.idempotency_keys_default TO paydedup_worker', s, s);
    END IF;
END
$$;
-- +goose StatementEnd
SELECT created FROM maintain_key_partitions(NULL, interval '48 hours', 2);

-- +goose Down
-- Destroys no rows: every row goes back into the old table, which becomes
-- idempotency_keys again.
DROP FUNCTION maintain_key_partitions(timestamptz, interval, integer);
ALTER TABLE idempotency_keys DETACH PARTITION idempotency_keys_unpartitioned;
INSERT INTO idempotency_keys_unpartitioned SELECT * FROM idempotency_keys;
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_unpartitioned RENAME TO idempotency_keys;
DROP TRIGGER IF EXISTS idempotency_keys_notify_completed ON idempotency_keys;
CREATE TRIGGER idempotency_keys_notify_completed
    AFTER UPDATE OF status ON idempotency_keys
    FOR EACH ROW WHEN (NEW.status = 'completed' AND OLD.status IS DISTINCT FROM 'completed'
                       AND current_setting('paydedup.completions_notified', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION paydedup_notify_completed();
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT SELECT ON TABLE %I.idempotency_keys TO paydedup_gateway', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd
