// Package audit proves exactly-once against the provider's own records: it
// lists the payment intents the provider created in a window, matches them
// with the payments ledger by their metadata (merchant_id, idempotency_key),
// and reports every disagreement: a key charged twice, an intent the ledger
// does not know, a ledger row whose intent the provider does not have, and
// amounts, currencies or outcomes that differ; and the same of the
// refunds of every charged payment (refund.go): a refund made twice, one
// the ledger lacks, one the provider lacks, amounts or outcomes that
// differ. It reads and never writes.
// `paydedup audit` runs it; the demo and the chaos harness end with it.
package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// Provider is what the audit reads of the payment provider: its intents by
// creation time, and one by id. stripe.Client and stripesim.Client
// implement it.
type Provider interface {
	ListIntents(ctx context.Context, req provider.ListRequest) iter.Seq2[provider.Intent, error]
	GetIntent(ctx context.Context, id string) (provider.Intent, error)
}

// Ledger is what the audit reads of the ledger; *dedup.Store implements it.
type Ledger interface {
	PaymentsBetween(ctx context.Context, from, to time.Time, merchantID string) ([]ledger.Payment, error)
	PaymentsFor(ctx context.Context, refs []ledger.KeyRef) ([]ledger.Payment, error)
	GetMany(ctx context.Context, refs []ledger.KeyRef) ([]ledger.Record, error)
}

// Defaults for Config.
const (
	// DefaultMargin widens the list of intents on both sides of the window.
	// A ledger row is written when its key completes, after its intent was
	// created: within the provider call's timeout for the worker, or when
	// the reconciler resolves a crash (minutes). An intent created up to
	// the margin before the window is still found by list; one older than
	// that is retrieved by id, so the margin saves calls, not findings.
	DefaultMargin = time.Hour
	// DefaultSettle is how far before now a window should end (`paydedup
	// audit` ends it there unless --until says otherwise): a payment in
	// flight has an intent and no ledger row yet, and the reconciler
	// resolves a crashed one within minutes (the stuck-pending alert fires
	// at 15 minutes).
	DefaultSettle = 15 * time.Minute
	// DefaultTries and DefaultRetryWait: see Config.
	DefaultTries     = 5
	DefaultRetryWait = 200 * time.Millisecond
)

// Config is one audit: the window [Since, Until) of ledger rows and intents,
// by creation time.
type Config struct {
	Since, Until time.Time
	// MerchantID limits the audit to one merchant; empty for all.
	MerchantID string
	// Margin is DefaultMargin when 0.
	Margin time.Duration
	// Tries bounds the provider calls for one page or one intent in a row
	// (DefaultTries when 0): a list only reads, so a failed page is asked
	// again, the list resuming after the last intent received.
	Tries int
	// RetryWait is the first pause before a retry, doubling after each
	// (DefaultRetryWait when 0).
	RetryWait time.Duration
}

// Validate reports what is wrong with the window.
func (c Config) Validate() error {
	switch {
	case c.Since.IsZero() || c.Until.IsZero():
		return errors.New("audit: the window needs both ends")
	case !c.Since.Before(c.Until):
		return fmt.Errorf("audit: the window [%s, %s) is empty: since must be before until", c.Since.Format(time.RFC3339), c.Until.Format(time.RFC3339))
	case c.Margin < 0:
		return fmt.Errorf("audit: margin %v is negative", c.Margin)
	case c.Tries < 0 || c.RetryWait < 0:
		return fmt.Errorf("audit: tries %d and retry wait %v must not be negative", c.Tries, c.RetryWait)
	}
	return nil
}

// Kind names a finding.
type Kind string

// The findings. Each is drift: the ledger and the provider disagree. A
// "possible" charge is an intent still processing: money that may yet move.
const (
	// DoubleCharge: two or more charged intents for one key.
	DoubleCharge Kind = "double_charge"
	// PossibleDoubleCharge: two or more intents for one key that charged
	// or may still charge (processing), not all of them charged yet.
	PossibleDoubleCharge Kind = "possible_double_charge"
	// LostCharge: the ledger says declined or failed, and its intent
	// charged: money moved that the ledger denies.
	LostCharge Kind = "lost_charge"
	// PossibleLostCharge: the ledger says declined or failed, and its
	// intent is processing: money may still move that the ledger denies.
	PossibleLostCharge Kind = "possible_lost_charge"
	// UnrecordedCharge: a charged intent for a key whose ledger row names
	// another intent (or none): money moved that the ledger does not show.
	UnrecordedCharge Kind = "unrecorded_charge"
	// PossibleUnrecordedCharge: the same for an intent still processing.
	PossibleUnrecordedCharge Kind = "possible_unrecorded_charge"
	// MissingLedger: intents with our metadata and no ledger row for their
	// key (a payment the provider has and we do not know the outcome of).
	MissingLedger Kind = "missing_ledger"
	// MissingIntent: a ledger row whose intent the provider does not have
	// (or has under another key).
	MissingIntent Kind = "missing_intent"
	// SuccessNotCharged: the ledger says succeeded, and its intent moved
	// no money (declined, canceled, never confirmed).
	SuccessNotCharged Kind = "success_not_charged"
	// SuccessUnsettled: the ledger says succeeded, and its intent is still
	// processing: the money may yet fail to arrive.
	SuccessUnsettled Kind = "success_unsettled"
	// AmountMismatch, CurrencyMismatch: the ledger row and its intent
	// disagree on what was charged.
	AmountMismatch   Kind = "amount_mismatch"
	CurrencyMismatch Kind = "currency_mismatch"
	// UnsettledCharge, UnsettledFailure: the ledger still says processing,
	// and its intent has charged, or has ended without money: the webhook
	// or the reconciler has yet to settle the row.
	UnsettledCharge  Kind = "unsettled_charge"
	UnsettledFailure Kind = "unsettled_failure"
	// ExtraIntent: an intent that moved no money, for a key whose ledger
	// row names another: a second provider request for one payment, which
	// one provider key per payment should make impossible.
	ExtraIntent Kind = "extra_intent"
	// UnrecordedCapture: the ledger says authorized (money held, not
	// moved), and its intent was captured (succeeded), or may have been
	// (processing): money moved that the ledger holds as only authorized.
	// A capture made through paydedup moves the row to succeeded; one
	// made elsewhere (the dashboard) never does.
	UnrecordedCapture Kind = "unrecorded_capture"
	// UnsettledCancel: the ledger still says authorized, and its intent
	// holds no money: the authorization was voided at the provider, or
	// its capture window ran out. The webhook's recheck (the reconciler's
	// retrieve) has yet to record it canceled; no money moved.
	UnsettledCancel Kind = "unsettled_cancel"
	// CanceledButCharged: the ledger says canceled (the authorization
	// voided), and its intent was captured, still holds the money for
	// capture, or is processing: money moved, or may still move, that the
	// ledger says was released.
	CanceledButCharged Kind = "canceled_but_charged"
)

// Kinds lists every Kind, most serious first.
var Kinds = []Kind{DoubleCharge, PossibleDoubleCharge, LostCharge, UnrecordedCharge, PossibleLostCharge, PossibleUnrecordedCharge,
	MissingLedger, MissingIntent, SuccessNotCharged, SuccessUnsettled, AmountMismatch, CurrencyMismatch,
	UnrecordedCapture, CanceledButCharged,
	UnsettledCharge, UnsettledFailure, UnsettledCancel, ExtraIntent,
	DoubleRefund, UnrecordedRefund, MissingRefund, RefundMismatch, UnsettledRefund}

// Severity says how urgent a finding is.
type Severity string

const (
	// Critical: money moved, or may still move, that the ledger does not
	// show, or the ledger shows money that did not move.
	Critical Severity = "critical"
	// Warning: the ledger lags the provider (a settle still to come), or
	// a provider request moved no money; look if it persists.
	Warning Severity = "warning"
)

// Severity is the kind's severity.
func (k Kind) Severity() Severity {
	switch k {
	case UnsettledCharge, UnsettledFailure, UnsettledCancel, ExtraIntent, UnsettledRefund:
		return Warning
	}
	return Critical
}

// money is what an intent's status says of the money: none moved, some may
// still move, or it moved (captured, or held for capture).
type money int

const (
	noMoney money = iota
	mayMove
	moved
)

// intentMoney classes every status of a Stripe PaymentIntent. A status not
// in it is taken as mayMove: an unknown means "may have happened".
var intentMoney = map[string]money{
	"requires_payment_method": noMoney, // declined, or a bank debit that failed
	"requires_confirmation":   noMoney,
	"requires_action":         noMoney, // the adapter cancels it
	"canceled":                noMoney,
	"processing":              mayMove,
	"requires_capture":        moved,
	"succeeded":               moved,
}

// StatusFinding is the finding of a ledger row whose status is
// ledgerStatus and whose own intent's is intentStatus (statusMatrix); the
// empty Kind where they agree.
func StatusFinding(ledgerStatus, intentStatus string) Kind {
	if ledgerStatus == ledger.PaymentAuthorized && intentStatus == "requires_capture" {
		// The one cell where moved money is not enough: an authorization
		// is held for capture, not captured (an unrecorded capture).
		return ""
	}
	return statusMatrix[ledgerStatus][moneyOf(provider.Intent{Status: intentStatus})]
}

// moneyOf is in's money.
func moneyOf(in provider.Intent) money {
	if m, ok := intentMoney[in.Status]; ok {
		return m
	}
	return mayMove
}

// statusMatrix is what a ledger row's status and its own intent's money
// find: the empty Kind where they agree. Every ledger status the schema
// allows is a row; with intentMoney it compares every ledger status with
// every intent status. An authorized row agrees with an intent held for
// capture (requires_capture), and finds a captured one (StatusFinding).
//
//	ledger \ intent  noMoney              mayMove (processing)  moved (succeeded, requires_capture)
//	succeeded        success_not_charged  success_unsettled     -
//	declined         -                    possible_lost_charge  lost_charge
//	failed           -                    possible_lost_charge  lost_charge
//	processing       unsettled_failure    -                     unsettled_charge
//	authorized       unsettled_cancel     unrecorded_capture    unrecorded_capture (succeeded), - (requires_capture)
//	canceled         -                    canceled_but_charged  canceled_but_charged
var statusMatrix = map[string][3]Kind{
	//                     noMoney            mayMove             moved
	ledger.PaymentSucceeded:  {SuccessNotCharged, SuccessUnsettled, ""},
	ledger.PaymentDeclined:   {"", PossibleLostCharge, LostCharge},
	ledger.PaymentFailed:     {"", PossibleLostCharge, LostCharge},
	ledger.PaymentProcessing: {UnsettledFailure, "", UnsettledCharge},
	ledger.PaymentAuthorized: {UnsettledCancel, UnrecordedCapture, UnrecordedCapture},
	ledger.PaymentCanceled:   {"", CanceledButCharged, CanceledButCharged},
}

// Finding is one disagreement, about one key.
type Finding struct {
	Kind           Kind     `json:"kind"`
	Severity       Severity `json:"severity"`
	MerchantID     string   `json:"merchant_id"`
	IdempotencyKey string   `json:"idempotency_key"`
	// IntentIDs are the provider's intents the finding is about.
	IntentIDs []string `json:"intent_ids,omitempty"`
	// ChargeID is the ledger row's charge id, when there is a row.
	ChargeID string `json:"charge_id,omitempty"`
	// RefundIDs are the provider's refunds a refund finding is about; its
	// IdempotencyKey is then the refund's key, ChargeID its payment's
	// intent.
	RefundIDs []string `json:"refund_ids,omitempty"`
	// Detail says what disagrees, in words.
	Detail string `json:"detail"`
}

// Report is an audit's result.
type Report struct {
	Since      time.Time `json:"since"`
	Until      time.Time `json:"until"`
	MerchantID string    `json:"merchant_id,omitempty"`
	// MarginSeconds is how far the list of intents reached outside the
	// window on each side.
	MarginSeconds float64 `json:"margin_seconds"`
	// Intents counts the listed intents with our metadata created in the
	// window (by whole seconds: one of the second Since falls in counts);
	// Foreign those without it (another system's, on the same account),
	// which the audit leaves alone.
	Intents int `json:"intents"`
	Foreign int `json:"foreign"`
	// LedgerRows counts the ledger rows created in the window.
	LedgerRows int `json:"ledger_rows"`
	// Keys counts the keys audited: those of the window's intents and
	// ledger rows.
	Keys int `json:"keys"`
	// Retrieved counts intents fetched by id (created outside the list's
	// reach).
	Retrieved int `json:"retrieved"`
	// Refunds counts the provider's refunds of the audited payments
	// (those the ledger holds as succeeded), LedgerRefunds the ledger's;
	// both 0 when the provider or the ledger cannot list refunds.
	Refunds       int       `json:"refunds"`
	LedgerRefunds int       `json:"ledger_refunds"`
	Findings      []Finding `json:"findings"`
}

// Drift reports whether the audit found anything.
func (r *Report) Drift() bool { return len(r.Findings) > 0 }

// Counts returns the number of findings of every kind, zeros included.
func (r *Report) Counts() map[Kind]int {
	m := make(map[Kind]int, len(Kinds))
	for _, k := range Kinds {
		m[k] = 0
	}
	for _, f := range r.Findings {
		m[f.Kind]++
	}
	return m
}

// Summary is one line: the findings by kind, or "no drift".
func (r *Report) Summary() string {
	if !r.Drift() {
		return "no drift"
	}
	counts := r.Counts()
	var parts []string
	for _, k := range Kinds {
		if n := counts[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
	}
	return strings.Join(parts, ", ")
}

// ErrDrift is wrapped by the error of a run that found drift (see
// DriftError).
var ErrDrift = errors.New("the ledger and the provider disagree")

// DriftError returns nil for a clean report, else an error wrapping ErrDrift
// that names the findings by kind.
func (r *Report) DriftError() error {
	if !r.Drift() {
		return nil
	}
	return fmt.Errorf("audit: DRIFT: %w in [%s, %s): %s", ErrDrift,
		r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339), r.Summary())
}

// keyAudit is what the audit gathers about one key.
type keyAudit struct {
	ref     ledger.KeyRef
	intents []provider.Intent
	row     *ledger.Payment
	// named is the intent the row names, as the provider has it (nil
	// when it has none): its refunds were created after it.
	named *provider.Intent
}

// Run audits cfg's window. An error means the audit could not read
// everything it needs (a failed page, an unreachable database) and the
// report is withheld: a partial list would report drift that is not there.
func Run(ctx context.Context, prov Provider, book Ledger, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	margin := cmp.Or(cfg.Margin, DefaultMargin)
	rep := &Report{Since: cfg.Since, Until: cfg.Until, MerchantID: cfg.MerchantID, MarginSeconds: margin.Seconds(), Findings: []Finding{}}
	// An intent's created is in whole seconds (Stripe's), so one made in
	// the window's first second reads as made before Since: an intent is
	// the window's when its second overlaps the window. (Taken for one
	// just outside, its orphan or second charge would go unseen; a key it
	// brings in from just before is matched by key like any other.)
	firstSecond := cfg.Since.Truncate(time.Second)
	inWindow := func(created time.Time) bool { return !created.Before(firstSecond) && created.Before(cfg.Until) }

	keys := map[ledger.KeyRef]*keyAudit{}
	get := func(ref ledger.KeyRef) *keyAudit {
		k, ok := keys[ref]
		if !ok {
			k = &keyAudit{ref: ref}
			keys[ref] = k
		}
		return k
	}
	// Intents within the margin: they settle the keys of the window, but
	// only the window's own intents bring a key in.
	var around []provider.Intent
	r := retrier{tries: cmp.Or(cfg.Tries, DefaultTries), wait: cmp.Or(cfg.RetryWait, DefaultRetryWait)}
	listed, err := r.list(ctx, prov, provider.ListRequest{From: cfg.Since.Add(-margin), To: cfg.Until.Add(margin)})
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	for _, in := range listed {
		switch {
		case !in.Ours():
			if inWindow(in.Created) {
				rep.Foreign++
			}
		case cfg.MerchantID != "" && in.MerchantID != cfg.MerchantID:
		case inWindow(in.Created):
			rep.Intents++
			k := get(ledger.KeyRef{MerchantID: in.MerchantID, IdempotencyKey: in.IdempotencyKey})
			k.intents = append(k.intents, in)
		default:
			around = append(around, in)
		}
	}

	rows, err := book.PaymentsBetween(ctx, cfg.Since, cfg.Until, cfg.MerchantID)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	rep.LedgerRows = len(rows)
	for i := range rows {
		get(ledger.KeyRef{MerchantID: rows[i].MerchantID, IdempotencyKey: rows[i].IdempotencyKey}).row = &rows[i]
	}
	for _, in := range around {
		if k, ok := keys[ledger.KeyRef{MerchantID: in.MerchantID, IdempotencyKey: in.IdempotencyKey}]; ok {
			k.intents = append(k.intents, in)
		}
	}
	// The window's intents whose row was written after the window ends (or
	// before it starts: a key completed before its intent's clock second).
	var unrowed []ledger.KeyRef
	for ref, k := range keys {
		if k.row == nil {
			unrowed = append(unrowed, ref)
		}
	}
	if len(unrowed) > 0 {
		late, err := book.PaymentsFor(ctx, unrowed)
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		for i := range late {
			keys[ledger.KeyRef{MerchantID: late[i].MerchantID, IdempotencyKey: late[i].IdempotencyKey}].row = &late[i]
		}
	}
	// What the idempotency table says of keys that still have no row: a
	// pending row is being (or waiting to be) resolved.
	states := map[ledger.KeyRef]ledger.Record{}
	unrowed = unrowed[:0]
	for ref, k := range keys {
		if k.row == nil {
			unrowed = append(unrowed, ref)
		}
	}
	if len(unrowed) > 0 {
		recs, err := book.GetMany(ctx, unrowed)
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		for _, r := range recs {
			states[ledger.KeyRef{MerchantID: r.MerchantID, IdempotencyKey: r.IdempotencyKey}] = r
		}
	}

	ordered := make([]*keyAudit, 0, len(keys))
	for _, k := range keys {
		ordered = append(ordered, k)
	}
	slices.SortFunc(ordered, func(a, b *keyAudit) int {
		return cmp.Or(strings.Compare(a.ref.MerchantID, b.ref.MerchantID), strings.Compare(a.ref.IdempotencyKey, b.ref.IdempotencyKey))
	})
	rep.Keys = len(ordered)
	for _, k := range ordered {
		found, err := k.audit(ctx, r.getter(prov), states, rep)
		if err != nil {
			return nil, err
		}
		rep.Findings = append(rep.Findings, found...)
	}
	_, each := prov.(RefundProvider)
	_, paged := prov.(AccountRefundProvider)
	rl, ok := book.(RefundLedger)
	if (each || paged) && ok {
		found, err := auditRefunds(ctx, prov, rl, r, cfg.Since.Add(-margin), ordered, rep)
		if err != nil {
			return nil, err
		}
		rep.Findings = append(rep.Findings, found...)
	}
	return rep, nil
}

// audit checks one key.
func (k *keyAudit) audit(ctx context.Context, getIntent func(context.Context, string) (provider.Intent, error), states map[ledger.KeyRef]ledger.Record, rep *Report) ([]Finding, error) {
	slices.SortFunc(k.intents, func(a, b provider.Intent) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
	})
	k.intents = slices.CompactFunc(k.intents, func(a, b provider.Intent) bool { return a.ID == b.ID })
	var out []Finding
	add := func(kind Kind, ids []string, format string, args ...any) {
		f := Finding{Kind: kind, Severity: kind.Severity(), MerchantID: k.ref.MerchantID, IdempotencyKey: k.ref.IdempotencyKey, IntentIDs: ids, Detail: fmt.Sprintf(format, args...)}
		if k.row != nil {
			f.ChargeID = k.row.ChargeID
		}
		out = append(out, f)
	}

	// Every intent that charged or may still charge is a possible charge:
	// two under one key are a double charge, or may become one.
	var possible []provider.Intent
	allMoved := true
	for _, in := range k.intents {
		if m := moneyOf(in); m != noMoney {
			possible = append(possible, in)
			allMoved = allMoved && m == moved
		}
	}
	switch {
	case len(possible) > 1 && allMoved:
		add(DoubleCharge, ids(possible), "%d charged intents for one key: %s", len(possible), describe(possible))
	case len(possible) > 1:
		add(PossibleDoubleCharge, ids(possible), "%d intents for one key charged or may still charge: %s", len(possible), describe(possible))
	}

	if k.row == nil {
		state := "no idempotency row"
		if rec, ok := states[k.ref]; ok {
			state = "its idempotency row is " + string(rec.Status)
			if rec.LastError != "" {
				state += " (last error: " + rec.LastError + ")"
			}
		}
		add(MissingLedger, ids(k.intents), "no ledger row for %s; %s", describe(k.intents), state)
		return out, nil
	}

	row := k.row
	var mine *provider.Intent
	if row.ChargeID != "" {
		if i := slices.IndexFunc(k.intents, func(in provider.Intent) bool { return in.ID == row.ChargeID }); i >= 0 {
			mine = &k.intents[i]
		} else {
			in, err := getIntent(ctx, row.ChargeID)
			rep.Retrieved++
			switch {
			case errors.Is(err, provider.ErrNoSuchIntent):
				add(MissingIntent, nil, "the ledger row (%s %d %s) names %s, which the provider does not have", row.Status, row.Amount, row.Currency, row.ChargeID)
			case err != nil:
				return nil, fmt.Errorf("audit: %w", err)
			case in.MerchantID != k.ref.MerchantID || in.IdempotencyKey != k.ref.IdempotencyKey:
				k.named = &in
				add(MissingIntent, []string{in.ID}, "the ledger row names %s, which the provider holds for merchant %q key %q", in.ID, in.MerchantID, in.IdempotencyKey)
			default:
				mine = &in
			}
		}
	}
	if mine != nil {
		k.named = mine
		if mine.Amount != row.Amount {
			add(AmountMismatch, []string{mine.ID}, "the ledger has %d %s, the intent %d %s", row.Amount, row.Currency, mine.Amount, mine.Currency)
		}
		if mine.Currency != row.Currency {
			add(CurrencyMismatch, []string{mine.ID}, "the ledger has currency %q, the intent %q", row.Currency, mine.Currency)
		}
		if kind := StatusFinding(row.Status, mine.Status); kind != "" {
			add(kind, []string{mine.ID}, "the ledger says %s, its intent %s is %s", row.Status, mine.ID, mine.Status)
		}
	}
	for _, in := range k.intents {
		m := moneyOf(in)
		switch {
		case in.ID == row.ChargeID:
		case m != noMoney && len(possible) > 1:
			// Reported as the (possible) double charge.
		case m == moved:
			add(UnrecordedCharge, []string{in.ID}, "%s is %s, and the ledger row (%s) names %s", in.ID, in.Status, row.Status, cmp.Or(row.ChargeID, "no intent"))
		case m == mayMove:
			add(PossibleUnrecordedCharge, []string{in.ID}, "%s is %s (money may still move), and the ledger row (%s) names %s", in.ID, in.Status, row.Status, cmp.Or(row.ChargeID, "no intent"))
		default:
			add(ExtraIntent, []string{in.ID}, "a second intent %s (%s) for a key whose ledger row names %s", in.ID, in.Status, cmp.Or(row.ChargeID, "no intent"))
		}
	}
	return out, nil
}

func ids(ins []provider.Intent) []string {
	out := make([]string, len(ins))
	for i, in := range ins {
		out[i] = in.ID
	}
	return out
}

func describe(ins []provider.Intent) string {
	parts := make([]string, len(ins))
	for i, in := range ins {
		parts[i] = fmt.Sprintf("%s %s %d %s", in.ID, in.Status, in.Amount, in.Currency)
	}
	return strings.Join(parts, ", ")
}

// retrier repeats the provider's reads: each is safe to repeat.
type retrier struct {
	tries int
	wait  time.Duration
}

func (r retrier) backoff(ctx context.Context) backoff.BackOffContext {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = r.wait, 30*r.wait, 0
	return backoff.WithContext(b, ctx)
}

// list returns every intent of req, newest first; after a failed page it
// lists again from the last intent received, up to r.tries failures in a
// row.
func (r retrier) list(ctx context.Context, prov Provider, req provider.ListRequest) ([]provider.Intent, error) {
	return pages(ctx, r, func(after string) iter.Seq2[provider.Intent, error] {
		if after != "" {
			req.StartingAfter = after
		}
		return prov.ListIntents(ctx, req)
	}, func(in provider.Intent) string { return in.ID })
}

// pages returns every item of a paged list, in its order: list(after)
// lists from the start ("") or after the item whose id is after, so that
// after a failed page it lists again from the last item received, up to
// r.tries failures in a row.
func pages[T any](ctx context.Context, r retrier, list func(after string) iter.Seq2[T, error], id func(T) string) ([]T, error) {
	var out []T
	after := ""
	b := r.backoff(ctx)
	for fails := 0; ; {
		var failed error
		for it, err := range list(after) {
			if err != nil {
				failed = err
				break
			}
			out = append(out, it)
			after = id(it)
			fails = 0
			b.Reset()
		}
		if failed == nil {
			return out, nil
		}
		if fails++; fails >= r.tries || ctx.Err() != nil {
			return nil, failed
		}
		if err := sleep(ctx, b.NextBackOff()); err != nil {
			return nil, failed
		}
	}
}

// getter is GetIntent, retried up to r.tries times; "no such intent" is an
// answer, not a failure.
func (r retrier) getter(prov Provider) func(context.Context, string) (provider.Intent, error) {
	return func(ctx context.Context, id string) (provider.Intent, error) {
		b := r.backoff(ctx)
		for fails := 1; ; fails++ {
			in, err := prov.GetIntent(ctx, id)
			if err == nil || errors.Is(err, provider.ErrNoSuchIntent) || fails >= r.tries || ctx.Err() != nil {
				return in, err
			}
			if serr := sleep(ctx, b.NextBackOff()); serr != nil {
				return in, err
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
