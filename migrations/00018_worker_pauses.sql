-- +goose Up
-- Workers paused by an outage, so the gateway can tell a client why its
-- payment is not moving. A paused worker (the provider unavailable, its API
-- key refused) writes its row every few seconds and deletes it when it
-- works again; a row not written for a while (its worker was killed) is
-- ignored by the reader and overwritten when the holder pauses again.
--   holder  : the worker's lease holder id;
--   cause   : provider_unavailable, provider_auth, postgres_unavailable;
--   since   : when the pause began (the worker's clock);
--   seen_at : the last write (database time).
CREATE TABLE worker_pauses (
    holder  text        PRIMARY KEY CHECK (length(holder) BETWEEN 1 AND 256),
    cause   text        NOT NULL CHECK (length(cause) BETWEEN 1 AND 64),
    since   timestamptz NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now()
);

-- The worker writes its own row; the gateway only reads.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I.worker_pauses TO paydedup_worker', current_schema());
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT SELECT ON TABLE %I.worker_pauses TO paydedup_gateway', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The rows only say which workers are paused now; the workers' /readyz and
-- the paydedup_worker_paused metric say the same.
DROP TABLE worker_pauses;
