-- +goose Up
-- The gateway's Stripe webhook (POST /v1/stripe/webhooks) settles a
-- processing payment as the reconciler does, through the same statement
-- (dedup.Store.SettlePayment): the ledger row's status and settled_at, and
-- the final answer on the key's row. The gateway role gets those columns
-- only. The ledger trigger of 00009 still refuses every change but
-- processing -> succeeded/failed, whoever asks; the gateway gets no INSERT
-- or DELETE on either table, and no other column of a key.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT UPDATE (status, settled_at) ON TABLE %I.payments TO paydedup_gateway', current_schema());
        EXECUTE format('GRANT UPDATE (response_status, response, updated_at) ON TABLE %I.idempotency_keys TO paydedup_gateway', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Grants hold no rows: nothing is lost.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('REVOKE UPDATE (status, settled_at) ON TABLE %I.payments FROM paydedup_gateway', current_schema());
        EXECUTE format('REVOKE UPDATE (response_status, response, updated_at) ON TABLE %I.idempotency_keys FROM paydedup_gateway', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd
