package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// defaultAdminAddr is the admin listener's address in the container image
// (deploy/Dockerfile sets PAYDEDUP_ADMIN_ADDR to it and exposes its port).
const defaultAdminAddr = ":9090"

type healthcheckCmd struct {
	app     *app
	addr    string
	path    string
	rawURL  string
	timeout time.Duration
}

func newHealthcheckCmd(a *app) *cobra.Command {
	h := &healthcheckCmd{app: a}
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Probe a running paydedup's admin listener; exit 0 when it is ready",
		Long: `healthcheck asks the admin listener of the paydedup process in the same
container (PAYDEDUP_ADMIN_ADDR, else ` + defaultAdminAddr + `) for /readyz and exits 0 on
200, 1 otherwise, printing what failed. It lets a container healthcheck
(docker compose, docker run --health-cmd) use the distroless image, which
has no shell, curl or wget. Kubernetes probes the listener itself.`,
		Example: `  paydedup healthcheck
  paydedup healthcheck --path /livez
  paydedup healthcheck --url http://127.0.0.1:12111/_sim/ledger`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return h.Run(cmd.Context()) },
	}
	f := cmd.Flags()
	f.StringVar(&h.addr, "admin-addr", envOr(a.getenv, "PAYDEDUP_ADMIN_ADDR", defaultAdminAddr), "address of the admin listener to probe; a host left out or 0.0.0.0 means this machine (PAYDEDUP_ADMIN_ADDR)")
	f.StringVar(&h.path, "path", "/readyz", "path to probe: /readyz or /livez")
	f.StringVar(&h.rawURL, "url", "", "probe this http:// URL instead of the admin listener")
	f.DurationVar(&h.timeout, "timeout", 3*time.Second, "how long to wait for the answer")
	return cmd
}

// target returns the URL to probe.
func (h *healthcheckCmd) target() (string, error) {
	if h.rawURL != "" {
		u, err := url.Parse(h.rawURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("--url %q is not an http:// or https:// URL", h.rawURL)
		}
		return h.rawURL, nil
	}
	host, port, err := net.SplitHostPort(h.addr)
	if err != nil || port == "" {
		return "", fmt.Errorf("PAYDEDUP_ADMIN_ADDR / --admin-addr %q is not host:port (e.g. :9090)", h.addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	if !strings.HasPrefix(h.path, "/") {
		return "", fmt.Errorf("--path %q must start with /", h.path)
	}
	return "http://" + net.JoinHostPort(host, port) + h.path, nil
}

// Run probes once.
func (h *healthcheckCmd) Run(ctx context.Context) error {
	target, err := h.target()
	if err != nil {
		return err
	}
	if h.timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, got %v", h.timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck %s: %w", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return errors.New("healthcheck " + target + ": " + resp.Status + ": " + strings.TrimSpace(string(body)))
	}
	return nil
}
