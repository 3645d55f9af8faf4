-- +goose Up
-- A webhook event is a hint, never a lookup: it may be forged (a leaked
-- signing secret, a compromised gateway) or stale. Two of its moves could
-- free or lose money on the event's word alone; both are closed here.
--
-- 1. A refund the provider held pending (processing) that an event says
--    failed: settle_refund (00028) let the gateway's role fail it, freeing
--    its amount, while the provider may still pay it out (a second refund
--    of that amount would then refund the customer twice). The gateway's
--    role loses EXECUTE on settle_refund (the worker's role, the
--    reconciler after its lookup, keeps it) and gets
--    settle_refund_succeeded: the same move, to succeeded only (a
--    succeeded refund holds its amount: the safe direction). A failed or
--    canceled report of a processing refund writes nothing; the
--    reconciler's settle pass looks every processing refund up each pass.
--
-- 2. cancel_authorized_payment (00032), the webhook's payment_intent.canceled:
--    it now takes the payment's advisory lock (the one a capture's,
--    cancel's or refund's claim takes, dedup's lockPayment) and changes
--    nothing while a capture or cancel of the payment holds (pending,
--    unknown, succeeded): that operation's own outcome (a capture refused
--    intent_canceled cancels the payment, 00032) decides. And
--    payment_ops_settled (00027) raises when a succeeded capture or cancel
--    moves no payment (one no longer authorized), rather than recording
--    money taken against a canceled payment: the completion's transaction
--    fails, the operation stays as it was, and the worker retries and logs
--    it.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    EXECUTE format($f$
CREATE FUNCTION %I.settle_refund_succeeded(p_merchant text, p_key text, p_refund_id text, p_reason text,
        p_response_status integer, p_response bytea, p_now timestamptz, OUT settled boolean, OUT status text)
    LANGUAGE sql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
    SELECT r.settled, r.status FROM settle_refund(p_merchant, p_key, p_refund_id, 'succeeded', p_reason,
        p_response_status, p_response, p_now) r
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.settle_refund_succeeded(text, text, text, text, integer, bytea, timestamptz) FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.settle_refund(text, text, text, text, text, integer, bytea, timestamptz) FROM paydedup_gateway', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.settle_refund_succeeded(text, text, text, text, integer, bytea, timestamptz) TO paydedup_gateway', s);
    END IF;

    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %I.cancel_authorized_payment(p_merchant text, p_key text, p_charge_id text, p_reason text, p_now timestamptz,
        OUT canceled boolean, OUT status text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    p payments%%ROWTYPE;
BEGIN
    -- Not from payment_ops_intent_canceled: that completion holds its
    -- operation's row, which a claim of the same key locks under the
    -- payment's lock (a deadlock); its operation, pending until this
    -- commit, already keeps every other claim out.
    IF pg_trigger_depth() = 0 THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(current_schema() || '/payment/' || p_merchant || ':' || p_key, 0));
    END IF;
    canceled := false;
    IF NOT EXISTS (SELECT 1 FROM payment_ops o
                   WHERE o.merchant_id = p_merchant AND o.payment_key = p_key AND o.status IN ('pending', 'unknown', 'succeeded')) THEN
        UPDATE payments x SET status = 'canceled', settled_at = coalesce(p_now, now())
            WHERE x.merchant_id = p_merchant AND x.idempotency_key = p_key AND x.charge_id = p_charge_id AND x.status = 'authorized'
            RETURNING x.* INTO p;
        canceled := FOUND;
    END IF;
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
CREATE OR REPLACE FUNCTION %I.payment_ops_settled() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    k text := CASE WHEN NEW.status = 'refused' THEN NEW.kind || '_failed'
                   WHEN NEW.kind = 'capture' THEN 'captured' ELSE 'canceled' END;
BEGIN
    IF NEW.status = 'succeeded' THEN
        UPDATE payments
        SET status = CASE NEW.kind WHEN 'capture' THEN 'succeeded' ELSE 'canceled' END,
            amount_received = CASE NEW.kind WHEN 'capture' THEN NEW.amount_received END,
            settled_at = coalesce(NEW.completed_at, now())
        WHERE merchant_id = NEW.merchant_id AND idempotency_key = NEW.payment_key AND status = 'authorized';
        IF NOT FOUND THEN
            RAISE EXCEPTION 'paydedup: %% %% succeeded, but its payment %% is not authorized', NEW.kind, NEW.idempotency_key, NEW.payment_key
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
    VALUES (NEW.merchant_id || ':' || NEW.idempotency_key || ':' || k, NEW.merchant_id, NEW.idempotency_key, 3, k,
            CASE WHEN NEW.status = 'refused' THEN 'refused' WHEN NEW.kind = 'capture' THEN 'succeeded' ELSE 'canceled' END,
            coalesce(NEW.amount_received, NEW.amount), NEW.currency, NEW.charge_id, left(NEW.reason, 255),
            coalesce(NEW.completed_at, now()));
    RETURN NULL;
END
$body$
$f$, s, s);
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Functions and grants hold no rows: nothing is lost. The gateway's role
-- gets settle_refund back; 00032's cancel and 00027's trigger return.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.settle_refund(text, text, text, text, text, integer, bytea, timestamptz) TO paydedup_gateway', s);
    END IF;
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %I.cancel_authorized_payment(p_merchant text, p_key text, p_charge_id text, p_reason text, p_now timestamptz,
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
CREATE OR REPLACE FUNCTION %I.payment_ops_settled() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    k text := CASE WHEN NEW.status = 'refused' THEN NEW.kind || '_failed'
                   WHEN NEW.kind = 'capture' THEN 'captured' ELSE 'canceled' END;
BEGIN
    IF NEW.status = 'succeeded' THEN
        UPDATE payments
        SET status = CASE NEW.kind WHEN 'capture' THEN 'succeeded' ELSE 'canceled' END,
            amount_received = CASE NEW.kind WHEN 'capture' THEN NEW.amount_received END,
            settled_at = coalesce(NEW.completed_at, now())
        WHERE merchant_id = NEW.merchant_id AND idempotency_key = NEW.payment_key AND status = 'authorized';
    END IF;
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
    VALUES (NEW.merchant_id || ':' || NEW.idempotency_key || ':' || k, NEW.merchant_id, NEW.idempotency_key, 3, k,
            CASE WHEN NEW.status = 'refused' THEN 'refused' WHEN NEW.kind = 'capture' THEN 'succeeded' ELSE 'canceled' END,
            coalesce(NEW.amount_received, NEW.amount), NEW.currency, NEW.charge_id, left(NEW.reason, 255),
            coalesce(NEW.completed_at, now()));
    RETURN NULL;
END
$body$
$f$, s, s);
END
$$;
-- +goose StatementEnd
DROP FUNCTION settle_refund_succeeded(text, text, text, text, integer, bytea, timestamptz);
