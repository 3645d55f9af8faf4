package consumer_test

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
)

func TestLogsCarryContextAndNoCardData(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// One unknown outcome, so retries and lease handling are logged too.
	if err := e.sim.SetFaults(stripesim.Faults{RateDropAfterCharge: 1}); err != nil {
		t.Fatal(err)
	}
	var buf testenv.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	stop := e.startWorkerLogged("logger", logger)

	const traceID, retryTraceID = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"
	tp := map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}
	e.publish("m_1", body("m_1", "logged", 100), "", tp)
	declined, _ := json.Marshal(cmdJSON{MerchantID: "m_1", IdempotencyKey: "declined", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_chargeDeclined"})
	e.publish("m_1", declined, "", nil)
	bad := strings.Replace(string(body("m_1", "bad", 100)), `"amount":100`, `"amount":-1`, 1)
	e.publish("m_1", []byte(bad), "", nil)
	e.eventually("charged and left pending", func() bool { return e.charges("m_1", "logged") == 1 })
	// The client retries with its own new traceparent: the re-call must
	// still send the first trace id, or the provider would see other
	// parameters under the same key (idempotency_error).
	e.publish("m_1", body("m_1", "logged", 100), "", map[string]string{"traceparent": "00-" + retryTraceID + "-b7ad6b7169203331-01"})
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("both completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == 2
	})
	e.quiescent()
	stop()

	for _, dl := range e.deadLetters() {
		if r := dl.Header.Get("Dlq-Reason"); r != "invalid_amount" {
			t.Errorf("unexpected dead letter %s: %s", r, dl.Header.Get("Dlq-Error"))
		}
	}
	out := buf.String()
	if strings.Contains(out, "pm_card") || strings.Contains(out, "pm_") {
		t.Fatalf("logs contain a payment method:\n%s", out)
	}
	// The trace id reached the provider's metadata, stored with the claim.
	rec, err := e.store.Get(e.ctx, "m_1", "logged")
	if err != nil || rec.TraceID != traceID {
		t.Fatalf("stored trace id %q (%v), want %s", rec.TraceID, err, traceID)
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line is not JSON: %s", sc.Text())
		}
		for k := range rec {
			seen[k] = true
		}
		if tid := rec["trace_id"]; rec["idempotency_key"] == "logged" && tid != traceID && tid != retryTraceID {
			t.Errorf("log line of the traced payment without its trace_id: %s", sc.Text())
		}
	}
	for _, k := range []string{"merchant_id", "idempotency_key", "stream_seq", "deliveries", "attempt", "trace_id"} {
		if !seen[k] {
			t.Errorf("no log line has %q", k)
		}
	}
}
