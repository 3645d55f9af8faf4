package dedup_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/ledger"
)

// intakeRow gives (merchant, key) a gateway_intake row, as the gateway's
// store does when it takes the key in: only such keys are announced on
// dedup.CompletedChannel.
func intakeRow(t testing.TB, b *bundle, merchant, key string) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO gateway_intake (merchant_id, idempotency_key, request_hash, amount, currency,
			attempt, locked_until, created_at, expires_at)
		VALUES ($1, $2, sha256($2::text::bytea), 100, 'usd', 1, now(), now(), now() + interval '1 hour')`, merchant, key); err != nil {
		t.Fatal(err)
	}
}

// listen opens a connection LISTENing on the completion channel.
func listen(t *testing.T, b *bundle) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(b.ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(b.ctx, `LISTEN `+dedup.CompletedChannel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// drain returns the keys notified before a sentinel NOTIFY sent now:
// notifications arrive in commit order, so the sentinel proves that
// nothing else is on its way.
func drain(t *testing.T, b *bundle, conn *pgx.Conn) []string {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `SELECT pg_notify($1, 'sentinel')`, dedup.CompletedChannel); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := b.pool.QueryRow(b.ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		n, err := conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			t.Fatalf("no sentinel: %v", err)
		}
		if n.Payload == "sentinel" {
			return keys
		}
		var p struct{ S, M, K string }
		if err := json.Unmarshal([]byte(n.Payload), &p); err != nil {
			t.Fatalf("payload %q: %v", n.Payload, err)
		}
		if p.S == schema { // other tests' schemas notify on the same channel
			keys = append(keys, p.M+":"+p.K)
		}
	}
}

// TestCompletionNotifiedOncePerRow: the statement-level trigger notifies
// each row that became completed, once, at commit, when the gateway took
// the key in; other updates, and keys only the queue knows, are quiet.
func TestCompletionNotifiedOncePerRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := listen(t, b)
	var leases []ledger.Lease
	for _, k := range []string{"a", "b", "c", "d", "queue-only"} {
		if k != "queue-only" { // only keys the gateway took in can have waiters
			intakeRow(t, b, "m_1", k)
		}
		leases = append(leases, *b.claim(t, "h", req("m_1", k, 100)).Lease)
	}
	if _, err := b.store.Heartbeat(b.ctx, leases[0], lease); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Fail(b.ctx, leases[3], "503"); err != nil {
		t.Fatal(err)
	}
	if got := drain(t, b, conn); len(got) != 0 {
		t.Fatalf("claims, heartbeats and failures notified %v", got)
	}
	errs, err := b.store.CompleteBatch(b.ctx, []ledger.CompleteItem{
		{Lease: leases[0], Completion: charged("ch_a")}, {Lease: leases[1], Completion: charged("ch_b")},
		{Lease: leases[4], Completion: charged("ch_q")},
	})
	if err != nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("complete batch: %v %v", err, errs)
	}
	if err := b.store.Complete(b.ctx, leases[2], ledger.Completion{Declined: true, ResponseStatus: 402, Response: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	// Completing again with the same lease is a no-op and must not notify.
	if err := b.store.Complete(b.ctx, leases[2], ledger.Completion{Declined: true, ResponseStatus: 402, Response: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(drain(t, b, conn), " ")
	if got != "m_1:a m_1:b m_1:c" {
		t.Fatalf("notified %q, want each completed gateway row once", got)
	}
}
