package main

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paydedup/paydedup/ops"
)

// watchConsumerLag exports the durable consumer's lag on reg, read from
// the server at scrape time (one consumer info request per TTL).
func watchConsumerLag(reg prometheus.Registerer, nc *nats.Conn, streamName, durable string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("consumer lag metrics: %w", err)
	}
	ops.WatchConsumer(reg, streamName, durable, ops.DefaultConsumerLagTTL, func(ctx context.Context) (ops.ConsumerLag, error) {
		// Consumer fetches the info once; CachedInfo is that answer.
		c, err := js.Consumer(ctx, streamName, durable)
		if err != nil {
			return ops.ConsumerLag{}, err
		}
		info := c.CachedInfo()
		return ops.ConsumerLag{
			Pending:     info.NumPending,
			AckPending:  uint64(info.NumAckPending),
			Redelivered: uint64(info.NumRedelivered),
			Waiting:     uint64(info.NumWaiting),
		}, nil
	})
	return nil
}
