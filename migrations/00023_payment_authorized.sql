-- +goose Up
-- An authorize (a command of kind authorize: a charge sent with manual
-- capture) ends with the money held at the provider, not moved: its
-- ledger row is `authorized`, with the intent's id, and its outcome event
-- is of kind `authorized`. A charge whose intent the provider left
-- requires_capture is never `authorized` nor `succeeded`: the worker
-- records it `processing` (ledger.CompletionFor).
ALTER TABLE payments
    DROP CONSTRAINT payments_status_known,
    ADD CONSTRAINT payments_status_known CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized')),
    ADD CONSTRAINT payments_authorized_has_charge CHECK (status <> 'authorized' OR charge_id IS NOT NULL);

ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_kind_check,
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized')),
    DROP CONSTRAINT outcome_events_status_check,
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized'));

-- As in 00022, with the authorized kind.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outcome_events_recorded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
    SELECT n.merchant_id || ':' || n.idempotency_key || ':' || k.kind, n.merchant_id, n.idempotency_key, 1, k.kind, n.status,
           n.amount, n.currency, n.charge_id,
           CASE WHEN n.status = 'declined' THEN (
               SELECT outcome_reason(r.response) FROM idempotency_keys r
               WHERE r.merchant_id = n.merchant_id AND r.idempotency_key = n.idempotency_key)
           END,
           n.created_at
    FROM new_rows n,
         LATERAL (SELECT CASE n.status WHEN 'succeeded' THEN 'charged' WHEN 'declined' THEN 'declined'
                                       WHEN 'authorized' THEN 'authorized' ELSE 'processing' END AS kind) k
    ORDER BY n.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
-- CREATE OR REPLACE resets the function's attributes: as in 00022, it
-- writes as the owner with its search_path pinned to this schema.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %I.outcome_events_recorded() SECURITY DEFINER SET search_path = %I, pg_temp',
        current_schema(), current_schema());
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Refuses while the ledger holds authorized payments, unless the session
-- sets paydedup.allow_data_loss = on: the older schema cannot store them,
-- and dropping them would lose money held at the provider.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM payments WHERE status = 'authorized')
       AND current_setting('paydedup.allow_data_loss', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'migration 00023 down: the payments ledger holds % authorized payments, which the older schema cannot store; run with --allow-data-loss to delete them',
            (SELECT count(*) FROM payments WHERE status = 'authorized');
    END IF;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outcome_events_recorded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
    SELECT n.merchant_id || ':' || n.idempotency_key || ':' || k.kind, n.merchant_id, n.idempotency_key, 1, k.kind, n.status,
           n.amount, n.currency, n.charge_id,
           CASE WHEN n.status = 'declined' THEN (
               SELECT outcome_reason(r.response) FROM idempotency_keys r
               WHERE r.merchant_id = n.merchant_id AND r.idempotency_key = n.idempotency_key)
           END,
           n.created_at
    FROM new_rows n,
         LATERAL (SELECT CASE n.status WHEN 'succeeded' THEN 'charged' WHEN 'declined' THEN 'declined' ELSE 'processing' END AS kind) k
    ORDER BY n.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
-- CREATE OR REPLACE resets the function's attributes: as in 00022, it
-- writes as the owner with its search_path pinned to this schema.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %I.outcome_events_recorded() SECURITY DEFINER SET search_path = %I, pg_temp',
        current_schema(), current_schema());
END
$$;
-- +goose StatementEnd
DELETE FROM outcome_events WHERE kind = 'authorized' OR status = 'authorized';
DELETE FROM payments WHERE status = 'authorized';
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_status_check,
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed')),
    DROP CONSTRAINT outcome_events_kind_check,
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled'));
ALTER TABLE payments
    DROP CONSTRAINT payments_authorized_has_charge,
    DROP CONSTRAINT payments_status_known,
    ADD CONSTRAINT payments_status_known CHECK (status IN ('succeeded', 'declined', 'processing', 'failed'));
