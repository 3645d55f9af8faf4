package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/console"
	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// screenshotEnv names a file the browser test writes its screenshot of
// the overview to (make console-screenshot sets it to docs/console.png).
const screenshotEnv = "PAYDEDUP_CONSOLE_SCREENSHOT"

// chromium returns Debian's Chromium, failing under CI when it is missing
// (.ci/run installs it) and skipping elsewhere.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if testenv.InCI() {
		t.Fatal("no chromium on PATH: the browser test needs it under CI (.ci/run installs it: apt-get install -y chromium)")
	}
	t.Skip("no chromium on PATH: install it (apt-get install -y chromium) to run the browser test")
	return ""
}

// startWorker runs a real worker on the world's streams, charging the
// simulator, until the test ends.
func (w *world) startWorker() {
	w.t.Helper()
	_, adapter := testenv.Provider(w.t, 7, 4*time.Second)
	cfg := consumer.Config{Stream: w.cfg, Holder: "browser-test"}
	cfg.Lease, cfg.Stream.AckWait, cfg.Stream.MaxDeliver = 10*time.Second, 15*time.Second, 6
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 2, AttemptTimeout: 4 * time.Second, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond}
	cfg.RetryBase, cfg.RetryMax = 50*time.Millisecond, 500*time.Millisecond
	cfg.DrainTimeout, cfg.Concurrency, cfg.FetchBatch = 2*time.Second, 4, 10
	wk, err := consumer.NewWorker(w.nc, consumer.NewProcessor(w.store, adapter, cfg, nil), cfg, nil, nil, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wk.Run(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			w.t.Errorf("worker: %v", err)
		}
	})
}

// The operator's path in a real browser: log in, find the dead letter,
// replay it after the confirmation, and look the payment up until the
// worker has completed it.
func TestBrowserReplaysADeadLetterToCompletion(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	w := setup(t, console.Config{Token: token})
	w.startWorker()

	// What an operator meets after an outage: letters that ran out of
	// deliveries, a client's reused key and a bad amount.
	seq := w.fileLetter(stream.ReasonMaxDeliveries, "m_shop", "order-1042", nil, nil)
	w.fileLetter(stream.ReasonMaxDeliveries, "m_shop", "order-1043", nil, nil)
	w.fileLetter(stream.ReasonKeyReused, "m_books", "cart-77", nil, nil)
	h := nats.Header{}
	h.Set("Idempotency-Key", "inv-9")
	w.fileLetter(string(payment.ReasonInvalidAmount), "m_books", "inv-9",
		[]byte(`{"merchant_id":"m_books","idempotency_key":"inv-9","amount":-5,"currency":"usd","payment_method":"pm_card_visa"}`), h)
	// A publisher put a card number in its subject, the key and the
	// description, beside other digits.
	const pan = "4111111111111111"
	w.fileLetter(string(payment.ReasonInvalidMethod), pan, "k 12 "+pan,
		[]byte(`{"merchant_id":"`+pan+`","idempotency_key":"k 12 `+pan+`","amount":5,"currency":"usd","payment_method":"pm_x","description":"`+pan+` 12/28"}`), nil)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.WindowSize(1280, 1100), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	css := func(format string, a ...any) chromedp.CSS { return chromedp.CSS(fmt.Sprintf(format, a...)) }
	row, replay := css("#letter-%d", seq), css("#replay-%d", seq)
	outcome, lookup := css("#outcome-%d", seq), css("#lookup-%d", seq)
	step := func(what string, a ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, a...); err != nil {
			t.Fatalf("browser: %s: %v", what, err)
		}
	}
	text := func(sel chromedp.CSS) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("browser: read %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}

	step("log in", chromedp.Navigate(w.base+"/login"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(row))
	overview := text("#dead-letters")
	for _, s := range []string{"max_deliveries", "key_reused", "invalid_amount", "order-1042", "verified", "[card number redacted]"} {
		if !strings.Contains(overview, s) {
			t.Errorf("the overview's dead letters do not show %q:\n%s", s, overview)
		}
	}
	html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		t.Fatalf("browser: read the page: %v", err)
	}
	if strings.Contains(html, pan) {
		t.Errorf("the page the browser shows holds the card number %s", pan)
	}
	// Open the letter's headers and body for the screenshot (PNG: quality 100).
	step("open the letter", chromedp.Click(row+" + tr summary"))
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	step("replay", chromedp.Click(replay), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	if got := text(outcome); got != "would replay" {
		t.Fatalf("before the confirmation the outcome is %q, want would replay", got)
	}
	if !w.letterExists(seq) {
		t.Fatal("the letter was replayed before the confirmation")
	}
	step("confirm", chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(lookup))
	if got := text(outcome); got != "replayed" {
		t.Fatalf("after the confirmation the outcome is %q, want replayed", got)
	}
	if w.letterExists(seq) {
		t.Fatal("the replayed letter is still in the dead-letter stream")
	}

	// The worker consumes the replay; the lookup shows it completed.
	step("look the payment up", chromedp.Click(lookup), chromedp.WaitVisible(chromedp.CSS("#record-status")))
	deadline := time.Now().Add(30 * time.Second)
	status := text("#record-status")
	for status != "completed" && time.Now().Before(deadline) {
		step("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#record-status")))
		status = text("#record-status")
	}
	if status != "completed" {
		t.Fatalf("the replayed payment's row is %q after 30s, want completed", status)
	}
	if ledger := text("#ledger-status"); ledger != "succeeded" {
		t.Fatalf("ledger status %q, want succeeded", ledger)
	}
	// Logging out ends the session: the banner says so, and the header
	// offers the login again.
	step("log out", chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if got := text("#flash"); !strings.Contains(got, "Logged out") {
		t.Errorf("after logging out the banner says %q", got)
	}
	if got := text("header"); !strings.Contains(got, "Log in to replay") {
		t.Errorf("after logging out the header says %q", got)
	}
	if path := os.Getenv(screenshotEnv); path != "" {
		if err := os.WriteFile(path, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s (%d bytes)", path, len(shot))
	}
}
