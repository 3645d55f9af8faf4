package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// app holds what every subcommand shares: output streams, the environment
// (injected so tests run the real wiring), and the logger.
type app struct {
	out    io.Writer
	errOut io.Writer
	getenv func(string) string
	logger *slog.Logger

	// tty says whether a stream is a terminal; nil asks the OS (tests set it).
	tty func(io.Writer) bool

	logFormat string
	logLevel  string
	// envErrs holds, by variable, why a set variable could not be parsed.
	// Only a command that uses the variable reports it (commandEnvErrs).
	envErrs map[string]error
}

func newRootCmd(out, errOut io.Writer, getenv func(string) string) *cobra.Command {
	root, _ := newRoot(out, errOut, getenv)
	return root
}

// newRoot builds the command tree and returns it with the app it shares.
func newRoot(out, errOut io.Writer, getenv func(string) string) (*cobra.Command, *app) {
	a := &app{out: out, errOut: errOut, getenv: getenv}
	root := &cobra.Command{
		Use:   "paydedup",
		Short: "Exactly-once payment processing on NATS JetStream and PostgreSQL",
		Long: `paydedup consumes payment commands from a NATS JetStream stream, claims each
command's idempotency key in PostgreSQL before calling the payment provider,
and acks only after the outcome is committed, so retries and redeliveries
never charge twice.`,
		Version:       buildVersion(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.commandEnvErrs(cmd); err != nil {
				return err
			}
			return a.setupLogger()
		},
	}
	root.SetVersionTemplate("paydedup {{.Version}}\n")
	root.SetOut(out)
	root.SetErr(errOut)
	root.PersistentFlags().StringVar(&a.logFormat, "log-format", envOr(getenv, "PAYDEDUP_LOG_FORMAT", "auto"), "log format: json, text, or auto: text at a terminal, else json (PAYDEDUP_LOG_FORMAT)")
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", envOr(getenv, "PAYDEDUP_LOG_LEVEL", "info"), "log level: debug, info, warn or error (PAYDEDUP_LOG_LEVEL)")
	root.AddCommand(newMigrateCmd(a), newWorkerCmd(a), newReconcileCmd(a),
		newPublishCmd(a), newStatusCmd(a), newOutcomesCmd(a), newDLQCmd(a), newGatewayCmd(a), newAPIKeyCmd(a), newVersionCmd(a), newHealthcheckCmd(a))
	root.AddCommand(newAuditCmd(a))
	root.AddCommand(newConsoleCmd(a))
	root.AddCommand(labCommands(a)...)
	return root, a
}

func (a *app) setupLogger() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return fmt.Errorf("--log-level / PAYDEDUP_LOG_LEVEL: %q is not one of debug, info, warn, error", a.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	format := strings.ToLower(a.logFormat)
	if format == "auto" {
		format = "json"
		if a.terminal(a.errOut) {
			format = "text"
		}
	}
	// Every logger of the binary derives from this one: card numbers are
	// masked in every line, whatever a call site logs.
	switch format {
	case "json":
		a.logger = slog.New(redact.NewHandler(slog.NewJSONHandler(a.errOut, opts)))
	case "text":
		a.logger = slog.New(redact.NewHandler(slog.NewTextHandler(a.errOut, opts)))
	default:
		return fmt.Errorf("--log-format / PAYDEDUP_LOG_FORMAT: %q is not json, text or auto", a.logFormat)
	}
	return nil
}

// envKeyInUsage finds the variables a flag's usage names, as in
// "claim lease (PAYDEDUP_LEASE)": every flag whose default comes from a
// variable says so that way.
var envKeyInUsage = regexp.MustCompile(`\(([A-Z][A-Z0-9_]*)\)`)

// commandEnvErrs returns the parse errors of the variables cmd's flags
// use, each once, sorted: a bad variable breaks only the commands that read
// it (PAYDEDUP_LEASE=45 does not stop migrate status).
func (a *app) commandEnvErrs(cmd *cobra.Command) error {
	seen := map[string]bool{}
	var errs []error
	visit := func(f *pflag.Flag) {
		for _, m := range envKeyInUsage.FindAllStringSubmatch(f.Usage, -1) {
			if err, ok := a.envErrs[m[1]]; ok && !seen[m[1]] {
				seen[m[1]] = true
				errs = append(errs, err)
			}
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	slices.SortFunc(errs, func(x, y error) int { return strings.Compare(x.Error(), y.Error()) })
	return errors.Join(errs...)
}

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}
