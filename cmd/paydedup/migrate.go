package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/migrations/migrate"

	"github.com/spf13/cobra"
)

// databaseFlag binds --database-url, falling back to DATABASE_URL. The
// environment value is read after parsing, never as the flag's default: a
// default is printed by --help, and a database URL may hold a password.
type databaseFlag struct {
	url    string
	getenv func(string) string
}

func (d *databaseFlag) bind(cmd *cobra.Command, a *app) {
	d.getenv = a.getenv
	cmd.Flags().StringVar(&d.url, "database-url", "", "PostgreSQL URL, e.g. postgres://user@host:5432/db?sslmode=disable (default: $DATABASE_URL)")
}

// validate resolves the URL (the flag, else DATABASE_URL) and checks it is
// set. Call it before reading url.
func (d *databaseFlag) validate() error {
	if d.url == "" && d.getenv != nil {
		d.url = d.getenv("DATABASE_URL")
	}
	if d.url == "" {
		return errors.New("no database: set DATABASE_URL or --database-url (e.g. postgres://postgres@127.0.0.1:5432/paydedup?sslmode=disable)")
	}
	return nil
}

type migrateCmd struct {
	app           *app
	db            databaseFlag
	allowDataLoss bool
}

func newMigrateCmd(a *app) *cobra.Command {
	m := &migrateCmd{app: a}
	cmd := &cobra.Command{
		Use:   "migrate up|down|status",
		Short: "Apply, roll back or list the database migrations",
		Long: `migrate applies paydedup's embedded schema migrations (goose). Many pods may run
"migrate up" at once: a Postgres advisory lock serialises them, and "up" on an
up-to-date database does nothing. Run it as the schema owner.

"down" rolls back the last migration. A step that would drop a table or a
column holding rows (the payments ledger, the idempotency keys, API keys,
trace ids, ...) refuses and changes nothing, naming what would be lost;
--allow-data-loss lets it proceed.`,
		Example: `  DATABASE_URL=postgres://postgres@127.0.0.1:5432/paydedup?sslmode=disable paydedup migrate up
  paydedup migrate status --database-url postgres://postgres@db:5432/paydedup
  paydedup migrate down --allow-data-loss   # drops rows: export what you need first`,
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"up", "down", "status"},
		RunE: func(cmd *cobra.Command, args []string) error {
			return explainDBError(m.Run(cmd.Context(), args[0]), m.db.url)
		},
	}
	m.db.bind(cmd, a)
	cmd.Flags().BoolVar(&m.allowDataLoss, "allow-data-loss", false,
		"with down: let a migration drop tables and columns that hold rows (sets paydedup.allow_data_loss = on for the migration's session)")
	return cmd
}

func (m *migrateCmd) Run(ctx context.Context, action string) error {
	if m.allowDataLoss && action != "down" {
		return fmt.Errorf("migrate %s: --allow-data-loss applies only to migrate down", action)
	}
	if err := m.db.validate(); err != nil {
		return err
	}
	pool, err := pg.Connect(ctx, m.db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	mig, err := migrate.NewMigratorWith(ctx, pool, migrate.MigratorConfig{Logger: m.app.logger, AllowDataLoss: m.allowDataLoss})
	if err != nil {
		return err
	}
	defer mig.Close()
	switch action {
	case "up":
		applied, err := mig.Up(ctx)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintln(m.app.out, "migrate: database is up to date")
		}
		for _, v := range applied {
			fmt.Fprintf(m.app.out, "migrate: applied %05d\n", v)
		}
	case "down":
		v, err := mig.Down(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(m.app.out, "migrate: rolled back %05d\n", v)
	case "status":
		st, err := mig.Status(ctx)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(m.app.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "VERSION\tSTATE\tAPPLIED AT\tFILE")
		for _, s := range st {
			state, at := "pending", "-"
			if s.Applied {
				state, at = "applied", s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
			}
			fmt.Fprintf(w, "%05d\t%s\t%s\t%s\n", s.Version, state, at, s.Name)
		}
		return w.Flush()
	default:
		return fmt.Errorf("migrate: unknown action %q: use up, down or status", action)
	}
	return nil
}
