-- +goose Up
-- Settling a refund the provider held pending (status processing, 00024)
-- is one function, settle_refund, and the only way the runtime roles may
-- do it: the reconciler (paydedup_worker, after a lookup) and the gateway's
-- Stripe webhook (paydedup_gateway, refund.updated and the like) both call
-- it through dedup.Store.SettleRefund, as settle_payment (00011) settles a
-- processing payment. It moves the refund (merchant, key, provider refund
-- id) from processing to succeeded or failed, stores the final answer and
-- the provider's reason, and stamps completed_at; the trigger of 00024
-- writes its outcome event (refunded or refund_failed, event id
-- <merchant>:<key>:<kind>) in the same transaction. A failed refund no
-- longer counts in what the payment's refunds hold (dedup's claim sums
-- every refund but a failed or refused one): its money may be refunded
-- again. It changes nothing when the refund is not processing, so a
-- webhook delivered twice, or after the reconciler settled the refund,
-- settles nothing and publishes nothing: settled is false and status is
-- the refund's as it stands (NULL: no such refund). p_now is the store's
-- test clock (NULL: the database's now()).
--
-- The gateway gets no right on refunds itself: the function reads and
-- writes as its owner (SECURITY DEFINER, search_path pinned to this
-- schema, pg_temp last, EXECUTE revoked from PUBLIC).
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    EXECUTE format($f$
CREATE FUNCTION %I.settle_refund(p_merchant text, p_key text, p_refund_id text, p_status text, p_reason text,
        p_response_status integer, p_response bytea, p_now timestamptz, OUT settled boolean, OUT status text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
BEGIN
    IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'paydedup: settle_refund: status %% is neither succeeded nor failed', p_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_refund_id IS NULL OR p_refund_id = '' OR p_response IS NULL OR p_response_status IS NULL
       OR p_response_status NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION 'paydedup: settle_refund needs the refund id, a response and its HTTP status'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE refunds r SET status = p_status, reason = nullif(left(p_reason, 255), ''), response_status = p_response_status,
            response = p_response, completed_at = coalesce(p_now, now()), updated_at = coalesce(p_now, now())
        WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.refund_id = p_refund_id AND r.status = 'processing';
    IF FOUND THEN
        settled := true;
        status := p_status;
        RETURN;
    END IF;
    settled := false;
    SELECT r.status INTO status FROM refunds r
        WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.refund_id = p_refund_id;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.settle_refund(text, text, text, text, text, integer, bytea, timestamptz) FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.settle_refund(text, text, text, text, text, integer, bytea, timestamptz) TO paydedup_worker', s);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.settle_refund(text, text, text, text, text, integer, bytea, timestamptz) TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- The refunds the reconciler settles by lookup, oldest first.
CREATE INDEX refunds_processing ON refunds (created_at, id) WHERE status = 'processing';

-- +goose Down
-- A function, its grants and an index hold no rows: nothing is lost.
DROP INDEX refunds_processing;
DROP FUNCTION settle_refund(text, text, text, text, text, integer, bytea, timestamptz);
