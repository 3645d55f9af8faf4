package gateway_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/paydedup/paydedup/gateway"
)

// TestFullStreamAnswers503: the payments stream has no max age and sheds
// at the door. At its bound (3 messages here, as an operator could set
// it) a POST is answered 503, never 202: nothing was stored, and the
// client retries with the same key. The commands stored stay, and a GET
// of the refused key says it was not accepted.
func TestFullStreamAnswers503(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgs = 3
	if _, err := w.js.UpdateStream(w.ctx, sc); err != nil {
		t.Fatal(err)
	}
	body := payBody(700, "pm_card_visa")
	for i := range 3 {
		wantStatus(t, w.post(fmt.Sprintf("fits-%d", i), body), http.StatusAccepted)
	}
	r := w.post("over", body)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("POST to a full stream: %d %s, want 503", r.status, r.body)
	}
	if p := r.problem(t); p.Type != gateway.ProblemUnavailable {
		t.Errorf("problem %+v, want %s (nothing stored, retry with the same key)", p, gateway.ProblemUnavailable)
	}
	info, err := s.Info(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 || info.State.FirstSeq != 1 {
		t.Fatalf("the stream holds %d messages from %d, want the 3 accepted from 1", info.State.Msgs, info.State.FirstSeq)
	}
	if g := w.do(http.MethodGet, "/v1/payments/over", w.keyA, "", nil); g.status == http.StatusOK {
		t.Fatalf("GET of the refused payment: 200 %s, want it not accepted", g.body)
	}
}
