package main

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/console"
	"github.com/paydedup/paydedup/lab/testenv"
)

// The console refuses to serve beyond loopback without a token, a token
// too guessable to be one, and host names or a session lifetime that make
// no sense: at start, before it connects to anything (the database here
// does not answer), naming the variable and the rule.
func TestConsoleRefusesUnsafeSettings(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "postgres://127.0.0.1:1/none?sslmode=disable&connect_timeout=1", true)
	strong := "4f9c2e7a1b8d3f60c5e2a9174d8b3e6f0a2c5e7b9d1f3a5c7e9b2d4f6a8c0e1b"
	for _, c := range []struct {
		env  map[string]string
		args []string
		want []string
	}{
		{map[string]string{"PAYDEDUP_CONSOLE_TOKEN": ""}, []string{"console", "--addr", "0.0.0.0:0"}, []string{"PAYDEDUP_CONSOLE_TOKEN"}},
		{map[string]string{"PAYDEDUP_CONSOLE_TOKEN": ""}, []string{"console", "--addr", ":8089"}, []string{"not a loopback address"}},
		{map[string]string{"PAYDEDUP_CONSOLE_TOKEN": "short"}, []string{"console", "--addr", "127.0.0.1:0"}, []string{"PAYDEDUP_CONSOLE_TOKEN", "128 bits"}},
		{map[string]string{"PAYDEDUP_CONSOLE_TOKEN": "aaaaaaaaaaaaaaaa"}, []string{"console", "--addr", "127.0.0.1:0"}, []string{"PAYDEDUP_CONSOLE_TOKEN", "128 bits"}},
		{map[string]string{"PAYDEDUP_CONSOLE_TOKEN": strings.Repeat("ab", 32)}, []string{"console", "--addr", "127.0.0.1:0"}, []string{"PAYDEDUP_CONSOLE_TOKEN", "128 bits"}},
		{map[string]string{"PAYDEDUP_CONSOLE_TOKEN": strong, "PAYDEDUP_CONSOLE_HOSTS": "ops.example,*.example"}, []string{"console", "--addr", "127.0.0.1:0"}, []string{"PAYDEDUP_CONSOLE_HOSTS", "*.example"}},
		{map[string]string{"PAYDEDUP_CONSOLE_TOKEN": strong, "PAYDEDUP_CONSOLE_SESSION_TTL": "-1h"}, []string{"console", "--addr", "127.0.0.1:0"}, []string{"PAYDEDUP_CONSOLE_SESSION_TTL"}},
		{map[string]string{"PAYDEDUP_CONSOLE_TOKEN": strong, "PAYDEDUP_CONSOLE_SECURE_COOKIE": "maybe"}, []string{"console", "--addr", "127.0.0.1:0"}, []string{"PAYDEDUP_CONSOLE_SECURE_COOKIE"}},
	} {
		for k, v := range c.env {
			w.env[k] = v
		}
		_, _, err := w.run("", c.args...)
		for _, want := range c.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%v with %v: %v, want an error naming %s", c.args, c.env, err, want)
			}
		}
		for k := range c.env {
			delete(w.env, k)
		}
	}
}

// `paydedup console token` prints a token the console accepts, another
// each time; a predictable one stops the console at start, naming the
// variable, what gives it away and the command that makes a good one.
func TestConsoleTokenCommand(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "postgres://127.0.0.1:1/none?sslmode=disable&connect_timeout=1", true)
	seen := map[string]bool{}
	for range 3 {
		out, _, err := w.run("", "console", "token")
		tok := strings.TrimSuffix(out, "\n")
		if err != nil || len(tok) != 64 || strings.Contains(tok, "\n") || seen[tok] {
			t.Fatalf("console token: %q %v, want a new line of 64 hex characters", out, err)
		}
		seen[tok] = true
		if err := console.ValidateToken(tok); err != nil {
			t.Fatalf("the printed token is refused: %v", err)
		}
	}
	w.env["PAYDEDUP_CONSOLE_TOKEN"] = "qwertyuiopasdfghjklzxcvbnm1234567890"
	defer delete(w.env, "PAYDEDUP_CONSOLE_TOKEN")
	_, _, err := w.run("", "console", "--addr", "127.0.0.1:0")
	for _, want := range []string{"PAYDEDUP_CONSOLE_TOKEN", "keyboard walk", "paydedup console token"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a keyboard walk as the token: %v, want an error naming %q", err, want)
		}
	}
}

// Off loopback the session cookie is Secure by default (a TLS proxy in
// front sends plain HTTP), and the listen address's own name is a Host
// the console answers to.
func TestConsoleOffLoopbackCookieIsSecure(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	strong := "4f9c2e7a1b8d3f60c5e2a9174d8b3e6f0a2c5e7b9d1f3a5c7e9b2d4f6a8c0e1b"
	w.env["PAYDEDUP_CONSOLE_TOKEN"] = strong
	port := strconv.Itoa(testenv.FreePort(t))
	var out, errOut testenv.Buffer
	root := newRootCmd(&out, &errOut, func(k string) string { return w.env[k] })
	root.SetArgs([]string{"console", "--addr", "0.0.0.0:" + port})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console: %v\n%s", err, errOut.String())
		}
	}()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	var cookie string
	eventually(t, "the console answers", func() bool {
		resp, err := client.PostForm("http://127.0.0.1:"+port+"/login", url.Values{"token": {strong}})
		if err != nil {
			return false
		}
		resp.Body.Close()
		cookie = resp.Header.Get("Set-Cookie")
		return resp.StatusCode == http.StatusSeeOther
	})
	if !strings.Contains(cookie, "; Secure") {
		t.Errorf("off loopback the session cookie is %q, want Secure", cookie)
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
