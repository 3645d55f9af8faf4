package testenv

import "go.uber.org/goleak"

// LeakOptions are the goleak options for packages whose tests use real
// services: pgx pools and net/http keep-alive connections close
// asynchronously after a test has released them.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		// toxiproxy's in-process link can leave a toxic's pipe blocked on
		// its output for a moment after the proxy stops (its own
		// goroutine, not ours; seen under load in client's tests).
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
	}
}
