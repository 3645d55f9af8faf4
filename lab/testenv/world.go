package testenv

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// Provider serves an in-process simulator and returns it with the Stripe
// adapter pointed at it: the real client path, the simulated provider.
func Provider(t testing.TB, seed int64, timeout time.Duration) (*stripesim.Simulator, *stripe.Client) {
	t.Helper()
	return ProviderWith(t, stripesim.Config{Seed: seed}, timeout)
}

// ProviderWith is Provider with a simulator configured by cfg (webhooks,
// a processing delay); it stops the simulator's webhooks when the test ends.
func ProviderWith(t testing.TB, cfg stripesim.Config, timeout time.Duration) (*stripesim.Simulator, *stripe.Client) {
	t.Helper()
	sim := stripesim.New(cfg)
	t.Cleanup(sim.Close)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	adapter, err := stripe.New(stripe.Config{SecretKey: "sk_test_paydedup", APIBase: srv.URL, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adapter.CloseIdleConnections)
	return sim, adapter
}

// DLQKey is the dead-letter authentication key of the tests' workers and
// CLI (PAYDEDUP_DLQ_KEY).
const DLQKey = "paydedup-test-dlq-key-0123456789abcdef"

// Streams returns a topology whose stream, subjects and
// consumer names are unique to the test, and deletes the streams when the
// test ends. Timeouts and sizes are left for the caller to set.
func Streams(t testing.TB, js jetstream.JetStream) stream.Config {
	t.Helper()
	u := Unique(t)
	name := strings.ToUpper(u)
	cfg := stream.Config{
		Name: name, SubjectPrefix: u + ".req", DLQStream: name + "_DLQ", DLQPrefix: u + ".dlq", Durable: "w",
		StreamMaxBytes: 64 << 20, DLQMaxAge: time.Hour, DLQKey: []byte(DLQKey),
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, cfg.Name)
		_ = js.DeleteStream(ctx, cfg.DLQStream)
		_ = js.DeleteStream(ctx, cfg.WithDefaults().AdvisoryStream)
	})
	return cfg
}

// CommandBody is the message body of a valid card payment of amount (US
// cents) for (merchant, key), as stream.EncodeCommand writes it.
func CommandBody(merchant, key string, amount int64) []byte {
	b, err := stream.EncodeCommand(&payment.Command{MerchantID: merchant, IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"})
	if err != nil {
		panic(err)
	}
	return b
}
