package dedup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start := b.clock.Now()

	// Two hours ago: one charged, one declined.
	old := b.claim(t, "w", req("m_1", "old", 100)).Lease
	if err := b.store.Complete(b.ctx, *old, charged("pi_old")); err != nil {
		t.Fatal(err)
	}
	oldDecl := b.claim(t, "w", req("m_1", "old-declined", 100)).Lease
	if err := b.store.Complete(b.ctx, *oldDecl, ledger.Completion{Declined: true, ResponseStatus: 402, Response: []byte(`{"declined":true}`)}); err != nil {
		t.Fatal(err)
	}
	// The oldest pending row: claimed now, its holder vanished.
	stuck := b.claim(t, "gone", req("m_1", "stuck", 100)).Lease
	_ = stuck
	b.clock.Advance(90 * time.Minute)
	// Thirty minutes ago: a charge and a decline.
	l := b.claim(t, "w", req("m_1", "half-hour", 100)).Lease
	if err := b.store.Complete(b.ctx, *l, charged("pi_half")); err != nil {
		t.Fatal(err)
	}
	l = b.claim(t, "w", req("m_2", "half-hour-declined", 100)).Lease
	if err := b.store.Complete(b.ctx, *l, ledger.Completion{Declined: true, ResponseStatus: 402, Response: []byte(`{"declined":true}`)}); err != nil {
		t.Fatal(err)
	}
	// A failed row (known not charged).
	l = b.claim(t, "w", req("m_1", "failed", 100)).Lease
	if _, err := b.store.Fail(b.ctx, *l, "429"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(29*time.Minute + 30*time.Second)
	// Seconds ago: one charge; one released after an unknown outcome (maybe
	// charged, lease expired but within the grace); one live lease.
	l = b.claim(t, "w", req("m_1", "recent", 100)).Lease
	if err := b.store.Complete(b.ctx, *l, charged("pi_recent")); err != nil {
		t.Fatal(err)
	}
	l = b.claim(t, "w", req("m_1", "released", 100)).Lease
	if err := b.store.Release(b.ctx, *l, "timeout"); err != nil {
		t.Fatal(err)
	}
	b.claim(t, "w", req("m_1", "live", 100))
	now := b.clock.Now()

	st, err := b.store.Stats(b.ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := ledger.Stats{
		Now:     now,
		Pending: 3, Completed: 5, Failed: 1,
		OldestPending:       start,
		Stuck:               1, // "stuck": its lease expired two hours ago; "released" only just
		MaybeCharged:        1,
		CompletedLastMinute: 1,
		CompletedLastHour:   3,
		DeclinedLastHour:    1,
	}
	if !st.OldestPending.Equal(want.OldestPending) {
		t.Errorf("oldest pending %v, want %v", st.OldestPending, want.OldestPending)
	}
	st.OldestPending = want.OldestPending
	if !st.Now.Equal(now) {
		t.Errorf("stats as of %v, want the store's time %v", st.Now, now)
	}
	st.Now = want.Now
	if st != want {
		t.Errorf("stats\n got %+v\nwant %+v", st, want)
	}
	if st.Total() != 9 {
		t.Errorf("total %d, want 9", st.Total())
	}

	// With no grace the released row is stuck too; an empty window is empty.
	b.clock.Advance(time.Hour + time.Minute)
	st, err = b.store.Stats(b.ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Stuck != 3 || st.CompletedLastHour != 0 || st.CompletedLastMinute != 0 {
		t.Errorf("an hour later: stuck %d, last hour %d, last minute %d; want 3, 0, 0", st.Stuck, st.CompletedLastHour, st.CompletedLastMinute)
	}
}

func TestStatsEmpty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := b.store.Stats(b.ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if st != (ledger.Stats{Now: st.Now}) || !st.Now.Equal(b.clock.Now()) {
		t.Fatalf("empty store: %+v", st)
	}
}

func TestGetMany(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"a", "b", "c"} {
		b.claim(t, "w", req("m_1", k, 100))
	}
	b.claim(t, "w", req("m_2", "a", 100))
	recs, err := b.store.GetMany(b.ctx, []ledger.KeyRef{
		{MerchantID: "m_1", IdempotencyKey: "a"}, {MerchantID: "m_1", IdempotencyKey: "a"},
		{MerchantID: "m_2", IdempotencyKey: "a"}, {MerchantID: "m_1", IdempotencyKey: "missing"},
		{MerchantID: "m_1", IdempotencyKey: "c"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[ledger.KeyRef]ledger.Status{}
	for _, r := range recs {
		got[ledger.KeyRef{MerchantID: r.MerchantID, IdempotencyKey: r.IdempotencyKey}] = r.Status
	}
	if len(recs) != 3 || len(got) != 3 || got[ledger.KeyRef{MerchantID: "m_2", IdempotencyKey: "a"}] != ledger.StatusPending {
		t.Fatalf("GetMany returned %d records: %v", len(recs), got)
	}
	if recs, err := b.store.GetMany(b.ctx, nil); err != nil || len(recs) != 0 {
		t.Fatalf("no keys: %v %v", recs, err)
	}
}

// TestPendingSinceKeptAcrossEpisode: a row's pending_since is set when it
// becomes pending and kept while it stays pending, whoever takes and
// releases it (a re-acquire after its lease expired, a release, a
// reconciler's lease and failed lookup); a `failed` row re-acquired starts
// a new episode, with its lookup back-off reset.
func TestPendingSinceKeptAcrossEpisode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	since := func() (time.Time, int) {
		t.Helper()
		var at *time.Time
		var failures int
		if err := b.pool.QueryRow(b.ctx, `SELECT pending_since, lookup_failures FROM idempotency_keys WHERE idempotency_key = 'ep'`).
			Scan(&at, &failures); err != nil {
			t.Fatal(err)
		}
		if at == nil {
			return time.Time{}, failures
		}
		return *at, failures
	}
	r := req("m_1", "ep", 100)
	first := b.clock.Now()
	l := b.claim(t, "a", r).Lease
	b.clock.Advance(lease + time.Second)
	l2 := b.claim(t, "b", r)
	if l2.Outcome != ledger.Reacquired {
		t.Fatalf("re-claim after expiry: %v", l2.Outcome)
	}
	if err := b.store.Release(b.ctx, *l2.Lease, "timeout"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Hour)
	stuck, err := b.store.AcquireStuck(b.ctx, "rec", time.Minute, lease, 10)
	if err != nil || len(stuck) != 1 {
		t.Fatalf("acquire stuck: %d %v", len(stuck), err)
	}
	if _, _, err := b.store.DeferLookup(b.ctx, stuck[0].Lease, "503", ledger.Backoff{Base: time.Minute, Max: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if at, n := since(); !at.Equal(first) || n != 1 {
		t.Fatalf("after re-acquire, release, reconciler lease and failed lookup: pending since %v with %d failed lookups; want %v and 1", at, n, first)
	}
	if st, err := b.store.Stats(b.ctx, 30*time.Second); err != nil || st.Stuck != 1 || st.LookupBackedOff != 1 || !st.OldestPending.Equal(first) {
		t.Fatalf("stats %+v %v: want the row stuck since %v and backed off", st, err, first)
	}
	if _, err := b.store.Heartbeat(b.ctx, *l, lease); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("the first holder's heartbeat: %v, want lease lost", err)
	}

	// A lookup proves nothing was charged: the row fails; the next claim
	// starts a new episode.
	stuck, err = b.store.AcquireStuck(b.ctx, "rec", 0, lease, 10)
	if err != nil || len(stuck) != 0 {
		t.Fatalf("a backed-off row was acquired before its next lookup: %d %v", len(stuck), err)
	}
	b.clock.Advance(2 * time.Minute)
	stuck, err = b.store.AcquireStuck(b.ctx, "rec", 0, lease, 10)
	if err != nil || len(stuck) != 1 {
		t.Fatalf("acquire once due: %d %v", len(stuck), err)
	}
	if err := b.store.ResolveNotCharged(b.ctx, stuck[0].Lease, "not found"); err != nil {
		t.Fatal(err)
	}
	again := b.clock.Now()
	if res := b.claim(t, "c", r); res.Outcome != ledger.Reacquired {
		t.Fatalf("claim of the failed row: %v", res.Outcome)
	}
	if at, n := since(); !at.Equal(again) || n != 0 {
		t.Fatalf("new episode: pending since %v with %d failed lookups; want %v and 0", at, n, again)
	}
}
