-- +goose Up
-- Keys compare byte by byte: the text columns that the hot path's btree
-- indexes and sorts order by take the "C" collation.
--
-- Merchant ids, idempotency keys, charge ids and the middleware's scopes
-- are identifiers, not words: nothing sorts them for a reader, and equality
-- is the only test that matters. Under the database's default collation
-- (C.UTF-8 here, en_US.UTF-8 on many servers) every comparison an index
-- descent or a sort makes went through strcoll() and a locale lookup; under
-- "C" it is memcmp(). Equality, and so every unique constraint, is the same
-- under both (a deterministic collation compares equal only what is byte
-- for byte equal), and hashing does not depend on the collation, so nothing
-- a release running beside this one computes changes: claimLocks' advisory
-- lock keys, the constraints, the probes. Only the order of a sort by these
-- columns changes, and nothing depends on it but the claim's insert, which
-- sorts its input in the index's order (dedup/claim.go).
--
-- Measured (bench --payments 60000, three interleaved pairs, before and
-- after this migration, a C.UTF-8 database): PostgreSQL CPU per payment
-- 89-95 -> 83-86 µs; no strcoll() left in the backends' profile.
--
-- Cost of the migration: the tables are not rewritten (the type stays
-- text), but every index on these columns is rebuilt, under the ACCESS
-- EXCLUSIVE lock that ALTER COLUMN TYPE takes on each table: the workers
-- and the gateway wait for it. The ledger (payments) is never purged, so
-- on a large one run this in a quiet window (the README's "Migrate the
-- database" has the figure per million rows).
ALTER TABLE idempotency_keys
    ALTER COLUMN merchant_id TYPE text COLLATE "C",
    ALTER COLUMN idempotency_key TYPE text COLLATE "C";
ALTER TABLE pending_keys
    ALTER COLUMN merchant_id TYPE text COLLATE "C",
    ALTER COLUMN idempotency_key TYPE text COLLATE "C";
ALTER TABLE payments
    ALTER COLUMN merchant_id TYPE text COLLATE "C",
    ALTER COLUMN idempotency_key TYPE text COLLATE "C",
    ALTER COLUMN charge_id TYPE text COLLATE "C";
ALTER TABLE gateway_intake
    ALTER COLUMN merchant_id TYPE text COLLATE "C",
    ALTER COLUMN idempotency_key TYPE text COLLATE "C";
ALTER TABLE http_idempotency
    ALTER COLUMN scope TYPE text COLLATE "C",
    ALTER COLUMN idempotency_key TYPE text COLLATE "C";

-- +goose Down
-- Destroys nothing: the columns go back to the database's default
-- collation, their indexes are rebuilt in its order.
ALTER TABLE http_idempotency
    ALTER COLUMN scope TYPE text COLLATE "default",
    ALTER COLUMN idempotency_key TYPE text COLLATE "default";
ALTER TABLE gateway_intake
    ALTER COLUMN merchant_id TYPE text COLLATE "default",
    ALTER COLUMN idempotency_key TYPE text COLLATE "default";
ALTER TABLE payments
    ALTER COLUMN merchant_id TYPE text COLLATE "default",
    ALTER COLUMN idempotency_key TYPE text COLLATE "default",
    ALTER COLUMN charge_id TYPE text COLLATE "default";
ALTER TABLE pending_keys
    ALTER COLUMN merchant_id TYPE text COLLATE "default",
    ALTER COLUMN idempotency_key TYPE text COLLATE "default";
ALTER TABLE idempotency_keys
    ALTER COLUMN merchant_id TYPE text COLLATE "default",
    ALTER COLUMN idempotency_key TYPE text COLLATE "default";
