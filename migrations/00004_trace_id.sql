-- +goose Up
-- The W3C trace id of the message that first claimed the key. Every call to
-- the provider under the row's provider_key sends this same value in its
-- metadata: a provider compares a replayed request's parameters with the
-- first one, so a redelivery or a client's re-publish (with its own
-- traceparent) must not change them.
ALTER TABLE idempotency_keys ADD COLUMN trace_id text
    CONSTRAINT trace_id_format CHECK (trace_id ~ '^[0-9a-f]{32}$');

-- +goose Down
-- Refuses while any row holds a trace id, unless the session sets
-- paydedup.allow_data_loss = on (paydedup migrate down --allow-data-loss):
-- a pending row's next provider call would send other metadata than its
-- first, and the provider refuses that as an idempotency mismatch.
-- +goose StatementBegin
DO $$
DECLARE
    n bigint;
BEGIN
    IF current_setting('paydedup.allow_data_loss', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM idempotency_keys WHERE trace_id IS NOT NULL;
    IF n > 0 THEN
        RAISE EXCEPTION 'paydedup: refusing to drop column idempotency_keys.trace_id: % of its rows hold a trace id, which every provider call under their key sends again; without it a pending key''s next call sends other metadata and the provider refuses it as an idempotency mismatch. Run "paydedup migrate down --allow-data-loss" to drop it anyway',
            n;
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE idempotency_keys DROP COLUMN trace_id;
