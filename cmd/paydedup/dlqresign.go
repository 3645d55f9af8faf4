package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/stream"
)

type dlqResignCmd struct {
	dlqBase
	seqs   []uint
	all    bool
	dryRun bool
	json   bool
}

func newDLQResignCmd(a *app) *cobra.Command {
	r := &dlqResignCmd{dlqBase: dlqBase{app: a}}
	cmd := &cobra.Command{
		Use:   "resign (--seq N... | --all) [--dry-run]",
		Short: "Sign dead letters of a previous DLQ key with the current one",
		Long: `resign is the last step of a DLQ key rotation (docs/operations.md): every dead
letter that verifies with a key listed in PAYDEDUP_DLQ_PREVIOUS_KEYS is filed
anew in the dead-letter stream signed with PAYDEDUP_DLQ_KEY (body and headers
unchanged, Dlq-Failed-At included, so replay still judges its age from when it
failed), and the old letter is deleted only after the new one's PubAck. Once
no letter lists a previous key (dlq list shows ok(previous)), that key can be
dropped. Run it after every worker signs with the new key.

Letters already signed with the current key are left; letters that verify
with no configured key are never re-signed (that would make a forgery
verify). A letter gets a new sequence; the report gives it. It exits non-zero
if a letter failed, or if a letter named with --seq was not re-signed.`,
		Example: `  paydedup dlq resign --all --dry-run
  paydedup dlq resign --all
  paydedup dlq resign --seq 42`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return r.Run(cmd.Context()) },
	}
	r.bind(cmd)
	f := cmd.Flags()
	f.UintSliceVar(&r.seqs, "seq", nil, "dead-letter sequence to re-sign; repeat or comma-separate for more")
	f.BoolVar(&r.all, "all", false, "re-sign every dead letter signed with a previous key")
	f.BoolVar(&r.dryRun, "dry-run", false, "show what would be re-signed; change nothing")
	f.BoolVar(&r.json, "json", false, "print the report as JSON")
	return cmd
}

// Run re-signs and prints what happened to each dead letter.
func (r *dlqResignCmd) Run(ctx context.Context) error {
	if r.all == (len(r.seqs) > 0) {
		return errors.New("say which dead letters to re-sign: --seq N (repeatable) or --all")
	}
	opts := dlq.ResignOptions{All: r.all, DryRun: r.dryRun}
	for _, s := range r.seqs {
		if s == 0 {
			return errors.New("--seq 0 is not a dead-letter sequence: use the SEQ column of paydedup dlq list")
		}
		opts.Seqs = append(opts.Seqs, uint64(s))
	}
	if err := r.app.dlqKeys(&stream.Config{}); err != nil {
		return fmt.Errorf("dlq resign: %w", err)
	}
	if r.app.getenv(dlqPreviousKeysEnv) == "" {
		return fmt.Errorf("dlq resign: %s is not set: list the keys %s replaced, or there is nothing to re-sign", dlqPreviousKeysEnv, dlqKeyEnv)
	}
	nc, js, err := r.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	rep, err := dlq.Resign(ctx, js, r.streams.cfg, opts)
	if err != nil {
		return err
	}
	for i := range rep.Results {
		res := &rep.Results[i]
		res.Reason, res.Detail = redact.PANs(res.Reason), redact.PANs(res.Detail) // what a publisher may have written
	}
	if r.json {
		if err := r.printJSON(rep); err != nil {
			return err
		}
	} else {
		r.print(rep)
	}
	notDone := rep.Failed
	if !r.all {
		notDone += rep.Refused + rep.NotFound
	}
	if notDone > 0 {
		return fmt.Errorf("dlq resign: %d dead letter(s) not re-signed (see above)", notDone)
	}
	return nil
}

func (r *dlqResignCmd) print(rep dlq.ResignReport) {
	out := r.app.out
	for _, res := range rep.Results {
		reason := termSafe(dash(res.Reason), false)
		switch res.Outcome {
		case dlq.Resigned:
			fmt.Fprintf(out, "resigned     %d  %s  key %s -> #%d\n", res.Seq, reason, termSafe(res.KeyID, false), res.NewSeq)
		case dlq.WouldResign:
			fmt.Fprintf(out, "would resign %d  %s  key %s\n", res.Seq, reason, termSafe(res.KeyID, false))
		case dlq.AlreadyCurrent:
			// Not worth a line each: the summary counts them.
		default:
			fmt.Fprintf(out, "%-12s %d  %s: %s\n", strings.ReplaceAll(string(res.Outcome), "_", " "), res.Seq, reason, termSafe(res.Detail, false))
		}
	}
	if r.dryRun {
		fmt.Fprintf(out, "dlq resign (dry run): %d would be re-signed, %d already current, %d refused, %d not found; nothing changed\n",
			rep.WouldResign, rep.Current, rep.Refused, rep.NotFound)
		return
	}
	fmt.Fprintf(out, "dlq resign: %d re-signed, %d already current, %d refused, %d not found, %d failed\n",
		rep.Resigned, rep.Current, rep.Refused, rep.NotFound, rep.Failed)
}
