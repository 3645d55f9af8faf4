package stripe_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/testenv"
)

// stripe-mock (github.com/stripe/stripe-mock, a tool in go.mod) is Stripe's
// own mock server: it validates every request against Stripe's published
// OpenAPI spec and answers with fixtures. It is built once per test binary
// into a temporary directory and started on loopback only: with -http-addr
// alone it would still open HTTPS on every interface.
var stripeMock struct {
	once sync.Once
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is drained
	url  string
	err  error
}

// stripeMockURL returns the base URL of the shared stripe-mock, starting it
// on first use. Without it the test is skipped, except under CI=true, where
// it fails.
func stripeMockURL(t *testing.T) string {
	t.Helper()
	stripeMock.once.Do(startStripeMock)
	if err := stripeMock.err; err != nil {
		if testenv.InCI() {
			t.Fatalf("stripe-mock: %v (CI=true: the conformance test must run)", err)
		}
		t.Skipf("stripe-mock unavailable: %v", err)
	}
	return stripeMock.url
}

func startStripeMock() {
	s := &stripeMock
	dir, err := os.MkdirTemp("", "paydedup-stripe-mock-")
	if err != nil {
		s.err = err
		return
	}
	s.dir = dir
	bin := filepath.Join(dir, "stripe-mock")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/stripe/stripe-mock").CombinedOutput(); err != nil {
		s.err = fmt.Errorf("go build github.com/stripe/stripe-mock: %v: %s", err, out)
		return
	}
	// Port 0 on loopback for both listeners; stripe-mock prints where.
	cmd := exec.Command(bin, "-http-addr", "127.0.0.1:0", "-https-addr", "127.0.0.1:0")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		s.err = fmt.Errorf("start stripe-mock: %w", err)
		return
	}
	s.cmd, s.done = cmd, make(chan struct{})
	found := make(chan string, 1)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(pr)
		var log []string
		for sc.Scan() {
			line := sc.Text()
			if addr, ok := strings.CutPrefix(line, "Listening for HTTP at address: "); ok {
				found <- "http://" + strings.TrimSpace(addr)
			}
			if len(log) < 20 {
				log = append(log, line)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		err := cmd.Wait()
		pw.CloseWithError(errors.Join(err, io.EOF))
	}()
	select {
	case s.url = <-found:
	case <-s.done:
		s.err = errors.New("stripe-mock exited before listening")
	case <-time.After(60 * time.Second):
		s.err = errors.New("stripe-mock did not listen within 60s")
	}
}

// stopStripeMock stops the shared stripe-mock, if one was started, and
// removes its binary.
func stopStripeMock() {
	s := &stripeMock
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}
