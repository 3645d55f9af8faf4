package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/testenv"
)

// TestDatabaseErrorsNameTheFix runs the commands a new user meets first
// with the wrong role or before migrating, through the real command
// wiring: each fails (a non-zero exit) and its message names the fix, not
// only what PostgreSQL said.
func TestDatabaseErrorsNameTheFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := testenv.PostgresURL(t)
	empty := testenv.PostgresEmptyURL(t)
	nats := testenv.NATSURL(t)
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		// want are what the message must say: the server's words, and
		// the fix.
		want []string
	}{
		{"apikey create as the worker role", map[string]string{"DATABASE_URL": withUser(t, owner, "paydedup_worker")},
			[]string{"apikey", "create", "--merchant", "m_1"},
			[]string{"permission denied for table api_keys", "paydedup_worker", "schema owner", "DATABASE_URL", "--database-url"}},
		{"apikey revoke as the gateway role", map[string]string{"DATABASE_URL": withUser(t, owner, "paydedup_gateway")},
			[]string{"apikey", "revoke", "0123456789ab"},
			[]string{"permission denied", "paydedup_gateway", "schema owner", "DATABASE_URL"}},
		{"migrate up as the gateway role", map[string]string{"DATABASE_URL": withUser(t, owner, "paydedup_gateway")},
			[]string{"migrate", "up"},
			[]string{"permission denied", "paydedup_gateway", "schema owner", "DATABASE_URL", "--database-url"}},
		{"status on an unmigrated database", map[string]string{"DATABASE_URL": empty, "NATS_URL": nats},
			[]string{"status"},
			[]string{`relation "idempotency_keys" does not exist`, "paydedup migrate up", "schema owner"}},
		{"apikey create on an unmigrated database", map[string]string{"DATABASE_URL": empty},
			[]string{"apikey", "create", "--merchant", "m_1"},
			[]string{`relation "api_keys" does not exist`, "paydedup migrate up"}},
		// It would otherwise listen, and fail every POST on a missing table.
		{"gateway on an unmigrated database", map[string]string{"DATABASE_URL": empty, "NATS_URL": nats,
			"PAYDEDUP_HTTP_ADDR": "127.0.0.1:0"},
			[]string{"gateway"},
			[]string{"the database is at migration 0", "paydedup migrate up", "schema owner"}},
	} {
		c.env["PAYDEDUP_LOG_LEVEL"] = "warn"
		// A command that serves instead of failing ends here, and is
		// reported as having succeeded.
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, _, err := runCLI(cctx, c.env, c.args...)
		cancel()
		if err == nil {
			t.Errorf("%s: succeeded; want an error (a non-zero exit)", c.name)
			continue
		}
		t.Logf("%s: %v", c.name, err)
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", c.name, err, w)
			}
		}
	}
}
