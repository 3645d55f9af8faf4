-- +goose Up
-- The role the worker (and the reconciler) connect as: the DML they need on
-- this schema's two tables, nothing else. No DDL (it owns nothing and has no
-- CREATE on the schema), no TRUNCATE, no access to other schemas or to
-- goose's version table. Migrations run as the schema owner.
--
-- Roles are cluster-wide: the role is created once, without a password (set
-- one, or use certificate/peer auth, as an administrator), and each schema
-- migrated grants it access to its own tables. If the migrating user may not
-- create roles, an administrator creates the role first:
--     CREATE ROLE paydedup_worker LOGIN;
-- and this migration then only grants.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'paydedup: no current schema; set search_path';
    END IF;
    -- A down migration in another schema may drop the role between our
    -- check and our grants ("concurrently dropped"): then create it again.
    FOR attempt IN 1..3 LOOP
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
                BEGIN
                    CREATE ROLE paydedup_worker LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
                    -- Marks the role as ours: the down migration drops only
                    -- a role it created, never one an administrator made.
                    COMMENT ON ROLE paydedup_worker IS 'paydedup worker (created by migration 00002)';
                EXCEPTION
                    -- Another schema's migration created it at the same moment.
                    WHEN duplicate_object OR unique_violation THEN NULL;
                    WHEN insufficient_privilege THEN
                        RAISE EXCEPTION 'paydedup: % may not create roles: as an administrator run "CREATE ROLE paydedup_worker LOGIN;" and migrate again', current_user;
                END;
            END IF;
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO paydedup_worker', s);
            -- The worker claims, heartbeats, completes (key + ledger row),
            -- the reconciler leases stuck rows (FOR UPDATE needs UPDATE) and
            -- purges (DELETE). payments.id is an identity column: INSERT
            -- draws from its sequence without any grant on it.
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I.idempotency_keys, %I.payments TO paydedup_worker', s, s);
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
-- Destroys no rows. Revokes this schema's grants. The role itself is dropped only when this
-- migration created it (its comment says so) and nothing else in the whole
-- cluster still refers to it: DROP ROLE itself refuses while any grant in
-- any schema or database remains, so another schema's worker is never cut
-- off. Otherwise the role is kept, with a notice.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        RETURN;
    END IF;
    EXECUTE format('REVOKE ALL ON TABLE %I.idempotency_keys, %I.payments FROM paydedup_worker', s, s);
    EXECUTE format('REVOKE ALL ON SCHEMA %I FROM paydedup_worker', s);
    IF coalesce(shobj_description((SELECT oid FROM pg_roles WHERE rolname = 'paydedup_worker'), 'pg_authid'), '')
        <> 'paydedup worker (created by migration 00002)' THEN
        RAISE NOTICE 'paydedup: role paydedup_worker was not created by this migration; kept';
        RETURN;
    END IF;
    BEGIN
        DROP ROLE paydedup_worker;
    EXCEPTION
        WHEN dependent_objects_still_exist THEN
            RAISE NOTICE 'paydedup: role paydedup_worker is still used elsewhere (%); kept', SQLERRM;
        WHEN insufficient_privilege THEN
            RAISE NOTICE 'paydedup: % may not drop roles; role paydedup_worker kept', current_user;
        WHEN undefined_object THEN NULL;
        WHEN OTHERS THEN
            -- Dropping the role is only tidying up: any other failure (a
            -- schema dropped concurrently elsewhere in the cluster, which
            -- DROP ROLE's dependency scan can trip over) keeps it.
            RAISE NOTICE 'paydedup: role paydedup_worker kept (%)', SQLERRM;
    END;
END
$$;
-- +goose StatementEnd
