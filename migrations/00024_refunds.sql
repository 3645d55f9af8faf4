-- +goose Up
-- Refunds of charged payments, one row per (merchant_id, idempotency_key)
-- of the refund itself (a refund's key is its own, never its payment's).
-- The claim (dedup.ClaimRefund) runs in one transaction that locks the
-- refunded payment (a transaction advisory lock on it: the worker's role
-- may not update the ledger, which FOR UPDATE needs), so two refunds of
-- one payment are judged one after the other: the payment exists and is charged (succeeded), and
-- the sum of its refunds that may hold money (pending: claimed, a call may
-- be under way; unknown: a call whose outcome was lost; processing: the
-- provider holds it pending; succeeded) plus this one is at most the
-- amount captured. A refund refused by that rule writes nothing and is
-- never sent.
--   payment_key   : the refunded payment's idempotency key (same merchant);
--   charge_id     : its intent, the refund's target at the provider;
--   provider_key  : the refund's provider idempotency key, derived and
--                   stored with the claim, before the first call;
--   status        : pending (leased), unknown (a call's outcome lost, no
--                   lease: looked up before any re-call), processing (the
--                   provider's pending refund), succeeded, failed (the
--                   provider's refund failed or was canceled: the money is
--                   back), refused (the provider's definitive no);
--   refund_id     : the provider's refund id (re_...), once it answered.
CREATE TABLE refunds (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    merchant_id      text        NOT NULL,
    idempotency_key  text        NOT NULL COLLATE "C",
    payment_key      text        NOT NULL COLLATE "C",
    request_hash     bytea       NOT NULL,
    provider_key     text        NOT NULL,
    charge_id        text        NOT NULL,
    amount           bigint      NOT NULL CHECK (amount > 0),
    currency         text        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('pending', 'unknown', 'processing', 'succeeded', 'failed', 'refused')),
    attempts         integer     NOT NULL CHECK (attempts > 0),
    locked_by        text,
    locked_until     timestamptz,
    key_window_start timestamptz NOT NULL,
    refund_id        text,
    response_status  integer,
    response         bytea,
    reason           text,
    last_error       text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    CONSTRAINT refunds_key_unique UNIQUE (merchant_id, idempotency_key),
    CONSTRAINT refunds_refund_id_unique UNIQUE (refund_id),
    CONSTRAINT refunds_pending_has_lease CHECK ((status = 'pending') = (locked_until IS NOT NULL AND locked_by IS NOT NULL)),
    CONSTRAINT refunds_answered_has_response CHECK (
        (status IN ('processing', 'succeeded', 'failed', 'refused')) = (response IS NOT NULL AND completed_at IS NOT NULL)),
    CONSTRAINT refunds_made_has_id CHECK (status NOT IN ('processing', 'succeeded', 'failed') OR refund_id IS NOT NULL)
);

-- The claim's sum over a payment's refunds.
CREATE INDEX refunds_payment ON refunds (merchant_id, payment_key);
-- The refunds a lookup must resolve (a lost answer, a lease that ran out).
CREATE INDEX refunds_unsettled ON refunds (updated_at) WHERE status IN ('pending', 'unknown');

-- A refund's final outcome is an outcome event (00022) written by the
-- statement that records it, so in its transaction: kind refunded (status
-- succeeded) or refund_failed (status failed: the provider's refund
-- failed, the money is back; refused: the provider's definitive no), under
-- the refund's own key with seq 3, event_id <merchant>:<refund key>:<kind>;
-- charge_id is the refunded payment's intent, reason the provider's.
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_seq_check,
    ADD CONSTRAINT outcome_events_seq_check CHECK (seq IN (1, 2, 3)),
    DROP CONSTRAINT outcome_events_kind_check,
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized',
                                                             'refunded', 'refund_failed')),
    DROP CONSTRAINT outcome_events_status_check,
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized',
                                                                 'refused'));

-- +goose StatementBegin
CREATE FUNCTION outcome_events_refunded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
    VALUES (NEW.merchant_id || ':' || NEW.idempotency_key || ':' || CASE NEW.status WHEN 'succeeded' THEN 'refunded' ELSE 'refund_failed' END,
            NEW.merchant_id, NEW.idempotency_key, 3, CASE NEW.status WHEN 'succeeded' THEN 'refunded' ELSE 'refund_failed' END,
            NEW.status, NEW.amount, NEW.currency, NEW.charge_id, left(NEW.reason, 255), coalesce(NEW.completed_at, now()));
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER outcome_events_refunded AFTER UPDATE OF status ON refunds
    FOR EACH ROW WHEN (OLD.status IN ('pending', 'unknown', 'processing') AND NEW.status IN ('succeeded', 'failed', 'refused'))
    EXECUTE FUNCTION outcome_events_refunded();

-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format('ALTER FUNCTION %I.outcome_events_refunded() SECURITY DEFINER SET search_path = %I, pg_temp', s, s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON TABLE %I.refunds TO paydedup_worker', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Refuses while refunds are recorded, unless the session sets
-- paydedup.allow_data_loss = on: without them a refund's redelivery would
-- be sent again.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM refunds)
       AND current_setting('paydedup.allow_data_loss', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'migration 00024 down: % refunds are recorded; run with --allow-data-loss to drop them',
            (SELECT count(*) FROM refunds);
    END IF;
END
$$;
-- +goose StatementEnd
DROP TRIGGER outcome_events_refunded ON refunds;
DROP FUNCTION outcome_events_refunded();
DELETE FROM outcome_events WHERE seq = 3;
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_status_check,
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized')),
    DROP CONSTRAINT outcome_events_kind_check,
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized')),
    DROP CONSTRAINT outcome_events_seq_check,
    ADD CONSTRAINT outcome_events_seq_check CHECK (seq IN (1, 2));
DROP TABLE refunds;
