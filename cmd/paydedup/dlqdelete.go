package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/stream"
)

// confirm asks question on the error stream and reads the answer from in:
// only y or yes goes ahead. With no answer (in closed, as in a script) it
// refuses and says to pass --yes.
func (a *app) confirm(in io.Reader, question string) error {
	fmt.Fprintf(a.errOut, "%s [y/N] ", question)
	line, err := bufio.NewReader(in).ReadString('\n')
	answer := strings.ToLower(strings.TrimSpace(line))
	if answer == "y" || answer == "yes" {
		return nil
	}
	if err != nil && answer == "" {
		fmt.Fprintln(a.errOut)
		return errors.New("no answer to the confirmation: nothing deleted (pass --yes to delete without asking)")
	}
	return errors.New("not confirmed: nothing deleted")
}

// neverCharged is the warning for deleting max_deliveries letters: their
// payments ran out of deliveries, uncharged, and nothing will retry them.
func neverCharged(letters []dlq.Info) string {
	n := 0
	for _, d := range letters {
		if d.Reason == stream.ReasonMaxDeliveries {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d of them ran out of deliveries (max_deliveries): those payments were not charged, and once deleted nothing retries them; dlq replay is the way to finish them.\n", n)
}

type dlqDeleteCmd struct {
	dlqBase
	yes bool
}

func newDLQDeleteCmd(a *app) *cobra.Command {
	d := &dlqDeleteCmd{dlqBase: dlqBase{app: a}}
	cmd := &cobra.Command{
		Use:   "delete SEQ...",
		Short: "Delete dead letters that will never be replayed",
		Long: `delete removes dead letters from the dead-letter stream, after showing them and
asking for confirmation (--yes skips it). It is for what will never be
replayed: bad input the publisher has resent fixed, a reused key, leftovers.
A max_deliveries letter is a payment that was not charged: deleting it means
nothing retries it, and delete says so before asking.`,
		Example: `  paydedup dlq delete 42
  paydedup dlq delete 42 43 --yes`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			seqs := make([]uint64, len(args))
			for i, s := range args {
				seq, err := parseSeq(s)
				if err != nil {
					return err
				}
				seqs[i] = seq
			}
			return d.Run(cmd.Context(), cmd.InOrStdin(), seqs)
		},
	}
	d.bind(cmd)
	cmd.Flags().BoolVarP(&d.yes, "yes", "y", false, "delete without asking")
	return cmd
}

// Run shows the letters, asks, and deletes them.
func (d *dlqDeleteCmd) Run(ctx context.Context, in io.Reader, seqs []uint64) error {
	nc, js, err := d.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	var letters []dlq.Info
	for _, seq := range seqs {
		l, err := dlq.Get(ctx, js, d.streams.cfg, seq)
		if err != nil {
			return err
		}
		letters = append(letters, l)
	}
	return d.deleteLetters(ctx, js, in, d.yes, letters)
}

// deleteLetters lists letters, asks unless yes, and deletes them one by one.
func (b *dlqBase) deleteLetters(ctx context.Context, js jetstream.JetStream, in io.Reader, yes bool, letters []dlq.Info) error {
	out := b.app.out
	for _, l := range letters {
		fmt.Fprintf(out, "  %d  %s  %s %s  stored %s\n", l.Seq, termSafe(l.Reason, false), termSafe(dash(l.MerchantID), false),
			termSafe(dash(l.IdempotencyKey), false), l.Stored.UTC().Format(time.RFC3339))
	}
	fmt.Fprint(out, neverCharged(letters))
	if !yes {
		if err := b.app.confirm(in, fmt.Sprintf("Delete these %d dead letter(s) from %s? This cannot be undone.", len(letters), b.streams.cfg.DLQStream)); err != nil {
			return err
		}
	}
	var deleted, gone int
	var errs []error
	for _, l := range letters {
		_, err := dlq.Delete(ctx, js, b.streams.cfg, l.Seq)
		switch {
		case err == nil:
			deleted++
		case errors.Is(err, dlq.ErrNotFound):
			gone++ // replayed or deleted meanwhile
		default:
			errs = append(errs, err)
		}
	}
	fmt.Fprintf(out, "dlq: %d deleted, %d already gone, %d failed\n", deleted, gone, len(errs))
	return errors.Join(errs...)
}

type dlqPurgeCmd struct {
	dlqBase
	reason    string
	olderThan time.Duration
	yes       bool
}

func newDLQPurgeCmd(a *app) *cobra.Command {
	p := &dlqPurgeCmd{dlqBase: dlqBase{app: a}}
	cmd := &cobra.Command{
		Use:   "purge --reason R --older-than D",
		Short: "Delete the dead letters of one reason older than an age",
		Long: `purge deletes every dead letter with reason R stored in the dead-letter stream
longer ago than D (by the stream's own time), after listing them and asking
for confirmation (--yes skips it). Both are required, so a purge never
takes more than one reason at a time. Deleting max_deliveries letters drops
payments that were not charged: purge says how many before asking.`,
		Example: `  paydedup dlq purge --reason malformed_json --older-than 168h
  paydedup dlq purge --reason key_reused --older-than 720h --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return p.Run(cmd.Context(), cmd.InOrStdin()) },
	}
	p.bind(cmd)
	f := cmd.Flags()
	f.StringVar(&p.reason, "reason", "", "the reason of the dead letters to delete, e.g. malformed_json (required)")
	f.DurationVar(&p.olderThan, "older-than", 0, "delete only those stored longer ago than this, e.g. 168h (required)")
	f.BoolVarP(&p.yes, "yes", "y", false, "delete without asking")
	return cmd
}

// Run lists the letters the purge selects, asks, and deletes them.
func (p *dlqPurgeCmd) Run(ctx context.Context, in io.Reader) error {
	filter := dlq.PurgeFilter{Reason: p.reason, OlderThan: p.olderThan}
	if err := filter.Validate(); err != nil {
		return fmt.Errorf("%w (--reason, --older-than)", err)
	}
	nc, js, err := p.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	letters, err := dlq.PurgeCandidates(ctx, js, p.streams.cfg, filter)
	if err != nil {
		return err
	}
	if len(letters) == 0 {
		fmt.Fprintf(p.app.out, "dlq: no %s dead letters stored more than %v ago; nothing deleted\n", termSafe(p.reason, false), p.olderThan)
		return nil
	}
	return p.deleteLetters(ctx, js, in, p.yes, letters)
}
