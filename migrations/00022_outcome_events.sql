-- +goose Up
-- The outbox of payment outcomes. Every final outcome the ledger records
-- (a charge, a decline, a payment accepted as processing, and a processing
-- payment's settlement) writes its event here in the statement that writes
-- the ledger row, so in its transaction: a rolled-back completion writes
-- none, a committed one cannot lose it. The workers relay the rows to the
-- outcomes stream (payments.outcomes.<merchant_id>) under Nats-Msg-Id =
-- event_id and mark them relayed; relayed rows are purged after a
-- retention.
--   seq         : the event's place among its payment's events (1: the
--                 ledger row's insert; 2: its settlement), relayed in order;
--   event_id    : <merchant_id>:<idempotency_key>:<kind>, stable: the
--                 ledger holds one row per key, and it settles once;
--   kind        : charged, declined, processing, settled;
--   status      : the ledger status the event left (succeeded, declined,
--                 processing, failed);
--   reason      : the provider's reason for a decline or a failed
--                 settlement, read from the stored answer;
--   relayed_at  : when a relay's publish was acknowledged (NULL: not yet).
CREATE TABLE outcome_events (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        text        NOT NULL,
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    seq             smallint    NOT NULL CHECK (seq IN (1, 2)),
    kind            text        NOT NULL CHECK (kind IN ('charged', 'declined', 'processing', 'settled')),
    status          text        NOT NULL CHECK (status IN ('succeeded', 'declined', 'processing', 'failed')),
    amount          bigint      NOT NULL,
    currency        text        NOT NULL,
    charge_id       text,
    reason          text,
    occurred_at     timestamptz NOT NULL,
    relayed_at      timestamptz,
    CONSTRAINT outcome_events_once UNIQUE (merchant_id, idempotency_key, seq)
);

-- The relay's keyset scan of what is left to publish, oldest first.
CREATE INDEX outcome_events_unrelayed ON outcome_events (id) WHERE relayed_at IS NULL;
-- The retention's purge of what was relayed.
CREATE INDEX outcome_events_relayed ON outcome_events (relayed_at) WHERE relayed_at IS NOT NULL;

-- outcome_reason reads the provider's reason out of a stored answer (a
-- Stripe error or a PaymentIntent's last_payment_error); NULL when there
-- is none or the answer is not JSON: an event never fails its outcome's
-- statement.
-- +goose StatementBegin
CREATE FUNCTION outcome_reason(p_response bytea) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    r jsonb;
BEGIN
    r := convert_from(p_response, 'UTF8')::jsonb;
    IF jsonb_typeof(r) <> 'object' THEN
        RETURN NULL;
    END IF;
    RETURN left(coalesce(r->'error'->>'decline_code', r->'error'->>'code',
                         r->'last_payment_error'->>'decline_code', r->'last_payment_error'->>'code'), 255);
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The events of a statement's new ledger rows (a completion: one row or a
-- group commit's many), from its transition table. The reason of a decline
-- is the provider's, in the answer the completion stored on the key.
-- +goose StatementBegin
CREATE FUNCTION outcome_events_recorded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
    SELECT n.merchant_id || ':' || n.idempotency_key || ':' || k.kind, n.merchant_id, n.idempotency_key, 1, k.kind, n.status,
           n.amount, n.currency, n.charge_id,
           CASE WHEN n.status = 'declined' THEN (
               SELECT outcome_reason(r.response) FROM idempotency_keys r
               WHERE r.merchant_id = n.merchant_id AND r.idempotency_key = n.idempotency_key)
           END,
           n.created_at
    FROM new_rows n,
         LATERAL (SELECT CASE n.status WHEN 'succeeded' THEN 'charged' WHEN 'declined' THEN 'declined' ELSE 'processing' END AS kind) k
    ORDER BY n.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER outcome_events_recorded AFTER INSERT ON payments
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outcome_events_recorded();

-- The events of a statement's settlements: a processing row moved to
-- succeeded or failed (settle_payment, by the reconciler or a webhook).
-- +goose StatementBegin
CREATE FUNCTION outcome_events_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, charge_id, reason, occurred_at)
    SELECT n.merchant_id || ':' || n.idempotency_key || ':settled', n.merchant_id, n.idempotency_key, 2, 'settled', n.status,
           n.amount, n.currency, n.charge_id,
           CASE WHEN n.status = 'failed' THEN (
               SELECT outcome_reason(r.response) FROM idempotency_keys r
               WHERE r.merchant_id = n.merchant_id AND r.idempotency_key = n.idempotency_key)
           END,
           coalesce(n.settled_at, now())
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.status = 'processing' AND n.status IN ('succeeded', 'failed')
    ORDER BY n.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER outcome_events_settled AFTER UPDATE ON payments
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outcome_events_settled();

-- The triggers write the events as the owner, whoever writes the ledger
-- (the worker's completion, settle_payment for the gateway): a role's
-- missing grant on outcome_events can never fail a completion. Their
-- search_path is pinned to this schema, like settle_payment's (00011).
-- The worker's relay reads, marks and purges the events.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format('ALTER FUNCTION %I.outcome_events_recorded() SECURITY DEFINER SET search_path = %I, pg_temp', s, s);
    EXECUTE format('ALTER FUNCTION %I.outcome_events_settled() SECURITY DEFINER SET search_path = %I, pg_temp', s, s);
    EXECUTE format('ALTER FUNCTION %I.outcome_reason(bytea) SET search_path = %I, pg_temp', s, s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, UPDATE, DELETE ON TABLE %I.outcome_events TO paydedup_worker', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Unrelayed events are outcomes no subscriber has seen yet; the ledger
-- keeps every outcome itself.
DROP TRIGGER outcome_events_settled ON payments;
DROP TRIGGER outcome_events_recorded ON payments;
DROP FUNCTION outcome_events_settled();
DROP FUNCTION outcome_events_recorded();
DROP FUNCTION outcome_reason(bytea);
DROP TABLE outcome_events;
