-- +goose Up
-- The HTTP door shows a payment's refunds (GET /v1/payments/{key}) and a
-- refund's own state (GET /v1/refunds/{key}), and answers a retried
-- refund from its row: the gateway role reads the refunds table. SELECT
-- only: refunds are claimed and recorded by the worker alone.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT SELECT ON TABLE %I.refunds TO paydedup_gateway', s);
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
        EXECUTE format('REVOKE SELECT ON TABLE %I.refunds FROM paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd
