-- +goose Up
-- The HTTP door shows a capture's or a cancel's own state (GET
-- /v1/captures/{key}, /v1/cancels/{key}) and answers a retried one from
-- the worker's row (00027): the gateway role reads payment_ops, the
-- columns it shows or decides by only (never the lease, the provider key,
-- the stored response or the last error). SELECT only: the worker alone
-- claims and records them.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT SELECT (merchant_id, idempotency_key, kind, payment_key, request_hash, amount, amount_received, '
                       'currency, status, reason, created_at, completed_at) ON TABLE %I.payment_ops TO paydedup_gateway', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd

-- The door's guard row of a refund, a capture or a cancel says which it
-- is, so that each is shown on its own route only before the worker
-- claims it (GET /v1/captures/{key} of a refund's key is 404). NULL for a
-- payment's row, and for an operation's taken in before this migration
-- (shown on any operation's route, as before). Nullable, no default, its
-- rule NOT VALID (every row holds NULL, which passes it): the hot table's
-- catalog changes, its rows are neither rewritten nor scanned.
ALTER TABLE gateway_intake
    ADD COLUMN kind text,
    ADD CONSTRAINT gateway_intake_kind CHECK (kind IN ('refund', 'capture', 'cancel')) NOT VALID;

-- +goose Down
-- The kind only narrows which route shows a queued operation: dropping it
-- loses no money's trace.
ALTER TABLE gateway_intake DROP COLUMN kind;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('REVOKE SELECT (merchant_id, idempotency_key, kind, payment_key, request_hash, amount, amount_received, '
                       'currency, status, reason, created_at, completed_at) ON TABLE %I.payment_ops FROM paydedup_gateway', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd
