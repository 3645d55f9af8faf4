package consumer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// windowStore is a store whose blind-call window is set by the test.
type windowStore struct {
	writes
	window time.Duration
}

func (w *windowStore) ProviderKeyWindow() time.Duration { return w.window }

// TestWorkerRefusesWindowPlusLeaseBeyondProviderMemory: a claim taken at the
// very end of the key window may call the provider up to MaxWaitUnderLease
// later (after waiting for a slot or a rate limit), a call lasting up to a
// lease; if
// the provider has forgotten the key by then, that call charges again (the
// protocol model finds this double charge). The worker refuses to start
// with such a window and lease, and starts with the defaults.
func TestWorkerRefusesWindowPlusLeaseBeyondProviderMemory(t *testing.T) {
	t.Parallel()
	cfg := consumer.Config{Stream: stream.Config{Name: "W", SubjectPrefix: "w.req", DLQStream: "W_DLQ", DLQPrefix: "w.dlq",
		Durable: "w", DLQKey: []byte(testenv.DLQKey)}}.WithDefaults()
	for _, tc := range []struct {
		window time.Duration
		ok     bool
	}{
		{23 * time.Hour, true},
		{provider.KeyLifetime - cfg.Lease - cfg.MaxWaitUnderLease - time.Second, true},
		{provider.KeyLifetime - cfg.Lease - cfg.MaxWaitUnderLease, false},
		{provider.KeyLifetime - cfg.Lease - time.Second, false},
		{provider.KeyLifetime, false},
	} {
		proc := consumer.NewProcessor(&windowStore{window: tc.window}, nil, cfg, nil)
		_, err := consumer.NewWorker(testenv.NATSConn(t), proc, cfg, nil, nil, nil)
		switch {
		case tc.ok && err != nil:
			t.Errorf("window %v, lease %v: %v", tc.window, cfg.Lease, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "key lifetime")):
			t.Errorf("window %v, lease %v: err = %v, want the window refused", tc.window, cfg.Lease, err)
		}
	}
}
