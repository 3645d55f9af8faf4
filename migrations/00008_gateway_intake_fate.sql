-- +goose Up
-- What the gateway's intake learns after the publish:
--   stream_seq       : the payments stream's sequence of the published copy
--                      (from the PubAck), so a retry republishes only when
--                      the stream no longer holds it, and a dead letter is
--                      matched to the very copy the gateway published;
--   dead_letter_*    : the worker dead-lettered that copy: the intake is
--                      terminal, and GET and retried POSTs answer the
--                      dead letter's reason instead of "queued". A dead
--                      letter can arrive before the gateway recorded its
--                      PubAck: it is then kept with its sequence, and the
--                      gateway's record keeps it only if the sequences
--                      agree.
ALTER TABLE gateway_intake
    ADD COLUMN stream_seq         bigint,
    ADD COLUMN dead_letter_reason text,
    ADD COLUMN dead_letter_error  text,
    ADD COLUMN dead_lettered_at   timestamptz,
    ADD CONSTRAINT gateway_intake_seq_positive CHECK (stream_seq IS NULL OR stream_seq > 0),
    ADD CONSTRAINT gateway_intake_dead_letter_complete CHECK (
        (dead_letter_reason IS NULL) = (dead_lettered_at IS NULL)
        AND (dead_letter_reason IS NULL OR stream_seq IS NOT NULL)),
    ADD CONSTRAINT gateway_intake_dead_letter_error_length CHECK (length(dead_letter_error) <= 1024);

-- The worker records the dead letter (with its sequence when it came
-- first); it may touch only those columns. The gateway role, where it
-- exists, writes all of them (a takeover clears them) and reads the
-- payments ledger (a key reused after its record was purged).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        GRANT SELECT ON gateway_intake TO paydedup_worker;
        GRANT UPDATE (stream_seq, dead_letter_reason, dead_letter_error, dead_lettered_at) ON gateway_intake TO paydedup_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        GRANT SELECT ON gateway_intake TO paydedup_gateway;
        GRANT UPDATE (stream_seq, dead_letter_reason, dead_letter_error, dead_lettered_at) ON gateway_intake TO paydedup_gateway;
        GRANT SELECT (merchant_id, idempotency_key, amount, currency) ON payments TO paydedup_gateway;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The columns hold what the gateway learnt of published commands; dropping
-- them would make dead-lettered payments look queued again.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM gateway_intake WHERE stream_seq IS NOT NULL OR dead_letter_reason IS NOT NULL)
       AND current_setting('paydedup.allow_data_loss', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'migration 00008 down would drop gateway_intake.stream_seq and the dead letters recorded in gateway_intake.dead_letter_reason/dead_letter_error/dead_lettered_at (% rows); run with --allow-data-loss to drop them',
            (SELECT count(*) FROM gateway_intake WHERE stream_seq IS NOT NULL OR dead_letter_reason IS NOT NULL);
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE gateway_intake
    DROP CONSTRAINT gateway_intake_dead_letter_error_length,
    DROP CONSTRAINT gateway_intake_dead_letter_complete,
    DROP CONSTRAINT gateway_intake_seq_positive,
    DROP COLUMN dead_lettered_at,
    DROP COLUMN dead_letter_error,
    DROP COLUMN dead_letter_reason,
    DROP COLUMN stream_seq;
