package consumer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/stream"
)

// The worker, the store and dlq replay judge a key's lifetime by the same
// default retention: a replay that allowed a longer one than the store keeps
// could charge a purged key again.
func TestDefaultKeyRetentionsAgree(t *testing.T) {
	if consumer.DefaultKeyRetention != ledger.DefaultRetention || dlq.DefaultKeyRetention != ledger.DefaultRetention {
		t.Fatalf("default key retention: consumer %v, dlq %v, dedup %v", consumer.DefaultKeyRetention, dlq.DefaultKeyRetention, ledger.DefaultRetention)
	}
}

// Validate refuses a duplicate window a lost requeue PubAck could outlast,
// and a key retention the redelivery schedule could outlast, naming the
// setting; the defaults pass.
func TestValidateDuplicateWindowAndRetention(t *testing.T) {
	base := consumer.Config{Stream: stream.Config{DLQKey: []byte(strings.Repeat("k", 40))}, NetRequeues: consumer.DefaultNetRequeues}.WithDefaults()
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*consumer.Config)
		want string
	}{
		{"window shorter than ack wait", func(c *consumer.Config) { c.Stream.DuplicateWindow = c.Stream.AckWait }, "duplicate window"},
		{"window shorter than ack wait and the net", func(c *consumer.Config) {
			c.Stream.AckWait, c.Stream.DuplicateWindow = 100*time.Second, 102*time.Second
		}, "duplicate window"},
		{"retention within the schedule", func(c *consumer.Config) { c.KeyRetention = 30 * time.Minute }, "key retention"},
		{"retention within a backoff schedule", func(c *consumer.Config) {
			c.Stream.BackOff = []time.Duration{time.Hour} // 3 × 20 × 1h > 48h
		}, "key retention"},
	} {
		c := base
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if need := consumer.DuplicateWindowNeed(base); need >= stream.DefaultDuplicateWindow {
		t.Errorf("the default duplicate window %v does not cover %v", stream.DefaultDuplicateWindow, need)
	}
}
