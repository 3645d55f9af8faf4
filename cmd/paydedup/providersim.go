//go:build !nolab

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/lab/stripesim"
)

type providerSimCmd struct {
	app             *app
	addr            string
	tlsCert, tlsKey string
	cfg             stripesim.Config
}

func newProviderSimCmd(a *app) *cobra.Command {
	p := &providerSimCmd{app: a}
	cmd := &cobra.Command{
		Use:   "provider-sim",
		Short: "Serve the Stripe-compatible payment provider simulator",
		Long: `provider-sim serves a subset of Stripe's v1 API (POST /v1/payment_intents with
Idempotency-Key, GET /v1/payment_intents/{id}, GET /v1/payment_intents/search)
with a ledger at GET /_sim/ledger and injectable faults: latency, 5xx, 429,
dropped connections before and after charging. Point a worker at it with
STRIPE_API_BASE=http://ADDR and any STRIPE_SECRET_KEY. With --webhook-url and
STRIPE_WEBHOOK_SECRET it posts payment_intent.succeeded and payment_failed
events, signed as Stripe signs them, when a processing intent settles (point
it at a gateway's /v1/stripe/webhooks with the gateway's secret).

The provider as it really is: --latency-median and --latency-p99 give every
request a log-normal delay of that median and 99th percentile (Stripe: a few
hundred milliseconds, a tail past a second); --rate-limit caps an account's
(a secret key's) requests per second across every endpoint, a token bucket
of one second's requests (Stripe: 100 in live mode, 25 in a sandbox), and
--concurrency-limit its requests in flight. A request past a limit is
answered at once as Stripe answers it, 429 with code rate_limit and
Stripe-Rate-Limited-Reason global-rate or global-concurrency, and is not
processed. GET /_sim/stats counts the requests by endpoint, the 429s by
reason, the requests in flight (now, peak, and their sum of seconds) and the
latency given (median and 99th percentile).

With --tls-cert and --tls-key it serves HTTPS, HTTP/2 offered by ALPN as
api.stripe.com does: point a worker at it with STRIPE_API_BASE=https://ADDR
and SSL_CERT_FILE naming a file that holds the certificate (or its CA).`,
		Example: `  paydedup provider-sim --addr 127.0.0.1:12111 --drop-after-charge 0.1 --rate-5xx 0.05 --latency 20ms
  curl -s 127.0.0.1:12111/_sim/ledger
  paydedup provider-sim --tls-cert sim.pem --tls-key sim-key.pem
  paydedup provider-sim --latency-median 300ms --latency-p99 900ms --rate-limit 100
  curl -s 127.0.0.1:12111/_sim/stats`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return p.Run(cmd.Context()) },
	}
	f := cmd.Flags()
	f.StringVar(&p.addr, "addr", "127.0.0.1:12111", "listen address")
	f.DurationVar(&p.cfg.Faults.Latency, "latency", 0, "latency added to every request")
	f.DurationVar(&p.cfg.Faults.Jitter, "jitter", 0, "random extra latency, up to this")
	f.Float64Var(&p.cfg.Faults.Rate5xx, "rate-5xx", 0, "fraction of requests answered 500 without processing")
	f.Float64Var(&p.cfg.Faults.Rate429, "rate-429", 0, "fraction of requests answered 429 with Retry-After")
	f.Float64Var(&p.cfg.Faults.RateDropAfterCharge, "drop-after-charge", 0, "fraction of requests processed (charged) whose connection is then dropped")
	f.Float64Var(&p.cfg.Faults.RateFailBeforeCharge, "fail-before-charge", 0, "fraction of requests whose connection is dropped before processing")
	f.Float64Var(&p.cfg.Faults.RateRefundFail, "refund-fail", 0, "fraction of refunds answered pending that fail after --processing-delay")
	f.DurationVar(&p.cfg.CaptureWindow, "capture-window", stripesim.DefaultCaptureWindow, "how long an authorization can be captured before it is canceled")
	f.Int64Var(&p.cfg.Seed, "seed", 0, "random seed for ids and faults (0: random)")
	f.DurationVar(&p.cfg.KeyTTL, "key-ttl", stripesim.DefaultKeyTTL, "how long an idempotency key is remembered")
	f.DurationVar(&p.cfg.SearchLag, "search-lag", 0, "how long new intents stay invisible to search")
	f.DurationVar(&p.cfg.ProcessingDelay, "processing-delay", stripesim.DefaultProcessingDelay,
		"how long a bank debit (pm_usBankAccount_success, pm_usBankAccount_accountClosed) stays processing")
	f.StringVar(&p.tlsCert, "tls-cert", "", "PEM certificate (chain) to serve HTTPS with; needs --tls-key")
	f.StringVar(&p.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.DurationVar(&p.cfg.Model.LatencyMedian, "latency-median", 0, "median of the log-normal latency of every request (0: none)")
	f.DurationVar(&p.cfg.Model.LatencyP99, "latency-p99", 0, "99th percentile of that latency, at least --latency-median (0: always the median)")
	f.Float64Var(&p.cfg.Model.RateLimit, "rate-limit", 0, "requests per second per account, every endpoint, answered 429 global-rate past it (0: none; Stripe live mode 100, sandbox 25)")
	f.IntVar(&p.cfg.Model.ConcurrencyLimit, "concurrency-limit", 0, "requests in flight per account, answered 429 global-concurrency past it (0: none)")
	f.StringVar(&p.cfg.WebhookURL, "webhook-url", "", "where to post webhook events (needs STRIPE_WEBHOOK_SECRET); empty sends none")
	p.cfg.WebhookSecret = a.getenv("STRIPE_WEBHOOK_SECRET")
	return cmd
}

// Run serves until ctx ends.
func (p *providerSimCmd) Run(ctx context.Context) error {
	switch {
	case p.cfg.WebhookURL == "":
		p.cfg.WebhookSecret = "" // a secret alone sends nothing
	case p.cfg.WebhookSecret == "":
		return errors.New("provider-sim: --webhook-url needs STRIPE_WEBHOOK_SECRET, the secret the receiving gateway verifies with")
	}
	if err := checkModelFlags(p.cfg.Model); err != nil {
		return fmt.Errorf("provider-sim: %w", err)
	}
	if err := p.cfg.Validate(); err != nil {
		return fmt.Errorf("provider-sim: %w", err)
	}
	scheme, tlsCfg := "http", (*tls.Config)(nil)
	switch {
	case (p.tlsCert == "") != (p.tlsKey == ""):
		return errors.New("provider-sim: --tls-cert and --tls-key go together: give both or neither")
	case p.tlsCert != "":
		cert, err := tls.LoadX509KeyPair(p.tlsCert, p.tlsKey)
		if err != nil {
			return fmt.Errorf("provider-sim: --tls-cert %s, --tls-key %s: %w", p.tlsCert, p.tlsKey, err)
		}
		// "h2" first: net/http's server then speaks HTTP/2 to a client that
		// offers it, as Stripe's API does.
		scheme, tlsCfg = "https", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	}
	p.cfg.Logger = p.app.logger
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("provider-sim: listen on --addr %s: %w", p.addr, err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	sim := stripesim.New(p.cfg)
	defer sim.Close()
	p.app.logger.Info("provider simulator listening", "addr", ln.Addr().String(), "scheme", scheme)
	fmt.Fprintf(p.app.out, "provider-sim: listening on %s://%s\n", scheme, ln.Addr())
	if err := sim.ServeListener(ctx, ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// checkModelFlags names the flag of the first bad model setting.
func checkModelFlags(m stripesim.Model) error {
	switch {
	case m.LatencyMedian < 0:
		return fmt.Errorf("--latency-median must not be negative, got %s", m.LatencyMedian)
	case m.LatencyP99 < 0:
		return fmt.Errorf("--latency-p99 must not be negative, got %s", m.LatencyP99)
	case m.LatencyP99 > 0 && m.LatencyP99 < m.LatencyMedian:
		return fmt.Errorf("--latency-p99 %s must be at least --latency-median %s", m.LatencyP99, m.LatencyMedian)
	case m.LatencyP99 > 0 && m.LatencyMedian == 0:
		return fmt.Errorf("--latency-p99 %s needs --latency-median", m.LatencyP99)
	case math.IsNaN(m.RateLimit) || math.IsInf(m.RateLimit, 0) || m.RateLimit < 0:
		return fmt.Errorf("--rate-limit must be a non-negative number of requests per second, got %v", m.RateLimit)
	case m.ConcurrencyLimit < 0:
		return fmt.Errorf("--concurrency-limit must not be negative, got %d", m.ConcurrencyLimit)
	}
	return nil
}
