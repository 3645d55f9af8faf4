-- +goose Up
-- The W3C trace id of the message that first claimed the key. Every call to
-- the provider under the row's provider_key sends this same value in its
-- metadata: a provider compares a replayed request's parameters with the
-- first one, so a redelivery or a client's re-publish (with its own
-- traceparent) must not change them.
ALTER TABLE idempotency_keys ADD COLUMN trace_id text
    CONSTRAINT trace_id_format CHECK (trace_id ~ '^[0-9a-f]{32}$');

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN trace_id;
