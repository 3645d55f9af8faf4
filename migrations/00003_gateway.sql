-- +goose Up
-- HTTP ingress (issue 9): API keys, the gateway's intake guard, the net/http
-- middleware's stored responses, and a notification on completion.

-- API keys: only the SHA-256 of a key is stored. A key is 256 random bits,
-- so an unsalted hash cannot be brute-forced; the id is its public name
-- (shown by `apikey list`, used by `apikey revoke`).
CREATE TABLE api_keys (
    id          text        PRIMARY KEY,
    merchant_id text        NOT NULL,
    key_hash    bytea       NOT NULL,
    label       text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz,

    CONSTRAINT api_keys_hash_unique UNIQUE (key_hash),
    CONSTRAINT api_keys_hash_sha256 CHECK (length(key_hash) = 32),
    CONSTRAINT api_keys_id_format CHECK (id ~ '^[0-9a-f]{12}$'),
    CONSTRAINT api_keys_merchant_format CHECK (merchant_id ~ '^[A-Za-z0-9_-]{1,64}$'),
    CONSTRAINT api_keys_label_length CHECK (length(label) <= 200)
);

CREATE INDEX api_keys_merchant ON api_keys (merchant_id);

-- The gateway's guard against concurrent first requests. The worker's claim
-- in idempotency_keys happens later, asynchronously, so the gateway keeps
-- its own short-lived row: whoever inserts it (or takes it over once
-- locked_until has passed) is the one request that publishes the command.
--   publishing : published_at IS NULL, locked_until = the publisher's lease
--   published  : published_at set, locked_until = when a retry that still
--                finds no idempotency record may publish again
-- attempt fences a publisher whose lease was taken over.
CREATE TABLE gateway_intake (
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    request_hash    bytea       NOT NULL,
    amount          bigint      NOT NULL,
    currency        text        NOT NULL,
    attempt         integer     NOT NULL DEFAULT 1,
    locked_until    timestamptz NOT NULL,
    published_at    timestamptz,
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,

    PRIMARY KEY (merchant_id, idempotency_key),
    CONSTRAINT gateway_intake_hash_sha256 CHECK (length(request_hash) = 32),
    CONSTRAINT gateway_intake_attempt_positive CHECK (attempt >= 1),
    CONSTRAINT gateway_intake_amount_positive CHECK (amount > 0)
);

CREATE INDEX gateway_intake_expiry ON gateway_intake (expires_at);

-- Stored responses of the net/http middleware (dedup/httpidem). Its records
-- have no amount or currency, so they do not fit idempotency_keys' CHECKs.
--   pending   : a handler is running under the claim until locked_until
--   completed : the response is stored and replayed byte for byte
--   failed    : released (5xx, client gone): the next request runs again
CREATE TABLE http_idempotency (
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    request_hash    bytea       NOT NULL,
    status          text        NOT NULL,
    attempt         integer     NOT NULL DEFAULT 1,
    locked_until    timestamptz,
    response_status integer,
    response_header jsonb,
    response_body   bytea,
    last_error      text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL,

    PRIMARY KEY (scope, idempotency_key),
    CONSTRAINT http_idempotency_key_length CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    CONSTRAINT http_idempotency_hash_sha256 CHECK (length(request_hash) = 32),
    CONSTRAINT http_idempotency_status_known CHECK (status IN ('pending', 'completed', 'failed')),
    CONSTRAINT http_idempotency_attempt_positive CHECK (attempt >= 1),
    CONSTRAINT http_idempotency_pending_has_lease CHECK ((status = 'pending') = (locked_until IS NOT NULL)),
    CONSTRAINT http_idempotency_completed_has_response CHECK (
        (status = 'completed') = (response_status IS NOT NULL AND response_header IS NOT NULL
                                  AND response_body IS NOT NULL AND completed_at IS NOT NULL))
);

CREATE INDEX http_idempotency_expiry ON http_idempotency (expires_at) WHERE status <> 'pending';

-- One notification per row that became completed, sent at commit, so a
-- gateway request waiting on it (Prefer: wait) wakes without polling.
-- Row-level, and only for UPDATEs that set status to completed (the WHEN
-- clause is checked without calling the function): claims and heartbeats
-- never fire it. A statement-level trigger with transition tables was
-- measured first and cost the worker's group commit about 2 ms per 100
-- rows, because every UPDATE of the table then materialises its rows.
-- Only keys the gateway took in (a gateway_intake row, inserted before the
-- command was published, so always visible here) can have a waiter:
-- payments that came straight from the queue send nothing, and the worker's
-- hot path pays no pg_notify (whose commit serialises on a cluster-wide
-- lock) for them. Channels are database-wide, so the payload names the
-- schema and listeners filter on it.
-- +goose StatementBegin
CREATE FUNCTION paydedup_notify_completed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM gateway_intake g
               WHERE g.merchant_id = NEW.merchant_id AND g.idempotency_key = NEW.idempotency_key) THEN
        PERFORM pg_notify('paydedup_key_completed',
                          json_build_object('s', TG_TABLE_SCHEMA, 'm', NEW.merchant_id, 'k', NEW.idempotency_key)::text);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER idempotency_keys_notify_completed
    AFTER UPDATE OF status ON idempotency_keys
    FOR EACH ROW WHEN (NEW.status = 'completed' AND OLD.status IS DISTINCT FROM 'completed')
    EXECUTE FUNCTION paydedup_notify_completed();

-- The runtime role of migration 00002, when it exists: the gateway reads API
-- keys (creating and revoking them is an operator's job, run as the owner)
-- and writes its guard rows; the middleware writes its responses.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        GRANT SELECT ON api_keys TO paydedup_worker;
        GRANT SELECT, INSERT, UPDATE, DELETE ON gateway_intake TO paydedup_worker;
        GRANT SELECT, INSERT, UPDATE, DELETE ON http_idempotency TO paydedup_worker;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Refuses while any of the three tables holds rows, unless the session sets
-- paydedup.allow_data_loss = on (paydedup migrate down --allow-data-loss).
-- +goose StatementBegin
DO $$
DECLARE
    n    bigint;
    lost text[] := '{}';
BEGIN
    IF current_setting('paydedup.allow_data_loss', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM api_keys;
    IF n > 0 THEN
        lost := lost || format('api_keys (%s: only their hashes are stored, so every merchant must be re-keyed)', n || CASE WHEN n = 1 THEN ' row' ELSE ' rows' END);
    END IF;
    SELECT count(*) INTO n FROM gateway_intake;
    IF n > 0 THEN
        lost := lost || format('gateway_intake (%s: the guard of requests being published; their retries may publish again)', n || CASE WHEN n = 1 THEN ' row' ELSE ' rows' END);
    END IF;
    SELECT count(*) INTO n FROM http_idempotency;
    IF n > 0 THEN
        lost := lost || format('http_idempotency (%s: stored responses of the middleware; retries run their handlers again)', n || CASE WHEN n = 1 THEN ' row' ELSE ' rows' END);
    END IF;
    IF cardinality(lost) > 0 THEN
        RAISE EXCEPTION 'paydedup: refusing to drop tables %. Run "paydedup migrate down --allow-data-loss" to drop them anyway',
            array_to_string(lost, ', ');
    END IF;
END
$$;
-- +goose StatementEnd
DROP TRIGGER idempotency_keys_notify_completed ON idempotency_keys;
DROP FUNCTION paydedup_notify_completed();
DROP TABLE http_idempotency;
DROP TABLE gateway_intake;
DROP TABLE api_keys;
