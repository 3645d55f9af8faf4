-- +goose Up
-- Each process gets only the statements it runs.
--
-- paydedup_worker (the worker and the reconciler): idempotency_keys as
-- before (claim, heartbeat, complete, fail, release, lease stuck rows with
-- FOR UPDATE, purge); the payments ledger is appended to and read, never
-- updated or deleted (no code path does, and a ledger row is the last net
-- against a second charge); gateway_intake is only read (the group commit's
-- and the completion trigger's notification test); api_keys and
-- http_idempotency not at all.
--
-- paydedup_gateway (the internet-facing `paydedup gateway`): reads api_keys
-- (creating and revoking keys is the owner's job), owns its guard rows in
-- gateway_intake (acquire, publish, abandon, purge), and reads
-- idempotency_keys and payments to answer with a payment's state. It writes
-- neither: only a worker's claim and completion do. LISTEN needs no grant.
--
-- http_idempotency (dedup/httpidem) belongs to neither process: grant the
-- application that runs the middleware SELECT, INSERT, UPDATE, DELETE on it.
--
-- Grants are on whole tables, so they cover columns later migrations add.
-- Like 00002, the role is created without a password when missing; if the
-- owner may not create roles, an administrator runs
--     CREATE ROLE paydedup_gateway LOGIN;
-- first and this migration only grants.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON TABLE %I.payments FROM paydedup_worker', s);
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON TABLE %I.gateway_intake FROM paydedup_worker', s);
        EXECUTE format('REVOKE ALL ON TABLE %I.api_keys, %I.http_idempotency FROM paydedup_worker', s, s);
        EXECUTE format('GRANT SELECT, INSERT ON TABLE %I.payments TO paydedup_worker', s);
        EXECUTE format('GRANT SELECT ON TABLE %I.gateway_intake TO paydedup_worker', s);
    END IF;
    -- A down migration in another schema may drop the role between our
    -- check and our grants ("concurrently dropped"): then create it again.
    FOR attempt IN 1..3 LOOP
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
                BEGIN
                    CREATE ROLE paydedup_gateway LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
                    -- Marks the role as ours: the down migration drops only
                    -- a role it created, never one an administrator made.
                    COMMENT ON ROLE paydedup_gateway IS 'paydedup gateway (created by migration 00006)';
                EXCEPTION
                    -- Another schema's migration created it at the same moment.
                    WHEN duplicate_object OR unique_violation THEN NULL;
                    WHEN insufficient_privilege THEN
                        RAISE EXCEPTION 'paydedup: % may not create roles: as an administrator run "CREATE ROLE paydedup_gateway LOGIN;" and migrate again', current_user;
                END;
            END IF;
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO paydedup_gateway', s);
            EXECUTE format('GRANT SELECT ON TABLE %I.api_keys, %I.idempotency_keys, %I.payments TO paydedup_gateway', s, s, s);
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I.gateway_intake TO paydedup_gateway', s);
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
-- Destroys no rows (grants and a role only), so it needs no
-- --allow-data-loss. It gives the worker back what 00002 and 00003 granted
-- and revokes this schema's grants to paydedup_gateway; the role itself is
-- dropped only when this migration created it and nothing anywhere in the
-- cluster still refers to it (DROP ROLE refuses while any grant remains).
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I.payments, %I.gateway_intake, %I.http_idempotency TO paydedup_worker', s, s, s);
        EXECUTE format('GRANT SELECT ON TABLE %I.api_keys TO paydedup_worker', s);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        RETURN;
    END IF;
    EXECUTE format('REVOKE ALL ON TABLE %I.api_keys, %I.idempotency_keys, %I.payments, %I.gateway_intake FROM paydedup_gateway', s, s, s, s);
    EXECUTE format('REVOKE ALL ON SCHEMA %I FROM paydedup_gateway', s);
    IF coalesce(shobj_description((SELECT oid FROM pg_roles WHERE rolname = 'paydedup_gateway'), 'pg_authid'), '')
        <> 'paydedup gateway (created by migration 00006)' THEN
        RAISE NOTICE 'paydedup: role paydedup_gateway was not created by this migration; kept';
        RETURN;
    END IF;
    BEGIN
        DROP ROLE paydedup_gateway;
    EXCEPTION
        WHEN dependent_objects_still_exist THEN
            RAISE NOTICE 'paydedup: role paydedup_gateway is still used elsewhere (%); kept', SQLERRM;
        WHEN insufficient_privilege THEN
            RAISE NOTICE 'paydedup: % may not drop roles; role paydedup_gateway kept', current_user;
        WHEN undefined_object THEN NULL;
        WHEN OTHERS THEN
            -- Dropping the role is only tidying up: any other failure (a
            -- schema dropped concurrently elsewhere in the cluster, which
            -- DROP ROLE's dependency scan can trip over) keeps it.
            RAISE NOTICE 'paydedup: role paydedup_gateway kept (%)', SQLERRM;
    END;
END
$$;
-- +goose StatementEnd
