-- +goose Up
-- One row per (merchant_id, idempotency_key). The CHECK constraints carry the
-- state machine so no code path can write a row that breaks it:
--   pending   : claimed; a lease (locked_by, locked_until) is present
--   completed : final (charged or declined); the response is stored
--   failed    : known not charged; may be re-acquired
CREATE TABLE idempotency_keys (
    merchant_id      text        NOT NULL,
    idempotency_key  text        NOT NULL,
    request_hash     bytea       NOT NULL,
    status           text        NOT NULL,
    provider_key     text        NOT NULL,
    amount           bigint      NOT NULL,
    currency         text        NOT NULL,
    attempts         integer     NOT NULL DEFAULT 1,
    locked_by        text,
    locked_until     timestamptz,
    -- true once a provider call under provider_key may have charged without
    -- us knowing the answer (a holder lost its lease or crashed). Such a row
    -- never becomes `failed` without a provider lookup that proves nothing
    -- was charged.
    maybe_charged    boolean     NOT NULL DEFAULT false,
    -- When calls under provider_key began to count against the provider's own
    -- key window: the first claim, or a re-acquire of a `failed` row. A
    -- pending row older than the window is never re-called blind.
    key_window_start timestamptz NOT NULL,
    charge_id        text,
    response_status  integer,
    response         jsonb,
    last_error       text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,

    PRIMARY KEY (merchant_id, idempotency_key),
    CONSTRAINT merchant_id_format CHECK (merchant_id ~ '^[A-Za-z0-9_-]{1,64}$'),
    CONSTRAINT idempotency_key_length CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    CONSTRAINT request_hash_sha256 CHECK (length(request_hash) = 32),
    CONSTRAINT status_known CHECK (status IN ('pending', 'completed', 'failed')),
    CONSTRAINT provider_key_derived CHECK (provider_key <> idempotency_key AND length(provider_key) BETWEEN 1 AND 255),
    CONSTRAINT amount_positive CHECK (amount > 0),
    CONSTRAINT attempts_positive CHECK (attempts >= 1),
    CONSTRAINT pending_has_lease CHECK ((status = 'pending') = (locked_until IS NOT NULL)),
    CONSTRAINT pending_has_holder CHECK (status <> 'pending' OR locked_by IS NOT NULL),
    CONSTRAINT completed_has_response CHECK (
        (status = 'completed') = (response IS NOT NULL AND response_status IS NOT NULL AND completed_at IS NOT NULL)),
    CONSTRAINT failed_not_maybe_charged CHECK (status <> 'failed' OR NOT maybe_charged)
);

-- The reconciler's scan: pending rows by lease expiry.
CREATE INDEX idempotency_keys_pending_lease ON idempotency_keys (locked_until)
    WHERE status = 'pending';

-- The purge's scan: finished rows by expiry. Pending rows are never purged.
CREATE INDEX idempotency_keys_finished_expiry ON idempotency_keys (expires_at)
    WHERE status <> 'pending';

-- The ledger: the business effect, written in the same transaction that
-- completes the key. Its unique constraints are the last net against a
-- second charge being recorded for one key or one provider charge.
CREATE TABLE payments (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    merchant_id      text        NOT NULL,
    idempotency_key  text        NOT NULL,
    provider_key     text        NOT NULL,
    charge_id        text,
    status           text        NOT NULL,
    amount           bigint      NOT NULL,
    currency         text        NOT NULL,
    created_at       timestamptz NOT NULL,

    CONSTRAINT payments_key_unique UNIQUE (merchant_id, idempotency_key),
    CONSTRAINT payments_charge_unique UNIQUE (charge_id),
    CONSTRAINT payments_status_known CHECK (status IN ('succeeded', 'declined')),
    CONSTRAINT payments_amount_positive CHECK (amount > 0),
    CONSTRAINT payments_succeeded_has_charge CHECK (status <> 'succeeded' OR charge_id IS NOT NULL)
);

CREATE INDEX payments_created_at ON payments (created_at);

-- +goose Down
-- Refuses while either table holds rows, unless the session sets
-- paydedup.allow_data_loss = on (paydedup migrate down --allow-data-loss):
-- without the ledger and the keys, a redelivered or replayed command is
-- charged again.
-- +goose StatementBegin
DO $$
DECLARE
    ledger bigint;
    keys   bigint;
BEGIN
    IF current_setting('paydedup.allow_data_loss', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    SELECT count(*) INTO ledger FROM payments;
    SELECT count(*) INTO keys FROM idempotency_keys;
    IF ledger > 0 OR keys > 0 THEN
        RAISE EXCEPTION 'paydedup: refusing to drop tables payments (%: the ledger of charges and declines) and idempotency_keys (%: every key and its stored outcome): afterwards a redelivered or replayed command would charge again. Export what you need, then run "paydedup migrate down --allow-data-loss" to drop them anyway',
            ledger || CASE WHEN ledger = 1 THEN ' row' ELSE ' rows' END,
            keys || CASE WHEN keys = 1 THEN ' row' ELSE ' rows' END;
    END IF;
END
$$;
-- +goose StatementEnd
DROP TABLE payments;
DROP TABLE idempotency_keys;
