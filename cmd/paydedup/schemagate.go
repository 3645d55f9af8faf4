package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/paydedup/paydedup/dedup"
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
