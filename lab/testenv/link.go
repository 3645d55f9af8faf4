package testenv

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Link is a TCP link on loopback between a client under test and a server,
// through an in-process toxiproxy, on which a test loses what one side
// sends while the other side goes on: the server stores a message whose
// PubAck never arrives, or a client's ack is sent and never received. It
// injects a boundary's unknown outcome from outside the code under test.
type Link struct {
	proxy *toxiproxy.Proxy

	mu     sync.Mutex
	toxics []string
}

// Directions of a Link: what the client sends, and what the server sends.
const (
	ClientToServer = "upstream"
	ServerToClient = "downstream"
)

// NewLink starts a link to upstream (host:port) on a free local port. It is
// closed when the test ends.
func NewLink(t testing.TB, name, upstream string) *Link {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, name, fmt.Sprintf("127.0.0.1:%d", FreePort(t)), upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	t.Cleanup(p.Stop)
	return &Link{proxy: p}
}

// Addr is the link's host:port, for the client to dial.
func (l *Link) Addr() string { return l.proxy.Listen }

// URL is addr with the scheme given, e.g. URL("nats").
func (l *Link) URL(scheme string) string { return scheme + "://" + l.Addr() }

// Lose drops everything dir carries from now on, on every open and new
// connection, until Restore; the connections stay open, so neither side
// learns of it but by a timeout.
func (l *Link) Lose(dir string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := "lose_" + dir
	toxic := `{"name":"` + name + `","stream":"` + dir + `","type":"timeout","attributes":{"timeout":0}}`
	if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		return fmt.Errorf("link %s: lose %s: %w", l.proxy.Name, dir, err)
	}
	l.toxics = append(l.toxics, name)
	return nil
}

// Restore removes every fault: the connections that lost data are closed
// (the client reconnects), and new ones carry everything again.
func (l *Link) Restore() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, name := range l.toxics {
		if err := l.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
			return fmt.Errorf("link %s: restore %s: %w", l.proxy.Name, name, err)
		}
	}
	l.toxics = nil
	return nil
}
