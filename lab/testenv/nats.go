package testenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultNATSURL is the machine's local NATS server.
const DefaultNATSURL = "nats://127.0.0.1:4222"

var (
	natsOnce sync.Once
	natsURL  string
	natsErr  error
	// natsSaid is done once a test of this package (this test binary) has
	// logged which server the tests use.
	natsSaid sync.Once
)

func sharedNATSURL() (string, error) {
	natsOnce.Do(func() {
		u := os.Getenv("TEST_NATS_URL")
		if u == "" {
			u = DefaultNATSURL
		}
		nc, err := nats.Connect(u, nats.Timeout(5*time.Second))
		if err != nil {
			natsErr = fmt.Errorf("no NATS answers at %s: %w", u, err)
			return
		}
		defer nc.Close()
		if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
			natsErr = fmt.Errorf("NATS at %s has no JetStream: %w", u, err)
			return
		}
		if err := anchorStreams(nc); err != nil {
			natsErr = fmt.Errorf("NATS at %s: %w", u, err)
			return
		}
		natsURL = u
	})
	return natsURL, natsErr
}

// AnchorStream is a file stream the tests keep on the shared server and
// never delete. The server removes an account's streams directory when a
// deleted stream was the last one in it, while another stream may be
// creating its own directory there: that creation fails ("error creating
// store for stream"), and tests of parallel packages, each deleting its
// streams when it ends, met it. With this stream the directory is never
// empty.
const AnchorStream = "PAYDEDUP_TESTENV_ANCHOR"

func anchorStreams(nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: AnchorStream,
		Subjects: []string{"paydedup.testenv.anchor"}, Storage: jetstream.FileStorage, MaxMsgs: 1})
	if err != nil {
		return fmt.Errorf("create the tests' anchor stream: %w", err)
	}
	return nil
}

// NATSURL returns the URL of a JetStream-enabled NATS server for the test:
// TEST_NATS_URL, else the local server, else (outside CI) an embedded one.
// Tests sharing a server isolate themselves with Unique names.
//
// The first test of a package to ask logs which server that is (go test -v
// shows it, and a failure's output): any server answering on the local
// port is used, though the demo, without NATS_URL, embeds its own.
func NATSURL(t testing.TB) string {
	t.Helper()
	u, err := sharedNATSURL()
	if err == nil {
		natsSaid.Do(func() {
			from := "the local server, " + DefaultNATSURL + "; TEST_NATS_URL names another"
			if os.Getenv("TEST_NATS_URL") != "" {
				from = "TEST_NATS_URL"
			}
			t.Logf("testenv: the tests of this package use the NATS server at %s (%s)", u, from)
		})
		return u
	}
	if InCI() {
		t.Fatalf("%v (CI=true: a missing service is a failure)", err)
	}
	t.Logf("%v; using an embedded server", err)
	return EmbeddedNATS(t).ClientURL()
}

// NATSConn connects to NATSURL and closes the connection when the test ends.
func NATSConn(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(NATSURL(t), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connect to NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Embedded is an in-process nats-server with JetStream on a fixed port and
// its own store directory, so a test can stop and restart it.
type Embedded struct {
	t    testing.TB
	opts *server.Options
	srv  *server.Server
}

// EmbeddedNATS starts an embedded JetStream server, shut down when the test
// ends.
func EmbeddedNATS(t testing.TB) *Embedded {
	t.Helper()
	opts := &server.Options{
		Host: "127.0.0.1", Port: FreePort(t), JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true, MaxPayload: 1 << 20,
	}
	e := &Embedded{t: t, opts: opts}
	e.Start()
	t.Cleanup(e.Shutdown)
	return e
}

// Start starts (or restarts) the server with its store.
func (e *Embedded) Start() {
	e.t.Helper()
	srv, err := server.NewServer(e.opts)
	if err != nil {
		e.t.Fatalf("embedded NATS: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		e.t.Fatal("embedded NATS did not become ready")
	}
	e.srv = srv
}

// Shutdown stops the server.
func (e *Embedded) Shutdown() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		e.srv = nil
	}
}

// ClientURL is the server's client URL.
func (e *Embedded) ClientURL() string {
	return fmt.Sprintf("nats://%s:%d", e.opts.Host, e.opts.Port)
}
