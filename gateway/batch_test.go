package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/ledger"
)

// gauge returns the value of a gauge, or a histogram's sample count.
func (w *world) gauge(name string) float64 {
	w.t.Helper()
	fams, err := w.reg.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// batched waits until the batched intake runs (it starts with Serve).
func (w *world) batched() {
	w.t.Helper()
	before := w.gauge("paydedup_gateway_intake_batch_size")
	wantStatus(w.t, w.post("warm-up-"+w.t.Name(), payBody(1, "pm_card_visa")), http.StatusAccepted)
	if w.gauge("paydedup_gateway_intake_batch_size") == before {
		w.t.Fatal("the POST was not taken in by a batch")
	}
}

// concurrently sends the POSTs at once and returns their answers in order.
func (w *world) concurrently(keys, bodies []string, apiKeys []string) []response {
	w.t.Helper()
	out := make([]response, len(keys))
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			r, err := w.req(w.ctx, http.MethodPost, "/v1/payments", apiKeys[i], bodies[i], map[string]string{"Idempotency-Key": keys[i]})
			if err != nil {
				w.t.Error(err)
			}
			out[i] = r
		})
	}
	wg.Wait()
	return out
}

// batchHolder lets a test put concurrent POSTs in one batch whatever
// their timing: the intake cuts a batch at once when no other batch is
// being answered, so POSTs sent together may be split. inOneBatch holds the
// intake's only flush slot (Flushers: 1) with a POST of its own whose
// batch waits in AcquireNewIntakes until every POST of the test is queued
// behind it; released, that batch fails (its POST is 503, nothing of it is
// kept or published) and the next one takes in every queued POST.
type batchHolder struct {
	*pgstore.Store
	holders atomic.Int64
	mu      sync.Mutex
	entered chan struct{} // non-nil: the next AcquireNewIntakes is held
	release chan struct{}
}

var errHeldBatch = errors.New("the test's holding batch")

// arm holds the next AcquireNewIntakes: entered is closed once it waits,
// and open (idempotent) lets it go.
func (s *batchHolder) arm() (entered <-chan struct{}, open func()) {
	in, release := make(chan struct{}), make(chan struct{})
	s.mu.Lock()
	s.entered, s.release = in, release
	s.mu.Unlock()
	var once sync.Once
	return in, func() { once.Do(func() { close(release) }) }
}

func (s *batchHolder) AcquireNewIntakes(ctx context.Context, reqs []ledger.ClaimRequest, apiKeys [][]byte, lease, retention time.Duration) ([]ledger.IntakeResult, error) {
	s.mu.Lock()
	entered, release := s.entered, s.release
	s.entered = nil
	s.mu.Unlock()
	if entered == nil {
		return s.Store.AcquireNewIntakes(ctx, reqs, apiKeys, lease, retention)
	}
	close(entered)
	<-release
	return nil, errHeldBatch
}

// setupHeld is setup with a batchHolder for the gateway's store, for
// inOneBatch; cfg must have one flusher.
func setupHeld(t *testing.T, cfg gateway.Config, o options) (*world, *batchHolder) {
	t.Helper()
	if cfg.Flushers != 1 {
		t.Fatal("inOneBatch holds the only flush slot: set Flushers: 1")
	}
	h := &batchHolder{}
	o.store = func(s gateway.Store) gateway.Store { h.Store = s.(*pgstore.Store); return h }
	return setupWith(t, cfg, o), h
}

// inOneBatch sends the POSTs (as concurrently does) so that one batch
// takes them all in (the config's BatchSize must hold them), and returns
// their answers in order.
func (w *world) inOneBatch(h *batchHolder, keys, bodies, apiKeys []string) []response {
	w.t.Helper()
	entered, open := h.arm()
	defer open()
	held := make(chan response, 1)
	go func() {
		r, _ := w.req(w.ctx, http.MethodPost, "/v1/payments", w.keyA, payBody(1, "pm_card_visa"),
			map[string]string{"Idempotency-Key": fmt.Sprintf("holder-%d", h.holders.Add(1))})
		held <- r
	}()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		w.t.Fatal("the holding batch did not reach AcquireNewIntakes")
	}
	answers := make(chan []response, 1)
	go func() { answers <- w.concurrently(keys, bodies, apiKeys) }()
	w.eventually(fmt.Sprintf("%d POSTs queued behind the holding batch", len(keys)), func() bool {
		return w.gauge("paydedup_gateway_intake_queued") == float64(len(keys))
	})
	batches := w.gauge("paydedup_gateway_intake_batch_size")
	open()
	if r := <-held; r.status != http.StatusServiceUnavailable {
		w.t.Fatalf("the holding POST: status %d, want 503", r.status)
	}
	rs := <-answers
	if n := w.gauge("paydedup_gateway_intake_batch_size") - batches; n != 1 {
		w.t.Fatalf("the POSTs took %v batches, want 1", n)
	}
	return rs
}

// TestBatchTwoIdenticalPOSTs: two concurrent first POSTs with one key in
// one batch: one is accepted, the other is 409 (the key is being taken in),
// as two racing requests in two batches are; one message.
func TestBatchTwoIdenticalPOSTs(t *testing.T) {
	t.Parallel()
	w, h := setupHeld(t, gateway.Config{BatchSize: 2, BatchWindow: time.Second, Flushers: 1}, options{})
	w.batched()
	before := w.streamMsgs()
	body := payBody(500, "pm_card_visa")
	rs := w.inOneBatch(h, []string{"twin", "twin"}, []string{body, body}, []string{w.keyA, w.keyA})
	codes := map[int]int{}
	for _, r := range rs {
		codes[r.status]++
		if r.status == http.StatusConflict && r.header.Get("Retry-After") == "" {
			t.Fatal("409 without Retry-After")
		}
	}
	if codes[http.StatusAccepted] != 1 || codes[http.StatusConflict] != 1 {
		t.Fatalf("answers %v, want one 202 and one 409", codes)
	}
	if n := w.streamMsgs() - before; n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
	// The same key with another payload in one batch: 422 for it.
	rs = w.inOneBatch(h, []string{"twin2", "twin2"}, []string{body, payBody(501, "pm_card_visa")}, []string{w.keyA, w.keyA})
	codes = map[int]int{}
	for _, r := range rs {
		codes[r.status]++
	}
	if codes[http.StatusAccepted] != 1 || codes[http.StatusUnprocessableEntity] != 1 {
		t.Fatalf("answers %v, want one 202 and one 422", codes)
	}
	// The same key for two merchants is two payments.
	rs = w.inOneBatch(h, []string{"shared", "shared"}, []string{body, body}, []string{w.keyA, w.keyB})
	for _, r := range rs {
		wantStatus(t, r, http.StatusAccepted)
	}
	// The same key under two API keys of one merchant: one 202 and one
	// 409; and when the second API key was revoked after the cache learnt
	// it, 401 for its POST whichever of the two the batch took first.
	keyA2 := w.apiKey("m_a")
	wantStatus(t, w.do(http.MethodPost, "/v1/payments", keyA2, body, map[string]string{"Idempotency-Key": "warm-" + t.Name()}), http.StatusAccepted)
	rs = w.inOneBatch(h, []string{"twin3", "twin3"}, []string{body, body}, []string{w.keyA, keyA2})
	codes = map[int]int{}
	for _, r := range rs {
		codes[r.status]++
	}
	if codes[http.StatusAccepted] != 1 || codes[http.StatusConflict] != 1 {
		t.Fatalf("two API keys of one merchant: answers %v, want one 202 and one 409", codes)
	}
	if _, err := w.gwStore.RevokeAPIKey(w.ctx, keyA2); err != nil {
		t.Fatal(err)
	}
	rs = w.inOneBatch(h, []string{"twin4", "twin4"}, []string{body, body}, []string{keyA2, w.keyA})
	if rs[0].status != http.StatusUnauthorized || rs[1].status != http.StatusAccepted {
		t.Fatalf("revoked second API key: answers %d and %d, want 401 and 202", rs[0].status, rs[1].status)
	}
	// twin, twin2, shared twice, the warm-up, twin3, twin4.
	if n := w.streamMsgs() - before; n != 7 {
		t.Fatalf("%d messages, want 7", n)
	}
}

// TestBatchRevokedKeyRefusedAtOnce: a key the cache knows is refused by
// the next POST once revoked.
func TestBatchRevokedKeyRefusedAtOnce(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	w.batched()
	wantStatus(t, w.post("before-revoke", payBody(100, "pm_card_visa")), http.StatusAccepted)
	if _, err := w.gwStore.RevokeAPIKey(w.ctx, w.keyA); err != nil {
		t.Fatal(err)
	}
	r := w.post("after-revoke", payBody(100, "pm_card_visa"))
	wantStatus(t, r, http.StatusUnauthorized)
	if p := r.problem(t); p.Type != gateway.ProblemUnauthenticated {
		t.Fatalf("problem %+v", p)
	}
	// A replay of an accepted key is refused too.
	wantStatus(t, w.post("before-revoke", payBody(100, "pm_card_visa")), http.StatusUnauthorized)
	if _, err := w.gwStore.GetIntake(w.ctx, "m_a", "after-revoke"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("a revoked key's POST was taken in: %v", err)
	}
}

// TestBatchNewPaymentsOneRoundTripBeforePublish: a batch of new payments
// takes one round trip to PostgreSQL before its publishes (the API keys
// checked, the keys found unknown to the worker and taken in, by one
// statement) and one after (the publishes recorded); every request is
// accepted and published once.
func TestBatchNewPaymentsOneRoundTripBeforePublish(t *testing.T) {
	t.Parallel()
	var trips atomic.Int64
	w, h := setupHeld(t, gateway.Config{BatchSize: 3, BatchWindow: time.Second, Flushers: 1}, options{roundTrips: &trips})
	w.batched()
	published := func(keys ...string) func() bool {
		return func() bool {
			return w.count(`SELECT count(*) FROM gateway_intake WHERE idempotency_key = ANY($1) AND published_at IS NOT NULL`, keys) == len(keys)
		}
	}
	w.eventually("the warm-up's publish recorded", published("warm-up-"+t.Name()))
	before := w.streamMsgs()
	trips.Store(0)
	keys := []string{"new-1", "new-2", "new-3"}
	body := payBody(100, "pm_card_visa")
	for _, r := range w.inOneBatch(h, keys, []string{body, body, body}, []string{w.keyA, w.keyA, w.keyA}) {
		wantStatus(t, r, http.StatusAccepted)
	}
	w.eventually("the publishes recorded", published(keys...))
	if n := trips.Load(); n != 2 {
		t.Fatalf("%d round trips for a batch of new payments, want 2 (take in, record the publishes)", n)
	}
	if n := w.streamMsgs() - before; n != uint64(len(keys)) {
		t.Fatalf("%d messages published, want %d", n, len(keys))
	}
}

// TestBatchLonePOSTIsNotHeld: a POST that arrives while no other batch is
// being answered is taken in at once, not after the batch window: waiting
// would only delay it, as nothing else is settling for other POSTs to
// gather behind. Each POST here comes after the last was answered (its
// publish mark may still be in flight); held for the window, five would
// take at least five windows.
func TestBatchLonePOSTIsNotHeld(t *testing.T) {
	t.Parallel()
	const window = time.Second
	w := setup(t, gateway.Config{BatchSize: 64, BatchWindow: window, Flushers: 1})
	w.batched()
	ctx, cancel := context.WithTimeout(w.ctx, 5*window)
	defer cancel()
	before := w.gauge("paydedup_gateway_intake_batch_size")
	for i := range 5 {
		r, err := w.req(ctx, http.MethodPost, "/v1/payments", w.keyA, payBody(100, "pm_card_visa"),
			map[string]string{"Idempotency-Key": fmt.Sprintf("lone-%d", i)})
		if err != nil {
			t.Fatalf("POST %d, alone: %v (held for the batch window?)", i, err)
		}
		wantStatus(t, r, http.StatusAccepted)
	}
	if n := w.gauge("paydedup_gateway_intake_batch_size") - before; n != 5 {
		t.Fatalf("%v batches for 5 POSTs one after another, want 5", n)
	}
}

// TestBatchGathersWhileABatchIsAnswered: while a batch is being settled,
// POSTs gather into the next one (up to BatchSize, or the window) instead
// of going one by one.
func TestBatchGathersWhileABatchIsAnswered(t *testing.T) {
	t.Parallel()
	h := &batchHolder{}
	w := setupWith(t, gateway.Config{BatchSize: 3, BatchWindow: time.Second, Flushers: 2},
		options{store: func(s gateway.Store) gateway.Store { h.Store = s.(*pgstore.Store); return h }})
	w.batched()
	entered, open := h.arm()
	t.Cleanup(open) // before the world's cleanup: the held flush ends
	held := make(chan response, 1)
	go func() { held <- w.post("holder", payBody(1, "pm_card_visa")) }()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the holding batch did not reach AcquireNewIntakes")
	}
	batches := w.gauge("paydedup_gateway_intake_batch_size")
	body := payBody(100, "pm_card_visa")
	answers := make(chan []response, 1)
	go func() {
		answers <- w.concurrently([]string{"g-1", "g-2", "g-3"}, []string{body, body, body}, []string{w.keyA, w.keyA, w.keyA})
	}()
	select {
	case rs := <-answers:
		for _, r := range rs {
			wantStatus(t, r, http.StatusAccepted)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the POSTs were not answered while the other batch was held")
	}
	if n := w.gauge("paydedup_gateway_intake_batch_size") - batches; n != 1 {
		t.Fatalf("the POSTs took %v batches while another was being answered, want 1", n)
	}
	open()
	if r := <-held; r.status != http.StatusServiceUnavailable {
		t.Fatalf("the holding POST: status %d, want 503", r.status)
	}
}

// TestBatchCommitFailsAnswersAll503: when the statement that takes in a
// batch fails (a trigger refuses one of its rows), every request of the
// batch is answered 503 and nothing of it is published or kept.
func TestBatchCommitFailsAnswersAll503(t *testing.T) {
	t.Parallel()
	w, h := setupHeld(t, gateway.Config{BatchSize: 3, BatchWindow: time.Second, Flushers: 1}, options{})
	w.batched()
	for _, q := range []string{
		`CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN IF NEW.idempotency_key = 'poison' THEN RAISE EXCEPTION 'injected: commit refused'; END IF; RETURN NEW; END $$`,
		`CREATE TRIGGER refuse_poison BEFORE INSERT ON gateway_intake FOR EACH ROW EXECUTE FUNCTION refuse_poison()`,
	} {
		if _, err := w.pool.Exec(w.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	before := w.streamMsgs()
	keys := []string{"poison", "ok-1", "ok-2"}
	body := payBody(100, "pm_card_visa")
	rs := w.inOneBatch(h, keys, []string{body, body, body}, []string{w.keyA, w.keyA, w.keyA})
	for i, r := range rs {
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Fatalf("%s: status %d (Retry-After %q), want 503 with Retry-After", keys[i], r.status, r.header.Get("Retry-After"))
		}
	}
	if n := w.streamMsgs() - before; n != 0 {
		t.Fatalf("%d messages published for a failed batch", n)
	}
	if n := w.count(`SELECT count(*) FROM gateway_intake WHERE idempotency_key = ANY($1)`, keys); n != 0 {
		t.Fatalf("%d intake rows kept for a failed batch", n)
	}
	// The retries, in a batch of their own, are accepted.
	rs = w.concurrently(keys[1:], []string{body, body}, []string{w.keyA, w.keyA})
	for _, r := range rs {
		wantStatus(t, r, http.StatusAccepted)
	}
}

// gatedStore holds the batched intake's first statement (AcquireNewIntakes) until released,
// keeping the batch methods of the real store.
type gatedStore struct {
	*pgstore.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *gatedStore) open() { s.once.Do(func() { close(s.release) }) }

func (s *gatedStore) AcquireNewIntakes(ctx context.Context, reqs []ledger.ClaimRequest, apiKeys [][]byte, lease, retention time.Duration) ([]ledger.IntakeResult, error) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return s.Store.AcquireNewIntakes(ctx, reqs, apiKeys, lease, retention)
}

// TestBatchOverloadSheds: past what the intake can queue, a POST is
// answered at once, 429 when its merchant holds its share of the queue
// (while another merchant still gets in), 503 when the queue is full, both
// with Retry-After; nothing shed is published, and every 202 is on the
// stream exactly once.
func TestBatchOverloadSheds(t *testing.T) {
	t.Parallel()
	gs := &gatedStore{entered: make(chan struct{}), release: make(chan struct{})}
	w := setupWith(t, gateway.Config{BatchSize: 1, BatchWindow: time.Millisecond, Flushers: 1, QueueSize: 4, MerchantShare: 0.75},
		options{store: func(s gateway.Store) gateway.Store { gs.Store = s.(*pgstore.Store); return gs }})
	t.Cleanup(gs.open) // before the world's cleanup: the held flush ends
	w.batched()
	gs.armed.Store(true)
	type sent struct {
		key string
		r   response
	}
	var mu sync.Mutex
	var all []sent
	var wg sync.WaitGroup
	send := func(apiKey, key string) {
		wg.Go(func() {
			r, err := w.req(w.ctx, http.MethodPost, "/v1/payments", apiKey, payBody(100, "pm_card_visa"), map[string]string{"Idempotency-Key": key})
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			all = append(all, sent{key, r})
			mu.Unlock()
		})
	}
	// The first batch is held in its flush; the queue then fills.
	send(w.keyA, "held")
	select {
	case <-gs.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first batch did not reach the store")
	}
	queued := func(n float64) func() bool {
		return func() bool { return w.gauge("paydedup_gateway_intake_queued") == n }
	}
	send(w.keyA, "a-1")
	send(w.keyA, "a-2")
	send(w.keyA, "a-3")
	w.eventually("three of merchant A queued", queued(3))
	r := w.post("a-4", payBody(100, "pm_card_visa")) // A holds its share (3 of 4)
	wantStatus(t, r, http.StatusTooManyRequests)
	if r.header.Get("Retry-After") == "" || r.problem(t).Type != gateway.ProblemRateLimited {
		t.Fatalf("429 %s %v", r.body, r.header)
	}
	send(w.keyB, "b-1") // another merchant still gets in
	w.eventually("the queue full", queued(4))
	r, err := w.req(w.ctx, http.MethodPost, "/v1/payments", w.keyB, payBody(100, "pm_card_visa"), map[string]string{"Idempotency-Key": "b-2"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, r, http.StatusServiceUnavailable)
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	gs.open()
	wg.Wait()
	accepted := map[string]bool{}
	for _, s := range all {
		wantStatus(t, s.r, http.StatusAccepted)
		accepted[s.key] = true
	}
	if len(accepted) != 5 { // held, a-1, a-2, a-3, b-1
		t.Fatalf("accepted %v", accepted)
	}
	onStream := map[string]int{}
	for _, m := range w.storedMsgs() {
		onStream[m.Header.Get("Idempotency-Key")]++
	}
	for k := range accepted {
		if onStream[k] != 1 {
			t.Fatalf("%s on the stream %d times", k, onStream[k])
		}
	}
	for _, k := range []string{"a-4", "b-2"} {
		if onStream[k] != 0 {
			t.Fatalf("shed %s was published", k)
		}
	}
}

// TestBatchOverloadLosesNothing drives the batched intake far past its
// queue: every POST is answered (202, or 429/503 with Retry-After; none
// times out), every 202 is on the stream exactly once, and nothing shed is.
func TestBatchOverloadLosesNothing(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{BatchSize: 4, Flushers: 1, QueueSize: 8, MerchantShare: 1})
	w.batched()
	const n = 400
	codes := make([]int, n)
	var wg sync.WaitGroup
	var missingRetryAfter atomic.Int64
	sem := make(chan struct{}, 64)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r, err := w.req(w.ctx, http.MethodPost, "/v1/payments", w.keyA, payBody(100, "pm_card_visa"), map[string]string{"Idempotency-Key": fmt.Sprintf("load-%d", i)})
			if err != nil {
				t.Error(err)
				return
			}
			codes[i] = r.status
			if r.status != http.StatusAccepted && r.header.Get("Retry-After") == "" {
				missingRetryAfter.Add(1)
			}
		})
	}
	wg.Wait()
	if m := missingRetryAfter.Load(); m > 0 {
		t.Fatalf("%d shed answers without Retry-After", m)
	}
	onStream := map[string]int{}
	for _, m := range w.storedMsgs() {
		onStream[m.Header.Get("Idempotency-Key")]++
	}
	shed := 0
	for i, c := range codes {
		k := fmt.Sprintf("load-%d", i)
		switch c {
		case http.StatusAccepted:
			if onStream[k] != 1 {
				t.Fatalf("accepted %s on the stream %d times", k, onStream[k])
			}
		case http.StatusServiceUnavailable, http.StatusTooManyRequests:
			shed++
			if onStream[k] != 0 {
				t.Fatalf("shed %s was published", k)
			}
		default:
			t.Fatalf("%s: status %d", k, c)
		}
	}
	t.Logf("%d of %d shed", shed, n)
}

// cancellingStore cuts the API key's look-up short the way a client that
// hangs up does: the request's context ends while the statement runs.
type cancellingStore struct {
	gateway.Store
	hangUp func()
}

func (s cancellingStore) Authenticate(ctx context.Context, apiKey string) (string, error) {
	s.hangUp()
	<-ctx.Done()
	return s.Store.Authenticate(ctx, apiKey)
}

// records keeps log records.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) find(msg string) (slog.Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if strings.Contains(rec.Message, msg) {
			return rec, true
		}
	}
	return slog.Record{}, false
}

// TestClientGoneIsDebug: a client that disconnects mid-request is logged
// at debug level, not as an error. (A GET: the server notices a hang-up
// once the request's body is read, and a POST's statements run in its
// batch, on the batch's deadline, not the request's.)
func TestClientGoneIsDebug(t *testing.T) {
	t.Parallel()
	logs := &records{}
	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	w := setupWith(t, gateway.Config{Logger: slog.New(logs)},
		options{store: func(s gateway.Store) gateway.Store { return cancellingStore{Store: s, hangUp: hangUp} }})
	if _, err := w.req(ctx, http.MethodGet, "/v1/payments/gone", w.keyA, "", nil); err == nil {
		t.Fatal("the request was not cut short")
	}
	w.eventually("the gateway logged the hang-up", func() bool { _, ok := logs.find("authentication failed"); return ok })
	rec, _ := logs.find("authentication failed")
	if rec.Level != slog.LevelDebug {
		t.Fatalf("a client hanging up is logged at %v: %q", rec.Level, rec.Message)
	}
}

// TestBatchPublishFailsAlone: in a batch published at once (the real
// publisher's PublishBatch), a command the stream refuses is answered 503
// and its intake given up, so that a retry publishes it; the others of the
// batch are accepted and on the stream.
func TestBatchPublishFailsAlone(t *testing.T) {
	t.Parallel()
	w, h := setupHeld(t, gateway.Config{BatchSize: 3, BatchWindow: time.Second, Flushers: 1}, options{})
	w.batched()
	maxMsgSize := func(n int32) {
		t.Helper()
		s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
		if err != nil {
			t.Fatal(err)
		}
		sc := s.CachedInfo().Config
		sc.MaxMsgSize = n
		if _, err := w.js.UpdateStream(w.ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	maxMsgSize(700)
	before := w.streamMsgs()
	long := fmt.Sprintf(`{"amount":300,"currency":"usd","payment_method":"pm_card_visa","description":%q}`, strings.Repeat("x", 1000))
	rs := w.inOneBatch(h, []string{"small-1", "long", "small-2"},
		[]string{payBody(100, "pm_card_visa"), long, payBody(200, "pm_card_visa")}, []string{w.keyA, w.keyA, w.keyA})
	wantStatus(t, rs[0], http.StatusAccepted)
	wantStatus(t, rs[1], http.StatusServiceUnavailable)
	wantStatus(t, rs[2], http.StatusAccepted)
	if n := w.streamMsgs() - before; n != 2 {
		t.Fatalf("%d messages, want the 2 accepted", n)
	}
	maxMsgSize(-1)
	wantStatus(t, w.post("long", long), http.StatusAccepted)
	if n := w.streamMsgs() - before; n != 3 {
		t.Fatalf("%d messages after the retry, want 3", n)
	}
}

// markGatedStore holds the IntakesPublished that records key's publish
// until released, keeping the rest of the real store. Only that key's
// mark is held: an earlier POST's mark (the warm-up's, which may commit
// after its 202) passes through.
type markGatedStore struct {
	*pgstore.Store
	key     string
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *markGatedStore) open() { s.once.Do(func() { close(s.release) }) }

func (s *markGatedStore) IntakesPublished(ctx context.Context, pubs []ledger.Published, holdFor time.Duration) ([]bool, error) {
	if slices.ContainsFunc(pubs, func(p ledger.Published) bool { return p.Intake.IdempotencyKey == s.key }) &&
		s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return s.Store.IntakesPublished(ctx, pubs, holdFor)
}

// TestBatchAcceptsBeforeThePublishMark: a batch's 202s wait for their
// PubAcks, not for the statement that records the publishes. While that
// statement is held, the POST is answered 202, and a retry of its key is
// 409 with Retry-After (its intake is held by the publish lease, as after
// the mark by the republish hold) and publishes nothing. Once released,
// the intake is marked published with the copy's stream sequence.
func TestBatchAcceptsBeforeThePublishMark(t *testing.T) {
	t.Parallel()
	gs := &markGatedStore{key: "early", entered: make(chan struct{}), release: make(chan struct{})}
	w := setupWith(t, gateway.Config{BatchSize: 1, BatchWindow: time.Millisecond, Flushers: 2},
		options{store: func(s gateway.Store) gateway.Store { gs.Store = s.(*pgstore.Store); return gs }})
	t.Cleanup(gs.open) // before the world's cleanup: the held flush ends
	w.batched()
	before := w.streamMsgs()
	gs.armed.Store(true)
	body := payBody(700, "pm_card_visa")
	answered := make(chan response, 1)
	go func() { answered <- w.post("early", body) }()
	select {
	case <-gs.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the batch did not reach the publish mark")
	}
	select {
	case r := <-answered:
		wantStatus(t, r, http.StatusAccepted)
		if r.header.Get("Location") == "" {
			t.Fatal("202 without Location")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the 202 waited for the publish mark")
	}
	if n := w.streamMsgs() - before; n != 1 {
		t.Fatalf("%d messages after the 202, want 1", n)
	}
	in, err := w.gwStore.GetIntake(w.ctx, "m_a", "early")
	if err != nil {
		t.Fatal(err)
	}
	if in.Published() {
		t.Fatal("the intake was marked while the mark was held")
	}
	r := w.post("early", body)
	wantStatus(t, r, http.StatusConflict)
	if r.header.Get("Retry-After") == "" {
		t.Fatal("409 without Retry-After")
	}
	if n := w.streamMsgs() - before; n != 1 {
		t.Fatalf("%d messages after the retry, want 1", n)
	}
	// A GET while the mark is held never says "not accepted" of a payment
	// answered 202: it waits for the publish to settle, and answers 409
	// with Retry-After when it has not.
	g := w.do(http.MethodGet, "/v1/payments/early", w.keyA, "", nil)
	wantStatus(t, g, http.StatusConflict)
	if p := g.problem(t); p.Type != gateway.ProblemKeyInUse || g.header.Get("Retry-After") == "" {
		t.Fatalf("GET while the publish is unsettled: %+v, Retry-After %q", p, g.header.Get("Retry-After"))
	}
	// One waiting when the mark commits answers the payment, queued.
	got := make(chan response, 1)
	go func() { got <- w.do(http.MethodGet, "/v1/payments/early", w.keyA, "", nil) }()
	time.Sleep(200 * time.Millisecond)
	gs.open()
	g = <-got
	wantStatus(t, g, http.StatusOK)
	if p := g.payment(t); p.Status != gateway.StateQueued || p.Amount != 700 {
		t.Fatalf("GET once the mark committed: %+v", p)
	}
	st, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	last, err := st.GetMsg(w.ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if k := last.Header.Get("Idempotency-Key"); k != "early" {
		t.Fatalf("the stream's last message is %q's", k)
	}
	seq := last.Sequence
	w.eventually("the intake marked published", func() bool {
		in, err := w.gwStore.GetIntake(w.ctx, "m_a", "early")
		return err == nil && in.Published() && in.StreamSeq == seq
	})
}
