// Package localpg makes the lab's room on a PostgreSQL server: the demo's
// and the bench's own database on the machine's local server, created when
// missing, and fresh schemas for a bench run or a test, dropped afterwards.
// It is the lab's one place for CREATE DATABASE and CREATE SCHEMA; the
// migrations themselves stay in dedup.
package localpg

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/internal/redact"
)

// AdminURL is where demo and bench look for a database when DATABASE_URL
// is not set.
const AdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Database returns the URL of database name on the local PostgreSQL
// (adminURL), creating the database if missing, with the pool size given.
func Database(ctx context.Context, adminURL, name string, poolSize int) (u string, created bool, err error) {
	admin, err := pg.Connect(ctx, adminURL)
	if err != nil {
		return "", false, fmt.Errorf(`no DATABASE_URL, and no PostgreSQL answers at %s (%v).
Start one (Debian: apt-get install postgresql; or docker compose -f deploy/compose.yaml up -d),
or point paydedup at yours:
  DATABASE_URL='postgres://USER:PASSWORD@HOST:5432/DB?sslmode=disable'`, redact.URLs(adminURL), err)
	}
	defer admin.Close()
	var exists bool
	check := func() error {
		return admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists)
	}
	if err := check(); err != nil {
		return "", false, fmt.Errorf("look for database %s: %w", name, err)
	}
	if !exists {
		if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
			// Another process may have created it meanwhile.
			if cerr := check(); cerr != nil || !exists {
				return "", false, fmt.Errorf("create database %s: %w (or set DATABASE_URL to a database you may use)", name, err)
			}
		} else {
			created = true
		}
	}
	p, err := url.Parse(adminURL)
	if err != nil {
		return "", false, err
	}
	p.Path = "/" + name
	q := p.Query()
	q.Set("pool_max_conns", fmt.Sprint(poolSize))
	p.RawQuery = q.Encode()
	return p.String(), created, nil
}

// FreshSchema creates schema name in the database at dbURL and returns a
// URL whose search_path selects it, and a func that drops it.
func FreshSchema(ctx context.Context, dbURL, name string) (string, func() error, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", nil, err
	}
	ident := pgx.Identifier{name}.Sanitize()
	exec := func(ctx context.Context, sql string) error {
		pool, err := pg.Connect(ctx, dbURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		_, err = pool.Exec(ctx, sql)
		return err
	}
	if err := exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		return "", nil, fmt.Errorf("create schema %s: %w", name, err)
	}
	drop := func() error {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(cctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %w", name, err)
		}
		return nil
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}

// Migrate applies the schema migrations.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	m, err := dedup.NewMigrator(ctx, pool, logger)
	if err != nil {
		return err
	}
	defer m.Close()
	_, err = m.Up(ctx)
	return err
}
