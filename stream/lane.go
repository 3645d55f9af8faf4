package stream

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// LaneName is the durable name of the lane of subject (one merchant's
// subject) beside the workers' durable consumer: the durable's name,
// "-lane-" and a hash of the subject, so that every worker names it alike
// and within a consumer name's characters whatever the merchant id. Lanes
// are the worker's (consumer/lane.go): best-effort consumers that serve
// the merchants behind another merchant's backlog.
func LaneName(durable, subject string) string {
	sum := sha256.Sum256([]byte(subject))
	return durable + "-lane-" + hex.EncodeToString(sum[:8])
}

// IsLane reports whether the consumer named name is a lane of durable.
func IsLane(durable, name string) bool { return strings.HasPrefix(name, durable+"-lane-") }

// LaneStats is one lane as ConsumerState reads it.
type LaneStats struct {
	Subject       string `json:"subject"`
	Name          string `json:"name"`
	NumPending    uint64 `json:"num_pending"`
	NumAckPending int    `json:"num_ack_pending"`
}
