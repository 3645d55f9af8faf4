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
--       there takes the later requested_at and is due at once. requested
--       false, and no stamp, when the payment is not authorized; status
--       the payment's (NULL: no such payment).
--   recheck_payment_cancel (worker role, the reconciler after its
--       non-charging retrieve of the intent, with the stamp's
--       requested_at as it listed it): when the provider's status is
--       canceled, moves the payment through cancel_authorized_payment
--       (its lock, its rule for a capture or cancel in flight, its one
--       canceled event); any other status changes nothing else. The stamp
--       is deleted, unless a newer one replaced it (requested_at later
--       than the listed one: a stale retrieve never clears a newer
--       event's stamp), and unless the provider said canceled while the
--       payment stays authorized and nothing moved (a capture or cancel
--       of it in flight): the confirmed cancel is kept for the next pass,
--       after that operation settles. Were it dropped, a capture refused
--       payment_intent_unexpected_state (not intent_canceled, so
--       payment_ops_intent_canceled does not fire) would leave the
--       payment authorized with no canceled event for good.
--   postpone_cancel_recheck (worker role): a pass that got no answer
--       (a failed retrieve, an operation in flight) pushes the stamp to
--       next_at and counts attempts, so stamps listed after it (oldest
--       next_at first) get their turn.
--   payment_ops_unexpected_state (trigger): a capture or cancel refused
--       payment_intent_unexpected_state stamps its payment, still
--       authorized, for a recheck: the provider's intent is in another
--       state than the ledger holds (canceled, or captured elsewhere),
--       which only the retrieve tells.
-- The gateway's role loses EXECUTE on cancel_authorized_payment; no role
-- gets it (recheck_payment_cancel and the trigger
-- payment_ops_intent_canceled call it as their owner).
CREATE TABLE payment_cancel_rechecks (
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    charge_id       text        NOT NULL,
    requested_at    timestamptz NOT NULL,
    next_at         timestamptz NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (merchant_id, idempotency_key)
);
CREATE INDEX payment_cancel_rechecks_next ON payment_cancel_rechecks (next_at, merchant_id, idempotency_key);

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
        INSERT INTO payment_cancel_rechecks AS r (merchant_id, idempotency_key, charge_id, requested_at, next_at)
        VALUES (p_merchant, p_key, p_charge_id, coalesce(p_now, now()), coalesce(p_now, now()))
        ON CONFLICT (merchant_id, idempotency_key) DO UPDATE
            SET requested_at = greatest(r.requested_at, EXCLUDED.requested_at),
                next_at = least(r.next_at, EXCLUDED.next_at);
    END IF;
    requested := coalesce(requested, false);
END
$body$
$f$, s, s);
    EXECUTE format($f$
CREATE FUNCTION %I.recheck_payment_cancel(p_merchant text, p_key text, p_charge_id text, p_requested_at timestamptz,
        p_provider_status text, p_reason text, p_now timestamptz, OUT canceled boolean, OUT status text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
BEGIN
    IF coalesce(p_provider_status, '') = '' OR p_requested_at IS NULL THEN
        RAISE EXCEPTION 'paydedup: recheck_payment_cancel needs the provider''s status of the intent and the stamp''s requested_at'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    canceled := false;
    IF p_provider_status = 'canceled' THEN
        SELECT c.canceled, c.status INTO canceled, status FROM cancel_authorized_payment(p_merchant, p_key, p_charge_id, p_reason, p_now) c;
        IF NOT canceled AND status = 'authorized' THEN
            -- A capture or cancel of it is in flight: kept for the next pass.
            RETURN;
        END IF;
    ELSE
        SELECT x.status INTO status FROM payments x
            WHERE x.merchant_id = p_merchant AND x.idempotency_key = p_key AND x.charge_id = p_charge_id;
    END IF;
    DELETE FROM payment_cancel_rechecks r
        WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.charge_id = p_charge_id
          AND r.requested_at <= p_requested_at;
END
$body$
$f$, s, s);
    EXECUTE format($f$
CREATE FUNCTION %I.postpone_cancel_recheck(p_merchant text, p_key text, p_requested_at timestamptz, p_next_at timestamptz,
        OUT attempts integer)
    LANGUAGE sql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
    UPDATE payment_cancel_rechecks r SET attempts = r.attempts + 1, next_at = p_next_at
        WHERE r.merchant_id = p_merchant AND r.idempotency_key = p_key AND r.requested_at <= p_requested_at
        RETURNING r.attempts
$body$
$f$, s, s);
    EXECUTE format($f$
CREATE FUNCTION %I.payment_ops_unexpected_state() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
BEGIN
    PERFORM request_cancel_recheck(NEW.merchant_id, NEW.payment_key, NEW.charge_id, NEW.completed_at);
    RETURN NULL;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON TABLE %I.payment_cancel_rechecks FROM PUBLIC', s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.request_cancel_recheck(text, text, text, timestamptz) FROM PUBLIC', s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.recheck_payment_cancel(text, text, text, timestamptz, text, text, timestamptz) FROM PUBLIC', s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.postpone_cancel_recheck(text, text, timestamptz, timestamptz) FROM PUBLIC', s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.payment_ops_unexpected_state() FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT ON TABLE %I.payment_cancel_rechecks TO paydedup_worker', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.request_cancel_recheck(text, text, text, timestamptz) TO paydedup_worker', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.recheck_payment_cancel(text, text, text, timestamptz, text, text, timestamptz) TO paydedup_worker', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.postpone_cancel_recheck(text, text, timestamptz, timestamptz) TO paydedup_worker', s);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.cancel_authorized_payment(text, text, text, text, timestamptz) FROM paydedup_gateway', s);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.request_cancel_recheck(text, text, text, timestamptz) TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER payment_ops_unexpected_state AFTER UPDATE OF status ON payment_ops
    FOR EACH ROW WHEN (OLD.status IN ('pending', 'unknown') AND NEW.status = 'refused' AND NEW.kind IN ('capture', 'cancel')
                       AND NEW.reason = 'payment_intent_unexpected_state')
    EXECUTE FUNCTION payment_ops_unexpected_state();

-- +goose Down
-- A pending recheck holds an event the gateway already answered 2xx: the
-- provider will not send it again, and the older schema has no place for
-- it. The down is refused while stamps exist (let the reconciler's pass
-- clear them) unless paydedup.allow_data_loss = on, which drops them:
-- those payments then stay authorized until an operation or a new event
-- tells otherwise.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM payment_cancel_rechecks)
       AND current_setting('paydedup.allow_data_loss', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'migration 00034 down: payments wait for a recheck of their cancel; run the reconciler, or with --allow-data-loss to drop them';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.cancel_authorized_payment(text, text, text, text, timestamptz) TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd
DROP TRIGGER payment_ops_unexpected_state ON payment_ops;
DROP FUNCTION payment_ops_unexpected_state();
DROP FUNCTION postpone_cancel_recheck(text, text, timestamptz, timestamptz);
DROP FUNCTION recheck_payment_cancel(text, text, text, timestamptz, text, text, timestamptz);
DROP FUNCTION request_cancel_recheck(text, text, text, timestamptz);
DROP TABLE payment_cancel_rechecks;
