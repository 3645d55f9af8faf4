package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// streamFlags name the streams, subjects and consumer every NATS-facing
// command works on; tests point them at per-test names.
type streamFlags struct{ cfg stream.Config }

func (s *streamFlags) bind(cmd *cobra.Command, a *app) {
	s.bindDefaults(cmd, a, stream.Config{}.WithDefaults())
}

// bindDefaults binds the flags with other defaults than the worker's.
func (s *streamFlags) bindDefaults(cmd *cobra.Command, a *app, def stream.Config) {
	f := cmd.Flags()
	c := &s.cfg
	f.StringVar(&c.Name, "stream", envOr(a.getenv, "PAYDEDUP_STREAM", def.Name), "payments stream (PAYDEDUP_STREAM)")
	f.StringVar(&c.SubjectPrefix, "subject-prefix", envOr(a.getenv, "PAYDEDUP_SUBJECT_PREFIX", def.SubjectPrefix), "payment commands go to <prefix>.<merchant_id> (PAYDEDUP_SUBJECT_PREFIX)")
	f.StringVar(&c.DLQStream, "dlq-stream", envOr(a.getenv, "PAYDEDUP_DLQ_STREAM", def.DLQStream), "dead-letter stream (PAYDEDUP_DLQ_STREAM)")
	f.StringVar(&c.DLQPrefix, "dlq-prefix", envOr(a.getenv, "PAYDEDUP_DLQ_PREFIX", def.DLQPrefix), "dead letters go to <prefix>.<reason> (PAYDEDUP_DLQ_PREFIX)")
	f.StringVar(&c.Durable, "durable", envOr(a.getenv, "PAYDEDUP_DURABLE", def.Durable), "the workers' durable consumer (PAYDEDUP_DURABLE)")
	f.StringVar(&c.OutcomeStream, "outcome-stream", envOr(a.getenv, "PAYDEDUP_OUTCOME_STREAM", def.OutcomeStream), "outcome events stream, subjects <outcome prefix>.<merchant_id> (PAYDEDUP_OUTCOME_STREAM)")
	f.StringVar(&c.OutcomePrefix, "outcome-prefix", envOr(a.getenv, "PAYDEDUP_OUTCOME_PREFIX", def.OutcomePrefix), "outcome events go to <prefix>.<merchant_id> (PAYDEDUP_OUTCOME_PREFIX)")
}

func (s *streamFlags) validate() error {
	var errs []error
	for _, v := range []struct{ flag, env, val string }{
		{"--stream", "PAYDEDUP_STREAM", s.cfg.Name}, {"--dlq-stream", "PAYDEDUP_DLQ_STREAM", s.cfg.DLQStream},
		{"--durable", "PAYDEDUP_DURABLE", s.cfg.Durable}, {"--outcome-stream", "PAYDEDUP_OUTCOME_STREAM", s.cfg.OutcomeStream},
	} {
		if v.val == "" || strings.ContainsAny(v.val, ". *>\t") {
			errs = append(errs, fmt.Errorf("%s / %s: %q must be a non-empty name without '.', '*', '>' or spaces", v.env, v.flag, v.val))
		}
	}
	for _, v := range []struct{ flag, env, val string }{
		{"--subject-prefix", "PAYDEDUP_SUBJECT_PREFIX", s.cfg.SubjectPrefix}, {"--dlq-prefix", "PAYDEDUP_DLQ_PREFIX", s.cfg.DLQPrefix},
		{"--outcome-prefix", "PAYDEDUP_OUTCOME_PREFIX", s.cfg.OutcomePrefix},
	} {
		if v.val == "" || strings.ContainsAny(v.val, " *>\t") || strings.HasPrefix(v.val, ".") || strings.HasSuffix(v.val, ".") {
			errs = append(errs, fmt.Errorf("%s / %s: %q must be a subject prefix such as payments.requests", v.env, v.flag, v.val))
		}
	}
	return errors.Join(errs...)
}

type publishCmd struct {
	app     *app
	bar     *progressbar.ProgressBar // progress of the PubAcks (--generate sets its total)
	nats    natsFlags
	streams streamFlags
	stdin   io.Reader

	file       string
	generate   int
	duplicates float64
	declines   float64
	merchant   string
	seed       uint64
	window     int
	ackTimeout time.Duration
	retry      time.Duration
	limits     payment.Limits
}

func newPublishCmd(a *app) *cobra.Command {
	p := &publishCmd{app: a}
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Publish payment commands (JSON lines, or generated ones)",
		Long: `publish sends payment commands to <subject-prefix>.<merchant_id> with the
Idempotency-Key and Nats-Msg-Id (<merchant_id>:<idempotency_key>) headers, and
waits for every PubAck (asynchronously, a bounded window of messages in flight).

Input is one JSON payment command per line, from stdin or --file; each line is
validated as a worker would, and a malformed line is reported with its line
number and skipped (the command then exits non-zero at the end); a line with
something that looks like a card number is refused the same way, naming the
field, never the number: commands carry payment-method tokens. Blank lines
and lines starting with # are ignored. A line may name its "kind": "charge"
(the default) or "authorize" (the amount held, captured later). Or
--generate N makes N distinct
payments; --duplicates 0.5 additionally republishes half of them (same
Nats-Msg-Id, interleaved), which the stream's duplicate window drops.

A message whose PubAck does not come (a timeout, no stream leader during a
NATS cluster's leader change, a reconnect) is sent again, the same message
with the same Nats-Msg-Id, for up to --retry; a copy that did land is dropped
by the stream's duplicate window, so a command is neither lost nor doubled.
One still without a PubAck after that is unknown: it may have been stored;
publish it again, the same line, and the duplicate window and the worker's
claim make that safe.

A message the duplicate window dropped is checked against the one the
stream holds under its Nats-Msg-Id: the same payment (byte for byte, or the
same fields written otherwise) is a harmless duplicate; another payment
under the same key is a reused key, named on its own line with the stream
sequence holding the other payment: it was not published, and a different
payment needs a new idempotency key.

The summary counts messages stored, duplicates, reused keys, messages the
stream refused (not stored) and unknown ones. Any reused key, refusal,
unknown message or malformed line makes the command exit non-zero. Progress
is shown when stderr is a terminal.`,
		Example: `  paydedup publish --file payments.jsonl
  echo '{"merchant_id":"m_1","idempotency_key":"order-42","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}' | paydedup publish
  paydedup publish --generate 10000 --duplicates 0.3 --declines 0.05 --merchant m_1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p.stdin = cmd.InOrStdin()
			return p.Run(cmd.Context())
		},
	}
	p.nats.bind(cmd, a)
	p.streams.bind(cmd, a)
	f := cmd.Flags()
	f.StringVar(&p.file, "file", "", "read JSON lines from this file instead of stdin")
	f.IntVar(&p.generate, "generate", 0, "generate N distinct payments instead of reading input")
	f.Float64Var(&p.duplicates, "duplicates", 0, "with --generate: fraction of payments published a second time, e.g. 0.5 sends 1.5×N messages")
	f.Float64Var(&p.declines, "declines", 0, "with --generate: fraction of payments with a card that is declined (pm_card_chargeDeclined)")
	f.StringVar(&p.merchant, "merchant", "", "with --generate: merchant id of every payment (default: spread over m_acme, m_globex, m_initech)")
	f.Uint64Var(&p.seed, "seed", 0, "with --generate: random seed; the same seed makes the same keys (0: random)")
	f.IntVar(&p.window, "window", stream.DefaultPublishWindow, "messages awaiting their PubAck at most")
	f.DurationVar(&p.ackTimeout, "ack-timeout", stream.DefaultPublishAckTimeout, "how long one PubAck may take before the message is sent again")
	f.DurationVar(&p.retry, "retry", stream.DefaultPublishRetry, "how long a message without a PubAck is sent again (same Nats-Msg-Id) before it counts as unknown; stay inside the stream's duplicate window (0: the default)")
	f.Int64Var(&p.limits.MaxAmount, "max-amount", a.envInt64("PAYDEDUP_MAX_AMOUNT", payment.DefaultMaxAmount), "largest accepted amount in minor units, as the worker checks it (PAYDEDUP_MAX_AMOUNT)")
	f.IntVar(&p.limits.MaxBodyBytes, "max-body-bytes", a.envInt("PAYDEDUP_MAX_BODY_BYTES", payment.DefaultMaxBodyBytes), "largest accepted line, as the worker checks it (PAYDEDUP_MAX_BODY_BYTES)")
	return cmd
}

func (p *publishCmd) validate() error {
	errs := []error{p.nats.validate(), p.streams.validate()}
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.generate < 0 {
		bad("--generate must be positive, got %d", p.generate)
	}
	if p.generate > 0 && !labBuild {
		bad("--generate needs the workload generator, which this build leaves out (-tags nolab)")
	}
	if p.generate > 0 && p.file != "" {
		bad("--generate and --file exclude each other: publish generated payments or a file's lines")
	}
	if p.generate == 0 && (p.duplicates != 0 || p.declines != 0 || p.merchant != "" || p.seed != 0) {
		bad("--duplicates, --declines, --merchant and --seed only apply with --generate N")
	}
	for _, v := range []struct {
		name string
		val  float64
	}{{"--duplicates", p.duplicates}, {"--declines", p.declines}} {
		if math.IsNaN(v.val) || v.val < 0 || v.val > 1 {
			bad("%s must be a fraction between 0 and 1, got %v", v.name, v.val)
		}
	}
	if p.merchant != "" {
		if err := payment.ValidateMerchant(p.merchant); err != nil {
			bad("--merchant: %v", err)
		}
	}
	if p.window < 1 {
		bad("--window must be at least 1, got %d", p.window)
	}
	if p.ackTimeout <= 0 {
		bad("--ack-timeout must be positive, got %v", p.ackTimeout)
	}
	if p.retry < 0 {
		bad("--retry must not be negative, got %v", p.retry)
	}
	return errors.Join(errs...)
}

// Run publishes and prints the summary. It fails if any line was
// malformed, any key was reused for another payment, or any message was
// refused or is unknown.
func (p *publishCmd) Run(ctx context.Context) error {
	if err := p.validate(); err != nil {
		return err
	}
	in := p.stdin
	if p.generate == 0 && p.file != "" {
		f, err := os.Open(p.file)
		if err != nil {
			return fmt.Errorf("publish: --file: %w", err)
		}
		defer f.Close()
		in = f
	}
	nc, err := p.nats.connect("paydedup-publish")
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := streamExists(ctx, nc, p.streams.cfg.Name); err != nil {
		return err
	}
	start := time.Now()
	var report publishReport
	// Messages PubAcked (or failed); --generate knows how many to expect.
	bar := p.app.progress(-1, "publish", "messages")
	p.bar = bar
	pub, err := stream.NewPublisher(nc, stream.PublisherConfig{
		Window: p.window, AckTimeout: p.ackTimeout, Retry: p.retry, Stream: p.streams.cfg.Name,
		OnResult: func(r stream.PublishResult) {
			bar.Add(1)
			report.add(r)
		},
	})
	if err != nil {
		return err
	}

	var malformed, cardData int
	var runErr error
	if p.generate > 0 {
		runErr = p.publishGenerated(ctx, pub)
	} else {
		malformed, cardData, runErr = p.publishLines(ctx, pub, in)
	}
	st := pub.Close()
	_ = bar.Finish()

	fmt.Fprintf(p.app.out, "publish: %d published, %d duplicates dropped by the stream's window, %d reused keys, %d refused, %d unknown, %d malformed lines skipped, %d resent without a PubAck (%.1f s)\n",
		st.Stored, st.Duplicates, st.Reused, st.Refused, st.Unknown, malformed, st.Retried, time.Since(start).Seconds())
	report.print(p.app.errOut)
	errs := []error{runErr}
	if st.Reused > 0 {
		errs = append(errs, fmt.Errorf("publish: %d reused keys: the stream holds another payment under each of these keys, so they were not published; a different payment needs a new idempotency key", st.Reused))
	}
	if st.Unknown > 0 {
		errs = append(errs, fmt.Errorf("publish: %d messages unknown: they may have been stored; publish them again with the same Nats-Msg-Id (the same lines): the duplicate window and the worker's claim make that safe", st.Unknown))
	}
	if st.Refused > 0 {
		errs = append(errs, fmt.Errorf("publish: %d messages refused by the stream or the client: not stored; fix what each line says and publish it again", st.Refused))
	}
	if cardData > 0 {
		errs = append(errs, fmt.Errorf("publish: %d lines refused for card data (each named above with its field): nothing of them was published; send a payment-method token (pm_...), never a card number", cardData))
	}
	if malformed -= cardData; malformed > 0 {
		errs = append(errs, fmt.Errorf("publish: %d malformed lines skipped: fix them and publish them again", malformed))
	}
	return errors.Join(errs...)
}

// publishReport keeps the first messages of each kind that was not done,
// to name them after the summary (OnResult runs on one goroutine).
type publishReport struct {
	reused, unknown, refused     []string
	moreReused, moreUnk, moreRef int
}

// publishReportLines bounds the lines printed per kind.
const publishReportLines = 20

func (r *publishReport) add(res stream.PublishResult) {
	keep := func(lines *[]string, more *int, format string, args ...any) {
		if len(*lines) == publishReportLines {
			*more++
			return
		}
		*lines = append(*lines, fmt.Sprintf(format, args...))
	}
	m := res.Msg
	merchant := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	who := fmt.Sprintf("merchant %s, key %q", merchant, m.Header.Get(stream.HeaderIdempotencyKey))
	switch {
	case res.Reused:
		keep(&r.reused, &r.moreReused, "publish: reused key: %s: the stream holds another payment under this key (%s #%d, Nats-Msg-Id %q), so this one was dropped and not published; a different payment needs a new idempotency key",
			who, streamOf(res), res.Seq, m.Header.Get(nats.MsgIdHdr))
	case res.Unknown() && res.Seq != 0:
		keep(&r.unknown, &r.moreUnk, "publish: unknown: %s (Nats-Msg-Id %q): %v: the stream may hold this payment or another under its key; publish it again with the same Nats-Msg-Id, the duplicate window and the worker's claim make that safe",
			who, m.Header.Get(nats.MsgIdHdr), res.Err)
	case res.Unknown():
		keep(&r.unknown, &r.moreUnk, "publish: unknown: %s (Nats-Msg-Id %q): no PubAck: %v: it may have been stored; publish it again with the same Nats-Msg-Id, the duplicate window and the worker's claim make that safe",
			who, m.Header.Get(nats.MsgIdHdr), res.Err)
	case res.Err != nil:
		keep(&r.refused, &r.moreRef, "publish: refused: %s (Nats-Msg-Id %q): %v: not stored", who, m.Header.Get(nats.MsgIdHdr), res.Err)
	}
}

// streamOf names the stream holding a reused key's other payment.
func streamOf(res stream.PublishResult) string {
	if res.Stream != "" {
		return res.Stream
	}
	return "the stream"
}

func (r *publishReport) print(w io.Writer) {
	for _, k := range []struct {
		lines []string
		more  int
		what  string
	}{{r.reused, r.moreReused, "reused keys"}, {r.unknown, r.moreUnk, "unknown messages"}, {r.refused, r.moreRef, "refused messages"}} {
		for _, l := range k.lines {
			fmt.Fprintln(w, l)
		}
		if k.more > 0 {
			fmt.Fprintf(w, "publish: and %d more %s\n", k.more, k.what)
		}
	}
}

// maxLine bounds one input line; the worker's body limit applies after.
const maxLine = 4 << 20

// publishLines publishes each valid line and reports malformed ones.
// malformed counts every line skipped, cardData those of them refused
// because they hold what looks like a card number (payment.ReasonCardData),
// which are named as refused: no part of such a line is published.
func (p *publishCmd) publishLines(ctx context.Context, pub *stream.Publisher, in io.Reader) (malformed, cardData int, err error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	line := 0
	for sc.Scan() {
		line++
		raw := strings.TrimSpace(sc.Text())
		if raw == "" || strings.HasPrefix(raw, "#") {
			continue
		}
		c, err := payment.Decode([]byte(raw), payment.Envelope{}, p.limits)
		var ve *payment.ValidationError
		switch {
		case errors.As(err, &ve) && ve.Reason == payment.ReasonCardData:
			malformed++
			cardData++
			fmt.Fprintf(p.app.errOut, "publish: line %d refused, not published: %v\n", line, err)
			continue
		case err != nil:
			malformed++
			fmt.Fprintf(p.app.errOut, "publish: line %d skipped: %v\n", line, err)
			continue
		}
		if err := pub.Publish(ctx, stream.CommandMsg(p.streams.cfg, c.MerchantID, c.IdempotencyKey, []byte(raw))); err != nil {
			return malformed, cardData, err
		}
	}
	if err := sc.Err(); err != nil {
		return malformed, cardData, fmt.Errorf("publish: reading line %d: %w", line+1, err)
	}
	return malformed, cardData, nil
}

// streamExists checks, before anything is published, that the payments
// stream exists: without it every publish would wait out its retries for a
// stream leader that will never come.
func streamExists(ctx context.Context, nc *nats.Conn, name string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("publish: stream %s does not exist: start a worker first (`paydedup worker` creates the streams), or name the right one with --stream / PAYDEDUP_STREAM", name)
	} else if err != nil {
		return fmt.Errorf("publish: stream %s: %w", name, err)
	}
	return nil
}
