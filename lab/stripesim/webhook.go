package stripesim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// WebhookAPIVersion is the api_version of the events the simulator sends:
// Stripe's version that the adapter's stripe-go pins, whose events it
// accepts.
const WebhookAPIVersion = "2025-08-27.basil"

// webhookTimeout bounds one delivery.
const webhookTimeout = 10 * time.Second

// webhookAttempts is how often a delivery is tried before it is given up
// (Stripe tries for days; a test needs a few).
const webhookAttempts = 3

// hooks sends the events of intents that settle after processing.
type hooks struct {
	url, secret string
	client      *http.Client
	log         interface{ Warn(string, ...any) }

	mu     sync.Mutex
	timers map[*time.Timer]struct{}
	closed bool
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// signWebhookAll signs payload with each of secrets, separated by commas
// (STRIPE_WEBHOOK_SECRET during a roll), as Stripe signs while an
// endpoint's old and new secrets overlap: one t=, a v1= per secret.
func signWebhookAll(payload []byte, secrets string, t time.Time) string {
	var sig string
	for i, secret := range strings.Split(secrets, ",") {
		one := SignWebhook(payload, strings.TrimSpace(secret), t)
		if i == 0 {
			sig = one
			continue
		}
		_, v1, _ := strings.Cut(one, ",")
		sig += "," + v1
	}
	return sig
}

// SignWebhook returns the Stripe-Signature header value of payload signed
// at t with secret, as Stripe signs: t=<unix seconds>,v1=<hex HMAC-SHA256
// of "t.payload">.
func SignWebhook(payload []byte, secret string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(payload)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// scheduleWebhook sends the event of account's processing intent id once
// it settles, after delay.
func (s *Simulator) scheduleWebhook(account, id string, delay time.Duration) {
	s.hooks.after(delay, func() { s.sendSettled(account, id) })
}

// scheduleExpiryWebhook sends payment_intent.canceled for an
// authorization at the end of its capture window, if the provider has
// canceled it by then (as Stripe does when the window runs out); one
// captured meanwhile sends nothing.
func (s *Simulator) scheduleExpiryWebhook(account, id string, delay time.Duration) {
	s.hooks.after(delay, func() {
		if in := s.intent(account, id); in != nil && in.status == simCanceled {
			s.sendSettled(account, id)
		}
	})
}

// scheduleRefundWebhook sends refund.updated for ref, a refund answered
// pending, once it has ended, after delay. It may be called with s.mu held
// (the order is s.mu, then h.mu; nothing takes them the other way).
func (s *Simulator) scheduleRefundWebhook(ref *simRefund, delay time.Duration) {
	s.hooks.after(delay, func() { s.sendRefundSettled(ref) })
}

// after runs fn after delay, unless the hooks are closed first.
func (h *hooks) after(delay time.Duration, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		defer h.wg.Done()
		h.mu.Lock()
		delete(h.timers, t)
		h.mu.Unlock()
		fn()
	})
	h.timers[t] = struct{}{}
}

// sendSettled posts the event of the intent's settled state, if it has
// settled.
func (s *Simulator) sendSettled(account, id string) {
	in := s.intent(account, id)
	if in == nil || in.status == simProcessing {
		return
	}
	typ := "payment_intent.succeeded"
	switch {
	case in.status == simCanceled:
		typ = "payment_intent.canceled"
	case in.status != simSucceeded:
		typ = "payment_intent.payment_failed"
	}
	s.mu.Lock()
	evID := "evt_" + s.randIDLocked(24)
	s.mu.Unlock()
	now := s.now()
	b := fmt.Appendf(nil, `{"id":%q,"object":"event","api_version":%q,"created":%d,"livemode":false,"pending_webhooks":1,"type":%q,"data":{"object":`,
		evID, WebhookAPIVersion, now.Unix(), typ)
	b = appendIntentJSON(b, in)
	b = append(b, "}}"...)
	s.deliver(b, now)
}

// sendRefundFailed posts refund.failed for ref, a refund failed after it
// succeeded (Simulator.FailRefund).
func (s *Simulator) sendRefundFailed(ref *simRefund) {
	now := s.now()
	s.mu.Lock()
	obj := refundJSON(ref)
	evID := "evt_" + s.randIDLocked(24)
	s.mu.Unlock()
	b := fmt.Appendf(nil, `{"id":%q,"object":"event","api_version":%q,"created":%d,"livemode":false,"pending_webhooks":1,"type":"refund.failed","data":{"object":`,
		evID, WebhookAPIVersion, now.Unix())
	b = append(b, obj...)
	b = append(b, "}}"...)
	s.deliver(b, now)
}

// sendRefundSettled posts refund.updated for ref as it stands, if it is
// no longer pending.
func (s *Simulator) sendRefundSettled(ref *simRefund) {
	now := s.now()
	s.mu.Lock()
	refundNowLocked(ref, now)
	if ref.status == provider.RefundPending {
		s.mu.Unlock()
		return
	}
	obj := refundJSON(ref)
	evID := "evt_" + s.randIDLocked(24)
	s.mu.Unlock()
	b := fmt.Appendf(nil, `{"id":%q,"object":"event","api_version":%q,"created":%d,"livemode":false,"pending_webhooks":1,"type":"refund.updated","data":{"object":`,
		evID, WebhookAPIVersion, now.Unix())
	b = append(b, obj...)
	b = append(b, "}}"...)
	s.deliver(b, now)
}

// deliver posts one signed event, trying again on a failure.
func (s *Simulator) deliver(payload []byte, signedAt time.Time) {
	h := s.hooks
	sig := signWebhookAll(payload, h.secret, signedAt)
	for attempt := range webhookAttempts {
		if attempt > 0 {
			select {
			case <-h.ctx.Done():
				return
			case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
			}
		}
		ctx, cancel := context.WithTimeout(h.ctx, webhookTimeout)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(payload))
		if err != nil {
			cancel()
			h.log.Warn("webhook not sent", "error", err)
			return
		}
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		req.Header.Set("Stripe-Signature", sig)
		resp, err := h.client.Do(req)
		cancel()
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return
			}
			err = fmt.Errorf("answered %s", resp.Status)
		}
		h.log.Warn("webhook delivery failed", "attempt", attempt+1, "error", err)
	}
}

// Close stops sending webhooks: pending ones are dropped and deliveries in
// progress end. It waits for them; the simulator still serves requests.
func (s *Simulator) Close() {
	h := s.hooks
	if h == nil {
		return
	}
	h.mu.Lock()
	h.closed = true
	for t := range h.timers {
		if t.Stop() {
			h.wg.Done()
		}
	}
	h.timers = nil
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}
