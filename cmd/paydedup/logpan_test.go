package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/testenv"
)

// Issue 54, item 4: a full run's logs, the gateway's and the worker's at
// debug, hold no card number. Payments whose Idempotency-Key, description
// and metadata hold one in several scripts go through the gateway and
// straight onto the stream, where the door refuses them (card_data), and
// one more whose trace id, which the door leaves alone, holds a card
// number's digits glued to zeros: one 32-digit group, an id and no card
// number by the definition, so it is logged as it is. Before the binary's handler
// masked every line, the gateway logged "idempotency_key":"4111111111111111"
// and the worker the keys and the quoted values.
func TestFullRunLogsHoldNoCardNumber(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	w.env["PAYDEDUP_PROVIDER"] = "sim"
	w.env["PAYDEDUP_LOG_LEVEL"] = "debug"
	// Text an operator configured reaches the logs without passing any
	// door ("worker started" logs the holder): only the log handler masks
	// it.
	w.env["PAYDEDUP_HOLDER"] = "worker-4111 1111 1111 1111"
	w.env["PAYDEDUP_LOG_FORMAT"] = "json"
	w.env["PAYDEDUP_HTTP_ADDR"] = httpAddr
	ctx := context.Background()
	out, _, err := w.run("", "apikey", "create", "--merchant", "m_1")
	if err != nil {
		t.Fatal(err)
	}
	apiKey := strings.TrimSpace(out)

	var logs testenv.Buffer
	gwEnv := map[string]string{}
	for k, v := range w.env {
		gwEnv[k] = v
	}
	gwEnv["PAYDEDUP_ADMIN_ADDR"] = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	stopGateway := startCommand(t, gwEnv, &logs, "gateway")
	wkEnv := map[string]string{}
	for k, v := range w.env {
		wkEnv[k] = v
	}
	wkEnv["PAYDEDUP_ADMIN_ADDR"] = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	stopWorker := startCommand(t, wkEnv, &logs, "worker")

	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	post := func(key, body string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+httpAddr+"/v1/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor(t, 30*time.Second, "the gateway", func() bool {
		return post("warm-up", `{"amount":100,"currency":"usd","payment_method":"pm_card_visa"}`) == http.StatusAccepted
	})
	payment := func(desc, metaKey, metaValue string) string {
		b, _ := json.Marshal(map[string]any{"amount": 100, "currency": "usd", "payment_method": "pm_card_visa",
			"description": desc, "metadata": map[string]string{metaKey: metaValue}})
		return string(b)
	}
	for _, p := range []struct{ key, body string }{
		{"4111111111111111", payment("card ４１１１ １１１１ １１１１ １１１１", "note", "٤١١١-١١١١-١١١١-١١١١")},
		{"5555-5555-5555-4444", payment("४१११ १११११११११११११", "card", "4111\t1111\t1111\t1111")},
		{"３７８２８２２４６３１０００５", payment("x", "y", "z")},
	} {
		if code := post(p.key, p.body); code == 0 {
			t.Fatalf("POST with key %q: no answer", p.key)
		}
	}
	// Straight onto the stream: four refused at the door (card_data), and
	// one the door lets through whose trace id is all digits: the door
	// leaves the trace context alone (tracers write it), and a group of 32
	// digits is no card number for the log handler either.
	subject := w.cfg.SubjectPrefix + ".m_1"
	traced := nats.NewMsg(subject)
	traced.Header.Set("traceparent", "00-00000000000000004111111111111111-0000000000000001-01")
	traced.Data = []byte(`{"merchant_id":"m_1","idempotency_key":"k-traced","amount":100,"currency":"usd","payment_method":"pm_card_visa"}`)
	if _, err := w.js.PublishMsg(ctx, traced); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"merchant_id":"m_1","idempotency_key":"378282246310005","amount":100,"currency":"usd","payment_method":"pm_card_visa","description":"𝟒𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏"}`,
		`{"merchant_id":"m_1","idempotency_key":"6011111111111117","amount":100,"currency":"usd","payment_method":"pm_card_visa"}`,
		`{"merchant_id":"m_1","idempotency_key":"k-currency","amount":100,"currency":"4111111111111111","payment_method":"pm_card_visa"}`,
		`{"merchant_id":"m_1","idempotency_key":"k-metadata","amount":100,"currency":"usd","payment_method":"pm_card_visa","metadata":{"[4111 1111 1111 1111]":"v"}}`,
	} {
		if _, err := w.js.Publish(ctx, subject, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "the worker to drain the stream and file the letters", func() bool {
		c, err := w.js.Consumer(ctx, w.cfg.Name, w.cfg.Durable)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		if err != nil || info.NumPending != 0 || info.NumAckPending != 0 {
			return false
		}
		dlq, err := w.js.Stream(ctx, w.cfg.DLQStream)
		if err != nil {
			return false
		}
		si, err := dlq.Info(ctx)
		return err == nil && si.State.Msgs >= 4
	})
	stopWorker()
	stopGateway()

	text := logs.String()
	if !strings.Contains(text, "payment completed") || !strings.Contains(text, "card_data") || !strings.Contains(text, "k-traced") {
		t.Fatalf("the run did not log what it should have:\n%s", text)
	}
	if start, end, ok := redact.FindPAN(text); ok {
		line := text[strings.LastIndex(text[:start], "\n")+1:]
		t.Errorf("the logs show %q, in:\n%s", text[start:end], line[:strings.IndexByte(line, '\n')+1])
	}
	const traceID = "00000000000000004111111111111111"
	if !strings.Contains(text, traceID) {
		t.Errorf("the trace id %s is not logged as it is", traceID)
	}
	text = strings.ReplaceAll(text, traceID, "<trace id>")
	for _, s := range []string{"4111111111111", "５５５５", "٤١١١", "४१११", "３７８２", "𝟒𝟏𝟏𝟏", "37828224631", "60111111111"} {
		if strings.Contains(text, s) {
			t.Errorf("the logs show %q", s)
		}
	}
}
