// Package testenv gives tests real services: a fresh, migrated Postgres
// schema and a NATS server with a unique name prefix per test.
//
// Where each comes from, in order: the TEST_DATABASE_URL / TEST_NATS_URL
// environment variables; the machine's local servers at 127.0.0.1:5432 and
// 127.0.0.1:4222; then, for Postgres, a testcontainers-go container when a
// Docker engine answers, and for NATS an embedded nats-server. When no Postgres
// answers the test is skipped, except under CI=true, where a missing
// service fails the run: CI must never pass by skipping.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/migrations/migrate"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/lab/localpg"
)

// DefaultDatabaseURL is the machine's local Postgres.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// InCI reports whether the run is under CI, where missing services fail.
func InCI() bool { return os.Getenv("CI") == "true" }

// unavailable skips the test, or fails it under CI.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("%s (CI=true: a missing service is a failure)", msg)
	}
	t.Skipf("%s; set TEST_DATABASE_URL or start the service", msg)
}

var (
	baseOnce sync.Once
	baseURL  string
	baseErr  error
)

func databaseURL() (string, error) {
	baseOnce.Do(func() {
		u := os.Getenv("TEST_DATABASE_URL")
		if u == "" {
			u = DefaultDatabaseURL
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, u)
		if err == nil {
			conn.Close(ctx)
			baseURL = u
			return
		}
		localErr := fmt.Errorf("no Postgres answers at %s: %w", redact(u), err)
		if os.Getenv("TEST_DATABASE_URL") != "" {
			baseErr = localErr
			return
		}
		cu, _, cerr := localpg.Container(context.Background(), "test")
		if cerr != nil {
			baseErr = fmt.Errorf("%w; and %v", localErr, cerr)
			return
		}
		baseURL = cu
	})
	return baseURL, baseErr
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	return p.Redacted()
}

// Unique returns a short name unique to this test run, safe as a schema
// name, a stream name and a subject token: a letter, the test's name
// shortened, and random hex.
func Unique(t testing.TB) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	name := strings.ToLower(nonWord.ReplaceAllString(t.Name(), "_"))
	if len(name) > 24 {
		name = name[len(name)-24:]
	}
	return "t" + hex.EncodeToString(b[:]) + "_" + strings.Trim(name, "_")
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9]+`)

// PostgresURL creates a fresh schema, migrates it, drops it when the test
// ends, and returns a database URL whose search_path is that schema.
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := PostgresEmptyURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pg.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect to test schema: %v", err)
	}
	defer pool.Close()
	m, err := migrate.NewMigrator(ctx, pool, nil)
	if err != nil {
		t.Fatalf("migrate test schema: %v", err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("migrate test schema: %v", err)
	}
	return u
}

// PostgresEmptyURL creates a fresh, empty schema, drops it when the test
// ends, and returns a database URL whose search_path is that schema.
func PostgresEmptyURL(t testing.TB) string {
	t.Helper()
	base, err := databaseURL()
	if err != nil {
		unavailable(t, "%v", err)
	}
	schema := Unique(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, drop, err := localpg.FreshSchema(ctx, base, schema)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return u
}

// Pool returns a pool on a fresh migrated schema, closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pg.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
