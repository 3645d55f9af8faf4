-- +goose Up
-- A fresh install's keys go to day partitions from its first day.
--
-- Migration 00013 attached the table as it was (idempotency_keys_
-- unpartitioned) for every instant up to the end of the day it ran, so
-- that its rows and whatever a previous release inserted that day stay
-- where they are. On a fresh install that table is empty, and the keys of
-- the install's first day went into it too: they are purged row by row
-- rather than dropped with their day, and each of them writes an entry in
-- its created_at index, which the day partitions do not have (bench, which
-- migrates a fresh schema and runs at once, measured that layout rather
-- than a deployment's).
--
-- When the old table holds no row, its range now ends where today begins
-- (UTC), and today's partition and the coming days' are created at once,
-- as maintain_key_partitions creates them (00013; a retention of a
-- hundred years drops nothing). With rows in it, nothing changes. The
-- exclusive lock is taken before the check: no claim can insert between
-- them (claims wait for the migration's commit).
-- +goose StatementBegin
DO $$
DECLARE
    today timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    upper timestamptz;
BEGIN
    LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE;
    SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz INTO upper
    FROM pg_class c WHERE c.oid = 'idempotency_keys_unpartitioned'::regclass;
    IF upper IS NULL OR upper <= today OR EXISTS (SELECT 1 FROM idempotency_keys_unpartitioned) THEN
        RETURN;
    END IF;
    ALTER TABLE idempotency_keys DETACH PARTITION idempotency_keys_unpartitioned;
    EXECUTE format('ALTER TABLE idempotency_keys ATTACH PARTITION idempotency_keys_unpartitioned FOR VALUES FROM (MINVALUE) TO (%L)', today);
    PERFORM maintain_key_partitions(now(), interval '100 years', 2);
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Destroys nothing and moves nothing: rows stay in the partitions they
-- were written to, and 00013's layout serves them as well.
SELECT 1;
