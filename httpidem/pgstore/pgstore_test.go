package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/httpidem"
	"github.com/paydedup/paydedup/httpidem/pgstore"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
)

type bundle struct {
	store *pgstore.Store
	clock *clock.Fake
	ctx   context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	s, err := pgstore.New(testenv.Pool(t), pgstore.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{store: s, clock: clk, ctx: context.Background()}
}

func TestResponseStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease, retention = 30 * time.Second, 24 * time.Hour
	h1, h2 := make([]byte, 32), make([]byte, 32)
	h2[0] = 1
	claim := func(key string, hash []byte) httpidem.ResponseClaimResult {
		t.Helper()
		res, err := b.store.ClaimResponse(b.ctx, "POST /x", key, hash, lease, retention)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := claim("k", h1)
	if res.Outcome != httpidem.ResponseClaimed || res.Claim.Attempt != 1 {
		t.Fatalf("first claim %+v", res)
	}
	if r := claim("k", h1); r.Outcome != httpidem.ResponseInFlight || r.RetryIn <= 0 {
		t.Fatalf("second claim %+v", r)
	}
	if r := claim("k", h2); r.Outcome != httpidem.ResponseMismatch {
		t.Fatalf("other request %+v", r)
	}
	body := []byte("{\"id\": 1}\n\x00\xff")
	stored := httpidem.StoredResponse{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}, Body: body}
	if err := b.store.CompleteResponse(b.ctx, *res.Claim, stored); err != nil {
		t.Fatal(err)
	}
	r := claim("k", h1)
	if r.Outcome != httpidem.ResponseReplay || r.Response.Status != 201 || string(r.Response.Body) != string(body) ||
		strings.Join(r.Response.Header["X-Multi"], ",") != "a,b" {
		t.Fatalf("replay %+v", r.Response)
	}

	// A released claim lets the next request run, whatever its payload.
	res = claim("rel", h1)
	if err := b.store.ReleaseResponse(b.ctx, *res.Claim, "503"); err != nil {
		t.Fatal(err)
	}
	if r := claim("rel", h2); r.Outcome != httpidem.ResponseClaimed || r.Claim.Attempt != 2 {
		t.Fatalf("after release %+v", r)
	}

	// A claim whose lease passed is taken over by the same request; the
	// old holder is fenced out.
	old := claim("exp", h1).Claim
	b.clock.Advance(lease + time.Second)
	if r := claim("exp", h2); r.Outcome != httpidem.ResponseMismatch {
		t.Fatalf("expired lease, other request: %+v", r)
	}
	taken := claim("exp", h1)
	if taken.Outcome != httpidem.ResponseClaimed {
		t.Fatalf("takeover %+v", taken)
	}
	if err := b.store.CompleteResponse(b.ctx, *old, stored); !errors.Is(err, httpidem.ErrLeaseLost) {
		t.Fatalf("stale complete: %v", err)
	}
	if err := b.store.ReleaseResponse(b.ctx, *old, "x"); !errors.Is(err, httpidem.ErrLeaseLost) {
		t.Fatalf("stale release: %v", err)
	}

	// Past retention a stored response is forgotten.
	b.clock.Advance(retention + time.Hour)
	if n, err := b.store.PurgeResponses(b.ctx, 10); err != nil || n != 1 { // "k"; "rel" and "exp" are pending
		t.Fatalf("purge: %d %v (pending rows are kept)", n, err)
	}
	if r := claim("k", h2); r.Outcome != httpidem.ResponseClaimed {
		t.Fatalf("after retention %+v", r)
	}
}

// TestSkewedClockClaimLease: the middleware's claim is a lease. A store
// whose host clock runs two minutes ahead does not take over a live claim,
// and one two minutes behind writes claims others respect: lease times come
// from the database's clock.
func TestSkewedClockClaimLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.Pool(t)
	store := func(c clock.Clock) *pgstore.Store {
		s, err := pgstore.New(pool, pgstore.Config{Clock: c})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	onTime, ahead, behind := store(nil), store(clock.System{Offset: 2 * time.Minute}), store(clock.System{Offset: -2 * time.Minute})
	const lease, retention = 30 * time.Second, time.Hour
	hash := make([]byte, 32)
	for _, tc := range []struct {
		name          string
		holder, other *pgstore.Store
	}{{"ahead", onTime, ahead}, {"behind", behind, onTime}} {
		key := "resp-" + tc.name
		if res, err := tc.holder.ClaimResponse(ctx, "scope", key, hash, lease, retention); err != nil || res.Outcome != httpidem.ResponseClaimed {
			t.Fatalf("%s: claim response: %v %v", tc.name, res.Outcome, err)
		}
		res, err := tc.other.ClaimResponse(ctx, "scope", key, hash, lease, retention)
		if err != nil || res.Outcome != httpidem.ResponseInFlight {
			t.Errorf("%s: a second handler on a live claim: %v %v, want in flight", tc.name, res.Outcome, err)
		}
		if res.Outcome == httpidem.ResponseInFlight && (res.RetryIn <= 0 || res.RetryIn > lease) {
			t.Errorf("%s: retry in %v, want the claim's remaining time", tc.name, res.RetryIn)
		}
	}
}
