package testenv

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/internal/pg"
)

// AsRole returns a pool on ownerURL's database logged in as role (trust
// auth, no password), closed when the test ends; it fails the test unless
// the session really is that role.
func AsRole(t testing.TB, ownerURL, role string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pg.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(pool.Close)
	var who string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&who); err != nil || who != role {
		t.Fatalf("connected as %q (%v), want %s", who, err, role)
	}
	return pool
}

// Denied asserts that sql fails for lack of privilege (SQLSTATE 42501).
func Denied(t testing.TB, pool *pgxpool.Pool, sql string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("%s: got %v, want permission denied (42501)", sql, err)
	}
}
