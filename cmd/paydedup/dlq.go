package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/stream"
	"github.com/spf13/cobra"
)

func newDLQCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq list|show|replay|resign|delete|purge",
		Short: "List, show, replay, re-sign and delete dead letters",
		Long: `dlq works on the dead-letter stream (PAYMENTS_DLQ): payment commands a worker
could not process, each kept with its original body and headers and the
Dlq-Reason, Dlq-Error, Dlq-Orig-Subject, Dlq-Orig-Seq, Dlq-Deliveries and
Dlq-Failed-At headers, authenticated by Dlq-Auth (an HMAC keyed with
PAYDEDUP_DLQ_KEY, named by Dlq-Key-Id). Letters signed with a key that
PAYDEDUP_DLQ_KEY replaced verify while that key is listed in
PAYDEDUP_DLQ_PREVIOUS_KEYS (comma-separated); dlq resign signs them with the
current key before it is dropped. A dead letter is named by its sequence in
that stream.

Reasons: bad input (malformed_json, missing_key, invalid_amount, ...: the
publisher must fix the message; card_data: something in it looked like a
card number, which the letter keeps masked), key_reused (the same key with
another payment: a client bug), max_deliveries (failed alone through every delivery
and every copy published again: replay it once the cause is fixed; an
outage pauses the workers and files none), provider_rejected (the provider
refused the request as sent: investigate, then replay or publish anew), and
the rare provider_idempotency_mismatch and ledger_conflict (investigate).`,
		Example: `  paydedup dlq list --reason max_deliveries --since 2h
  paydedup dlq show 42
  paydedup dlq replay --all --reason max_deliveries --dry-run
  paydedup dlq purge --reason malformed_json --older-than 168h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newDLQListCmd(a), newDLQShowCmd(a), newDLQReplayCmd(a), newDLQResignCmd(a), newDLQDeleteCmd(a), newDLQPurgeCmd(a))
	return cmd
}

// dlqBase is what every dlq subcommand shares: the connection and the
// stream names.
type dlqBase struct {
	app     *app
	nats    natsFlags
	streams streamFlags
	// keyErr says why dead letters cannot be verified (PAYDEDUP_DLQ_KEY
	// missing or too short, or PAYDEDUP_DLQ_PREVIOUS_KEYS malformed); list
	// and show still work and say so.
	keyErr error
}

func (b *dlqBase) bind(cmd *cobra.Command) {
	b.nats.bind(cmd, b.app)
	b.streams.bind(cmd, b.app)
}

func (b *dlqBase) connect() (*nats.Conn, jetstream.JetStream, error) {
	if err := errors.Join(b.nats.validate(), b.streams.validate()); err != nil {
		return nil, nil, err
	}
	b.keyErr = b.app.dlqKeys(&b.streams.cfg)
	nc, err := b.nats.connect("paydedup-dlq")
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

func (b *dlqBase) printJSON(v any) error { return printJSONTo(b.app.out, v) }

// printJSONTo writes v indented. Its texts are masked field by field by
// the caller: a mask over the whole would also hit numbers (a stream
// sequence) and break the JSON.
func printJSONTo(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ---------------------------------------------------------------------------

type dlqListCmd struct {
	dlqBase
	reason string
	since  time.Duration
	limit  int
	json   bool
}

func newDLQListCmd(a *app) *cobra.Command {
	l := &dlqListCmd{dlqBase: dlqBase{app: a}}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Long: `list prints one line per dead letter, oldest first: its sequence (for dlq show
and dlq replay), reason, merchant, idempotency key, deliveries, when it failed,
and the error. Merchant and key are read best effort: a malformed message may
not have them.`,
		Example: `  paydedup dlq list
  paydedup dlq list --reason max_deliveries --since 1h --limit 20
  paydedup dlq list --json | jq -r '.[].seq'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return l.Run(cmd.Context()) },
	}
	l.bind(cmd)
	f := cmd.Flags()
	f.StringVar(&l.reason, "reason", "", "only dead letters with this reason, e.g. max_deliveries")
	f.DurationVar(&l.since, "since", 0, "only dead letters filed within this long, e.g. 2h (0: all)")
	f.IntVar(&l.limit, "limit", 100, "at most this many (0: all)")
	f.BoolVar(&l.json, "json", false, "print a JSON array")
	return cmd
}

// dlqEntry is the JSON shape of one listed dead letter.
type dlqEntry struct {
	Seq            uint64 `json:"seq"`
	Reason         string `json:"reason"`
	MerchantID     string `json:"merchant_id"`
	IdempotencyKey string `json:"idempotency_key"`
	// Kind is the command's kind (charge when its body names none);
	// PaymentKey the payment a refund, a capture or a cancel acts on.
	Kind        string    `json:"kind,omitempty"`
	PaymentKey  string    `json:"payment_key,omitempty"`
	Deliveries  uint64    `json:"deliveries"`
	FailedAt    time.Time `json:"failed_at"`
	Error       string    `json:"error"`
	OrigSubject string    `json:"orig_subject"`
	OrigSeq     uint64    `json:"orig_seq"`
	Invalid     string    `json:"invalid,omitempty"`
	Verified    bool      `json:"verified"`
	Unverified  string    `json:"unverified,omitempty"`
	// KeyID names the DLQ key that verified it (Dlq-Key-Id); PreviousKey:
	// one of PAYDEDUP_DLQ_PREVIOUS_KEYS (dlq resign before dropping it).
	KeyID       string `json:"key_id,omitempty"`
	PreviousKey bool   `json:"previous_key,omitempty"`
}

// entry is a letter as list --json and show --json print it: every text a
// publisher may have written has its card numbers masked (encoding/json
// escapes the control bytes).
func entry(d dlq.Info) dlqEntry {
	return dlqEntry{
		Seq: d.Seq, Reason: redact.PANs(d.Reason), MerchantID: redact.PANs(d.MerchantID), IdempotencyKey: redact.PANs(d.IdempotencyKey),
		Kind: redact.PANs(d.Kind), PaymentKey: redact.PANs(d.PaymentKey),
		Deliveries: d.Deliveries, FailedAt: d.FailedAt.UTC(), Error: redact.PANs(d.Error),
		OrigSubject: redact.PANs(d.OrigSubject), OrigSeq: d.OrigSeq, Invalid: redact.PANs(d.Invalid),
		Verified: d.Verified, Unverified: redact.PANs(d.Unverified), KeyID: d.KeyID, PreviousKey: d.PreviousKey,
	}
}

// Run lists the dead letters.
func (l *dlqListCmd) Run(ctx context.Context) error {
	if l.limit < 0 {
		return fmt.Errorf("--limit must not be negative, got %d", l.limit)
	}
	if l.since < 0 {
		return fmt.Errorf("--since must be a positive duration such as 2h, got %v", l.since)
	}
	nc, js, err := l.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	f := dlq.Filter{Reason: l.reason, Limit: l.limit}
	if l.since > 0 {
		f.Since = time.Now().Add(-l.since)
	}
	letters, err := dlq.List(ctx, js, l.streams.cfg, f)
	if err != nil {
		return err
	}
	if l.json {
		return l.printJSON(entries(letters))
	}
	if len(letters) == 0 {
		fmt.Fprintf(l.app.out, "no dead letters in %s matching\n", l.streams.cfg.DLQStream)
		return nil
	}
	if err := printList(l.app.out, letters); err != nil {
		return err
	}
	if l.keyErr != nil {
		fmt.Fprintf(l.app.out, "(no letter verified: %v)\n", l.keyErr)
	}
	if l.limit > 0 && len(letters) == l.limit {
		fmt.Fprintf(l.app.out, "(first %d shown; --limit 0 shows all)\n", l.limit)
	}
	return nil
}

// entries is what list --json prints.
func entries(letters []dlq.Info) []dlqEntry {
	out := make([]dlqEntry, len(letters))
	for i, d := range letters {
		out[i] = entry(d)
	}
	return out
}

// printList writes list's table: every text a publisher may have written
// masked and made printable, the error clipped after masking.
func printList(out io.Writer, letters []dlq.Info) error {
	var table strings.Builder
	w := tabwriter.NewWriter(&table, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SEQ\tREASON\tMERCHANT\tKEY\tDELIVERIES\tFAILED AT\tAUTH\tERROR")
	for _, d := range letters {
		failed := "-"
		if !d.FailedAt.IsZero() {
			failed = d.FailedAt.UTC().Format("2006-01-02 15:04:05Z")
		}
		errText := d.Error
		if d.Invalid != "" {
			errText = "unreadable dead letter: " + d.Invalid
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.Seq, termSafe(d.Reason, false), termSafe(dash(d.MerchantID), false),
			termSafe(dash(d.IdempotencyKey), false), d.Deliveries, failed, authText(d), termSafe(clipText(errText, 100), false))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	// Masked as a whole too: columns side by side can bring digits
	// together that no field held alone.
	_, err := io.WriteString(out, redact.PANs(table.String()))
	return err
}

// authText says whether a worker holding the DLQ key filed the letter, and
// whether that key is a previous one.
func authText(d dlq.Info) string {
	switch {
	case d.Verified && d.PreviousKey:
		return "ok(previous)"
	case d.Verified:
		return "ok"
	}
	return "UNVERIFIED"
}

// termSafe makes text from a dead letter safe to print on a terminal:
// card numbers masked (redact.PANs), then an invalid UTF-8 byte becomes
// \xNN, a C0 control or DEL \xNN, a C1 control or other non-printing rune
// (bidi overrides) \uNNNN, so no escape sequence (clear screen, window
// title, OSC 52 clipboard write) reaches the terminal. Newlines and tabs
// are kept when multiline.
func termSafe(s string, multiline bool) string { return redact.Shown(s, multiline) }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clipText bounds a column, card numbers masked before the cut (a number
// cut to 15 of its 16 digits would no longer be masked).
func clipText(s string, n int) string {
	if c, cut := redact.Cut(s, n-3); cut {
		return c + "..."
	}
	return redact.PANs(s)
}

// ---------------------------------------------------------------------------

type dlqShowCmd struct {
	dlqBase
	json bool
}

func newDLQShowCmd(a *app) *cobra.Command {
	s := &dlqShowCmd{dlqBase: dlqBase{app: a}}
	cmd := &cobra.Command{
		Use:   "show SEQ",
		Short: "Show one dead letter's headers and body",
		Long: `show prints a dead letter's headers (the original ones and the Dlq-* ones) and its
body. Card numbers are masked everywhere (13 to 19 digits with a card brand's
prefix and length, Luhn-valid, whatever separators lie between them), and control bytes and invalid UTF-8
are printed escaped (\x1b, \xff, \u009b), so a hostile message cannot drive
the terminal; --json gives the body as a JSON string and body_base64 byte for
byte, card numbers masked (a JSON body that held one comes re-encoded).`,
		Example: `  paydedup dlq show 42
  paydedup dlq show 42 --json | jq -r .body`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			seq, err := parseSeq(args[0])
			if err != nil {
				return err
			}
			return s.Run(cmd.Context(), seq)
		},
	}
	s.bind(cmd)
	cmd.Flags().BoolVar(&s.json, "json", false, "print a JSON object (headers, body as a string)")
	return cmd
}

func parseSeq(s string) (uint64, error) {
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 {
		return 0, fmt.Errorf("%q is not a dead-letter sequence: use the SEQ column of paydedup dlq list", s)
	}
	return seq, nil
}

// Run shows the dead letter.
func (s *dlqShowCmd) Run(ctx context.Context, seq uint64) error {
	nc, js, err := s.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	d, err := dlq.Get(ctx, js, s.streams.cfg, seq)
	if err != nil {
		return err
	}
	if s.json {
		return s.printJSON(showJSON(d))
	}
	printShow(s.app.out, d, s.streams.cfg.DLQStream, s.keyErr)
	return nil
}

// maskedHeaders names the one entry show --json gives headers whose names
// and values side by side held a card number.
const maskedHeaders = "Paydedup-Masked-Headers"

// showJSON is what show --json prints: every text a publisher may have
// written masked.
func showJSON(d dlq.Info) any {
	body := redact.Body(d.Data)
	headers := make(map[string][]string, len(d.Header))
	for k, vs := range d.Header {
		mk := redact.PANs(k)
		for _, v := range vs {
			headers[mk] = append(headers[mk], redact.PANs(v))
		}
	}
	// Names and values side by side, as show --json indents them, can show
	// a card number that none holds alone: then the headers are shown as
	// one masked text.
	if b, err := json.MarshalIndent(headers, "  ", "  "); err == nil && redact.ContainsPAN(string(b)) {
		headers = map[string][]string{maskedHeaders: {redact.PANs(string(b))}}
	}
	return struct {
		dlqEntry
		Subject string              `json:"subject"`
		Stored  time.Time           `json:"stored"`
		Headers map[string][]string `json:"headers"`
		Body    string              `json:"body"`
		Base64  []byte              `json:"body_base64"`
	}{entry(d), redact.PANs(d.Subject), d.Stored.UTC(), headers, string(body), body}
}

// printShow writes a letter as show prints it: card numbers masked and
// control bytes escaped in everything a publisher may have written.
func printShow(w io.Writer, d dlq.Info, dlqStream string, keyErr error) {
	var out strings.Builder
	// Masked as a whole at the end too: lines side by side can bring
	// digits together that no field held alone.
	defer func() { _, _ = io.WriteString(w, redact.PANs(out.String())) }()
	fmt.Fprintf(&out, "dead letter %d in %s (subject %s, stored %s)\n\nheaders:\n", d.Seq, dlqStream, termSafe(d.Subject, false), d.Stored.UTC().Format(time.RFC3339Nano))
	keys := make([]string, 0, len(d.Header))
	for k := range d.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range d.Header[k] {
			fmt.Fprintf(&out, "  %s: %s\n", termSafe(k, false), termSafe(v, false))
		}
	}
	fmt.Fprintf(&out, "\nbody (%d bytes; card data masked, control bytes and invalid UTF-8 escaped, --json for the bytes):\n%s\n", len(d.Data), redact.ShownBody(d.Data))
	if d.Invalid != "" {
		fmt.Fprintf(&out, "\nnot a readable dead letter: %s\n", termSafe(d.Invalid, false))
	}
	if d.Truncated {
		fmt.Fprintf(&out, "\nTRUNCATED to fit under max_payload: the original body is %s bytes (SHA-256 %s); the original is %s #%d while that stream keeps it\n",
			termSafe(d.Header.Get(stream.HeaderDLQBodyLength), false), termSafe(d.Header.Get(stream.HeaderDLQBodySHA256), false), termSafe(d.OrigStream, false), d.OrigSeq)
	}
	if d.PreviousKey {
		fmt.Fprintf(&out, "\nsigned with a previous DLQ key (Dlq-Key-Id %s, listed in %s): it stops verifying when that key is dropped; paydedup dlq resign signs it with the current key\n",
			d.KeyID, dlqPreviousKeysEnv)
	}
	if !d.Verified {
		fmt.Fprintf(&out, "\nUNVERIFIED: %s; replay refuses it\n", termSafe(d.Unverified, false))
		if keyErr != nil {
			fmt.Fprintf(&out, "(%v)\n", keyErr)
		}
	}
}

// ---------------------------------------------------------------------------

type dlqReplayCmd struct {
	dlqBase
	seqs      []uint
	all       bool
	reason    string
	dryRun    bool
	force     bool
	retention time.Duration
	rate      float64
	json      bool
}

func newDLQReplayCmd(a *app) *cobra.Command {
	r := &dlqReplayCmd{dlqBase: dlqBase{app: a}}
	cmd := &cobra.Command{
		Use:   "replay (SEQ... | --seq N... | --reason R | --all) [--dry-run] [--force]",
		Short: "Republish dead letters to their original subject",
		Long: `replay republishes dead letters to their original subject, with their original
body and headers and a new Nats-Msg-Id (the old one may still be inside the
stream's duplicate window), waits for the PubAck, and only then deletes the
dead letter. The workers then process it as any message: PostgreSQL still
guards the charge, so replaying a payment that was completed in the meantime
is acked as a duplicate and never charged twice.

It needs PAYDEDUP_DLQ_KEY, the secret the workers authenticate dead letters
with, and refuses any letter that does not verify with it: a message
published straight to the DLQ's subjects is never replayed. It refuses dead
letters that failed longer ago than the key retention (PAYDEDUP_KEY_RETENTION,
from the earlier of the authenticated Dlq-Failed-At and the stream's stored
time, so a re-filed copy is as old as the original): their key may have been
purged, and a replay could charge again. It skips reasons that cannot succeed unchanged (bad input, and
key_reused) unless --force. It never replays a card_data letter, not even
with --force: its card number is masked, so the replay would be another
command; the client must send the payment anew with a payment-method token.
Name the letters by sequence (dlq replay 42 43, or --seq 42 --seq 43), by
reason (--reason R: every letter with that reason), or all of them (--all).
--all also skips provider_idempotency_mismatch and
ledger_conflict, which need investigating first, unless --reason names them
(or a sequence names the letter). --reason and --all read the stream a batch at a time and
republish at most --rate letters per second, so a large backlog does not
flood the workers and the provider. --dry-run shows what would be replayed and
changes nothing. It exits non-zero if a replay failed, or if a dead letter
named by its sequence was not replayed.`,
		Example: `  paydedup dlq replay --reason max_deliveries --dry-run
  paydedup dlq replay --reason max_deliveries
  paydedup dlq replay --reason provider_rejected
  paydedup dlq replay 42 43
  paydedup dlq replay --all --dry-run`,
		Args: func(_ *cobra.Command, args []string) error {
			for _, a := range args {
				if _, err := parseSeq(a); err != nil {
					return err
				}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, a := range args {
				seq, _ := parseSeq(a)
				r.seqs = append(r.seqs, uint(seq))
			}
			return r.Run(cmd.Context())
		},
	}
	r.bind(cmd)
	f := cmd.Flags()
	f.UintSliceVar(&r.seqs, "seq", nil, "dead-letter sequence to replay; repeat or comma-separate for more")
	f.BoolVar(&r.all, "all", false, "replay every dead letter (with --reason: every one with that reason)")
	f.StringVar(&r.reason, "reason", "", "replay every dead letter with this reason (with sequences: only those of them with it)")
	f.BoolVar(&r.dryRun, "dry-run", false, "show what would be replayed; change nothing")
	f.BoolVar(&r.force, "force", false, "also replay reasons that cannot succeed unchanged (bad input, key_reused)")
	f.DurationVar(&r.retention, "key-retention", a.envDuration("PAYDEDUP_KEY_RETENTION", dlq.DefaultKeyRetention), "the store's key retention: older dead letters are refused (PAYDEDUP_KEY_RETENTION)")
	f.Float64Var(&r.rate, "rate", dlq.DefaultReplayRate, "republish at most this many dead letters per second (0: no limit)")
	f.BoolVar(&r.json, "json", false, "print the report as JSON")
	return cmd
}

func (r *dlqReplayCmd) validate() error {
	var errs []error
	switch {
	case r.all && len(r.seqs) > 0:
		errs = append(errs, errors.New("name dead letters by sequence or replay --all, not both"))
	case !r.all && len(r.seqs) == 0 && r.reason == "":
		errs = append(errs, errors.New("say which dead letters to replay: SEQ... (or --seq N, repeatable), --reason R, or --all"))
	}
	for _, s := range r.seqs {
		if s == 0 {
			errs = append(errs, errors.New("--seq 0 is not a dead-letter sequence: use the SEQ column of paydedup dlq list"))
		}
	}
	if r.rate < 0 || math.IsNaN(r.rate) || math.IsInf(r.rate, 0) {
		errs = append(errs, fmt.Errorf("--rate must be a number of dead letters per second, 0 for no limit, got %v", r.rate))
	}
	if r.retention <= 0 {
		errs = append(errs, fmt.Errorf("--key-retention / PAYDEDUP_KEY_RETENTION must be positive, got %v", r.retention))
	}
	return errors.Join(errs...)
}

// Run replays and prints what happened to each dead letter.
func (r *dlqReplayCmd) Run(ctx context.Context) error {
	if err := r.validate(); err != nil {
		return err
	}
	if err := r.app.dlqKeys(&stream.Config{}); err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	nc, js, err := r.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	// --reason alone is every letter with that reason: --all's walk, with
	// the same checks.
	all := r.all || len(r.seqs) == 0
	opts := dlq.ReplayOptions{All: all, Reason: r.reason, DryRun: r.dryRun, Force: r.force, KeyRetention: r.retention, Rate: r.rate}
	for _, s := range r.seqs {
		opts.Seqs = append(opts.Seqs, uint64(s))
	}
	finish := func() {}
	if all {
		// The letters in the stream now: the bar's total, at most.
		var total int64 = -1
		if s, err := js.Stream(ctx, r.streams.cfg.DLQStream); err == nil {
			if info, err := s.Info(ctx); err == nil {
				total = int64(info.State.Msgs)
			}
		}
		bar := r.app.progress(total, "dlq replay", "letters")
		opts.OnResult = func(dlq.ReplayResult) { _ = bar.Add(1) }
		finish = func() { _ = bar.Finish() }
	}
	rep, err := dlq.Replay(ctx, js, r.streams.cfg, opts)
	finish()
	if err != nil {
		return err
	}
	// The printed lines list every letter; the log gets one line per
	// replayed letter only when nobody is reading them at a terminal.
	for i := range rep.Results {
		res := &rep.Results[i]
		for _, f := range []*string{&res.Reason, &res.MerchantID, &res.IdempotencyKey, &res.Subject, &res.MsgID, &res.Detail} {
			*f = redact.PANs(*f) // what a publisher wrote; print and JSON escape the rest
		}
		if res.Outcome == dlq.Replayed && !r.app.terminal(r.app.out) {
			r.app.logger.Info("dead letter replayed", "dlq_seq", res.Seq, "reason", res.Reason, "merchant_id", res.MerchantID,
				"idempotency_key", res.IdempotencyKey, "subject", res.Subject, "stream_seq", res.StreamSeq, "msg_id", res.MsgID)
		}
	}
	if r.json {
		if err := r.printJSON(rep); err != nil {
			return err
		}
	} else {
		r.print(rep)
	}
	notDone := rep.Failed
	if !all {
		notDone += rep.Skipped + rep.Refused + rep.NotFound
	}
	if notDone > 0 {
		return fmt.Errorf("dlq replay: %d dead letter(s) not replayed (see above)", notDone)
	}
	return nil
}

func (r *dlqReplayCmd) print(rep dlq.ReplayReport) {
	out := r.app.out
	for _, res := range rep.Results {
		who := termSafe(strings.Trim(dash(res.MerchantID)+" "+dash(res.IdempotencyKey), " "), false)
		reason, subject := termSafe(dash(res.Reason), false), termSafe(res.Subject, false)
		switch res.Outcome {
		case dlq.Replayed:
			fmt.Fprintf(out, "replayed     %d  %s  %s -> %s #%d (Nats-Msg-Id %s)\n", res.Seq, reason, who, subject, res.StreamSeq, termSafe(res.MsgID, false))
		case dlq.WouldReplay:
			fmt.Fprintf(out, "would replay %d  %s  %s -> %s\n", res.Seq, reason, who, subject)
		default:
			fmt.Fprintf(out, "%-12s %d  %s  %s: %s\n", strings.ReplaceAll(string(res.Outcome), "_", " "), res.Seq, reason, who, termSafe(res.Detail, false))
		}
	}
	if r.dryRun {
		fmt.Fprintf(out, "dlq replay (dry run): %d would be replayed, %d skipped, %d refused, %d not found; nothing changed\n",
			rep.WouldReplay, rep.Skipped, rep.Refused, rep.NotFound)
		return
	}
	fmt.Fprintf(out, "dlq replay: %d replayed, %d skipped, %d refused, %d not found, %d failed\n",
		rep.Replayed, rep.Skipped, rep.Refused, rep.NotFound, rep.Failed)
}
