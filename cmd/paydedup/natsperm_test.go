package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// The deploy tree's NATS configuration lets only the workers file dead
// letters: a publisher or an operator publishing on payments.dlq.> is
// refused, while the operator can still list and replay them, and nobody
// can forge a server advisory.
func TestDeployNATSPermissions(t *testing.T) {
	t.Parallel()
	opts, err := server.ProcessConfigFile("../../deploy/nats/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", testenv.FreePort(t), 0, t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS did not start with deploy/nats/nats.conf")
	}
	connect := func(user, pass string) jetstream.JetStream {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, pass), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	ctx := context.Background()
	cfg := stream.Config{DLQKey: []byte(testenv.DLQKey), StreamMaxBytes: 256 << 20, DLQMaxAge: time.Hour}.WithDefaults()
	worker := connect("paydedup_worker", "compose-worker")
	if _, _, err := stream.EnsureStreams(ctx, worker, cfg); err != nil {
		t.Fatalf("the worker cannot set up the streams: %v", err)
	}
	letter := func() *nats.Msg {
		d := stream.Letter{Reason: stream.ReasonMaxDeliveries, Err: errors.New("x"), OrigSubject: cfg.SubjectPrefix + ".m_1",
			OrigStream: cfg.Name, OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 2, Header: nats.Header{},
			Data: []byte(paymentLine("k", 100)), FailedAt: time.Now()}
		return d.Msg(cfg)
	}
	publish := func(js jetstream.JetStream, m *nats.Msg) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.PublishMsg(pctx, m)
		return err
	}
	if err := publish(worker, letter()); err != nil {
		t.Fatalf("the worker cannot file a dead letter: %v", err)
	}
	publisher := connect("paydedup_publisher", "compose-publisher")
	operator := connect("paydedup_operator", "compose-operator")
	stored := func(stream string) uint64 {
		s, err := worker.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	for name, js := range map[string]jetstream.JetStream{"publisher": publisher, "operator": operator} {
		_ = publish(js, letter())
		if n := stored(cfg.DLQStream); n != 1 {
			t.Errorf("the %s filed a dead letter: the DLQ holds %d", name, n)
		}
		adv := nats.NewMsg(stream.AdvisorySubject(cfg.Name, cfg.Durable))
		adv.Data = []byte(`{"stream":"PAYMENTS","stream_seq":1,"deliveries":20}`)
		_ = publish(js, adv)
		if n := stored(cfg.AdvisoryStream); n != 0 {
			t.Errorf("the %s published a MAX_DELIVERIES advisory", name)
		}
	}
	if err := publish(publisher, stream.CommandMsg(cfg, "m_1", "k1", []byte(paymentLine("k1", 100)))); err != nil {
		t.Fatalf("the publisher cannot publish a payment: %v", err)
	}
	if err := operator.DeleteStream(ctx, cfg.DLQStream); err == nil {
		t.Error("the operator deleted the DLQ stream")
	}
	letters, err := dlq.List(ctx, operator, cfg, dlq.Filter{})
	if err != nil || len(letters) != 1 || !letters[0].Verified {
		t.Fatalf("the operator cannot list the dead letters: %d listed, %v", len(letters), err)
	}
	rep, err := dlq.Replay(ctx, operator, cfg, dlq.ReplayOptions{All: true})
	if err != nil || rep.Replayed != 1 {
		t.Fatalf("the operator cannot replay: %+v %v", rep, err)
	}
}
