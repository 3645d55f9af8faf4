package stripesim_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/stripesim"
)

// TestSimListRefundsByCreated: GET /v1/refunds filters on created as
// Stripe does (an exact second, and [gte], [gt], [lte], [lt] in Unix
// seconds, combined), newest first, paged with limit and starting_after
// (a cursor outside the range still places the page); a bad value or an
// unknown filter is refused.
func TestSimListRefundsByCreated(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2031, 2, 3, 4, 5, 6, 0, time.UTC)
	clk := clock.NewFake(t0)
	_, srv := simServer(t, stripesim.Config{Now: clk.Now})
	r := post(t, srv, "/v1/payment_intents", "sk_test", "key-pi", intentForm("1000"))
	var pi struct{ ID string }
	if err := json.Unmarshal(r.body, &pi); err != nil || r.status != 200 {
		t.Fatalf("charge: %d %s", r.status, r.body)
	}
	// Five refunds, ten seconds apart: ids[0] at t0, ids[4] at t0+40s.
	var ids []string
	for i := range 5 {
		r := post(t, srv, "/v1/refunds", "sk_test", fmt.Sprintf("key-re-%d", i), url.Values{"payment_intent": {pi.ID}, "amount": {"100"}})
		var re struct{ ID string }
		if err := json.Unmarshal(r.body, &re); err != nil || r.status != 200 {
			t.Fatalf("refund %d: %d %s", i, r.status, r.body)
		}
		ids = append(ids, re.ID)
		clk.Advance(10 * time.Second)
	}
	at := func(s int) string { return fmt.Sprint(t0.Unix() + int64(s)) }
	list := func(query string) ([]string, bool) {
		t.Helper()
		r := get(t, srv, "/v1/refunds?"+query, "sk_test")
		var page struct {
			Data    []struct{ ID string }
			HasMore bool `json:"has_more"`
		}
		if err := json.Unmarshal(r.body, &page); err != nil || r.status != 200 {
			t.Fatalf("list %s: %d %s", query, r.status, r.body)
		}
		var got []string
		for _, d := range page.Data {
			got = append(got, d.ID)
		}
		return got, page.HasMore
	}
	for _, tt := range []struct {
		query string
		want  []string
		more  bool
	}{
		{"created[gte]=" + at(10), []string{ids[4], ids[3], ids[2], ids[1]}, false},
		{"created[gte]=" + at(11), []string{ids[4], ids[3], ids[2]}, false},
		{"created[gte]=" + at(10) + "&created[lte]=" + at(30), []string{ids[3], ids[2], ids[1]}, false},
		{"created[gt]=" + at(10) + "&created[lt]=" + at(30), []string{ids[2]}, false},
		{"created=" + at(20), []string{ids[2]}, false},
		{"created=" + at(25), nil, false},
		{"created[gte]=" + at(10) + "&payment_intent=" + pi.ID + "&limit=2", []string{ids[4], ids[3]}, true},
		{"created[gte]=" + at(10) + "&limit=2&starting_after=" + ids[3], []string{ids[2], ids[1]}, false},
		// A cursor outside the range: the page is what follows it.
		{"created[lte]=" + at(20) + "&starting_after=" + ids[4], []string{ids[2], ids[1], ids[0]}, false},
	} {
		got, more := list(tt.query)
		if !slices.Equal(got, tt.want) || more != tt.more {
			t.Errorf("list %s = %v (has_more %v), want %v (%v)", tt.query, got, more, tt.want, tt.more)
		}
	}
	for _, tt := range []struct{ query, param string }{
		{"created[gte]=yesterday", "created[gte]"},
		{"created=1.5", "created"},
		{"created[after]=1", "created[after]"},
		{"ending_before=" + ids[0], "ending_before"},
	} {
		r := get(t, srv, "/v1/refunds?"+tt.query, "sk_test")
		if e := decodeErr(t, r); r.status != 400 || e.Error.Param != tt.param {
			t.Errorf("list %s: %d %s, want 400 naming %s", tt.query, r.status, r.body, tt.param)
		}
	}
}
