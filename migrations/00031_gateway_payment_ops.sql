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

-- +goose Down
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
