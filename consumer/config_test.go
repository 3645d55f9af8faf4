package consumer_test

import (
	"testing"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
)

// The worker, the store and dlq replay judge a key's lifetime by the same
// default retention: a replay that allowed a longer one than the store keeps
// could charge a purged key again.
func TestDefaultKeyRetentionsAgree(t *testing.T) {
	if consumer.DefaultKeyRetention != dedup.DefaultRetention || dlq.DefaultKeyRetention != dedup.DefaultRetention {
		t.Fatalf("default key retention: consumer %v, dlq %v, dedup %v", consumer.DefaultKeyRetention, dlq.DefaultKeyRetention, dedup.DefaultRetention)
	}
}
