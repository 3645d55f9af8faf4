-- +goose Up
-- The transactional intake for publishers. A service that shares this
-- database inserts its payment command here in its own transaction (the
-- order and its payment commit together, or neither does: package intake,
-- docs/intake.md); the workers relay each row to the payments stream
-- (payments.requests.<merchant_id>, Nats-Msg-Id <merchant_id>:<key>, the
-- id every other publisher uses) and mark it relayed with the stream
-- sequence only after the PubAck. A row that is not a valid command (one
-- inserted by hand, past the Go function's checks) is marked rejected
-- with its reason, kept and counted, never published and never in the way
-- of the rows behind it.
--   body          : the command's JSON, as the stream will carry it;
--   publisher     : the role that inserted it: a publisher reads only its
--                   own rows (row-level security);
--   relayed_at,
--   stream_seq    : the PubAck's time and sequence (NULL: not yet);
--   rejected_at,
--   reject_reason,
--   reject_error  : why the relay refused it (a payment.Reason), terminal.
CREATE TABLE intake_commands (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    merchant_id     text        COLLATE "C" NOT NULL,
    idempotency_key text        COLLATE "C" NOT NULL,
    body            text        NOT NULL,
    publisher       name        NOT NULL DEFAULT current_user,
    created_at      timestamptz NOT NULL DEFAULT now(),
    relayed_at      timestamptz,
    stream_seq      bigint,
    rejected_at     timestamptz,
    reject_reason   text,
    reject_error    text,
    CONSTRAINT intake_commands_once UNIQUE (merchant_id, idempotency_key),
    CONSTRAINT intake_commands_relayed CHECK ((relayed_at IS NULL) = (stream_seq IS NULL)),
    CONSTRAINT intake_commands_rejected CHECK ((rejected_at IS NULL) = (reject_reason IS NULL)),
    CONSTRAINT intake_commands_one_fate CHECK (relayed_at IS NULL OR rejected_at IS NULL)
);

-- The relay's keyset scan of what is left to publish, oldest first.
CREATE INDEX intake_commands_waiting ON intake_commands (id) WHERE relayed_at IS NULL AND rejected_at IS NULL;
-- The retention's purge of what was relayed (rejected rows stay).
CREATE INDEX intake_commands_relayed ON intake_commands (relayed_at) WHERE relayed_at IS NOT NULL;
-- The count of rejected rows that status and the metrics read.
CREATE INDEX intake_commands_rejected ON intake_commands (id) WHERE rejected_at IS NOT NULL;

-- paydedup_publisher: a service's role (or a group its login roles are
-- members of) that may insert commands and read the fate of its own rows,
-- nothing else: INSERT on the command's columns only (never relayed_at,
-- stream_seq or another role's name), SELECT through a policy on its own
-- rows. paydedup_worker (the relay) reads, marks and purges every row.
-- The owner is not subject to the policies. Like 00006, the role is
-- created without a password when missing; if the owner may not create
-- roles, an administrator runs
--     CREATE ROLE paydedup_publisher LOGIN;
-- first and this migration only grants.
ALTER TABLE intake_commands ENABLE ROW LEVEL SECURITY;
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, UPDATE, DELETE ON TABLE %I.intake_commands TO paydedup_worker', s);
        EXECUTE format('CREATE POLICY intake_commands_relay ON %I.intake_commands TO paydedup_worker USING (true) WITH CHECK (true)', s);
    END IF;
    FOR attempt IN 1..3 LOOP
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_publisher') THEN
                BEGIN
                    CREATE ROLE paydedup_publisher LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
                    COMMENT ON ROLE paydedup_publisher IS 'paydedup publisher (created by migration 00025)';
                EXCEPTION
                    WHEN duplicate_object OR unique_violation THEN NULL;
                    WHEN insufficient_privilege THEN
                        RAISE EXCEPTION 'paydedup: % may not create roles: as an administrator run "CREATE ROLE paydedup_publisher LOGIN;" and migrate again', current_user;
                END;
            END IF;
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO paydedup_publisher', s);
            EXECUTE format('GRANT INSERT (merchant_id, idempotency_key, body) ON TABLE %I.intake_commands TO paydedup_publisher', s);
            EXECUTE format('GRANT SELECT ON TABLE %I.intake_commands TO paydedup_publisher', s);
            EXECUTE format('CREATE POLICY intake_commands_own ON %I.intake_commands TO paydedup_publisher '
                           'USING (publisher = current_user) WITH CHECK (publisher = current_user)', s);
            EXIT;
        EXCEPTION WHEN undefined_object THEN
            IF attempt = 3 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Refuses while the intake holds commands not yet published or rejected
-- ones (their publishers committed them; nothing else has them), unless
-- the session sets paydedup.allow_data_loss = on (paydedup migrate down
-- --allow-data-loss). Relayed rows are in the stream already. The role is
-- dropped only when this migration created it and nothing in the cluster
-- still refers to it.
-- +goose StatementBegin
DO $$
DECLARE
    n bigint;
BEGIN
    IF current_setting('paydedup.allow_data_loss', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM intake_commands WHERE relayed_at IS NULL;
    IF n > 0 THEN
        RAISE EXCEPTION 'paydedup: refusing to drop tables intake_commands (%: commands publishers committed that were never published, or were rejected). Run "paydedup migrate down --allow-data-loss" to drop them anyway',
            n || CASE WHEN n = 1 THEN ' row' ELSE ' rows' END;
    END IF;
END
$$;
-- +goose StatementEnd
DROP TABLE intake_commands;
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_publisher') THEN
        RETURN;
    END IF;
    EXECUTE format('REVOKE ALL ON SCHEMA %I FROM paydedup_publisher', s);
    IF coalesce(shobj_description((SELECT oid FROM pg_roles WHERE rolname = 'paydedup_publisher'), 'pg_authid'), '')
        <> 'paydedup publisher (created by migration 00025)' THEN
        RAISE NOTICE 'paydedup: role paydedup_publisher was not created by this migration; kept';
        RETURN;
    END IF;
    BEGIN
        DROP ROLE paydedup_publisher;
    EXCEPTION
        WHEN dependent_objects_still_exist THEN
            RAISE NOTICE 'paydedup: role paydedup_publisher is still used elsewhere (%); kept', SQLERRM;
        WHEN insufficient_privilege THEN
            RAISE NOTICE 'paydedup: % may not drop roles; role paydedup_publisher kept', current_user;
        WHEN undefined_object THEN NULL;
        WHEN OTHERS THEN
            RAISE NOTICE 'paydedup: role paydedup_publisher kept (%)', SQLERRM;
    END;
END
$$;
-- +goose StatementEnd
