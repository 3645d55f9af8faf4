// Command river is paydedup's measurement of River (the library, v0.51.2)
// by the method of River's own `river bench`, for `make bench-compare`.
// River's CLI is not installable from the module proxy here, so this small
// program drives River's library the same way instead.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const about = `river: paydedup's measurement of River (the library, v0.51.2) by the method
of River's own "river bench"; River's CLI is not installable from the module
proxy here.

Usage:
  river migrate-up --database-url URL
      raise River's schema in that database to the newest version (rivermigrate)
  river bench --database-url URL --num-total-jobs N
      empty River's tables, insert N no-op jobs, then time a River client
      working them all; the last line reads
      "bench: total jobs worked [ … ], total jobs inserted [ … ], overall job/sec [ … ], running …"
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "river:", err)
		}
		os.Exit(1)
	}
}

// run parses the subcommand and its flags and runs it, printing results to
// stdout and logs (warnings and worse, as River's CLI does by default) to
// stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, about)
		return nil
	}
	fs := flag.NewFlagSet("river "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, about) }
	dbURL := fs.String("database-url", "", "PostgreSQL URL of River's database")
	var n int
	if args[0] == "bench" {
		fs.IntVar(&n, "num-total-jobs", 0, "jobs to insert and work")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *dbURL == "" {
		return errors.New("--database-url is required")
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	switch args[0] {
	case "migrate-up":
		return migrateUp(ctx, *dbURL, logger, stdout)
	case "bench":
		if n < 1 {
			return errors.New("--num-total-jobs must be at least 1")
		}
		pool, err := openPool(ctx, *dbURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		return bench(ctx, pool, n, logger, stdout)
	default:
		fs.Usage()
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// openPool opens pgx's default pool on url (its size is pgx's default,
// max(4, CPUs), unless the URL sets one), with the session timeouts River's
// CLI sets so that a stuck statement fails rather than hangs the run.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	params := cfg.ConnConfig.RuntimeParams
	for k, v := range map[string]string{
		"application_name":                    "paydedup river bench",
		"statement_timeout":                   "10000",
		"idle_in_transaction_session_timeout": "11000",
	} {
		if params[k] == "" {
			params[k] = v
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	return pool, nil
}

// migrateUp applies every River migration not yet applied to the database.
func migrateUp(ctx context.Context, url string, logger *slog.Logger, stdout io.Writer) error {
	pool, err := openPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("new migrator: %w", err)
	}
	res, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	if len(res.Versions) == 0 {
		fmt.Fprintln(stdout, "River's schema is current; nothing applied")
	}
	for _, v := range res.Versions {
		fmt.Fprintf(stdout, "applied River migration %03d %s [%s]\n", v.Version, v.Name, v.Duration.Round(time.Millisecond))
	}
	return nil
}
