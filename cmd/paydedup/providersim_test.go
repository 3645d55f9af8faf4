//go:build !nolab

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/providertest"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestProviderSimServesHTTPS starts provider-sim with a certificate: it
// answers over TLS with HTTP/2, and the Stripe adapter, trusting the CA,
// charges through it.
func TestProviderSimServesHTTPS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t)
	files := ca.issue(t, "provider-sim", dir, true)
	addr := freeAddr(t)
	stop := startCommand(t, nil, &testenv.Buffer{}, "provider-sim", "--addr", addr, "--tls-cert", files.cert, "--tls-key", files.key, "--log-level", "warn")
	defer stop()

	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	tr := stripe.NewTransport()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	base := "https://" + addr
	waitFor(t, 10*time.Second, "provider-sim to answer over TLS", func() bool {
		resp, err := client.Get(base + "/_sim/ledger")
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("provider-sim answered over %s, want HTTP/2", resp.Proto)
		}
		return resp.StatusCode == http.StatusOK
	})
	s, err := stripe.New(stripe.Config{SecretKey: "sk_test_paydedup", APIBase: base, HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}
	providertest.MustCharge(t, s, providertest.ChargeReq("k-tls"))
}

func TestProviderSimTLSNeedsBothFiles(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--tls-cert", "x.pem"}, {"--tls-key", "x-key.pem"}} {
		_, _, err := runCLI(context.Background(), nil, append([]string{"provider-sim", "--addr", "127.0.0.1:0"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "--tls-cert and --tls-key") {
			t.Errorf("%v: err %v, want one naming --tls-cert and --tls-key", args, err)
		}
	}
	_, _, err := runCLI(context.Background(), nil, "provider-sim", "--addr", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent-key.pem")
	if err == nil || !strings.Contains(err.Error(), "/nonexistent.pem") {
		t.Errorf("missing files: err %v, want one naming the file", err)
	}
}

func TestProviderSimRejectsBadModelFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--latency-median", "-1ms"}, "--latency-median"},
		{[]string{"--latency-median", "10ms", "--latency-p99", "-1ms"}, "--latency-p99"},
		{[]string{"--latency-median", "10ms", "--latency-p99", "5ms"}, "--latency-p99"},
		{[]string{"--latency-p99", "5ms"}, "--latency-median"},
		{[]string{"--rate-limit", "-1"}, "--rate-limit"},
		{[]string{"--rate-limit", "NaN"}, "--rate-limit"},
		{[]string{"--concurrency-limit", "-2"}, "--concurrency-limit"},
	} {
		_, _, err := runCLI(context.Background(), nil, append([]string{"provider-sim", "--addr", "127.0.0.1:0"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want one naming %s", c.args, err, c.want)
		}
	}
}

// TestProviderSimServesTheModel starts provider-sim with a rate limit of
// one request per second: the second request at once is answered 429
// global-rate, and /_sim/stats reports the model and the counts.
func TestProviderSimServesTheModel(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	stop := startCommand(t, nil, &testenv.Buffer{}, "provider-sim", "--addr", addr, "--log-level", "warn",
		"--latency-median", "1ms", "--latency-p99", "3ms", "--rate-limit", "1", "--concurrency-limit", "8")
	defer stop()
	base := "http://" + addr
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	waitFor(t, 10*time.Second, "provider-sim to answer", func() bool {
		resp, err := client.Get(base + "/_sim/stats")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	codes := []int{}
	for range 2 {
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/payment_intents", nil)
		req.Header.Set("Authorization", "Bearer sk_test_model")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get(stripesim.HeaderRateLimitedReason) != stripesim.ReasonGlobalRate {
			t.Errorf("429 without Stripe-Rate-Limited-Reason: global-rate: %v", resp.Header)
		}
	}
	if codes[0] != http.StatusOK || codes[1] != http.StatusTooManyRequests {
		t.Errorf("two lists at once: %v, want 200 then 429", codes)
	}
	resp, err := client.Get(base + "/_sim/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st stripesim.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	want := stripesim.Model{LatencyMedian: time.Millisecond, LatencyP99: 3 * time.Millisecond, RateLimit: 1, ConcurrencyLimit: 8}
	if st.Model != want || st.Requests[stripesim.KindList] != 2 || st.RateLimited[stripesim.ReasonGlobalRate] != 1 || st.LatencyCount != 1 {
		t.Errorf("stats %+v, want model %+v, 2 lists, one global-rate 429, one latency", st, want)
	}
}
