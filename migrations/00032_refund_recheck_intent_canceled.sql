-- +goose Up
-- A refund recorded succeeded that the provider later reports failed
-- (Stripe documents it: a refund.failed or refund.updated after
-- succeeded, the card gone since) must not stay succeeded: the customer
-- has not got the money back, and the payment's refunds still hold it.
-- The webhook's event is only a hint (it may be stale, or out of order),
-- and the gateway cannot ask the provider, so the move takes two steps:
--   request_refund_recheck (gateway and worker roles): stamps
--       recheck_requested_at on a succeeded refund (merchant, key, provider
--       refund id); nothing else changes. A stamp already there is kept.
--   recheck_refund (worker role, the reconciler after its lookup): with
--       the provider's status now, failed moves the refund from succeeded to
--       failed (its reason and answer stored; its amount is free again, as
--       a failed refund no longer counts in the claim's sum) and writes one
--       refund_failed event, seq 4 after the refunded one (seq 3), event id
--       <merchant>:<key>:refund_failed; succeeded only clears the stamp.
--       Only a succeeded refund moves, so a stale event never moves a
--       failed refund back, and a second call writes nothing.
-- The seq list of outcome_events gains 4 (the relay orders a refund's
-- reversal after its refunded event); its kind and status lists are
-- unchanged.
ALTER TABLE refunds
    ADD COLUMN recheck_requested_at timestamptz,
    ADD CONSTRAINT refunds_recheck_succeeded CHECK (recheck_requested_at IS NULL OR status = 'succeeded');
CREATE INDEX refunds_recheck ON refunds (recheck_requested_at, id) WHERE recheck_requested_at IS NOT NULL;

ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_seq_check,
    ADD CONSTRAINT outcome_events_seq_check CHECK (seq IN (0, 1, 2, 3, 4));

-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    EXECUTE format($f$
CREATE FUNCTION %I.request_refund_recheck(p_merchant text, p_key text, p_refund_id text, p_now timestamptz,
        OUT requested boolean, OUT status text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
BEGIN
    UPDATE refunds r SET recheck_requested_at = coalesce(r.recheck_requested_at, p_now, now())
        WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.refund_id = p_refund_id AND r.status = 'succeeded';
    requested := FOUND;
    SELECT r.status INTO status FROM refunds r
        WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.refund_id = p_refund_id;
END
$body$
$f$, s, s);
    EXECUTE format($f$
CREATE FUNCTION %I.recheck_refund(p_merchant text, p_key text, p_refund_id text, p_status text, p_reason text,
        p_response_status integer, p_response bytea, p_now timestamptz, OUT reversed boolean, OUT status text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    rf refunds%%ROWTYPE;
BEGIN
    IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'paydedup: recheck_refund: status %% is neither succeeded nor failed', p_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_status = 'failed' AND (p_response IS NULL OR p_response_status IS NULL OR p_response_status NOT BETWEEN 100 AND 599) THEN
        RAISE EXCEPTION 'paydedup: recheck_refund needs the failed refund''s response and its HTTP status'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    reversed := false;
    IF p_status = 'failed' THEN
        UPDATE refunds r SET status = 'failed', reason = nullif(left(p_reason, 255), ''), response_status = p_response_status,
                response = p_response, recheck_requested_at = NULL, updated_at = coalesce(p_now, now())
            WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.refund_id = p_refund_id AND r.status = 'succeeded'
            RETURNING r.* INTO rf;
        IF FOUND THEN
            INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
            VALUES (rf.merchant_id || ':' || rf.idempotency_key || ':refund_failed', rf.merchant_id, rf.idempotency_key, 4,
                    'refund_failed', 'failed', rf.amount, rf.currency, rf.charge_id, left(rf.reason, 255), coalesce(p_now, now()));
            reversed := true;
        END IF;
    ELSE
        UPDATE refunds r SET recheck_requested_at = NULL
            WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.refund_id = p_refund_id
              AND r.recheck_requested_at IS NOT NULL;
    END IF;
    SELECT r.status INTO status FROM refunds r
        WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.refund_id = p_refund_id;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.request_refund_recheck(text, text, text, timestamptz) FROM PUBLIC', s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.recheck_refund(text, text, text, text, text, integer, bytea, timestamptz) FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.request_refund_recheck(text, text, text, timestamptz) TO paydedup_worker', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.recheck_refund(text, text, text, text, text, integer, bytea, timestamptz) TO paydedup_worker', s);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.request_refund_recheck(text, text, text, timestamptz) TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- An authorized payment (00023) the provider canceled itself (its capture
-- window ran out, or someone voided it at the provider) moves to canceled
-- through cancel_authorized_payment (merchant, key, its intent): the
-- gateway's webhook calls it on payment_intent.canceled, and a capture
-- recorded refused intent_canceled (its lookup found the intent canceled;
-- the worker's or the reconciler's completion) calls it from the trigger
-- payment_ops_intent_canceled, in the completion's transaction. The move
-- is the one payments_only_settle (00027) lets an authorized row make, and
-- it writes the payment's outcome event under its own key: seq 2 (after
-- its authorized event), kind and status canceled, event id
-- <merchant>:<key>:canceled, reason the why. It changes nothing when the
-- payment is not authorized (a second delivery, a cancel recorded first),
-- so one event is written: canceled false, status the payment's as it
-- stands (NULL: no such payment with that intent). A cancel operation's
-- own success (00027) still moves the payment itself, with its event
-- under the operation's key.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format($f$
CREATE FUNCTION %I.cancel_authorized_payment(p_merchant text, p_key text, p_charge_id text, p_reason text, p_now timestamptz,
        OUT canceled boolean, OUT status text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    p payments%%ROWTYPE;
BEGIN
    UPDATE payments x SET status = 'canceled', settled_at = coalesce(p_now, now())
        WHERE x.merchant_id = p_merchant AND x.idempotency_key = p_key AND x.charge_id = p_charge_id AND x.status = 'authorized'
        RETURNING x.* INTO p;
    canceled := FOUND;
    IF canceled THEN
        INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
        VALUES (p.merchant_id || ':' || p.idempotency_key || ':canceled', p.merchant_id, p.idempotency_key, 2, 'canceled', 'canceled',
                p.amount, p.currency, p.charge_id, nullif(left(p_reason, 255), ''), p.settled_at);
    END IF;
    SELECT x.status INTO status FROM payments x
        WHERE x.merchant_id = p_merchant AND x.idempotency_key = p_key AND x.charge_id = p_charge_id;
END
$body$
$f$, s, s);
    EXECUTE format($f$
CREATE FUNCTION %I.payment_ops_intent_canceled() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
BEGIN
    PERFORM cancel_authorized_payment(NEW.merchant_id, NEW.payment_key, NEW.charge_id, NEW.reason, NEW.completed_at);
    RETURN NULL;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.cancel_authorized_payment(text, text, text, text, timestamptz) FROM PUBLIC', s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.payment_ops_intent_canceled() FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.cancel_authorized_payment(text, text, text, text, timestamptz) TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER payment_ops_intent_canceled AFTER UPDATE OF status ON payment_ops
    FOR EACH ROW WHEN (OLD.status IN ('pending', 'unknown') AND NEW.status = 'refused' AND NEW.kind = 'capture'
                       AND NEW.reason = 'intent_canceled')
    EXECUTE FUNCTION payment_ops_intent_canceled();

-- +goose Down
-- A reversed refund stays failed (the older schema holds it as any failed
-- refund); its seq 4 event is deleted once relayed, refused while not,
-- unless paydedup.allow_data_loss = on. A pending recheck is dropped: the
-- provider's next event asks again. A payment canceled by the provider
-- stays canceled, with its event (00027's schema holds both).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM outcome_events WHERE seq = 4 AND relayed_at IS NULL)
       AND current_setting('paydedup.allow_data_loss', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'migration 00032 down: reversed refund events are not published yet; run with --allow-data-loss to drop them';
    END IF;
END
$$;
-- +goose StatementEnd
DROP TRIGGER payment_ops_intent_canceled ON payment_ops;
DROP FUNCTION payment_ops_intent_canceled();
DROP FUNCTION cancel_authorized_payment(text, text, text, text, timestamptz);
DROP FUNCTION recheck_refund(text, text, text, text, text, integer, bytea, timestamptz);
DROP FUNCTION request_refund_recheck(text, text, text, timestamptz);
DELETE FROM outcome_events WHERE seq = 4;
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_seq_check,
    ADD CONSTRAINT outcome_events_seq_check CHECK (seq IN (0, 1, 2, 3));
DROP INDEX refunds_recheck;
ALTER TABLE refunds DROP COLUMN recheck_requested_at;
