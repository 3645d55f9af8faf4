-- +goose Up
-- A payment the provider accepted but has not finished (a PaymentIntent
-- `processing`: bank debits take days) is in the ledger as `processing`:
-- its key is completed (never charged again), and the reconciler, retrieving
-- the intent by its id, later settles the ledger row to `succeeded` or
-- `failed` (money never moved) and stamps settled_at.
--
-- The ledger stays append-only but for that one transition: a trigger
-- refuses every other UPDATE, whoever runs it, and the worker role may
-- write only the two columns it needs (status, settled_at). DELETE stays
-- revoked (00006).
ALTER TABLE payments
    ADD COLUMN settled_at timestamptz,
    DROP CONSTRAINT payments_status_known,
    ADD CONSTRAINT payments_status_known CHECK (status IN ('succeeded', 'declined', 'processing', 'failed')),
    ADD CONSTRAINT payments_async_has_charge CHECK (status NOT IN ('processing', 'failed') OR charge_id IS NOT NULL),
    ADD CONSTRAINT payments_settled_after_processing CHECK (
        (status = 'failed') <= (settled_at IS NOT NULL) AND (settled_at IS NULL OR status IN ('succeeded', 'failed')));

-- The reconciler's scan of payments still moving.
CREATE INDEX payments_processing ON payments (created_at, id) WHERE status = 'processing';

-- +goose StatementBegin
CREATE FUNCTION payments_only_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'processing' AND NEW.status IN ('succeeded', 'failed') AND NEW.settled_at IS NOT NULL
       AND (NEW.id, NEW.merchant_id, NEW.idempotency_key, NEW.provider_key, NEW.charge_id, NEW.amount, NEW.currency, NEW.created_at)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.merchant_id, OLD.idempotency_key, OLD.provider_key, OLD.charge_id, OLD.amount, OLD.currency, OLD.created_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'paydedup: the payments ledger is append-only: a row changes only from processing to succeeded or failed (row % is %, asked %)',
        OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'integrity_constraint_violation';
END
$$;
-- +goose StatementEnd
CREATE TRIGGER payments_only_settle BEFORE UPDATE ON payments
    FOR EACH ROW EXECUTE FUNCTION payments_only_settle();

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        GRANT UPDATE (status, settled_at) ON payments TO paydedup_worker;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Refuses while the ledger holds processing or failed payments, unless the
-- session sets paydedup.allow_data_loss = on: the older schema cannot
-- store them, and dropping them would lose payments whose money may move.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM payments WHERE status IN ('processing', 'failed'))
       AND current_setting('paydedup.allow_data_loss', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'migration 00009 down: the payments ledger holds % processing or failed payments, which the older schema cannot store; settle them first, or run with --allow-data-loss to delete them',
            (SELECT count(*) FROM payments WHERE status IN ('processing', 'failed'));
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        REVOKE UPDATE (status, settled_at) ON payments FROM paydedup_worker;
    END IF;
END
$$;
-- +goose StatementEnd
DROP TRIGGER payments_only_settle ON payments;
DROP FUNCTION payments_only_settle();
DELETE FROM payments WHERE status IN ('processing', 'failed');
DROP INDEX payments_processing;
ALTER TABLE payments
    DROP CONSTRAINT payments_settled_after_processing,
    DROP CONSTRAINT payments_async_has_charge,
    DROP CONSTRAINT payments_status_known,
    ADD CONSTRAINT payments_status_known CHECK (status IN ('succeeded', 'declined')),
    DROP COLUMN settled_at;
