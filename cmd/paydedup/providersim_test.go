//go:build !nolab

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/providertest"
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
