package testenv

import (
	"net"
	"sync"
	"testing"
)

// FrontProxy is a TCP proxy in front of a server, for tests that must close
// a client's connection at a chosen moment: CutClients closes the client side
// of every open connection while the server side stays open, so the server
// finishes (and answers into the void) whatever it had received. That is what
// a load balancer or a NAT does when it drops a kept-alive connection after a
// request went through and before the response came back.
type FrontProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	clients  map[net.Conn]bool
	upstream map[net.Conn]bool
	accepted int
	closed   bool
	wg       sync.WaitGroup
}

// NewFrontProxy listens on a free local port and forwards every connection to
// target (host:port). It is closed when the test ends.
func NewFrontProxy(t testing.TB, target string) *FrontProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("front proxy: %v", err)
	}
	p := &FrontProxy{ln: ln, target: target, clients: map[net.Conn]bool{}, upstream: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *FrontProxy) Addr() string { return p.ln.Addr().String() }

// URL is the proxy's http:// base URL.
func (p *FrontProxy) URL() string { return "http://" + p.Addr() }

// Accepted is how many client connections the proxy has accepted.
func (p *FrontProxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// CutClients closes the client side of every open connection and returns how
// many it closed. The server sides stay open until the server closes them or
// the proxy is closed; what the server sends on them is discarded.
func (p *FrontProxy) CutClients() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.clients {
		_ = c.Close()
		delete(p.clients, c)
		n++
	}
	return n
}

// Close stops the proxy and closes every connection, then waits for its
// goroutines.
func (p *FrontProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.clients {
		_ = c.Close()
	}
	for c := range p.upstream {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *FrontProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.accepted++
		p.clients[c], p.upstream[u] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(u, c, false) // client → server
		go p.pipe(c, u, true)  // server → client
	}
}

// pipe copies from src to dst until src ends. When the server's side ends,
// both connections are closed. When the client's side ends, the server's is
// closed too, unless the proxy cut the client: then the server keeps its
// connection, finishes what it received, and its answer is read and
// discarded (writes to the cut client fail) until it closes.
func (p *FrontProxy) pipe(dst, src net.Conn, fromServer bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			_, _ = dst.Write(buf[:n])
		}
		if err != nil {
			break
		}
	}
	client, server := dst, src
	if !fromServer {
		client, server = src, dst
	}
	p.mu.Lock()
	_, open := p.clients[client]
	cut := !open && !p.closed
	delete(p.clients, client)
	if fromServer || !cut {
		delete(p.upstream, server)
	}
	p.mu.Unlock()
	_ = client.Close()
	if fromServer || !cut {
		_ = server.Close()
	}
}
