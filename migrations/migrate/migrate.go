// Package migrate applies paydedup's embedded migrations (package
// migrations) with goose, over a pgx pool.
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc64"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/migrations"
)

// MigrationStatus is one migration's state.
type MigrationStatus struct {
	Version   int64
	Name      string
	Applied   bool
	AppliedAt time.Time
}

// AllowDataLossSetting is the session setting every down migration reads
// before it drops a table or a column holding rows:
// current_setting('paydedup.allow_data_loss', true) = 'on' lets it proceed,
// anything else makes it refuse with an error naming what would be lost.
const AllowDataLossSetting = "paydedup.allow_data_loss"

// MigratorConfig configures a Migrator.
type MigratorConfig struct {
	Logger *slog.Logger
	// AllowDataLoss lets down migrations drop tables and columns that hold
	// rows (`paydedup migrate down --allow-data-loss`). It sets
	// AllowDataLossSetting on the migrator's own connections only, never on
	// the pool's.
	AllowDataLoss bool
}

// Migrator applies the embedded goose migrations over a pgx pool. Many pods
// may migrate at once: goose takes a Postgres session advisory lock, keyed
// by the target schema so separate schemas (tests) do not wait on each other.
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
}

// NewMigrator prepares migrations for the pool's current schema. Its down
// migrations refuse to destroy rows.
func NewMigrator(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (*Migrator, error) {
	return NewMigratorWith(ctx, pool, MigratorConfig{Logger: logger})
}

// NewMigratorWith prepares migrations for the pool's current schema.
func NewMigratorWith(ctx context.Context, pool *pgxpool.Pool, cfg MigratorConfig) (*Migrator, error) {
	var schema string
	if err := pool.QueryRow(ctx, `SELECT coalesce(current_schema(), '')`).Scan(&schema); err != nil {
		return nil, pg.Interpret("read current schema", err, pg.Errors{})
	}
	if schema == "" {
		return nil, errors.New("migrate: the connection has no current schema: check search_path in DATABASE_URL")
	}
	lockID := int64(crc64.Checksum([]byte("paydedup-migrations:"+schema), crc64.MakeTable(crc64.ECMA)) & (1<<62 - 1))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migrate: session locker: %w", err)
	}
	var db *sql.DB
	if cfg.AllowDataLoss {
		// Connections of their own, each with the setting for its whole
		// session (goose runs every migration in a transaction on one of
		// them), closed with the migrator: a session setting on a pool
		// connection would outlive the migration.
		db = stdlib.OpenDB(*pool.Config().ConnConfig.Copy(), stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, `SELECT set_config('`+AllowDataLossSetting+`', 'on', false)`)
			return err
		}))
	} else {
		db = stdlib.OpenDBFromPool(pool)
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true)}
	if cfg.Logger != nil {
		opts = append(opts, goose.WithSlog(cfg.Logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, opts...)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return &Migrator{db: db, provider: p}, nil
}

// Close releases the migrator's database handle (not the pool).
func (m *Migrator) Close() error { return m.db.Close() }

// Up applies every pending migration and returns the versions applied. A
// database already up to date is left alone.
func (m *Migrator) Up(ctx context.Context) ([]int64, error) {
	res, err := m.provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate up: %w", err)
	}
	var versions []int64
	for _, r := range res {
		versions = append(versions, r.Source.Version)
	}
	return versions, nil
}

// UpTo applies the pending migrations up to and including version (a test's
// way to a schema as an earlier release left it) and returns the versions
// applied.
func (m *Migrator) UpTo(ctx context.Context, version int64) ([]int64, error) {
	res, err := m.provider.UpTo(ctx, version)
	if err != nil {
		return nil, fmt.Errorf("migrate up to %05d: %w", version, err)
	}
	var versions []int64
	for _, r := range res {
		versions = append(versions, r.Source.Version)
	}
	return versions, nil
}

// Down rolls back the most recent migration and returns its version. A step
// that would drop rows refuses (and changes nothing) unless the migrator
// was made with AllowDataLoss.
func (m *Migrator) Down(ctx context.Context) (int64, error) {
	res, err := m.provider.Down(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrate down: %w", err)
	}
	return res.Source.Version, nil
}

// Status reports every known migration.
func (m *Migrator) Status(ctx context.Context) ([]MigrationStatus, error) {
	st, err := m.provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate status: %w", err)
	}
	out := make([]MigrationStatus, 0, len(st))
	for _, s := range st {
		out = append(out, MigrationStatus{
			Version: s.Source.Version, Name: s.Source.Path,
			Applied: s.State == goose.StateApplied, AppliedAt: s.AppliedAt,
		})
	}
	return out, nil
}
