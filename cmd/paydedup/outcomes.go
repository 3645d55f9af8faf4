package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/outbox"
	"github.com/paydedup/paydedup/stream"
)

// startRelay creates the outcomes stream and starts the relay of the
// store's two outboxes: the outcome events to the outcomes stream, and the
// commands publishers committed in the intake (package intake) to the
// payments stream. It exports both backlogs on reg. Relayed rows are
// purged after retention (the key retention).
func startRelay(ctx context.Context, nc *nats.Conn, store *dedup.Store, istore *intake.Store, cfg stream.Config, retention time.Duration,
	log *slog.Logger, reg prometheus.Registerer) (*outbox.Relay, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	if _, err := stream.EnsureOutcomeStream(ctx, js, cfg); err != nil {
		return nil, err
	}
	cmds, err := stream.NewCommandPublisher(nc, cfg, 0)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	commands, err := intake.NewSource(istore, cmds, cfg.Limits)
	if err != nil {
		return nil, err
	}
	relay, err := outbox.New(outbox.Config{Retention: retention, Logger: log},
		outbox.Outcomes(store, stream.NewOutcomePublisher(js, cfg, 0)), commands)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(&outboxCollector{store: store,
		unrelayed: prometheus.NewDesc("paydedup_outcome_events_unrelayed",
			"Outcome events committed and not yet published to the outcomes stream.", nil, nil),
		age: prometheus.NewDesc("paydedup_outcome_relay_lag_seconds",
			"Age of the oldest outcome event not yet published (0: none): how late subscribers learn outcomes; alert when it grows.", nil, nil),
	})
	reg.MustRegister(&intakeCollector{store: istore,
		waiting: prometheus.NewDesc("paydedup_intake_commands_waiting",
			"Payment commands publishers committed to the intake and not yet published to the payments stream.", nil, nil),
		age: prometheus.NewDesc("paydedup_intake_relay_lag_seconds",
			"Age of the oldest intake command not yet published (0: none): how late the publishers' committed payments reach the workers.", nil, nil),
		rejected: prometheus.NewDesc("paydedup_intake_commands_rejected",
			"Intake rows the relay refused as invalid commands (reject_reason): kept, never published, until an operator deletes them.", nil, nil),
	})
	if err := relay.Start(ctx); err != nil {
		return nil, err
	}
	return relay, nil
}

// intakeCollector reads the intake's backlog once per scrape; each reads
// NaN when the store cannot say.
type intakeCollector struct {
	store                  *intake.Store
	waiting, age, rejected *prometheus.Desc
}

func (c *intakeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.waiting
	ch <- c.age
	ch <- c.rejected
}

func (c *intakeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b, err := c.store.Backlog(ctx)
	n, age, rej := float64(b.Waiting), 0.0, float64(b.Rejected)
	if !b.Oldest.IsZero() {
		age = max(b.Now.Sub(b.Oldest).Seconds(), 0)
	}
	if err != nil {
		n, age, rej = math.NaN(), math.NaN(), math.NaN()
	}
	ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, n)
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age)
	ch <- prometheus.MustNewConstMetric(c.rejected, prometheus.GaugeValue, rej)
}

// outboxCollector reads the outbox's backlog once per scrape; both read
// NaN when the store cannot say.
type outboxCollector struct {
	store          *dedup.Store
	unrelayed, age *prometheus.Desc
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.unrelayed
	ch <- c.age
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b, err := c.store.OutcomeBacklog(ctx)
	n, age := float64(b.Unrelayed), 0.0
	if !b.Oldest.IsZero() {
		age = max(b.Now.Sub(b.Oldest).Seconds(), 0)
	}
	if err != nil {
		n, age = math.NaN(), math.NaN()
	}
	ch <- prometheus.MustNewConstMetric(c.unrelayed, prometheus.GaugeValue, n)
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age)
}

type outcomesCmd struct {
	app      *app
	nats     natsFlags
	streams  streamFlags
	merchant string
	all      bool
	max      int
	json     bool
	out      io.Writer
}

func newOutcomesCmd(a *app) *cobra.Command {
	o := &outcomesCmd{app: a}
	cmd := &cobra.Command{
		Use:   "outcomes",
		Short: "Tail the payments' outcome events",
		Long: `outcomes follows the outcomes stream (PAYMENTS_OUTCOMES, subjects
payments.outcomes.<merchant_id>) and prints each event: one per final outcome
of a payment (charged, declined, processing, settled), relayed by the workers
from the transaction that recorded it. It starts with the new events, or the
stream's oldest with --all, and runs until interrupted or --max events.

An event may be delivered more than once (the relay publishes at least once;
the stream's duplicate window drops most repeats): a subscriber reads each
exactly once by its event_id (docs/message-contract.md, "Outcome events").
--json prints each event's JSON body, one a line.`,
		Example: `  paydedup outcomes
  paydedup outcomes --merchant m_123 --all --json | jq .status`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out = cmd.OutOrStdout()
			return o.Run(cmd.Context())
		},
	}
	o.nats.bind(cmd, a)
	o.streams.bind(cmd, a)
	f := cmd.Flags()
	f.StringVar(&o.merchant, "merchant", "", "only this merchant's events")
	f.BoolVar(&o.all, "all", false, "start with the oldest event the stream holds, not the next one")
	f.IntVar(&o.max, "max", 0, "stop after this many events (0: never)")
	f.BoolVar(&o.json, "json", false, "print each event's JSON, one a line")
	return cmd
}

func (o *outcomesCmd) validate() error {
	errs := []error{o.nats.validate(), o.streams.validate()}
	if o.max < 0 {
		errs = append(errs, fmt.Errorf("--max must not be negative, got %d", o.max))
	}
	return errors.Join(errs...)
}

// Run prints the events until ctx ends or --max were printed.
func (o *outcomesCmd) Run(ctx context.Context) error {
	if err := o.validate(); err != nil {
		return err
	}
	nc, err := o.nats.connect("paydedup outcomes")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := o.streams.cfg.WithDefaults()
	occ := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}
	if o.all {
		occ.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	if o.merchant != "" {
		occ.FilterSubjects = []string{cfg.OutcomeSubject(o.merchant)}
	}
	cons, err := js.OrderedConsumer(ctx, cfg.OutcomeStream, occ)
	if err != nil {
		return fmt.Errorf("follow stream %s: %w", cfg.OutcomeStream, err)
	}
	for n := 0; o.max == 0 || n < o.max; {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) {
			if ctx.Err() != nil {
				return nil
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("follow stream %s: %w", cfg.OutcomeStream, err)
		}
		if err := o.print(m.Data()); err != nil {
			return err
		}
		n++
	}
	return nil
}

func (o *outcomesCmd) print(body []byte) error {
	e, err := stream.DecodeOutcomeEvent(body)
	if err != nil {
		_, werr := fmt.Fprintf(o.out, "? %v\n", err)
		return werr
	}
	if o.json {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(o.out, "%s\n", b)
		return err
	}
	line := fmt.Sprintf("%s  %s  %s  %-10s %-10s %d %s", e.OccurredAt.Format(time.RFC3339Nano), e.MerchantID, e.IdempotencyKey,
		e.Kind, e.Status, e.Amount, e.Currency)
	if e.ChargeID != "" {
		line += "  " + e.ChargeID
	}
	if e.Reason != "" {
		line += "  reason=" + e.Reason
	}
	_, err = fmt.Fprintln(o.out, line)
	return err
}
