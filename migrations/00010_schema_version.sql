-- +goose Up
-- The schema's version, readable by the runtime roles. A worker or a gateway
-- refuses to become ready until the database holds every migration the
-- binary was built with; it may not read goose's own table (and should not:
-- goose_db_version is the owner's). A view runs with its owner's rights, so
-- SELECT on the view is all the roles get: one number, no history.
CREATE VIEW schema_version AS
    SELECT coalesce(max(version_id), 0)::bigint AS version
    FROM goose_db_version
    WHERE is_applied;

-- +goose StatementBegin
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['paydedup_worker', 'paydedup_gateway'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('GRANT SELECT ON TABLE %I.schema_version TO %I', current_schema(), r);
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- A view holds no rows: nothing is lost.
DROP VIEW schema_version;
