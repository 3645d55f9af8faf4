-- +goose Up
-- Commands filed for an operator in the outbox of outcome events (00022,
-- 00026). A message dead-lettered for a reason that waits for a person
-- (max_deliveries, provider_rejected, provider_idempotency_mismatch,
-- ledger_conflict, ...: every reason that is not final for its client)
-- writes a 'waiting_for_operator' event, through record_waiting, when its
-- dead letter is filed and before the message is termed (or, filed by the
-- max-deliveries net, before its advisory is acked). It is not final: a
-- replay of the letter that succeeds then writes the payment's own final
-- event. Like a refusal it stands outside the payment's order:
--   seq      : 0 (the relay neither holds it back nor holds one back for it);
--   event_id : <merchant_id>:<idempotency_key>:waiting_for_operator:<stream
--              sequence of the first copy of the message>, unique: once per
--              stored command (a redelivery, a copy published again);
--   kind, status : 'waiting_for_operator';
--   reason   : the dead letter's reason.
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_kind_check,
    DROP CONSTRAINT outcome_events_status_check,
    DROP CONSTRAINT outcome_events_refused,
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized',
                                                             'refunded', 'refund_failed', 'refused',
                                                             'captured', 'canceled', 'capture_failed', 'cancel_failed',
                                                             'waiting_for_operator')),
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized',
                                                                 'refused', 'canceled', 'waiting_for_operator')),
    -- Only a refused command or one waiting for an operator is at seq 0;
    -- each carries its status and its reason, and no charge.
    ADD CONSTRAINT outcome_events_refused CHECK ((seq = 0) = (kind IN ('refused', 'waiting_for_operator'))
                                                 AND (kind <> 'refused' OR (status = 'refused' AND reason IS NOT NULL AND charge_id IS NULL))
                                                 AND (kind <> 'waiting_for_operator'
                                                      OR (status = 'waiting_for_operator' AND reason IS NOT NULL AND charge_id IS NULL)));

-- record_waiting writes the event of a command filed for an operator once
-- and reports whether it wrote it (false: the event was there); as
-- record_refusal (00026) it builds the id itself, writes only its own kind
-- of row, and runs as the owner for the worker role, which may not insert
-- into the outbox.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    EXECUTE format($f$
CREATE FUNCTION %I.record_waiting(p_merchant text, p_key text, p_stream_seq bigint, p_reason text,
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
        RAISE EXCEPTION 'paydedup: record_waiting needs the merchant, the key, the stream sequence, the reason and the time'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, reason, occurred_at)
    VALUES (p_merchant || ':' || p_key || ':waiting_for_operator:' || p_stream_seq, p_merchant, p_key, 0,
            'waiting_for_operator', 'waiting_for_operator', coalesce(p_amount, 0), coalesce(p_currency, ''), left(p_reason, 255),
            p_occurred_at)
    ON CONFLICT (event_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END
$body$
$f$, s, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.record_waiting(text, text, bigint, text, bigint, text, timestamptz) FROM PUBLIC', s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.record_waiting(text, text, bigint, text, bigint, text, timestamptz) TO paydedup_worker', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Refuses while the outbox holds waiting events not yet published, unless
-- the session sets paydedup.allow_data_loss = on (paydedup migrate down
-- --allow-data-loss); their dead letters keep every one. Relayed ones are
-- in the stream already and are deleted.
-- +goose StatementBegin
DO $$
DECLARE
    n bigint;
BEGIN
    IF current_setting('paydedup.allow_data_loss', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM outcome_events WHERE kind = 'waiting_for_operator' AND relayed_at IS NULL;
    IF n > 0 THEN
        RAISE EXCEPTION 'paydedup: refusing to delete from outcome_events (%: waiting events never published). Run "paydedup migrate down --allow-data-loss" to delete them anyway',
            n || CASE WHEN n = 1 THEN ' row' ELSE ' rows' END;
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION record_waiting(text, text, bigint, text, bigint, text, timestamptz);
DELETE FROM outcome_events WHERE kind = 'waiting_for_operator';
ALTER TABLE outcome_events
    DROP CONSTRAINT outcome_events_refused,
    DROP CONSTRAINT outcome_events_kind_check,
    DROP CONSTRAINT outcome_events_status_check,
    ADD CONSTRAINT outcome_events_kind_check CHECK (kind IN ('charged', 'declined', 'processing', 'settled', 'authorized',
                                                             'refunded', 'refund_failed', 'refused',
                                                             'captured', 'canceled', 'capture_failed', 'cancel_failed')),
    ADD CONSTRAINT outcome_events_status_check CHECK (status IN ('succeeded', 'declined', 'processing', 'failed', 'authorized',
                                                                 'refused', 'canceled')),
    ADD CONSTRAINT outcome_events_refused CHECK ((seq = 0) = (kind = 'refused')
                                                 AND (kind <> 'refused' OR (status = 'refused' AND reason IS NOT NULL AND charge_id IS NULL)));
