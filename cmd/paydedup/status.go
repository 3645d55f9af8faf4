package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/reconciler"
	"github.com/paydedup/paydedup/stream"
)

type statusCmd struct {
	app     *app
	db      databaseFlag
	nats    natsFlags
	streams streamFlags
	grace   time.Duration
	json    bool
}

func newStatusCmd(a *app) *cobra.Command {
	s := &statusCmd{app: a}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show idempotency rows by status, stuck payments, dead letters and the consumer backlog",
		Long: `status reads PostgreSQL and NATS and shows:

  - idempotency rows by status (pending, completed, failed);
  - the oldest pending row, and how many are stuck: pending for more than
    --grace (their worker is gone or their outcome is unknown; a redelivery
    or the reconciler should resolve them soon: if the number stays up, look
    at the reconciler's logs and at the provider);
  - outcomes committed in the last minute and the last hour;
  - the outboxes the workers relay: payment commands publishers committed
    to the intake and not yet published (waiting, the oldest's age, and the
    rows refused as invalid commands), and outcome events not yet published;
  - dead letters by reason;
  - why the workers' payments wait, as the workers note it for GET's delay:
    a pause's cause, rate_limited (the provider's rate limit or the fleet's
    budget), or behind_another_merchant (payments of several merchants wait
    for call slots, served in turn, or lanes serve merchants stored behind
    another's backlog);
  - the workers' consumer: messages not yet delivered (pending) and delivered
    but not yet acked (ack pending).

--json prints one JSON object instead of the tables. When NATS cannot be read,
the database figures are still printed and the command exits non-zero.`,
		Example: `  paydedup status
  paydedup status --json | jq .dead_letters
  watch -n 5 paydedup status`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return explainDBError(s.Run(cmd.Context()), s.db.url) },
	}
	s.db.bind(cmd, a)
	s.nats.bind(cmd, a)
	s.streams.bind(cmd, a)
	cmd.Flags().DurationVar(&s.grace, "grace", a.envDuration("PAYDEDUP_RECONCILE_GRACE", reconciler.DefaultGrace), "a row is stuck when it has been pending for longer than this (PAYDEDUP_RECONCILE_GRACE)")
	cmd.Flags().BoolVar(&s.json, "json", false, "print one JSON object")
	return cmd
}

// statusReport is the JSON shape of `status --json`.
type statusReport struct {
	Time    time.Time `json:"time"`
	Keys    keyCounts `json:"keys"`
	Pending struct {
		OldestPending           *time.Time `json:"oldest_pending"`
		OldestPendingAgeSeconds float64    `json:"oldest_pending_age_seconds"`
		Stuck                   int64      `json:"stuck"`
		GraceSeconds            float64    `json:"grace_seconds"`
		MaybeCharged            int64      `json:"maybe_charged"`
		LookupBackedOff         int64      `json:"lookup_backed_off"`
	} `json:"pending"`
	Completed struct {
		LastMinute       int64 `json:"last_minute"`
		LastHour         int64 `json:"last_hour"`
		DeclinedLastHour int64 `json:"declined_last_hour"`
	} `json:"completed"`
	Intake      *intakeCounts         `json:"intake"`
	Outcomes    *outcomeCounts        `json:"outcome_events"`
	DeadLetters *deadLetterCounts     `json:"dead_letters"`
	Consumer    *stream.ConsumerStats `json:"consumer"`
	// Waiting is why the workers' payments wait, as the workers note it
	// for the gateway's GET (its delay): a pause's cause, rate_limited or
	// behind_another_merchant; absent while none waits.
	Waiting *workersWaiting `json:"workers_waiting,omitempty"`
	Errors  []string        `json:"errors,omitempty"`
}

type workersWaiting struct {
	Cause   string     `json:"cause"`
	Since   time.Time  `json:"since"`
	Workers int        `json:"workers"`
	RetryAt *time.Time `json:"retry_at,omitempty"`
}

type keyCounts struct {
	Pending   int64 `json:"pending"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
	Total     int64 `json:"total"`
}

// intakeCounts is the intake's backlog (package intake).
type intakeCounts struct {
	Waiting          int64      `json:"waiting"`
	OldestWaiting    *time.Time `json:"oldest_waiting"`
	OldestAgeSeconds float64    `json:"oldest_waiting_age_seconds"`
	Rejected         int64      `json:"rejected"`
}

// outcomeCounts is the outcome events' backlog.
type outcomeCounts struct {
	Unrelayed        int64   `json:"unrelayed"`
	OldestAgeSeconds float64 `json:"oldest_unrelayed_age_seconds"`
}

type deadLetterCounts struct {
	Stream   string            `json:"stream"`
	Total    uint64            `json:"total"`
	ByReason map[string]uint64 `json:"by_reason"`
}

func (s *statusCmd) validate() error {
	errs := []error{s.db.validate(), s.nats.validate(), s.streams.validate()}
	if s.grace < 0 {
		errs = append(errs, fmt.Errorf("--grace / PAYDEDUP_RECONCILE_GRACE must not be negative, got %v", s.grace))
	}
	return errors.Join(errs...)
}

// Run gathers the figures and prints them.
func (s *statusCmd) Run(ctx context.Context) error {
	if err := s.validate(); err != nil {
		return err
	}
	pool, err := pg.Connect(ctx, s.db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		return err
	}
	st, err := store.Stats(ctx, s.grace)
	if err != nil {
		return err
	}
	now := st.Now // the database's clock, which every lease time comes from
	var rep statusReport
	rep.Time = now.UTC()
	rep.Keys = keyCounts{Pending: st.Pending, Completed: st.Completed, Failed: st.Failed, Total: st.Total()}
	if !st.OldestPending.IsZero() {
		t := st.OldestPending.UTC()
		rep.Pending.OldestPending = &t
		rep.Pending.OldestPendingAgeSeconds = now.Sub(t).Round(time.Millisecond).Seconds()
	}
	rep.Pending.Stuck, rep.Pending.GraceSeconds, rep.Pending.MaybeCharged = st.Stuck, s.grace.Seconds(), st.MaybeCharged
	rep.Pending.LookupBackedOff = st.LookupBackedOff
	rep.Completed.LastMinute, rep.Completed.LastHour, rep.Completed.DeclinedLastHour = st.CompletedLastMinute, st.CompletedLastHour, st.DeclinedLastHour
	if ib, err := s.intakeBacklog(ctx); err != nil {
		rep.Errors = append(rep.Errors, "intake: "+err.Error())
	} else {
		ic := &intakeCounts{Waiting: ib.Waiting, Rejected: ib.Rejected}
		if !ib.Oldest.IsZero() {
			t := ib.Oldest.UTC()
			ic.OldestWaiting, ic.OldestAgeSeconds = &t, max(ib.Now.Sub(t), 0).Round(time.Millisecond).Seconds()
		}
		rep.Intake = ic
	}
	if ob, err := store.OutcomeBacklog(ctx); err != nil {
		rep.Errors = append(rep.Errors, "outcome events: "+err.Error())
	} else {
		rep.Outcomes = &outcomeCounts{Unrelayed: ob.Unrelayed}
		if !ob.Oldest.IsZero() {
			rep.Outcomes.OldestAgeSeconds = max(ob.Now.Sub(ob.Oldest), 0).Round(time.Millisecond).Seconds()
		}
	}
	// What the workers note for the gateway's GET: why payments wait.
	if notes, err := pgstore.New(pool, pgstore.Config{}); err != nil {
		return err
	} else if p, ok, err := notes.WorkerPauses(ctx); err != nil {
		rep.Errors = append(rep.Errors, "workers' notes: "+err.Error())
	} else if ok {
		rep.Waiting = &workersWaiting{Cause: p.Cause, Since: p.Since, Workers: p.Workers}
		if !p.RetryAt.IsZero() {
			rep.Waiting.RetryAt = &p.RetryAt
		}
	}

	if nc, err := s.nats.connect("paydedup-status"); err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	} else {
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		if counts, err := dlq.Counts(ctx, js, s.streams.cfg); err != nil {
			rep.Errors = append(rep.Errors, "dead letters: "+err.Error())
		} else {
			dl := &deadLetterCounts{Stream: s.streams.cfg.DLQStream, ByReason: map[string]uint64{}}
			for reason, n := range counts {
				dl.ByReason[termSafe(reason, false)] += n // a subject token anyone on the DLQ's subjects chose
				dl.Total += n
			}
			rep.DeadLetters = dl
		}
		if cs, err := stream.ConsumerState(ctx, js, s.streams.cfg); err != nil {
			rep.Errors = append(rep.Errors, "consumer: "+err.Error())
		} else {
			rep.Consumer = &cs
		}
	}

	if s.json {
		enc := json.NewEncoder(s.app.out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := s.print(s.app.out, rep); err != nil {
		return err
	}
	if len(rep.Errors) > 0 {
		return fmt.Errorf("status: incomplete: %d part(s) could not be read", len(rep.Errors))
	}
	return nil
}

// intakeBacklog reads the intake's backlog on a connection of its own.
func (s *statusCmd) intakeBacklog(ctx context.Context) (intake.Backlog, error) {
	pool, err := pg.Connect(ctx, s.db.url, pg.WithMaxConns(1))
	if err != nil {
		return intake.Backlog{}, err
	}
	defer pool.Close()
	st, err := intake.NewStore(pool, 0)
	if err != nil {
		return intake.Backlog{}, err
	}
	return st.Backlog(ctx)
}

func (s *statusCmd) print(out io.Writer, rep statusReport) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "paydedup status at %s\n\n", rep.Time.Format(time.RFC3339))
	fmt.Fprintln(w, "IDEMPOTENCY KEYS\tROWS")
	fmt.Fprintf(w, "completed\t%d\n", rep.Keys.Completed)
	fmt.Fprintf(w, "pending\t%d\n", rep.Keys.Pending)
	fmt.Fprintf(w, "failed\t%d\n", rep.Keys.Failed)
	fmt.Fprintf(w, "total\t%d\n\n", rep.Keys.Total)

	fmt.Fprintln(w, "PENDING\t")
	if rep.Pending.OldestPending == nil {
		fmt.Fprintln(w, "oldest pending\tnone")
	} else {
		age := time.Duration(rep.Pending.OldestPendingAgeSeconds * float64(time.Second)).Round(time.Second)
		fmt.Fprintf(w, "oldest pending\t%s ago (created %s)\n", age, rep.Pending.OldestPending.Format(time.RFC3339))
	}
	fmt.Fprintf(w, "stuck\t%d\t(pending for more than %s)\n", rep.Pending.Stuck, s.grace)
	fmt.Fprintf(w, "lookups backed off\t%d\t(the provider's lookups failed; retried with back-off)\n", rep.Pending.LookupBackedOff)
	fmt.Fprintf(w, "maybe charged\t%d\t(outcome unknown; a redelivery or the reconciler resolves them)\n\n", rep.Pending.MaybeCharged)

	fmt.Fprintln(w, "COMPLETED\tOUTCOMES")
	fmt.Fprintf(w, "last minute\t%d\n", rep.Completed.LastMinute)
	fmt.Fprintf(w, "last hour\t%d\t(%d declined)\n\n", rep.Completed.LastHour, rep.Completed.DeclinedLastHour)

	if ic := rep.Intake; ic != nil {
		fmt.Fprintln(w, "INTAKE (publishers' committed commands)\tROWS")
		fmt.Fprintf(w, "waiting\t%d\t(committed, not yet published to the payments stream)\n", ic.Waiting)
		if ic.OldestWaiting != nil {
			age := time.Duration(ic.OldestAgeSeconds * float64(time.Second)).Round(time.Second)
			fmt.Fprintf(w, "oldest waiting\t%s ago\t(committed %s)\n", age, ic.OldestWaiting.Format(time.RFC3339))
		}
		fmt.Fprintf(w, "rejected\t%d\t(not valid commands, never published: SELECT * FROM intake_commands WHERE rejected_at IS NOT NULL)\n\n", ic.Rejected)
	}
	if oc := rep.Outcomes; oc != nil {
		fmt.Fprintln(w, "OUTCOME EVENTS\tROWS")
		fmt.Fprintf(w, "unrelayed\t%d\t(oldest %s ago)\n\n", oc.Unrelayed,
			time.Duration(oc.OldestAgeSeconds*float64(time.Second)).Round(time.Second))
	}
	if dl := rep.DeadLetters; dl != nil {
		fmt.Fprintf(w, "DEAD LETTERS (%s)\tMESSAGES\n", dl.Stream)
		reasons := make([]string, 0, len(dl.ByReason))
		for r := range dl.ByReason {
			reasons = append(reasons, r)
		}
		slices.Sort(reasons)
		for _, r := range reasons {
			fmt.Fprintf(w, "%s\t%d\n", r, dl.ByReason[r])
		}
		fmt.Fprintf(w, "total\t%d\n\n", dl.Total)
	}
	if p := rep.Waiting; p != nil {
		retry := ""
		if p.RetryAt != nil {
			retry = ", trying again at " + p.RetryAt.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "payments wait\t%s\t(%d workers, for %s%s)\n\n", termSafe(p.Cause, false), p.Workers, rep.Time.Sub(p.Since).Round(time.Second), retry)
	}
	if c := rep.Consumer; c != nil {
		fmt.Fprintf(w, "CONSUMER %s ON %s\tMESSAGES\n", c.Durable, c.Stream)
		fmt.Fprintf(w, "pending\t%d\t(not yet delivered)\n", c.NumPending)
		fmt.Fprintf(w, "ack pending\t%d\t(delivered, not yet acked: in work or waiting for a redelivery)\n", c.NumAckPending)
		fmt.Fprintf(w, "redelivered\t%d\n", c.NumRedelivered)
		fmt.Fprintf(w, "stream holds\t%d\t(of %s messages; %s of %s bytes: full, it refuses publishes)\n", c.StreamMessages,
			bound(c.StreamMaxMsgs), fill(int64(c.StreamBytes), c.StreamMaxBytes), bound(c.StreamMaxBytes))
		if !c.OldestUnsettled.IsZero() {
			fmt.Fprintf(w, "oldest unsettled\t%s\t(stored %s)\n", time.Since(c.OldestUnsettled).Round(time.Second), c.OldestUnsettled.Format(time.RFC3339))
		}
		for _, l := range c.Lanes {
			fmt.Fprintf(w, "lane %s\t%d\t(pending; %d in work: served beside the backlog, not behind it)\n", termSafe(l.Subject, false), l.NumPending, l.NumAckPending)
		}
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "\nerror: %s\n", e)
	}
	return w.Flush()
}

// bound prints a stream bound: "no bound" for -1.
func bound(n int64) string {
	if n < 0 {
		return "no bound"
	}
	return strconv.FormatInt(n, 10)
}

// fill prints n and, under a bound, its share of it.
func fill(n, limit int64) string {
	if limit <= 0 {
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("%d (%.1f%%)", n, 100*float64(n)/float64(limit))
}
