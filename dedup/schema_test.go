package dedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
)

// TestSchemaVersionGate: the runtime roles read the schema's version from
// the view, and CheckSchema refuses a database that lacks a migration this
// build has, naming what to run; a newer database passes (the previous
// release keeps serving during a rollout).
func TestSchemaVersionGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ownerURL := testenv.PostgresURL(t)
	owner, err := pg.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	built := dedup.BuiltSchemaVersion()
	if built < 10 {
		t.Fatalf("BuiltSchemaVersion %d: the embedded migrations include 00010", built)
	}
	for _, role := range []string{workerRole, "paydedup_gateway"} {
		s, err := dedup.New(testenv.AsRole(t, ownerURL, role), dedup.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := s.SchemaVersion(ctx); err != nil || v != built {
			t.Fatalf("as %s: schema version %d (%v), want %d", role, v, err, built)
		}
		if err := s.CheckSchema(ctx); err != nil {
			t.Fatalf("as %s on an up-to-date schema: %v", role, err)
		}
	}
	var store *dedup.Store
	store, err = dedup.New(asWorker(t, ownerURL), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}

	// A newer schema than this build (the next release migrated first).
	if _, err := owner.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, built+1); err != nil {
		t.Fatal(err)
	}
	if err := store.CheckSchema(ctx); err != nil {
		t.Fatalf("schema newer than the build: %v", err)
	}

	// A schema missing this build's last migration.
	if _, err := owner.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= $1`, built); err != nil {
		t.Fatal(err)
	}
	err = store.CheckSchema(ctx)
	if !errors.Is(err, dedup.ErrSchemaBehind) || !strings.Contains(err.Error(), "migrate up") {
		t.Fatalf("schema behind the build: %v, want ErrSchemaBehind naming migrate up", err)
	}

	// A schema from before the view: behind, not an error to crash on.
	if _, err := owner.Exec(ctx, `DROP VIEW schema_version`); err != nil {
		t.Fatal(err)
	}
	if v, err := store.SchemaVersion(ctx); err != nil || v != 0 {
		t.Fatalf("without the view: version %d (%v), want 0", v, err)
	}
	if err := store.CheckSchema(ctx); !errors.Is(err, dedup.ErrSchemaBehind) {
		t.Fatalf("without the view: %v, want ErrSchemaBehind", err)
	}
}
