// Package dlq is the operator's side of the dead-letter stream: list and
// show dead letters (List, Get), count them by reason (Counts), and replay
// them to the payments stream (Replay), refusing what a replay could harm.
// The dead-letter format itself is stream's.
package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// adminTimeout bounds one admin request to the server.
const adminTimeout = 10 * time.Second

// DefaultKeyRetention is ReplayOptions.KeyRetention's default: the
// idempotency store's default key retention (ledger.DefaultRetention, the
// worker's consumer.DefaultKeyRetention).
const DefaultKeyRetention = 48 * time.Hour

// notSetUp wraps stream.ErrNotSetUp when the stream is missing.
func notSetUp(what string, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("%s: %w", what, stream.ErrNotSetUp)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Counts returns how many dead letters the DLQ stream holds per
// reason (the last token of the subject). It wraps ErrNotSetUp when the
// stream does not exist.
func Counts(ctx context.Context, js jetstream.JetStream, cfg stream.Config) (map[string]uint64, error) {
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	dlqs, err := js.Stream(ctx, cfg.DLQStream)
	if err != nil {
		return nil, notSetUp("stream "+cfg.DLQStream, err)
	}
	info, err := dlqs.Info(ctx, jetstream.WithSubjectFilter(cfg.DLQPrefix+".>"))
	if err != nil {
		return nil, fmt.Errorf("stream %s info: %w", cfg.DLQStream, err)
	}
	counts := make(map[string]uint64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		counts[strings.TrimPrefix(subj, cfg.DLQPrefix+".")] += n
	}
	return counts, nil
}

// ---------------------------------------------------------------------------
// Reading dead letters

// Info is one dead letter as stored in the DLQ stream.
type Info struct {
	// Seq is the dead letter's sequence in the DLQ stream: the handle
	// `dlq show` and `dlq replay --seq` take.
	Seq     uint64    `json:"seq"`
	Subject string    `json:"subject"`
	Stored  time.Time `json:"stored"`
	stream.ParsedDeadLetter
	// MerchantID and IdempotencyKey are read, best effort, from the body,
	// the Idempotency-Key header and the original subject; empty when the
	// message does not say (it may be malformed: that may be why it is here).
	MerchantID     string `json:"merchant_id"`
	IdempotencyKey string `json:"idempotency_key"`
	// Kind is the command's kind read, best effort, from the body
	// (payment.KindCharge when it names none, empty when the body is not
	// a JSON object); PaymentKey the payment a refund, a capture or a
	// cancel acts on.
	Kind       string `json:"kind,omitempty"`
	PaymentKey string `json:"payment_key,omitempty"`
	// Invalid says why the Dlq-* headers could not be read; such a message
	// is listed but never replayed.
	Invalid string `json:"invalid,omitempty"`
	// Verified: its Dlq-Auth matches the configured DLQ key, so a worker
	// filed it as it is. Unverified says why not; such a letter (perhaps
	// published straight to the DLQ's subjects) is listed but never
	// replayed.
	Verified   bool   `json:"verified"`
	Unverified string `json:"unverified,omitempty"`
	// KeyID is the Dlq-Key-Id of the key that verified it; PreviousKey:
	// that key is a previous one (stream.Config.DLQPreviousKeys), so the
	// letter stops verifying when that key is dropped unless Resign signs
	// it with the current key first.
	KeyID       string      `json:"key_id,omitempty"`
	PreviousKey bool        `json:"previous_key,omitempty"`
	Header      nats.Header `json:"header,omitempty"`
	Data        []byte      `json:"-"`
}

// Filter selects dead letters.
type Filter struct {
	// Reason keeps only dead letters with this reason; empty keeps all.
	Reason string
	// Since keeps only dead letters stored at or after this time; zero
	// keeps all.
	Since time.Time
	// Limit stops after this many; 0 means no limit.
	Limit int
	// batch is how many letters one fetch asks for; dlqFetchBatch when 0.
	batch int
}

// dlqFetchBatch is how many dead letters one fetch asks for.
const dlqFetchBatch = 256

// List returns the dead letters matching f, oldest first. It
// reads them with a short-lived ephemeral consumer (no acks, one filter
// subject, so it works with nats-server 2.9) and deletes it afterwards.
func List(ctx context.Context, js jetstream.JetStream, cfg stream.Config, f Filter) ([]Info, error) {
	var out []Info
	err := eachDeadLetter(ctx, js, cfg, f, func(d Info) error {
		out = append(out, d)
		return nil
	})
	return out, err
}

// eachDeadLetter calls fn for each dead letter matching f, oldest first,
// reading them a batch at a time so that no more than one batch is held.
// It stops at the letters the stream held when it began: one filed
// meanwhile (a replayed message dead-lettered again) is left for the next
// run. An error from fn stops it and is returned.
func eachDeadLetter(ctx context.Context, js jetstream.JetStream, cfg stream.Config, f Filter, fn func(Info) error) error {
	cfg = cfg.WithDefaults()
	if f.Limit < 0 {
		return fmt.Errorf("list dead letters: negative limit %d", f.Limit)
	}
	filter := cfg.DLQPrefix + ".>"
	if f.Reason != "" {
		filter = cfg.DLQSubject(f.Reason)
	}
	cc := jetstream.ConsumerConfig{
		Description:       "paydedup dlq reader",
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		FilterSubject:     filter,
		InactiveThreshold: 5 * time.Minute, // removed by the server if we die before deleting it
		MemoryStorage:     true,
	}
	if !f.Since.IsZero() {
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &f.Since
	}
	cctx, cancel := context.WithTimeout(ctx, adminTimeout)
	cons, err := js.CreateConsumer(cctx, cfg.DLQStream, cc)
	cancel()
	if err != nil {
		return notSetUp("read stream "+cfg.DLQStream, err)
	}
	name := cons.CachedInfo().Name
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminTimeout)
		defer cancel()
		_ = js.DeleteConsumer(dctx, cfg.DLQStream, name)
	}()

	// The consumer's pending count when created bounds the read, so
	// letters filed while we read are not read (nor replayed) again.
	want := cons.CachedInfo().NumPending
	if f.Limit > 0 {
		want = min(want, uint64(f.Limit))
	}
	var seen uint64
	for seen < want {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch, err := cons.Fetch(int(min(want-seen, uint64(cmp.Or(f.batch, dlqFetchBatch)))), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("read stream %s: %w", cfg.DLQStream, err)
		}
		var letters []Info
		last := false
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			letters = append(letters, deadLetterInfo(cfg, meta.Sequence.Stream, m.Subject(), meta.Timestamp, m.Headers(), m.Data()))
			last = last || meta.NumPending == 0
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("read stream %s: %w", cfg.DLQStream, err)
		}
		if len(letters) == 0 {
			break // dead letters deleted (replayed) while we read
		}
		for _, d := range letters {
			if seen == want {
				break
			}
			seen++
			if err := fn(d); err != nil {
				return err
			}
		}
		if last {
			break // the rest were deleted meanwhile
		}
	}
	return nil
}

// Get returns one dead letter by its DLQ sequence. It wraps ErrNotFound
// when there is none.
func Get(ctx context.Context, js jetstream.JetStream, cfg stream.Config, seq uint64) (Info, error) {
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	dlqs, err := js.Stream(ctx, cfg.DLQStream)
	if err != nil {
		return Info{}, notSetUp("stream "+cfg.DLQStream, err)
	}
	raw, err := dlqs.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Info{}, fmt.Errorf("no dead letter %d in %s: %w", seq, cfg.DLQStream, ErrNotFound)
		}
		return Info{}, fmt.Errorf("get dead letter %d from %s: %w", seq, cfg.DLQStream, err)
	}
	return deadLetterInfo(cfg, raw.Sequence, raw.Subject, raw.Time, raw.Header, raw.Data), nil
}

// ErrNotFound means the DLQ stream has no message at the sequence.
var ErrNotFound = errors.New("dead letter not found")

func deadLetterInfo(cfg stream.Config, seq uint64, subject string, stored time.Time, h nats.Header, data []byte) Info {
	d := Info{Seq: seq, Subject: subject, Stored: stored, Header: h, Data: data}
	p, err := stream.ParseDeadLetter(h)
	d.ParsedDeadLetter = p
	if err != nil {
		d.Invalid = err.Error()
		if d.Reason == "" {
			d.Reason = strings.TrimPrefix(subject, cfg.DLQPrefix+".")
		}
	}
	if v, err := stream.VerifyLetter(cfg, h, data); err != nil {
		d.Unverified = err.Error()
	} else {
		d.Verified, d.KeyID, d.PreviousKey = true, v.KeyID, v.Previous
	}
	d.MerchantID, d.IdempotencyKey, d.Kind, d.PaymentKey = identify(h, data, p.OrigSubject)
	return d
}

// identify reads merchant and key from whatever the message offers, without
// validating it: the body's fields, else the Idempotency-Key header and the
// subject's last token; and the command's kind and the payment it acts on
// from the body only.
func identify(h nats.Header, data []byte, origSubject string) (merchant, key, kind, paymentKey string) {
	var body struct {
		MerchantID     any `json:"merchant_id"`
		IdempotencyKey any `json:"idempotency_key"`
		Kind           any `json:"kind"`
		PaymentKey     any `json:"payment_key"`
	}
	if json.Unmarshal(data, &body) == nil {
		merchant, _ = body.MerchantID.(string)
		key, _ = body.IdempotencyKey.(string)
		kind, _ = body.Kind.(string)
		kind = cmp.Or(kind, payment.KindCharge)
		paymentKey, _ = body.PaymentKey.(string)
	}
	key = cmp.Or(key, h.Get(stream.HeaderIdempotencyKey))
	if merchant == "" {
		if i := strings.LastIndexByte(origSubject, '.'); i >= 0 {
			merchant = origSubject[i+1:]
		}
	}
	return clipField(merchant), clipField(key), clipField(kind), clipField(paymentKey)
}

// clipField bounds a field read best effort from a letter, card numbers
// masked before the cut.
func clipField(s string) string {
	s = stream.SanitizeHeader(s)
	if c, cut := redact.Cut(s, 77); cut {
		return c + "..."
	}
	return s
}

// ---------------------------------------------------------------------------
// Replay

// ReplayOptions chooses the dead letters to replay.
type ReplayOptions struct {
	// Seqs are the DLQ sequences to replay. Either Seqs or All.
	Seqs []uint64
	// All replays every dead letter (matching Reason).
	All bool
	// Reason keeps only dead letters with this reason.
	Reason string
	// DryRun reports what would be replayed and changes nothing.
	DryRun bool
	// Force also replays reasons that cannot succeed unchanged: bad input
	// (payment.IsInputReason) and key_reused. It never overrides the key
	// retention rule, nor replays a card_data letter (its body is masked).
	Force bool
	// KeyRetention is the idempotency store's key retention: a dead letter
	// that failed longer ago than this is refused, because its key may be
	// purged and a replay could charge again. Its age runs from the earlier
	// of its authenticated Dlq-Failed-At and the stream's stored time
	// (failedAt). DefaultKeyRetention when 0.
	KeyRetention time.Duration
	// Now is the time the retention rule is judged at; time.Now() when zero.
	Now time.Time
	// Rate bounds the republishes per second, so a large replay does not
	// flood the workers and the provider; 0 is unbounded.
	Rate float64
	// OnResult, when set, is called with each letter's result as it is
	// decided (to show progress); the report has them all at the end.
	OnResult func(ReplayResult)
}

// DefaultReplayRate is the dlq replay command's default Rate.
const DefaultReplayRate = 50

// ReplayOutcome is what happened to one dead letter.
type ReplayOutcome string

// Replay outcomes.
const (
	// Replayed: republished (PubAck received), then deleted from the DLQ.
	Replayed ReplayOutcome = "replayed"
	// WouldReplay: a dry run would have replayed it.
	WouldReplay ReplayOutcome = "would_replay"
	// Skipped: its reason cannot succeed on replay; Force replays it.
	Skipped ReplayOutcome = "skipped"
	// Refused: older than the key retention, or not a readable dead letter.
	Refused ReplayOutcome = "refused"
	// NotFound: no dead letter at that sequence.
	NotFound ReplayOutcome = "not_found"
	// Failed: the republish or the delete failed; Detail says which.
	Failed ReplayOutcome = "failed"
)

// ReplayResult is the fate of one dead letter.
type ReplayResult struct {
	Seq            uint64        `json:"seq"`
	Reason         string        `json:"reason,omitempty"`
	MerchantID     string        `json:"merchant_id,omitempty"`
	IdempotencyKey string        `json:"idempotency_key,omitempty"`
	Subject        string        `json:"subject,omitempty"` // where it was (or would be) republished
	Outcome        ReplayOutcome `json:"outcome"`
	MsgID          string        `json:"msg_id,omitempty"`     // the new Nats-Msg-Id
	StreamSeq      uint64        `json:"stream_seq,omitempty"` // its sequence in the payments stream
	Detail         string        `json:"detail,omitempty"`
}

// ReplayReport lists every dead letter considered, in order, and counts
// them by outcome.
type ReplayReport struct {
	Results     []ReplayResult `json:"results"`
	Replayed    int            `json:"replayed"`
	WouldReplay int            `json:"would_replay"`
	Skipped     int            `json:"skipped"`
	Refused     int            `json:"refused"`
	NotFound    int            `json:"not_found"`
	Failed      int            `json:"failed"`
}

func (r *ReplayReport) add(res ReplayResult) {
	r.Results = append(r.Results, res)
	switch res.Outcome {
	case Replayed:
		r.Replayed++
	case WouldReplay:
		r.WouldReplay++
	case Skipped:
		r.Skipped++
	case Refused:
		r.Refused++
	case NotFound:
		r.NotFound++
	case Failed:
		r.Failed++
	}
}

// Replay republishes dead letters to their original subject and
// deletes each from the DLQ stream only after the republish's PubAck.
//
// The republished message carries the dead letter's original headers and
// body, a new Nats-Msg-Id stream.ReplayMsgID (the original id may
// still be inside the stream's duplicate window; this one makes concurrent
// replays of one letter publish it once) and Paydedup-Replay-Of; a
// Paydedup-Requeues count is dropped, so the max-deliveries net may publish
// the replay again as it would a new command.
// Postgres still guards the charge: a replay of a completed key is acked as
// a duplicate, and a crash between the PubAck and the delete at worst
// publishes it twice. Dead letters that verify with neither cfg.DLQKey nor
// one of cfg.DLQPreviousKeys, or
// were stored longer ago than opts.KeyRetention, are refused; reasons that
// cannot succeed are skipped unless opts.Force. Without a valid cfg.DLQKey
// it replays nothing and returns an error wrapping ErrDLQKey.
//
// The error is for failures that stop the whole replay (bad options, the
// DLQ stream unreachable); per-letter failures are in the report.
func Replay(ctx context.Context, js jetstream.JetStream, cfg stream.Config, opts ReplayOptions) (ReplayReport, error) {
	r, err := newReplayer(js, cfg, opts)
	if err != nil {
		return ReplayReport{}, fmt.Errorf("replay dead letters: %w", err)
	}
	// A rate-limited replay fetches about a minute of letters at a time,
	// well within the reader's inactive threshold.
	f := Filter{Reason: opts.Reason}
	if opts.Rate > 0 && !opts.DryRun {
		f.batch = int(min(max(opts.Rate*60, 1), dlqFetchBatch))
	}
	pick := func(d Info) error { return r.pick(ctx, d) }
	if err := eachChosen(ctx, r.js, r.cfg, opts.All, f, opts.Seqs, pick, r.notFound); err != nil {
		return r.rep, fmt.Errorf("replay dead letters: %w", err)
	}
	return r.rep, nil
}

// replayer is one Replay under way: its options, the DLQ stream once
// opened, the pace of its republishes, and its report so far.
type replayer struct {
	js          jetstream.JetStream
	cfg         stream.Config
	opts        ReplayOptions
	retention   time.Duration
	now         time.Time     // when the retention rule is judged
	interval    time.Duration // between republishes; 0: unbounded
	dlqs        jetstream.Stream
	lastPublish time.Time
	rep         ReplayReport
}

// newReplayer checks opts and cfg's DLQ keys, and fills in the defaults.
func newReplayer(js jetstream.JetStream, cfg stream.Config, opts ReplayOptions) (*replayer, error) {
	cfg = cfg.WithDefaults()
	if opts.All == (len(opts.Seqs) > 0) {
		return nil, errors.New("give either sequences or All")
	}
	if err := errors.Join(stream.ValidateDLQKey(cfg.DLQKey), stream.ValidateDLQPreviousKeys(cfg.DLQPreviousKeys)); err != nil {
		return nil, err
	}
	if opts.Rate < 0 {
		return nil, fmt.Errorf("negative rate %v", opts.Rate)
	}
	r := &replayer{js: js, cfg: cfg, opts: opts, retention: cmp.Or(opts.KeyRetention, DefaultKeyRetention), now: opts.Now}
	if r.now.IsZero() {
		r.now = time.Now()
	}
	if opts.Rate > 0 {
		r.interval = time.Duration(float64(time.Second) / opts.Rate)
	}
	return r, nil
}

// add reports res, and passes it to opts.OnResult.
func (r *replayer) add(res ReplayResult) {
	r.rep.add(res)
	if r.opts.OnResult != nil {
		r.opts.OnResult(res)
	}
}

// notFound reports a sequence with no dead letter.
func (r *replayer) notFound(seq uint64) {
	r.add(ReplayResult{Seq: seq, Outcome: NotFound,
		Detail: fmt.Sprintf("no dead letter %d in %s (already replayed, or expired)", seq, r.cfg.DLQStream)})
}

// pick judges a chosen letter. A letter's reason is its signed one, not
// its subject's (Dlq-Auth does not cover the subject, so a letter moved
// onto another reason's subject keeps its own); letters named by sequence
// are not filtered by reason as they are read. One of another reason is
// skipped here.
func (r *replayer) pick(ctx context.Context, d Info) error {
	if r.opts.Reason != "" && d.Reason != r.opts.Reason {
		r.add(ReplayResult{Seq: d.Seq, Reason: d.Reason, MerchantID: d.MerchantID,
			IdempotencyKey: d.IdempotencyKey, Outcome: Skipped, Detail: fmt.Sprintf("reason %s is not %s", d.Reason, r.opts.Reason)})
		return nil
	}
	return r.judge(ctx, d)
}

// judge decides a letter's fate (verdict) and, unless it is refused or
// skipped or the run is dry, replays it.
func (r *replayer) judge(ctx context.Context, d Info) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	res := ReplayResult{Seq: d.Seq, Reason: d.Reason, MerchantID: d.MerchantID, IdempotencyKey: d.IdempotencyKey, Subject: d.OrigSubject}
	if res.Outcome, res.Detail = r.verdict(d); res.Outcome == "" {
		if err := r.republish(ctx, d, &res); err != nil {
			return err
		}
	}
	r.add(res)
	return nil
}

// republish replays d (replayOne) at the run's pace, opening the DLQ
// stream on first use. An error stops the run: the stream cannot be
// opened, or ctx ended while it waited.
func (r *replayer) republish(ctx context.Context, d Info, res *ReplayResult) error {
	if err := openDLQ(ctx, r.js, r.cfg, &r.dlqs); err != nil {
		return err
	}
	if wait := time.Until(r.lastPublish.Add(r.interval)); r.interval > 0 && wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	r.lastPublish = time.Now()
	replayOne(ctx, r.js, r.dlqs, r.cfg, d, res)
	return nil
}

// verdict is a letter's fate before any republish: refused, skipped, or
// (a dry run) would be replayed, with why. An empty outcome: replay it.
func (r *replayer) verdict(d Info) (ReplayOutcome, string) {
	cfg, opts, now, retention := r.cfg, r.opts, r.now, r.retention
	switch {
	case d.Invalid != "":
		return Refused, "not a readable dead letter: " + d.Invalid
	case !d.Verified:
		// Anyone who may publish on the DLQ's subjects could forge one;
		// replay publishes with the operator's credentials.
		return Refused, d.Unverified + ": refusing to replay it"
	case d.Reason == string(payment.ReasonCardData):
		// Even with Force: the letter keeps the body with its card
		// number masked, so a replay would publish another command.
		return Refused, "card data: the message held what looks like a card number, which the letter keeps masked, so a replay would be another command; the client must send the payment anew with a payment-method token (pm_...), never the card number"
	case d.Truncated:
		return Refused, fmt.Sprintf("truncated: the letter keeps only part of the message (body of %s bytes, SHA-256 %s) to fit under max_payload: the original is %s #%d while the stream keeps it; publish it anew from there",
			d.Header.Get(stream.HeaderDLQBodyLength), d.Header.Get(stream.HeaderDLQBodySHA256), d.OrigStream, d.OrigSeq)
	case !replayTarget(cfg, d):
		// Defence in depth: replay only ever publishes payment commands.
		return Refused, fmt.Sprintf("original subject %q (stream %q) is not a payment subject %s.<merchant_id> of stream %s: refusing to publish it",
			d.OrigSubject, d.OrigStream, cfg.SubjectPrefix, cfg.Name)
	case now.Sub(failedAt(d)) > retention:
		return Refused, fmt.Sprintf("dead-lettered %s ago, longer than the key retention %s: its key may have been purged, so a replay could charge again",
			now.Sub(failedAt(d)).Round(time.Second), retention)
	case opts.All && opts.Reason == "" && stream.NeedsInvestigation(d.Reason):
		return Skipped, fmt.Sprintf("%s needs investigating first (docs/runbooks.md); once understood, replay it with paydedup dlq replay --reason %s, or this one alone with paydedup dlq replay %d",
			d.Reason, d.Reason, d.Seq)
	case !opts.Force && d.Reason == stream.ReasonKeyReused:
		return Skipped, "the key was already used for another payment (a client bug): a replay is dead-lettered again; publish it with a new key, or use --force"
	case !opts.Force && !stream.ReplayableReason(d.Reason):
		return Skipped, fmt.Sprintf("bad input (%s): a replay is dead-lettered again; fix the message and publish it anew, or use --force", d.Reason)
	case opts.DryRun:
		return WouldReplay, ""
	}
	return "", ""
}

// eachChosen is the read loop of Replay and Resign: it calls fn for each
// chosen dead letter, every one matching f (eachDeadLetter) when all, else
// each of seqs once, in order, calling missing for a sequence with no dead
// letter. A failed read or an error from fn stops it and is returned.
func eachChosen(ctx context.Context, js jetstream.JetStream, cfg stream.Config, all bool, f Filter, seqs []uint64,
	fn func(Info) error, missing func(seq uint64)) error {
	if all {
		return eachDeadLetter(ctx, js, cfg, f, fn)
	}
	seqs = slices.Clone(seqs)
	slices.Sort(seqs)
	for _, seq := range slices.Compact(seqs) {
		d, err := Get(ctx, js, cfg, seq)
		switch {
		case errors.Is(err, ErrNotFound):
			missing(seq)
		case err != nil:
			return err
		default:
			if err := fn(d); err != nil {
				return err
			}
		}
	}
	return nil
}

// openDLQ sets *dlqs to the dead-letter stream, opening it on first use
// only, so that a dry run or a run that changes nothing never needs it.
func openDLQ(ctx context.Context, js jetstream.JetStream, cfg stream.Config, dlqs *jetstream.Stream) error {
	if *dlqs != nil {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	s, err := js.Stream(sctx, cfg.DLQStream)
	if err != nil {
		return notSetUp("stream "+cfg.DLQStream, err)
	}
	*dlqs = s
	return nil
}

// deleteLetter deletes the dead letter at seq once its copy is filed (the
// replay, the re-signed letter), even if ctx was cancelled meanwhile. A
// letter another run deleted first is done, not a failure.
func deleteLetter(ctx context.Context, dlqs jetstream.Stream, seq uint64) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminTimeout)
	defer cancel()
	err := dlqs.DeleteMsg(dctx, seq)
	if err != nil {
		if _, gerr := dlqs.GetMsg(dctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return nil
		}
	}
	return err
}

// failedAt is when a verified letter's age starts: the earlier of the
// Dlq-Failed-At its Dlq-Auth covers and the time the stream stored it. The
// stored time alone is reset by re-filing a copy of the letter (anyone who
// may publish on the DLQ's subjects can; dlq resign does, on purpose); the
// header alone would trust a worker's clock set in the future.
func failedAt(d Info) time.Time {
	if d.Verified && !d.FailedAt.IsZero() && d.FailedAt.Before(d.Stored) {
		return d.FailedAt
	}
	return d.Stored
}

// replayTarget reports whether d's original subject is a payment subject of
// the configured stream: <SubjectPrefix>.<merchant_id>.
func replayTarget(cfg stream.Config, d Info) bool {
	merchant, ok := strings.CutPrefix(d.OrigSubject, cfg.SubjectPrefix+".")
	return ok && d.OrigStream == cfg.Name && payment.ValidateMerchant(merchant) == nil
}

// replayOne republishes d and then deletes it.
func replayOne(ctx context.Context, js jetstream.JetStream, dlqs jetstream.Stream, cfg stream.Config, d Info, res *ReplayResult) {
	m := nats.NewMsg(d.OrigSubject)
	m.Data = d.Data
	for k, vs := range d.Header {
		if strings.HasPrefix(k, "Nats-") || strings.HasPrefix(k, "Dlq-") || k == stream.HeaderReplayOf || k == stream.HeaderRequeues || k == stream.HeaderRequeueOf {
			continue
		}
		m.Header[k] = append([]string(nil), vs...)
	}
	// One id per dead letter: two replays of it (two operators, a retry
	// after a lost PubAck) publish one message within the payments stream's
	// duplicate window.
	res.MsgID = stream.ReplayMsgID(cfg, d.Seq)
	m.Header.Set(nats.MsgIdHdr, res.MsgID)
	m.Header.Set(stream.HeaderReplayOf, cfg.DLQStream+":"+strconv.FormatUint(d.Seq, 10))

	pctx, cancel := context.WithTimeout(ctx, adminTimeout)
	ack, err := js.PublishMsg(pctx, m)
	cancel()
	if err != nil {
		res.Outcome, res.Detail = Failed, fmt.Sprintf("republish to %s: %v; the dead letter is kept", d.OrigSubject, err)
		return
	}
	res.StreamSeq = ack.Sequence
	if ack.Duplicate {
		// The id names this letter, but a recreated DLQ stream reuses
		// sequences: only delete if the stored message is this letter's.
		gctx, cancel := context.WithTimeout(ctx, adminTimeout)
		same, err := stream.SameStored(gctx, js, ack, m)
		cancel()
		switch {
		case err != nil:
			res.Outcome, res.Detail = Failed, fmt.Sprintf("%s was dropped as a duplicate of %s #%d, which could not be read (%v): unknown whether this letter was republished; the dead letter is kept, replay it again",
				res.MsgID, ack.Stream, ack.Sequence, err)
			return
		case !same:
			res.Outcome, res.Detail = Failed, fmt.Sprintf("%s was dropped as a duplicate of %s #%d, which holds another message than this letter's replay; the dead letter is kept",
				res.MsgID, ack.Stream, ack.Sequence)
			return
		}
		res.Detail = "already republished by another replay"
	}
	if err := deleteLetter(ctx, dlqs, d.Seq); err != nil {
		res.Outcome = Failed
		res.Detail = fmt.Sprintf("republished as %s #%d, but deleting the dead letter failed: %v; delete it, or a later replay publishes it again (harmless: Postgres guards the charge)",
			ack.Stream, ack.Sequence, err)
		return
	}
	res.Outcome = Replayed
}
