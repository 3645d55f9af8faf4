-- +goose Up
-- The HTTP door shows a payment's refunds (GET /v1/payments/{key}) and a
-- refund's own state (GET /v1/refunds/{key}), and answers a retried
-- refund from its row: the gateway role reads the refunds table. SELECT
-- only: refunds are claimed and recorded by the worker alone. A refund
-- the ledger's rules refuse (over_refundable...) writes no row, only its
-- refused outcome event (00026): the gateway reads outcome_events too,
-- for that reason.
--
-- The door's refunds, captures and cancels (POST
-- /v1/payments/{key}/refunds, /capture, /cancel) are taken in by the same
-- intake guard rows as payments, under their own keys. Such a row has no
-- currency (the operation acts on its payment's) and, for a refund of the
-- rest or a capture of the whole, no amount: currency '' marks it, and
-- only it may have amount 0.
ALTER TABLE gateway_intake
    DROP CONSTRAINT gateway_intake_amount_positive,
    ADD CONSTRAINT gateway_intake_amount_positive CHECK (amount > 0 OR (currency = '' AND amount = 0));

-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT SELECT ON TABLE %I.refunds, %I.outcome_events TO paydedup_gateway', s, s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('REVOKE SELECT ON TABLE %I.refunds, %I.outcome_events FROM paydedup_gateway', s, s);
    END IF;
END
$$;
-- +goose StatementEnd
-- An operation's guard row of amount 0 has no place under the old rule:
-- the rows go (a retry of the operation finds the worker's row, or
-- publishes again, which the worker's claim makes harmless).
DELETE FROM gateway_intake WHERE amount = 0;
ALTER TABLE gateway_intake
    DROP CONSTRAINT gateway_intake_amount_positive,
    ADD CONSTRAINT gateway_intake_amount_positive CHECK (amount > 0);
