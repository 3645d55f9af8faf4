package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/payment"
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
  - rows by kind: charges' and authorizations' keys by status, refunds',
    captures' and cancels' rows by status (pending, unknown: an answer
    lost, looked up before any re-call; processing; succeeded; failed;
    refused), how many of each kind are stuck (a key pending for more than
    --grace, an operation pending past its lease) and how many of each
    kind's commands are dead letters (waiting for an operator, or
    refused); and the ledger's authorizations: held, captured, canceled;
  - dead letters by reason and by kind;
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
	// Kinds counts each kind's rows by status (charge, authorize, refund,
	// capture, cancel), its stuck ones and its dead letters;
	// Authorizations what the ledger holds of authorizations.
	Kinds          map[string]*kindCounts `json:"kinds"`
	Authorizations map[string]int64       `json:"authorizations"`
	Intake         *intakeCounts          `json:"intake"`
	Outcomes       *outcomeCounts         `json:"outcome_events"`
	DeadLetters    *deadLetterCounts      `json:"dead_letters"`
	Consumer       *stream.ConsumerStats  `json:"consumer"`
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
	// ByKind counts the letters by the kind their body names, over the
	// first KindsRead letters (at most statusLetterLimit; less than Total
	// when more are filed).
	ByKind    map[string]uint64 `json:"by_kind"`
	KindsRead uint64            `json:"by_kind_read"`
}

// kindCounts is one kind's rows: by status, stuck (a payment's key
// pending for longer than --grace; a refund, capture or cancel pending
// past its lease), and its dead letters (filed for an operator or
// refused), absent when the DLQ could not be read.
type kindCounts struct {
	ByStatus     map[string]int64 `json:"by_status"`
	Stuck        int64            `json:"stuck"`
	DeadLettered *uint64          `json:"dead_lettered,omitempty"`
}

// kindOrder is the order the kinds are printed in.
var kindOrder = []string{payment.KindCharge, payment.KindAuthorize, payment.KindCapture, payment.KindCancel, payment.KindRefund}

// statusLetterLimit bounds the dead letters status reads to count them by
// kind.
const statusLetterLimit = 10000

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
	if ks, err := store.KindStats(ctx, s.grace); err != nil {
		rep.Errors = append(rep.Errors, "rows by kind: "+err.Error())
	} else {
		rep.Kinds, rep.Authorizations = map[string]*kindCounts{}, ks.Authorized
		for kind, kc := range ks.Kinds {
			rep.Kinds[kind] = &kindCounts{ByStatus: kc.ByStatus, Stuck: kc.Stuck}
		}
	}
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
			if dl.Total > 0 {
				s.lettersByKind(ctx, js, dl, &rep)
			}
			for kind, kc := range rep.Kinds {
				n := dl.ByKind[kind]
				kc.DeadLettered = &n
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

// lettersByKind counts the dead letters by the kind their body names,
// over the first statusLetterLimit.
func (s *statusCmd) lettersByKind(ctx context.Context, js jetstream.JetStream, dl *deadLetterCounts, rep *statusReport) {
	letters, err := dlq.List(ctx, js, s.streams.cfg, dlq.Filter{Limit: statusLetterLimit})
	if err != nil {
		rep.Errors = append(rep.Errors, "dead letters by kind: "+err.Error())
		return
	}
	dl.ByKind = map[string]uint64{}
	for _, l := range letters {
		dl.ByKind[termSafe(cmp.Or(l.Kind, "unreadable"), false)]++
	}
	dl.KindsRead = uint64(len(letters))
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

	if len(rep.Kinds) > 0 {
		printKinds(w, rep)
	}

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
		fmt.Fprintf(w, "total\t%d\n", dl.Total)
		if len(dl.ByKind) > 0 {
			read := ""
			if dl.KindsRead < dl.Total {
				read = fmt.Sprintf(" (of the first %d)", dl.KindsRead)
			}
			fmt.Fprintf(w, "by kind%s\t%s\n", read, counts(dl.ByKind, nil))
		}
		fmt.Fprintln(w)
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

// printKinds prints each kind's rows by status, its stuck rows and its
// dead letters, and the ledger's authorizations.
func printKinds(w io.Writer, rep statusReport) {
	fmt.Fprintln(w, "BY KIND\tROWS BY STATUS\tSTUCK\tDEAD LETTERS")
	for _, kind := range kindOrder {
		kc := rep.Kinds[kind]
		if kc == nil {
			continue
		}
		dead := "-"
		if kc.DeadLettered != nil {
			dead = strconv.FormatUint(*kc.DeadLettered, 10)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", kind, counts(kc.ByStatus, kindStatusOrder[kind]), kc.Stuck, dead)
	}
	fmt.Fprintf(w, "authorizations\t%s\t\t(the ledger's: held, captured, released)\n", counts(rep.Authorizations, []string{"authorized", "captured", "canceled"}))
	fmt.Fprintf(w, "\t(stuck: a payment's key pending for more than --grace; a refund, capture or cancel pending past its lease.\n")
	fmt.Fprintf(w, "\t unknown: a call's answer lost, looked up by the reconciler before any re-call)\n\n")
}

// kindStatusOrder is the order a kind's statuses are printed in: as the
// row moves.
var kindStatusOrder = map[string][]string{
	payment.KindCharge:    {"pending", "completed", "failed"},
	payment.KindAuthorize: {"pending", "completed", "failed"},
	payment.KindCapture:   {"pending", "unknown", "succeeded", "refused"},
	payment.KindCancel:    {"pending", "unknown", "succeeded", "refused"},
	payment.KindRefund:    {"pending", "unknown", "processing", "succeeded", "failed", "refused"},
}

// counts prints "name n" pairs in order, then the names order leaves out,
// sorted.
func counts[N int64 | uint64](m map[string]N, order []string) string {
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	rest := make([]string, 0, len(m))
	for k := range m {
		if !slices.Contains(order, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
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
