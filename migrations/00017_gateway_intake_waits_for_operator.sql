-- +goose Up
-- What the gateway's intake learns of a dead letter that waits for an
-- operator (provider_rejected, max_deliveries, ledger_conflict,
-- provider_mismatch...): a replay may still charge it, so it is not final
-- and the dead_letter_* columns (00008, which mean "final") stay empty.
--   operator_reason, operator_error : the letter's reason and error text;
--   operator_at                      : when the worker filed it (database
--                                      time).
-- The gateway answers "waiting_for_operator" while the key's record is not
-- completed and has not changed since operator_at (no worker claimed the
-- key again: nobody replayed the letter yet); after that, the record's own
-- state again. A later letter of the key replaces the columns.
ALTER TABLE gateway_intake
    ADD COLUMN operator_reason text,
    ADD COLUMN operator_error  text,
    ADD COLUMN operator_at     timestamptz,
    ADD CONSTRAINT gateway_intake_operator_complete CHECK ((operator_reason IS NULL) = (operator_at IS NULL)),
    ADD CONSTRAINT gateway_intake_operator_error_length CHECK (length(operator_error) <= 1024);

-- The worker records the letter and may touch only those columns; the
-- gateway role owns its rows (00006: whole-table grants cover new columns).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT UPDATE (operator_reason, operator_error, operator_at) ON TABLE %I.gateway_intake TO paydedup_worker', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The columns only say which payments wait for an operator; without them
-- those payments read "retrying" or "processing" again, as before. The
-- dead letters themselves are in the dead-letter stream: nothing is lost.
ALTER TABLE gateway_intake
    DROP CONSTRAINT gateway_intake_operator_error_length,
    DROP CONSTRAINT gateway_intake_operator_complete,
    DROP COLUMN operator_at,
    DROP COLUMN operator_error,
    DROP COLUMN operator_reason;
