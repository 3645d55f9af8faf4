-- +goose Up
-- Captures and cancels of authorized payments (an authorize's payment,
-- 00023), one row per (merchant_id, idempotency_key) of the operation
-- itself (its key is its own, never its payment's), in one table so that
-- one rule covers them all: a payment's authorization is captured once
-- (Stripe has no multicapture) or canceled once, never both. The claim
-- (dedup.ClaimPaymentOp) runs in one transaction under the payment's
-- advisory lock, the one a refund's claim takes (00024), and judges: the
-- payment exists, is authorized, in the currency named; no other capture
-- or cancel of it holds (pending: claimed, a call may be under way;
-- unknown: an answer lost; succeeded); a capture's amount is at most the
-- amount authorized. A claim refused by those rules writes nothing and is
-- never sent. The partial unique index payment_ops_once is the last net
-- under the lock: one holding operation per payment.
--   kind          : capture or cancel;
--   payment_key   : the payment's idempotency key (same merchant);
--   charge_id     : its intent, the operation's target at the provider;
--   provider_key  : the operation's provider idempotency key (pdc_/pdv_),
--                   derived and stored with the claim, before the first call;
--   amount        : a capture's amount; a cancel's is the amount it releases;
--   amount_received : what a succeeded capture took, from the provider;
--   status        : pending (leased), unknown (a call's outcome lost, no
--                   lease: looked up, RetrieveIntent, before any re-call),
--                   succeeded, refused (the provider's definitive no, or a
--                   lookup that shows the intent can never be so moved).
CREATE TABLE payment_ops (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    merchant_id      text        NOT NULL,
    idempotency_key  text        NOT NULL COLLATE "C",
    kind             text        NOT NULL CHECK (kind IN ('capture', 'cancel')),
    payment_key      text        NOT NULL COLLATE "C",
    request_hash     bytea       NOT NULL,
    provider_key     text        NOT NULL,
    charge_id        text        NOT NULL,
    amount           bigint      NOT NULL CHECK (amount > 0),
    currency         text        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('pending', 'unknown', 'succeeded', 'refused')),
    amount_received  bigint,
    attempts         integer     NOT NULL CHECK (attempts > 0),
    locked_by        text,
    locked_until     timestamptz,
    key_window_start timestamptz NOT NULL,
    response_status  integer,
    response         bytea,
    reason           text,
    last_error       text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    CONSTRAINT payment_ops_key_unique UNIQUE (merchant_id, idempotency_key),
    CONSTRAINT payment_ops_pending_has_lease CHECK ((status = 'pending') = (locked_until IS NOT NULL AND locked_by IS NOT NULL)),
    CONSTRAINT payment_ops_answered_has_response CHECK (
        (status IN ('succeeded', 'refused')) = (response IS NOT NULL AND completed_at IS NOT NULL)),
    -- Captured ≤ authorized: a capture takes at most what it asked.
    CONSTRAINT payment_ops_captured_received CHECK (
        (kind = 'capture' AND status = 'succeeded') = (amount_received IS NOT NULL)
        AND (amount_received IS NULL OR amount_received BETWEEN 1 AND amount))
);

-- One capture or cancel of a payment that may hold (every one but a
-- refused one): the claim's rule, and its net.
CREATE UNIQUE INDEX payment_ops_once ON payment_ops (merchant_id, payment_key) WHERE status <> 'refused';
-- The operations a lookup must resolve (a lost answer, a lease that ran out).
CREATE INDEX payment_ops_unsettled ON payment_ops (updated_at) WHERE status IN ('pending', 'unknown');

-- A captured payment's ledger row moves from authorized to succeeded with
-- what the capture received (amount_received: what a refund may give
-- back); a canceled one to canceled. Only the operation's completion moves
-- it (payment_ops_settled, as the owner): the worker's role still may not
-- update the ledger.
ALTER TABLE payments
    ADD COLUMN amount_received bigint,
    DROP CONSTRAINT payments_status_known,
    ADD CONSTRAINT payments_status_known CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized', 'canceled')),
    DROP CONSTRAINT payments_settled_after_processing,
    ADD CONSTRAINT payments_settled_after_processing CHECK (
        (status = 'failed') <= (settled_at IS NOT NULL) AND (settled_at IS NULL OR status IN ('succeeded', 'failed', 'canceled'))),
    ADD CONSTRAINT payments_received_captured CHECK (amount_received IS NULL OR (amount_received BETWEEN 1 AND amount AND status = 'succeeded'));

-- As in 00009, and an authorized row moves once, to succeeded (with what
-- was received) or canceled.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION payments_only_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.id, NEW.merchant_id, NEW.idempotency_key, NEW.provider_key, NEW.charge_id, NEW.amount, NEW.currency, NEW.created_at)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.merchant_id, OLD.idempotency_key, OLD.provider_key, OLD.charge_id, OLD.amount, OLD.currency, OLD.created_at)
       AND NEW.settled_at IS NOT NULL
       AND ((OLD.status = 'processing' AND NEW.status IN ('succeeded', 'failed') AND NEW.amount_received IS NOT DISTINCT FROM OLD.amount_received)
            OR (OLD.status = 'authorized' AND NEW.status = 'succeeded' AND NEW.amount_received IS NOT NULL)
            OR (OLD.status = 'authorized' AND NEW.status = 'canceled' AND NEW.amount_received IS NULL)) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'paydedup: the payments ledger is append-only: a row changes only from processing to succeeded or failed, or from authorized to succeeded or canceled (row % is %, asked %)',
        OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'integrity_constraint_violation';
END
$$;
-- +goose StatementEnd

-- An operation's final outcome is an outcome event (00022) written by the
-- statement that records it, so in its transaction, under the operation's
-- own key with seq 3 (as a refund's), event_id <merchant>:<key>:<kind>:
-- captured (status succeeded, amount what was received), canceled (status
-- canceled, amount what was released), capture_failed or cancel_failed
-- (status refused, reason the provider's). A succeeded one moves the
-- payment's ledger row in the same statement.
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_kind_check,
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized',
                                                             'refunded', 'refund_failed', 'refused',
                                                             'captured', 'canceled', 'capture_failed', 'cancel_failed')),
    DROP CONSTRAINT outcome_events_status_check,
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized',
                                                                 'refused', 'canceled'));

-- +goose StatementBegin
CREATE FUNCTION payment_ops_settled() RETURNS trigger LANGUAGE plpgsql AS $$
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
$$;
-- +goose StatementEnd
CREATE TRIGGER payment_ops_settled AFTER UPDATE OF status ON payment_ops
    FOR EACH ROW WHEN (OLD.status IN ('pending', 'unknown') AND NEW.status IN ('succeeded', 'refused'))
    EXECUTE FUNCTION payment_ops_settled();

-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format('ALTER FUNCTION %I.payment_ops_settled() SECURITY DEFINER SET search_path = %I, pg_temp', s, s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON TABLE %I.payment_ops TO paydedup_worker', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Refuses while captures or cancels are recorded, unless the session sets
-- paydedup.allow_data_loss = on: without them an operation's redelivery
-- would be sent again, and the older ledger cannot store a canceled
-- payment nor what a capture received.
-- +goose StatementBegin
DO $$
BEGIN
    IF (EXISTS (SELECT 1 FROM payment_ops) OR EXISTS (SELECT 1 FROM payments WHERE status = 'canceled' OR amount_received IS NOT NULL))
       AND current_setting('paydedup.allow_data_loss', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'migration 00027 down: % captures or cancels are recorded; run with --allow-data-loss to drop them',
            (SELECT count(*) FROM payment_ops);
    END IF;
END
$$;
-- +goose StatementEnd
DROP TRIGGER payment_ops_settled ON payment_ops;
DROP FUNCTION payment_ops_settled();
DELETE FROM outcome_events WHERE kind IN ('captured', 'canceled', 'capture_failed', 'cancel_failed');
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_status_check,
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized',
                                                                 'refused')),
    DROP CONSTRAINT outcome_events_kind_check,
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized',
                                                             'refunded', 'refund_failed', 'refused'));
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION payments_only_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'processing' AND NEW.status IN ('succeeded', 'failed') AND NEW.settled_at IS NOT NULL
       AND (NEW.id, NEW.merchant_id, NEW.idempotency_key, NEW.provider_key, NEW.charge_id, NEW.amount, NEW.currency, NEW.created_at)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.merchant_id, OLD.idempotency_key, OLD.provider_key, OLD.charge_id, OLD.amount, OLD.currency, OLD.created_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'paydedup: the payments ledger is append-only: a row changes only from processing to succeeded or failed (row % is %, asked %)',
        OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'integrity_constraint_violation';
END
$$;
-- +goose StatementEnd
DELETE FROM payments WHERE status = 'canceled';
ALTER TABLE payments
    DROP CONSTRAINT payments_received_captured,
    DROP CONSTRAINT payments_settled_after_processing,
    ADD CONSTRAINT payments_settled_after_processing CHECK (
        (status = 'failed') <= (settled_at IS NOT NULL) AND (settled_at IS NULL OR status IN ('succeeded', 'failed'))),
    DROP CONSTRAINT payments_status_known,
    ADD CONSTRAINT payments_status_known CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized')),
    DROP COLUMN amount_received;
DROP TABLE payment_ops;
