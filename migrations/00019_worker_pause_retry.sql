-- +goose Up
-- When a paused worker next tries again (its next probe, the worker's
-- clock), so the gateway can tell a client not only why its payment waits
-- but when it is tried again. NULL in the notes of workers that predate it.
ALTER TABLE worker_pauses ADD COLUMN retry_at timestamptz;

-- +goose Down
ALTER TABLE worker_pauses DROP COLUMN retry_at;
