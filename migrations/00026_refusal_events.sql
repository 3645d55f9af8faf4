-- +goose Up
-- Refused commands in the outbox of outcome events (00022). A command the
-- worker refuses (dead-lettered for bad input or a reused key) writes a
-- 'refused' event, through record_refusal, when its dead letter is filed
-- and before the message is termed. A refusal is final for the command,
-- not for its key (a refused command never binds it; a later valid command
-- under the key may be charged), so it stands beside the payment's own
-- events:
--   seq      : 0, outside the payment's order (1, 2; 3 a refund's), which the relay
--              keeps: a refusal waits for no event and holds none back;
--   event_id : <merchant_id>:<idempotency_key>:refused:<stream sequence of
--              the refused message>, unique: a redelivery of the same
--              stored message writes nothing;
--   kind, status : 'refused';
--   reason   : the dead letter's reason (invalid_amount, key_reused, ...).
-- The once-per-payment rule moves to a partial unique index of the
-- payment's events (seq > 0), and every event's id is unique.
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_seq_check,
    DROP CONSTRAINT outcome_events_kind_check,
    DROP CONSTRAINT outcome_events_status_check,
    DROP CONSTRAINT outcome_events_once,
    ADD CONSTRAINT outcome_events_seq_check CHECK (seq IN (0, 1, 2, 3)),
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized',
                                                             'refunded', 'refund_failed', 'refused')),
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized',
                                                                 'refused')),
    -- A refund the provider refused (00024) is kind refund_failed with
    -- status refused; only a refused command is kind refused, at seq 0.
    ADD CONSTRAINT outcome_events_refused CHECK ((seq = 0) = (kind = 'refused')
                                                 AND (kind <> 'refused' OR (status = 'refused' AND reason IS NOT NULL AND charge_id IS NULL))),
    ADD CONSTRAINT outcome_events_event_id UNIQUE (event_id);
CREATE UNIQUE INDEX outcome_events_once ON outcome_events (merchant_id, idempotency_key, seq) WHERE seq > 0;

-- record_refusal writes a refused command's event once and reports whether
-- it wrote it (false: the event was there). It builds the id itself and
-- writes only 'refused' rows: the worker role may not insert into the
-- outbox (a payment's events come from the ledger's triggers alone), and
-- calls this, as the owner (SECURITY DEFINER, search_path pinned to this
-- schema, EXECUTE revoked from PUBLIC), as settle_payment (00011) does.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    EXECUTE format($f$
CREATE FUNCTION %I.record_refusal(p_merchant text, p_key text, p_stream_seq bigint, p_reason text,
        p_amount bigint, p_currency text, p_occurred_at timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    n bigint;
BEGIN
    IF p_merchant IS NULL OR p_merchant = '' OR p_key IS NULL OR p_key = '' OR p_reason IS NULL OR p_reason = ''
            OR p_stream_seq IS NULL OR p_stream_seq < 1 OR p_occurred_at IS NULL THEN
        RAISE EXCEPTION 'paydedup: record_refusal needs the merchant, the key, the stream sequence, the reason and the time'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, reason, occurred_at)
    VALUES (p_merchant || ':' || p_key || ':refused:' || p_stream_seq, p_merchant, p_key, 0, 'refused', 'refused',
            coalesce(p_amount, 0), coalesce(p_currency, ''), left(p_reason, 255), p_occurred_at)
    ON CONFLICT (event_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.record_refusal(text, text, bigint, text, bigint, text, timestamptz) FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.record_refusal(text, text, bigint, text, bigint, text, timestamptz) TO paydedup_worker', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Refuses while the outbox holds refusal events not yet published (no
-- subscriber has seen them), unless the session sets
-- paydedup.allow_data_loss = on (paydedup migrate down --allow-data-loss);
-- their dead letters keep every refusal. Relayed ones are in the stream
-- already and are deleted. The payment's events are kept.
-- +goose StatementBegin
DO $$
DECLARE
    n bigint;
BEGIN
    IF current_setting('paydedup.allow_data_loss', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM outcome_events WHERE seq = 0 AND relayed_at IS NULL;
    IF n > 0 THEN
        RAISE EXCEPTION 'paydedup: refusing to delete from outcome_events (%: refusal events never published). Run "paydedup migrate down --allow-data-loss" to delete them anyway',
            n || CASE WHEN n = 1 THEN ' row' ELSE ' rows' END;
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION record_refusal(text, text, bigint, text, bigint, text, timestamptz);
DELETE FROM outcome_events WHERE seq = 0;
DROP INDEX outcome_events_once;
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_event_id,
    DROP CONSTRAINT outcome_events_refused,
    DROP CONSTRAINT outcome_events_seq_check,
    DROP CONSTRAINT outcome_events_kind_check,
    DROP CONSTRAINT outcome_events_status_check,
    ADD CONSTRAINT outcome_events_seq_check CHECK (seq IN (1, 2, 3)),
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized',
                                                             'refunded', 'refund_failed')),
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized',
                                                                 'refused')),
    ADD CONSTRAINT outcome_events_once UNIQUE (merchant_id, idempotency_key, seq);
