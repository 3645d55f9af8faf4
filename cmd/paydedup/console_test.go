package main

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/testenv"
)

// The console refuses to serve beyond loopback without a token, and a
// token too short to be one.
func TestConsoleRefusesUnsafeSettings(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	for _, c := range []struct {
		token string
		args  []string
		want  string
	}{
		{"", []string{"console", "--addr", "0.0.0.0:0"}, "PAYDEDUP_CONSOLE_TOKEN"},
		{"", []string{"console", "--addr", ":8089"}, "not a loopback address"},
		{"short", []string{"console", "--addr", "127.0.0.1:0"}, "PAYDEDUP_CONSOLE_TOKEN"},
	} {
		w.env["PAYDEDUP_CONSOLE_TOKEN"] = c.token
		_, _, err := w.run("", c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v with token %q: %v, want an error naming %s", c.args, c.token, err, c.want)
		}
	}
}

// paydedup console serves the page, read-only without a token, and stops
// when its context ends.
func TestConsoleCommandServes(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	var out, errOut testenv.Buffer
	root := newRootCmd(&out, &errOut, func(k string) string { return w.env[k] })
	root.SetArgs([]string{"console", "--addr", addr})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console: %v\n%s", err, errOut.String())
		}
	}()
	var body string
	eventually(t, "the console answers", func() bool {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	})
	if !strings.Contains(body, "read-only") || !strings.Contains(body, w.cfg.DLQStream) {
		t.Fatalf("the page is not the read-only console of this world's streams:\n%s", body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "(read-only)") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "paydedup console on http://"+addr+" (read-only)") {
		t.Errorf("stdout %q does not say where it listens and that it is read-only", out.String())
	}
}
