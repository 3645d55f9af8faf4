-- +goose Up
-- Settling a processing payment is one function, settle_payment, and the
-- only way the runtime roles may do it: the reconciler (paydedup_worker)
-- and the gateway's Stripe webhook (paydedup_gateway, internet-facing) both
-- call it through dedup.Store.SettlePayment, so they cannot settle a row
-- differently. It moves the ledger row (merchant, key, intent) from
-- processing to succeeded or failed and stamps settled_at, and replaces the
-- final answer stored on the key's completed row; it changes nothing, and
-- returns false, when that ledger row is not processing. p_now is the
-- store's test clock (NULL: the database's now()).
--
-- Neither role may update either table itself: the gateway gets no UPDATE
-- at all (an UPDATE grant, even on one column, would let it lock key rows
-- with SELECT ... FOR UPDATE and rewrite the answer of any completed key),
-- and the worker's UPDATE (status, settled_at) on payments from 00009 is
-- revoked. The ledger trigger of 00009 still refuses every other change,
-- even by the owner.
--
-- The function runs with the rights of its owner, the role that runs the
-- migrations and owns the tables (SECURITY DEFINER). As Postgres requires
-- for such a function, its search_path is pinned to the schema it is
-- created in, pg_temp last: a caller's search_path or temporary tables
-- named like ours cannot redirect it, and one schema's function never
-- touches another schema's tables. EXECUTE is revoked from PUBLIC in the
-- same transaction that creates it.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    EXECUTE format($f$
CREATE FUNCTION %I.settle_payment(p_merchant text, p_key text, p_charge_id text, p_status text,
        p_response_status integer, p_response jsonb, p_now timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    n bigint;
BEGIN
    IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'paydedup: settle_payment: status %% is neither succeeded nor failed', p_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_charge_id IS NULL OR p_response IS NULL OR p_response_status IS NULL OR p_response_status NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION 'paydedup: settle_payment needs the charge id, a response and its HTTP status'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH settled AS (
        UPDATE payments SET status = p_status, settled_at = coalesce(p_now, now())
        WHERE merchant_id = p_merchant AND idempotency_key = p_key AND charge_id = p_charge_id AND status = 'processing'
        RETURNING merchant_id, idempotency_key, charge_id
    ), key_row AS (
        UPDATE idempotency_keys k SET response_status = p_response_status, response = p_response, updated_at = coalesce(p_now, now())
        FROM settled s
        WHERE k.merchant_id = s.merchant_id AND k.idempotency_key = s.idempotency_key
          AND k.status = 'completed' AND k.charge_id = s.charge_id
        RETURNING 1
    )
    SELECT count(*) INTO n FROM settled;
    RETURN n > 0;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.settle_payment(text, text, text, text, integer, jsonb, timestamptz) FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('REVOKE UPDATE (status, settled_at) ON TABLE %I.payments FROM paydedup_worker', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.settle_payment(text, text, text, text, integer, jsonb, timestamptz) TO paydedup_worker', s);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.settle_payment(text, text, text, text, integer, jsonb, timestamptz) TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- A function and grants hold no rows: nothing is lost. The worker settles
-- with its own UPDATE again, as 00009 granted.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT UPDATE (status, settled_at) ON TABLE %I.payments TO paydedup_worker', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION settle_payment(text, text, text, text, integer, jsonb, timestamptz);
