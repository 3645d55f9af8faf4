-- +goose Up
-- The gateway's publish mark becomes a HOT update.
--
-- A POST the gateway accepts writes its gateway_intake row twice: the
-- batch's AcquireIntakes inserts it (committed before the command is
-- published), and IntakesPublished, once the PubAck is in, sets
-- published_at, locked_until and stream_seq. None of those columns is in an
-- index (the primary key and gateway_intake_expiry on expires_at), so the
-- mark may be heap-only (no new index entries), but only if the page has
-- room for the new version. At the default fillfactor (100) the inserts of
-- a batch fill their pages and none of the marks was HOT: each wrote its
-- row's new version on another page and new entries in both indexes.
-- Leaving 60 % of each page free for the marks of the rows inserted there
-- makes them HOT (gateway/pgstore TestPublishMarkIsHeapOnlyUpdate; 50 left
-- about 7 % of them non-HOT in a batch of 100). The rows live for the
-- intake's retention and are purged; the table is 2.5 times as large for
-- the same rows. It applies to pages written from now on.
ALTER TABLE gateway_intake SET (fillfactor = 40);

-- +goose Down
ALTER TABLE gateway_intake RESET (fillfactor);
