-- +goose Up
-- payment_intent.canceled is a hint too (00033's rule for refunds): the
-- event may be forged (a leaked signing secret) or stale (replayed), and
-- the gateway cannot ask the provider. Until now cancel_authorized_payment
-- (00032, 00033) let the gateway's role move an authorized payment to
-- canceled on the event's word: a payment the provider still holds
-- requires_capture (or captured since) was then shown canceled, its hold
-- no longer capturable through paydedup and its canceled event told to
-- the merchant. The move now takes two steps, as a refund's reversal does:
--   request_cancel_recheck (gateway and worker roles): stamps an
--       authorized payment (merchant, key, its intent) in
--       payment_cancel_rechecks; nothing else changes. A stamp already
--       there is kept. requested false, and no stamp, when the payment is
--       not authorized; status the payment's (NULL: no such payment).
--   recheck_payment_cancel (worker role, the reconciler after its
--       non-charging retrieve of the intent): deletes the stamp and, when
--       the provider's status is canceled, moves the payment through
--       cancel_authorized_payment (its lock, its rule for a capture or
--       cancel in flight, its one canceled event); any other status
--       changes nothing else.
-- The gateway's role loses EXECUTE on cancel_authorized_payment; the
-- worker's role gets it (the trigger payment_ops_intent_canceled calls it
-- as its owner, unchanged).
CREATE TABLE payment_cancel_rechecks (
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    charge_id       text        NOT NULL,
    requested_at    timestamptz NOT NULL,
    PRIMARY KEY (merchant_id, idempotency_key)
);
CREATE INDEX payment_cancel_rechecks_requested ON payment_cancel_rechecks (requested_at, merchant_id, idempotency_key);

-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    EXECUTE format($f$
CREATE FUNCTION %I.request_cancel_recheck(p_merchant text, p_key text, p_charge_id text, p_now timestamptz,
        OUT requested boolean, OUT status text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
BEGIN
    SELECT x.status INTO status FROM payments x
        WHERE x.merchant_id = p_merchant AND x.idempotency_key = p_key AND x.charge_id = p_charge_id;
    requested := status = 'authorized';
    IF requested THEN
        INSERT INTO payment_cancel_rechecks (merchant_id, idempotency_key, charge_id, requested_at)
        VALUES (p_merchant, p_key, p_charge_id, coalesce(p_now, now()))
        ON CONFLICT (merchant_id, idempotency_key) DO NOTHING;
    END IF;
    requested := coalesce(requested, false);
END
$body$
$f$, s, s);
    EXECUTE format($f$
CREATE FUNCTION %I.recheck_payment_cancel(p_merchant text, p_key text, p_charge_id text, p_provider_status text, p_reason text,
        p_now timestamptz, OUT canceled boolean, OUT status text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
BEGIN
    IF coalesce(p_provider_status, '') = '' THEN
        RAISE EXCEPTION 'paydedup: recheck_payment_cancel needs the provider''s status of the intent'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM payment_cancel_rechecks r
        WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.charge_id = p_charge_id;
    canceled := false;
    IF p_provider_status = 'canceled' THEN
        SELECT c.canceled, c.status INTO canceled, status FROM cancel_authorized_payment(p_merchant, p_key, p_charge_id, p_reason, p_now) c;
    ELSE
        SELECT x.status INTO status FROM payments x
            WHERE x.merchant_id = p_merchant AND x.idempotency_key = p_key AND x.charge_id = p_charge_id;
    END IF;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON TABLE %I.payment_cancel_rechecks FROM PUBLIC', s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.request_cancel_recheck(text, text, text, timestamptz) FROM PUBLIC', s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.recheck_payment_cancel(text, text, text, text, text, timestamptz) FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT ON TABLE %I.payment_cancel_rechecks TO paydedup_worker', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.request_cancel_recheck(text, text, text, timestamptz) TO paydedup_worker', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.recheck_payment_cancel(text, text, text, text, text, timestamptz) TO paydedup_worker', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.cancel_authorized_payment(text, text, text, text, timestamptz) TO paydedup_worker', s);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.cancel_authorized_payment(text, text, text, text, timestamptz) FROM paydedup_gateway', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.request_cancel_recheck(text, text, text, timestamptz) TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- A pending recheck is dropped: the provider's next event asks again, and
-- the older schema lets the gateway cancel on the event's word.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.cancel_authorized_payment(text, text, text, text, timestamptz) TO paydedup_gateway', s);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.cancel_authorized_payment(text, text, text, text, timestamptz) FROM paydedup_worker', s);
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION recheck_payment_cancel(text, text, text, text, text, timestamptz);
DROP FUNCTION request_cancel_recheck(text, text, text, timestamptz);
DROP TABLE payment_cancel_rechecks;
