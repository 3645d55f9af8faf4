package localpg

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/internal/redact"
)

// The container fallback either answers with a working database (a Docker
// engine is there) or says that none is, promptly: a machine without Docker
// must not hang the test run.
func TestPostgresContainerFallback(t *testing.T) {
	start := time.Now()
	u, stop, err := Container(context.Background(), "test")
	if err != nil {
		if !strings.Contains(err.Error(), "Docker") {
			t.Fatalf("error does not say what is missing: %v", err)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Fatalf("took %v to find there is no Docker engine", d)
		}
		return
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("container database %s does not answer: %v", redact.URLs(u), err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil || !strings.HasPrefix(v, "15") {
		t.Fatalf("server version %q (%v), want 15", v, err)
	}
}
