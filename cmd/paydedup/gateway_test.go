package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// cliBuffer is an output a running command writes while the test reads.
type cliBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (c *cliBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.Write(p)
}

func (c *cliBuffer) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}

// runCLI runs the real command tree with env; it returns stdout and stderr.
func runCLI(ctx context.Context, env map[string]string, args ...string) (string, string, error) {
	var out, errOut cliBuffer
	root := newRootCmd(&out, &errOut, func(k string) string { return env[k] })
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

func TestAPIKeyCommands(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "PAYDEDUP_LOG_LEVEL": "warn"}
	ctx := context.Background()
	if _, _, err := runCLI(ctx, env, "apikey", "create"); err == nil || !strings.Contains(err.Error(), "--merchant") {
		t.Fatalf("create without --merchant: %v", err)
	}
	if _, _, err := runCLI(ctx, env, "apikey", "create", "--merchant", "m.bad"); err == nil {
		t.Fatal("an invalid merchant was accepted")
	}
	out, note, err := runCLI(ctx, env, "apikey", "create", "--merchant", "m_1", "--label", "checkout")
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(out)
	if !strings.HasPrefix(key, "pd_") || strings.Count(out, "\n") != 1 || !strings.Contains(note, "only this once") {
		t.Fatalf("create printed %q / %q", out, note)
	}
	id := key[3:15]
	list, _, err := runCLI(ctx, env, "apikey", "list", "--merchant", "m_1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, id) || !strings.Contains(list, "checkout") || strings.Contains(list, key[16:]) {
		t.Fatalf("list:\n%s", list)
	}
	if _, _, err := runCLI(ctx, env, "apikey", "revoke", "ffffffffffff"); err == nil || !strings.Contains(err.Error(), "no such key") {
		t.Fatalf("revoke unknown: %v", err)
	}
	out, _, err = runCLI(ctx, env, "apikey", "revoke", id)
	if err != nil || !strings.Contains(out, "revoked key "+id) {
		t.Fatalf("revoke: %q %v", out, err)
	}
	list, _, _ = runCLI(ctx, env, "apikey", "list")
	revoked := false
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == id {
			_, err := time.Parse(time.RFC3339, f[3])
			revoked = err == nil
		}
	}
	if !revoked {
		t.Fatalf("revoked key not shown as revoked:\n%s", list)
	}
}

func TestGatewayCommandRefusesBadConfiguration(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/db", "PAYDEDUP_HTTP_MAX_WAIT": "1h",
		"PAYDEDUP_REPUBLISH_AFTER": "1s", "PAYDEDUP_LOG_LEVEL": "error"}
	_, _, err := runCLI(context.Background(), env, "gateway")
	if err == nil || !strings.Contains(err.Error(), "max wait") || !strings.Contains(err.Error(), "republish after") {
		t.Fatalf("got %v", err)
	}
	// The door limits and the webhook secrets, each named.
	for k, v := range map[string]string{
		"PAYDEDUP_GATEWAY_AUTH_FAILURES":       "-1",
		"PAYDEDUP_GATEWAY_AUTH_FAILURE_WINDOW": "10ms",
		"PAYDEDUP_GATEWAY_MAX_CONNS":           "-5",
		"STRIPE_WEBHOOK_SECRET":                "whsec_new,,whsec_old",
	} {
		env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/db", "PAYDEDUP_LOG_LEVEL": "error", k: v}
		_, _, err := runCLI(context.Background(), env, "gateway")
		want := map[string]string{"PAYDEDUP_GATEWAY_AUTH_FAILURES": "PAYDEDUP_GATEWAY_AUTH_FAILURES",
			"PAYDEDUP_GATEWAY_AUTH_FAILURE_WINDOW": "auth failure window", "PAYDEDUP_GATEWAY_MAX_CONNS": "max conns",
			"STRIPE_WEBHOOK_SECRET": "STRIPE_WEBHOOK_SECRET"}[k]
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "whsec_") {
			t.Errorf("%s=%s: %v, want an error naming %q (and no secret)", k, v, err, want)
		}
	}
}

// TestGatewayCommandServes runs "paydedup gateway" as deployed, logged in
// as the paydedup_gateway role (API keys are created as the owner): it
// accepts a payment, answers /readyz and /metrics, and drains on cancel.
func TestGatewayCommandServes(t *testing.T) {
	t.Parallel()
	u := testenv.Unique(t)
	cfg := stream.Config{Name: strings.ToUpper(u), SubjectPrefix: u + ".req", DLQStream: strings.ToUpper(u) + "_DLQ",
		DLQPrefix: u + ".dlq", Durable: "w", StreamMaxBytes: 256 << 20, DLQMaxAge: time.Hour}
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := stream.EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = js.DeleteStream(context.Background(), cfg.Name)
		_ = js.DeleteStream(context.Background(), cfg.DLQStream)
		_ = js.DeleteStream(context.Background(), cfg.WithDefaults().AdvisoryStream)
	})
	httpAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	ownerURL := testenv.PostgresURL(t)
	env := map[string]string{
		"DATABASE_URL": ownerURL, "NATS_URL": testenv.NATSURL(t),
		"PAYDEDUP_STREAM": cfg.Name, "PAYDEDUP_SUBJECT_PREFIX": cfg.SubjectPrefix,
		"PAYDEDUP_DLQ_STREAM": cfg.DLQStream, "PAYDEDUP_DLQ_PREFIX": cfg.DLQPrefix, "PAYDEDUP_DURABLE": cfg.Durable,
		"PAYDEDUP_HTTP_ADDR": httpAddr, "PAYDEDUP_ADMIN_ADDR": adminAddr, "PAYDEDUP_LOG_LEVEL": "warn",
	}
	out, _, err := runCLI(ctx, env, "apikey", "create", "--merchant", "m_1")
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(out)
	gwEnv := maps.Clone(env)
	gwEnv["DATABASE_URL"] = withUser(t, ownerURL, "paydedup_gateway")

	defer startCommand(t, gwEnv, &testenv.Buffer{}, "gateway")()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	get := func(url string) (int, string) {
		resp, err := client.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _ := get("http://" + adminAddr + "/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			_, body := get("http://" + adminAddr + "/readyz")
			t.Fatalf("never ready: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+httpAddr+"/v1/payments",
		strings.NewReader(`{"amount":100,"currency":"usd","payment_method":"pm_card_visa"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Idempotency-Key", "cli-1")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST: %d", resp.StatusCode)
	}
	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(ctx, cfg.SubjectPrefix+".m_1")
	if err != nil {
		t.Fatal(err)
	}
	if msg.Header.Get("Nats-Msg-Id") != "m_1:cli-1" || msg.Header.Get("Idempotency-Key") != "cli-1" ||
		!strings.Contains(string(msg.Data), `"merchant_id":"m_1"`) {
		t.Fatalf("published %v %s", msg.Header, msg.Data)
	}
	code, metrics := get("http://" + adminAddr + "/metrics")
	if code != http.StatusOK || !strings.Contains(metrics, `paydedup_gateway_requests_total{code="202",route="post_payment"} 1`) {
		t.Fatalf("metrics %d:\n%s", code, metrics)
	}
}

// withUser returns dbURL logged in as user (the local Postgres trusts
// loopback, so no password).
func withUser(t *testing.T, dbURL, user string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return u.String()
}
