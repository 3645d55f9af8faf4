-- +goose NO TRANSACTION
-- +goose Up
-- The HTTP door shows a payment's refunds (GET /v1/payments/{key}) and a
-- refund's own state (GET /v1/refunds/{key}), and answers a retried
-- refund from its row: the gateway role reads the refunds table, the
-- columns it shows or decides by only (never the lease, the provider key,
-- the stored response or the last error). SELECT only: refunds are
-- claimed and recorded by the worker alone. A refund the ledger's rules
-- refuse (over_refundable...) writes no row, only its refused outcome
-- event (00026): the gateway reads the columns of outcome_events that
-- find one and say why, for that reason.
--
-- The door's refunds, captures and cancels (POST
-- /v1/payments/{key}/refunds, /capture, /cancel) are taken in by the same
-- intake guard rows as payments, under their own keys. Such a row has no
-- currency (the operation acts on its payment's) and, for a refund of the
-- rest or a capture of the whole, no amount: currency '' marks it, and
-- only it may have amount 0.
--
-- gateway_intake is hot: the new rule is added NOT VALID (checked on
-- every write from now on, the table locked only for the catalog
-- change), then validated apart, each statement committed on its own (NO
-- TRANSACTION): VALIDATE CONSTRAINT scans the rows under a lock that
-- lets writes go on. Every existing row passes (amount > 0). Each step
-- may run again after a failure.
ALTER TABLE gateway_intake
    DROP CONSTRAINT gateway_intake_amount_positive,
    ADD CONSTRAINT gateway_intake_amount_positive CHECK (amount > 0 OR (currency = '' AND amount = 0)) NOT VALID;
ALTER TABLE gateway_intake VALIDATE CONSTRAINT gateway_intake_amount_positive;

-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT SELECT (id, merchant_id, idempotency_key, payment_key, request_hash, amount, currency, status, refund_id, '
                       'reason, created_at, updated_at, completed_at) ON TABLE %I.refunds TO paydedup_gateway', s);
        EXECUTE format('GRANT SELECT (event_id, merchant_id, idempotency_key, kind, reason) ON TABLE %I.outcome_events TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- An operation's guard row of amount 0 has no place under the old rule.
-- The down refuses while one lives (within its retention), unless the
-- session sets paydedup.allow_data_loss = on (paydedup migrate down
-- --allow-data-loss): without it, a retry of a refund whose row it
-- deleted would find neither the worker's row nor its refusal and be
-- published again.
-- +goose StatementBegin
DO $$
DECLARE
    n bigint;
BEGIN
    IF current_setting('paydedup.allow_data_loss', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM gateway_intake WHERE amount = 0;
    IF n > 0 THEN
        RAISE EXCEPTION 'paydedup: refusing to delete from gateway_intake (%: the guard rows of refunds of the rest and captures of the whole taken at the door; a retry of one would be published again). Wait for them to expire, or run "paydedup migrate down --allow-data-loss" to delete them anyway',
            n || CASE WHEN n = 1 THEN ' row' ELSE ' rows' END;
    END IF;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('REVOKE SELECT (id, merchant_id, idempotency_key, payment_key, request_hash, amount, currency, status, refund_id, '
                       'reason, created_at, updated_at, completed_at) ON TABLE %I.refunds FROM paydedup_gateway', s);
        EXECUTE format('REVOKE SELECT (event_id, merchant_id, idempotency_key, kind, reason) ON TABLE %I.outcome_events FROM paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd
DELETE FROM gateway_intake WHERE amount = 0;
ALTER TABLE gateway_intake
    DROP CONSTRAINT gateway_intake_amount_positive,
    ADD CONSTRAINT gateway_intake_amount_positive CHECK (amount > 0) NOT VALID;
ALTER TABLE gateway_intake VALIDATE CONSTRAINT gateway_intake_amount_positive;
