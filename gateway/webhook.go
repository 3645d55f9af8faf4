package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

// PathStripeWebhooks is where Stripe posts its events.
const PathStripeWebhooks = "/v1/stripe/webhooks"

// HeaderStripeSignature carries a webhook event's signature.
const HeaderStripeSignature = "Stripe-Signature"

// ProblemBadSignature is a webhook event whose signature did not verify.
const ProblemBadSignature = problemTypePrefix + "webhook-signature"

// WebhookEnvelopeBytes is what a webhook event may hold beyond the command
// it is about: the event reads at most Limits.MaxBodyBytes plus this
// (128 KiB with the defaults), all before its signature is verified. A
// Stripe event about a payment intent is the intent and an envelope, a
// few KiB of Stripe's own fields (an intent, its last error, the event's
// id, type and request), plus what the command put in it (description,
// metadata, statement descriptor), which the gateway bounded by
// MaxBodyBytes when it took the command in. An event over the bound is
// 413: Stripe tries it again for days, and the reconciler settles the
// payment meanwhile, so a bound too tight costs latency, not a payment;
// one too loose lets anyone make the gateway read and hash it.
const WebhookEnvelopeBytes = 64 << 10

// webhookReply is the body of a 200 to Stripe (it reads only the status).
type webhookReply struct {
	Received bool   `json:"received"`
	Result   string `json:"result"`
}

// webhookLimit is the most of a webhook event's body the gateway reads.
func (g *Gateway) webhookLimit() int64 {
	return int64(g.cfg.Limits.MaxBodyBytes) + WebhookEnvelopeBytes
}

// postStripeWebhook verifies an event and applies it. The signature
// header is checked before any of the body is read, and the body is read
// up to webhookLimit only (a declared larger one never: limits.go), then
// verified before anything parses it. A bad signature, an old timestamp
// or an unreadable body is 400 and changes nothing; a fault of ours is
// 503, so Stripe delivers the event again; anything else is 200.
// Redeliveries need no table of seen event ids: settling changes only a row
// still processing, so a repeated event finds the row final and agreeing.
func (g *Gateway) postStripeWebhook(w http.ResponseWriter, r *http.Request) {
	sigs := r.Header.Values(HeaderStripeSignature)
	sig := ""
	err := errors.New("more than one Stripe-Signature header")
	if len(sigs) <= 1 {
		sig = r.Header.Get(HeaderStripeSignature)
		err = g.cfg.Webhooks.Verifier.CheckSignature(sig)
	}
	if err != nil {
		// Unread: the connection is closed after the answer rather than
		// the body read and discarded first (net/http would, up to 256 KiB).
		w.Header().Set("Connection", "close")
		g.refuseEvent(w, err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.webhookLimit()))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			// Closed, not drained: MaxBytesReader tells net/http to close
			// only when given its own ResponseWriter, and w is wrapped.
			w.Header().Set("Connection", "close")
			writeProblem(w, Problem{Type: ProblemTooLarge, Status: http.StatusRequestEntityTooLarge,
				Detail: "The event exceeds " + strconv.FormatInt(tooLarge.Limit, 10) + " bytes.", Reason: string(payment.ReasonBodyTooLarge)})
			return
		}
		writeProblem(w, Problem{Type: ProblemInvalidRequest, Status: http.StatusBadRequest, Detail: "The event body could not be read."})
		return
	}
	ev, err := g.cfg.Webhooks.Verifier.Verify(body, sig)
	if err != nil {
		g.refuseEvent(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.RequestTimeout)
	defer cancel()
	result, err := g.applyEvent(ctx, ev)
	g.metrics.webhooks.WithLabelValues(result).Inc()
	if err != nil {
		level := slog.LevelError
		if errors.Is(err, errRefundNotRecorded) {
			level = slog.LevelInfo
		}
		g.log.Log(ctx, level, "webhook event not applied; the provider will send it again", "event_id", ev.ID, "type", ev.Type, "error", err)
		unavailable(w)
		return
	}
	writeJSON(w, http.StatusOK, webhookReply{Received: true, Result: result})
}

// refuseEvent answers an event whose signature does not verify.
func (g *Gateway) refuseEvent(w http.ResponseWriter, err error) {
	g.metrics.webhooks.WithLabelValues(WebhookBadSignature).Inc()
	g.log.Warn("webhook event refused", "error", err)
	writeProblem(w, Problem{Type: ProblemBadSignature, Status: http.StatusBadRequest,
		Detail: "The Stripe-Signature does not verify with the endpoint's signing secret, or it is too old."})
}

// applyEvent settles the processing payment an event is about, or checks
// that a final one agrees with it, and says which it did. A refund event
// settles its refunds (applyRefunds).
func (g *Gateway) applyEvent(ctx context.Context, ev provider.Event) (string, error) {
	if ev.Refunds != nil {
		return g.applyRefunds(ctx, ev)
	}
	if ev.Outcome == nil {
		return WebhookIgnoredType, nil
	}
	in := ev.Intent
	if in.MerchantID == "" || in.IdempotencyKey == "" {
		return WebhookNotOurs, nil
	}
	log := g.log.With("event_id", ev.ID, "type", ev.Type, "merchant_id", in.MerchantID,
		"idempotency_key", in.IdempotencyKey, "charge_id", in.ID)
	book := g.cfg.Webhooks.Ledger
	p, err := book.GetPayment(ctx, in.MerchantID, in.IdempotencyKey)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		// The worker has not recorded its answer yet (or never will:
		// the audit finds such an intent). Its own answer, or the
		// reconciler, records the outcome.
		log.Info("webhook event for a payment not in the ledger; ignored")
		return WebhookNoPayment, nil
	case err != nil:
		return WebhookError, fmt.Errorf("read payment: %w", err)
	}
	if p.ChargeID != in.ID {
		log.Error("webhook event for another intent than the ledger's; ignored", "ledger_charge_id", p.ChargeID)
		return WebhookForeignIntent, nil
	}
	if err := provider.CheckIntent(provider.LookupRequest{Amount: p.Amount, Currency: p.Currency}, in); err != nil {
		log.Error("webhook event for an intent that is not the ledger's; ignored", "error", err)
		return WebhookForeignIntent, nil
	}
	out := ev.Outcome
	if p.Status == ledger.PaymentAuthorized || p.Status == ledger.PaymentCanceled {
		return g.applyAuthorization(ctx, p, out, log)
	}
	if out.Processing {
		return WebhookStillProcessing, nil
	}
	c := ledger.CompletionOf(out, ledger.ProviderBodyOnly)
	status := c.SettleStatus()
	if p.Status == ledger.PaymentProcessing {
		err := book.SettlePayment(ctx, p, status, c.ResponseStatus, c.Response)
		switch {
		case err == nil:
			log.Info("processing payment settled by webhook", "status", status)
			return WebhookSettled, nil
		case !errors.Is(err, ledger.ErrNotFound):
			return WebhookError, fmt.Errorf("settle payment: %w", err)
		}
		// Settled meanwhile (the reconciler, another delivery): check it.
		if p, err = book.GetPayment(ctx, in.MerchantID, in.IdempotencyKey); err != nil {
			return WebhookError, fmt.Errorf("read payment: %w", err)
		}
	}
	if p.Status == status || (status == ledger.PaymentFailed && p.Status == ledger.PaymentDeclined) {
		return WebhookAgrees, nil
	}
	log.Error("webhook event disagrees with the ledger; the ledger is unchanged", "ledger_status", p.Status, "event_status", status)
	return WebhookDisagrees, nil
}

// applyAuthorization applies an event about an authorize's payment, held
// authorized or canceled. payment_intent.canceled (the provider canceled
// the intent: its capture window ran out, or it was voided there) is a
// hint, as a refund's failure is: the event may be forged (a leaked
// signing secret) or stale (replayed), and the gateway cannot ask the
// provider. An authorized payment is stamped for the reconciler
// (RequestCancelRecheck, migration 00034), which retrieves the intent
// (a lookup that never acts) and records the payment canceled, with its
// canceled event, once, only if the provider says so; a capture or cancel
// of the payment that holds still decides (cancel_authorized_payment,
// 00033). Answered recheck_requested: Stripe need not send it again. An
// intent still requires_capture (payment_intent.amount_capturable_updated)
// agrees with an authorized payment; canceled agrees with a canceled one.
func (g *Gateway) applyAuthorization(ctx context.Context, p ledger.Payment, out *provider.Outcome, log *slog.Logger) (string, error) {
	switch {
	case out.Status == provider.StatusCanceled && p.Status == ledger.PaymentCanceled:
		return WebhookAgrees, nil
	case out.Status == provider.StatusCanceled:
		requested, status, err := g.cfg.Webhooks.Ledger.RequestCancelRecheck(ctx, p.MerchantID, p.IdempotencyKey, p.ChargeID)
		switch {
		case err != nil && !errors.Is(err, ledger.ErrNotFound):
			return WebhookError, fmt.Errorf("request cancel recheck: %w", err)
		case requested:
			log.Warn("provider reports canceled an authorized payment; the reconciler looks its intent up before the ledger records it")
			return WebhookRecheckRequested, nil
		case status == ledger.PaymentCanceled:
			return WebhookAgrees, nil
		}
		log.Error("webhook event disagrees with the ledger; the ledger is unchanged", "ledger_status", status, "event_status", out.Status)
		return WebhookDisagrees, nil
	case out.Authorized && p.Status == ledger.PaymentAuthorized:
		return WebhookAgrees, nil
	}
	log.Error("webhook event disagrees with the ledger; the ledger is unchanged", "ledger_status", p.Status, "event_status", out.Status)
	return WebhookDisagrees, nil
}
