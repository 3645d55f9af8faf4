// Package inproc starts the lab's servers inside the process: an embedded
// JetStream server when no NATS_URL is given, and the Stripe-compatible
// simulator on a loopback port with the Stripe adapter pointed at it. The
// production binary (built with -tags nolab) links neither.
package inproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider/stripe"
)

// NATS starts an in-process JetStream server on a random loopback port with
// a temporary store, for demo and bench when NATS_URL is not set. stop shuts
// it down and removes the store.
func NATS() (clientURL string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "paydedup-nats-")
	if err != nil {
		return "", nil, fmt.Errorf("temporary NATS store: %w", err)
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		os.RemoveAll(dir)
		return "", nil, errors.New("the embedded NATS server did not start within 10s")
	}
	return srv.ClientURL(), func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
	}, nil
}

// SimKey is the secret key the Stripe adapter presents to the in-process
// simulator, which accepts any.
const SimKey = "sk_test_paydedup_sim"

// Simulator serves a simulator on a loopback port and returns the Stripe
// adapter pointed at it, each attempt bounded by timeout; stop shuts the
// simulator down.
func Simulator(ctx context.Context, cfg stripesim.Config, timeout time.Duration) (prov *stripe.Client, sim *stripesim.Simulator, stop func(), err error) {
	sim = stripesim.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, fmt.Errorf("start the simulator: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sim.ServeListener(sctx, ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "simulator:", err)
		}
	}()
	stop = func() { cancel(); <-done }
	prov, err = stripe.New(stripe.Config{SecretKey: SimKey, APIBase: "http://" + ln.Addr().String(), Timeout: timeout})
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	return prov, sim, stop, nil
}
