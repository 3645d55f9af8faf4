package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"
)

// app holds what every subcommand shares: output streams, the environment
// (injected so tests run the real wiring), and the logger.
type app struct {
	out    io.Writer
	errOut io.Writer
	getenv func(string) string
	logger *slog.Logger

	logFormat string
	logLevel  string
	envErrs   []error
}

func newRootCmd(out, errOut io.Writer, getenv func(string) string) *cobra.Command {
	a := &app{out: out, errOut: errOut, getenv: getenv}
	root := &cobra.Command{
		Use:   "paydedup",
		Short: "Exactly-once payment processing on NATS JetStream and PostgreSQL",
		Long: `paydedup consumes payment commands from a NATS JetStream stream, claims each
command's idempotency key in PostgreSQL before calling the payment provider,
and acks only after the outcome is committed, so retries and redeliveries
never charge twice.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := errors.Join(a.envErrs...); err != nil {
				return err
			}
			return a.setupLogger()
		},
	}
	root.SetOut(out)
	root.SetErr(errOut)
	root.PersistentFlags().StringVar(&a.logFormat, "log-format", envOr(getenv, "PAYDEDUP_LOG_FORMAT", "json"), "log format: json or text (PAYDEDUP_LOG_FORMAT)")
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", envOr(getenv, "PAYDEDUP_LOG_LEVEL", "info"), "log level: debug, info, warn or error (PAYDEDUP_LOG_LEVEL)")
	root.AddCommand(newMigrateCmd(a), newWorkerCmd(a), newReconcileCmd(a),
		newPublishCmd(a), newStatusCmd(a), newDLQCmd(a), newGatewayCmd(a), newAPIKeyCmd(a), newHealthcheckCmd(a))
	root.AddCommand(labCommands(a)...)
	return root
}

func (a *app) setupLogger() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return fmt.Errorf("--log-level / PAYDEDUP_LOG_LEVEL: %q is not one of debug, info, warn, error", a.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(a.logFormat) {
	case "json":
		a.logger = slog.New(slog.NewJSONHandler(a.errOut, opts))
	case "text":
		a.logger = slog.New(slog.NewTextHandler(a.errOut, opts))
	default:
		return fmt.Errorf("--log-format / PAYDEDUP_LOG_FORMAT: %q is not json or text", a.logFormat)
	}
	return nil
}

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}
