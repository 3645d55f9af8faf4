package dedup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paydedup/paydedup/migrations"
)

// ErrSchemaBehind means the database lacks migrations this binary was built
// with: run `paydedup migrate up` (the migrate Job) before the workers.
var ErrSchemaBehind = errors.New("database schema is behind this build")

// BuiltSchemaVersion is the highest migration embedded in this binary: the
// schema version it was built for.
func BuiltSchemaVersion() int64 {
	var v int64
	names, _ := fs.Glob(migrations.FS, "*.sql")
	for _, name := range names {
		prefix, _, _ := strings.Cut(name, "_")
		if n, err := strconv.ParseInt(prefix, 10, 64); err == nil && n > v {
			v = n
		}
	}
	return v
}

// schemaVersionSQL reads the view of migration 00010, which the runtime
// roles may read (goose's own table they may not).
const schemaVersionSQL = `SELECT version FROM schema_version`

// SchemaVersion returns the version of the newest migration applied to the
// store's schema; 0 when the schema predates migration 00010 or is empty.
func (s *Store) SchemaVersion(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.db.Timeout)
	defer cancel()
	var v int64
	err := s.db.Pool.QueryRow(ctx, schemaVersionSQL).Scan(&v)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return 0, nil
	}
	if err != nil {
		return 0, interpretError("read schema version", err)
	}
	return v, nil
}

// CheckSchema returns nil when the database holds every migration this
// binary was built with (a newer schema is fine: migrations only add, so
// the previous release keeps running while the next one rolls out), and
// an error wrapping ErrSchemaBehind that says what to run otherwise.
func (s *Store) CheckSchema(ctx context.Context) error {
	have, err := s.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if want := BuiltSchemaVersion(); have < want {
		return fmt.Errorf("%w: the database is at migration %d, this build needs %d: run \"paydedup migrate up\" as the schema owner (the migrate Job) first", ErrSchemaBehind, have, want)
	}
	return nil
}
