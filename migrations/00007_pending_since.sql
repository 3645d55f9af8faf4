-- +goose Up
-- What an operator needs to see a payment that stays unresolved.
--
-- pending_since is when the row's current pending episode began: its first
-- claim, or the re-acquire of a `failed` row. Releases, lease expiries,
-- redeliveries and the reconciler's leases keep it, so the age of a stuck
-- row keeps growing while lookups fail (locked_until, which each release
-- rewrites, cannot tell that).
--
-- lookup_failures and next_lookup_at back off the reconciler's lookups of
-- one row: each failed lookup counts one more and pushes the next one out
-- exponentially, capped; a successful lookup or a new episode resets them.
ALTER TABLE idempotency_keys
    ADD COLUMN pending_since timestamptz,
    ADD COLUMN lookup_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN next_lookup_at timestamptz;

-- Rows already pending began their episode at most when their key window
-- last started (the first claim, or the re-acquire of a failed row).
UPDATE idempotency_keys SET pending_since = key_window_start WHERE status = 'pending';

-- Every write from now on is checked. Existing rows satisfy both by
-- construction (the UPDATE above, the default), and validating them would
-- scan the whole table under the lock this migration holds: NOT VALID.
ALTER TABLE idempotency_keys
    ADD CONSTRAINT pending_has_since CHECK (status <> 'pending' OR pending_since IS NOT NULL) NOT VALID,
    ADD CONSTRAINT lookup_failures_non_negative CHECK (lookup_failures >= 0) NOT VALID;

-- +goose Down
-- Dropping the columns loses when pending rows became pending and how far
-- their lookups are backed off; refused while any row has such data, unless
-- paydedup.allow_data_loss is on (paydedup migrate down --allow-data-loss).
-- +goose StatementBegin
DO $$
DECLARE
    pending bigint;
    backed_off bigint;
BEGIN
    SELECT count(*) FILTER (WHERE status = 'pending'),
           count(*) FILTER (WHERE lookup_failures > 0 OR next_lookup_at IS NOT NULL)
      INTO pending, backed_off
      FROM idempotency_keys;
    IF (pending > 0 OR backed_off > 0)
       AND current_setting('paydedup.allow_data_loss', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'paydedup: migration 00007 down would drop idempotency_keys.pending_since of % pending row(s) and the lookup back-off of % row(s); resolve them first or run with --allow-data-loss', pending, backed_off;
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE idempotency_keys
    DROP CONSTRAINT lookup_failures_non_negative,
    DROP CONSTRAINT pending_has_since,
    DROP COLUMN next_lookup_at,
    DROP COLUMN lookup_failures,
    DROP COLUMN pending_since;
