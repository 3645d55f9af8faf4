package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paydedup/paydedup/ops"
	"github.com/paydedup/paydedup/stream"
)

// watchConsumerLag exports the durable consumer's lag on reg, read from
// the server at scrape time (one consumer info request per TTL).
func watchConsumerLag(reg prometheus.Registerer, nc *nats.Conn, streamName, durable string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("consumer lag metrics: %w", err)
	}
	ops.WatchConsumer(reg, streamName, durable, ops.DefaultConsumerLagTTL, func(ctx context.Context) (ops.ConsumerLag, error) {
		st, err := stream.ConsumerState(ctx, js, stream.Config{Name: streamName, Durable: durable})
		if err != nil {
			return ops.ConsumerLag{}, err
		}
		lag := ops.ConsumerLag{
			Pending:     st.NumPending,
			AckPending:  uint64(st.NumAckPending),
			Redelivered: uint64(st.NumRedelivered),
			Waiting:     uint64(st.NumWaiting),
			StreamBytes: st.StreamBytes, StreamMsgs: st.StreamMessages,
			StreamMaxBytes: st.StreamMaxBytes, StreamMaxMsgs: st.StreamMaxMsgs,
		}
		if !st.OldestUnsettled.IsZero() {
			lag.OldestUnsettledAge = max(time.Since(st.OldestUnsettled), 0)
		}
		return lag, nil
	})
	return nil
}
