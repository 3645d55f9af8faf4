package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
)

// schemaPollInterval is how often a process waiting for migrations asks
// the database again.
const schemaPollInterval = 2 * time.Second

// schemaGate holds a process unready until the database has every
// migration this binary was built with, and logs each change of that state
// once (not once per probe).
type schemaGate struct {
	store *dedup.Store
	log   *slog.Logger

	mu   sync.Mutex
	last string // the last error logged; "" when the schema was current
	seen bool
}

// Check is the readiness check: nil when the schema is current.
func (g *schemaGate) Check(ctx context.Context) error {
	err := g.store.CheckSchema(ctx)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.seen || msg != g.last {
		g.seen, g.last = true, msg
		if err != nil {
			g.log.Error("not ready: database schema is not the one this build needs",
				"built_schema_version", dedup.BuiltSchemaVersion(), "error", err)
		} else {
			g.log.Info("database schema is current", "built_schema_version", dedup.BuiltSchemaVersion())
		}
	}
	return err
}

// Wait blocks until the schema is current or ctx ends: a worker consumes
// nothing against a schema older than its code.
func (g *schemaGate) Wait(ctx context.Context) error {
	t := time.NewTicker(schemaPollInterval)
	defer t.Stop()
	for {
		if g.Check(ctx) == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// The SQLSTATEs a new user meets first: a command run as a runtime role
// that needs the schema owner, and a database not migrated yet.
const (
	sqlstateInsufficientPrivilege = "42501"
	sqlstateUndefinedTable        = "42P01"
)

// explainDBError adds to err, the error of a command run on dbURL, the fix
// for the PostgreSQL errors a new user meets first: missing privileges (a
// runtime role running what the schema owner must) and missing tables (a
// database not migrated). Other errors are returned as they are.
func explainDBError(err error, dbURL string) error {
	if err == nil {
		return nil
	}
	switch pg.SQLState(err) {
	case sqlstateInsufficientPrivilege:
		return fmt.Errorf("%w\n%s lacks the privilege: run this command as the schema owner (the role that owns "+
			"paydedup's tables and runs `paydedup migrate up`), setting DATABASE_URL or --database-url to the owner's URL, e.g. "+
			"postgres://owner@db:5432/paydedup; paydedup_worker and paydedup_gateway run only the worker and the gateway",
			err, dbRole(dbURL))
	case sqlstateUndefinedTable:
		return fmt.Errorf("%w\nthe database has no paydedup tables yet (or older ones): run `paydedup migrate up` "+
			"as the schema owner (DATABASE_URL or --database-url naming the owner) first", err)
	}
	return err
}

// dbRole names the role dbURL logs in as, for a message: never its
// password.
func dbRole(dbURL string) string {
	if u, err := url.Parse(dbURL); err == nil && u.User != nil && u.User.Username() != "" {
		return "the database role " + u.User.Username()
	}
	return "the database role of DATABASE_URL"
}
