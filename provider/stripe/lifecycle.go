package stripe

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/http/httptrace"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/paydedup/paydedup/provider"
)

// Capture captures req.Amount (all that is capturable when 0) of an
// authorized intent under req.ProviderKey. Stripe captures an intent once:
// the rest of the authorization is released.
func (s *Client) Capture(ctx context.Context, req provider.CaptureRequest) (*provider.IntentOutcome, error) {
	if err := checkOp(req.ProviderKey, req.ChargeID); err != nil {
		return nil, err
	}
	ctx, copies, cancel := s.opContext(ctx)
	defer cancel()
	params := &stripego.PaymentIntentCaptureParams{}
	if req.Amount > 0 {
		params.AmountToCapture = stripego.Int64(req.Amount)
	}
	params.SetIdempotencyKey(req.ProviderKey)
	pi, err := s.client.V1PaymentIntents.Capture(ctx, req.ChargeID, params)
	if err != nil {
		return s.intentRefusal(req.ChargeID, err, copies)
	}
	return intentState(pi)
}

// Cancel cancels (voids) an intent under req.ProviderKey.
func (s *Client) Cancel(ctx context.Context, req provider.CancelRequest) (*provider.IntentOutcome, error) {
	if err := checkOp(req.ProviderKey, req.ChargeID); err != nil {
		return nil, err
	}
	ctx, copies, cancel := s.opContext(ctx)
	defer cancel()
	params := &stripego.PaymentIntentCancelParams{}
	if req.Reason != "" {
		params.CancellationReason = stripego.String(req.Reason)
	}
	params.SetIdempotencyKey(req.ProviderKey)
	pi, err := s.client.V1PaymentIntents.Cancel(ctx, req.ChargeID, params)
	if err != nil {
		return s.intentRefusal(req.ChargeID, err, copies)
	}
	return intentState(pi)
}

// RetrieveIntent reads an intent by id without acting on it: the lookup
// after a capture or a cancel whose answer was lost. A missing intent is
// an error wrapping provider.ErrNoSuchIntent.
func (s *Client) RetrieveIntent(ctx context.Context, req provider.RetrieveIntentRequest) (*provider.IntentOutcome, error) {
	if req.ChargeID == "" {
		return nil, &provider.Error{Class: provider.ClassMismatch, Message: "retrieve needs an intent id", Err: provider.ErrInvalidRequest}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	pi, err := s.client.V1PaymentIntents.Retrieve(ctx, req.ChargeID, nil)
	if err != nil {
		if isResourceMissing(err) {
			return nil, fmt.Errorf("retrieve payment intent %s: %w", req.ChargeID, provider.ErrNoSuchIntent)
		}
		return nil, fmt.Errorf("retrieve payment intent: %w", s.lookupError(err))
	}
	return intentState(pi)
}

// Refund refunds req.Amount (the rest when 0) of a captured intent under
// req.ProviderKey, with the refund's merchant_id and idempotency_key in its
// metadata so that LookupRefund can find it.
func (s *Client) Refund(ctx context.Context, req provider.RefundRequest) (*provider.RefundOutcome, error) {
	if err := checkOp(req.ProviderKey, req.ChargeID); err != nil {
		return nil, err
	}
	if req.MerchantID == "" || req.IdempotencyKey == "" {
		return nil, &provider.Error{Class: provider.ClassMismatch, Message: "refund needs merchant id and idempotency key", Err: provider.ErrInvalidRequest}
	}
	ctx, copies, cancel := s.opContext(ctx)
	defer cancel()
	params := &stripego.RefundCreateParams{PaymentIntent: stripego.String(req.ChargeID), Metadata: provider.RefundMetadata(req)}
	if req.Amount > 0 {
		params.Amount = stripego.Int64(req.Amount)
	}
	params.SetIdempotencyKey(req.ProviderKey)
	re, err := s.client.V1Refunds.Create(ctx, params)
	if err != nil {
		code, perr := s.opFailure(err, copies)
		if perr != nil {
			return nil, perr
		}
		raw, hdr := failureResponse(err)
		return &provider.RefundOutcome{ChargeID: req.ChargeID, Refused: true, RefusalCode: code,
			MerchantID: req.MerchantID, IdempotencyKey: req.IdempotencyKey,
			HTTPStatus: httpStatusOf(err), Response: raw, Replayed: replayed(hdr)}, nil
	}
	return refundState(re, req.ChargeID)
}

// LookupRefund finds, without refunding, the refund with req's metadata
// among the refunds of req.ChargeID (GET /v1/refunds?payment_intent=): a
// list read from the source, unlike Search, which covers no refunds.
func (s *Client) LookupRefund(ctx context.Context, req provider.RefundLookupRequest) (provider.RefundLookupResult, error) {
	if req.ChargeID == "" || req.MerchantID == "" || req.IdempotencyKey == "" {
		return provider.RefundLookupResult{}, &provider.Error{Class: provider.ClassMismatch,
			Message: "refund lookup needs the intent id, merchant id and idempotency key", Err: provider.ErrInvalidRequest}
	}
	found, err := s.ListRefunds(ctx, req.ChargeID)
	if err != nil {
		return provider.RefundLookupResult{}, err
	}
	return provider.RefundVerdict(req, found)
}

// ListRefunds lists, without refunding, every refund of the intent
// chargeID (GET /v1/refunds?payment_intent=), newest first, whatever its
// metadata: the audit compares them with the ledger's.
func (s *Client) ListRefunds(ctx context.Context, chargeID string) ([]*provider.RefundOutcome, error) {
	if chargeID == "" {
		return nil, &provider.Error{Class: provider.ClassMismatch, Message: "refund list needs the intent id", Err: provider.ErrInvalidRequest}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	params := &stripego.RefundListParams{PaymentIntent: stripego.String(chargeID)}
	params.Limit = stripego.Int64(searchLimit)
	var found []*provider.RefundOutcome
	for re, err := range s.client.V1Refunds.List(ctx, params) {
		if err != nil {
			return nil, fmt.Errorf("list refunds: %w", s.lookupError(err))
		}
		out, err := refundState(re, chargeID)
		if err != nil {
			return nil, err
		}
		found = append(found, out)
	}
	return found, nil
}

// ListRefundsSince yields, without refunding, the account's refunds
// created at or after from (GET /v1/refunds with created[gte], limit 100
// and starting_after), newest first, whatever their intent or metadata:
// the audit reads a window's refunds a page at a time rather than one list
// per payment (ListRefunds), which spent the account's shared rate budget
// at one call per payment. Stripe filters on whole seconds, so from is
// rounded down; a zero from lists every refund. startingAfter, when set,
// resumes after that refund (after a failed page). Like ListIntents the
// iteration is bounded by ctx alone, and a failed page ends it with an
// error.
func (s *Client) ListRefundsSince(ctx context.Context, from time.Time, startingAfter string) iter.Seq2[*provider.RefundOutcome, error] {
	return func(yield func(*provider.RefundOutcome, error) bool) {
		params := &stripego.RefundListParams{}
		if !from.IsZero() {
			params.CreatedRange = &stripego.RangeQueryParams{GreaterThanOrEqual: from.Unix()}
		}
		params.Limit = stripego.Int64(listLimit)
		if startingAfter != "" {
			params.StartingAfter = stripego.String(startingAfter)
		}
		for re, err := range s.client.V1Refunds.List(ctx, params) {
			if err != nil {
				yield(nil, fmt.Errorf("list refunds: %w", s.lookupError(err)))
				return
			}
			out, err := refundState(re, "")
			if !yield(out, err) || err != nil {
				return
			}
		}
	}
}

// checkOp refuses an operation that cannot be sent as it is.
func checkOp(providerKey, chargeID string) error {
	if err := provider.CheckProviderKey(providerKey); err != nil {
		return err
	}
	if chargeID == "" {
		return &provider.Error{Class: provider.ClassMismatch, Message: "no payment intent id", Err: provider.ErrInvalidRequest}
	}
	return nil
}

// opContext bounds one POST and counts the copies of it net/http writes
// (see Client): a "not executed" answer to a resend speaks only for itself.
func (s *Client) opContext(ctx context.Context) (context.Context, *writtenCopies, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	copies := &writtenCopies{}
	return httptrace.WithClientTrace(ctx, copies.trace()), copies, cancel
}

// opFailure reads a failed capture, cancel or refund with the charge
// path's classification: the refusal code when Stripe said no for good,
// else the *Error (made unknown when an earlier copy was written).
func (s *Client) opFailure(err error, copies *writtenCopies) (string, error) {
	var se *stripego.Error
	if !errors.As(err, &se) {
		return "", copies.check(transportError(err), false)
	}
	f := stripeFailure(se, s.now())
	code, perr := f.Refusal()
	if perr != nil {
		return "", copies.check(perr, answered(err))
	}
	if int(copies.n.Load()) > 1 {
		// A refusal of a resend may answer the first copy's own effect
		// (a capture refused because the first copy captured).
		return "", &provider.Error{Class: provider.ClassUnknown, HTTPStatus: f.HTTPStatus, Type: f.Type, Code: f.Code,
			Message: fmt.Sprintf("net/http resent the request after writing it; the refusal of the resend proves nothing about the first copy (%s)", f.Message)}
	}
	return code, nil
}

// intentRefusal is a failed capture's or cancel's answer.
func (s *Client) intentRefusal(id string, err error, copies *writtenCopies) (*provider.IntentOutcome, error) {
	code, perr := s.opFailure(err, copies)
	if perr != nil {
		return nil, perr
	}
	raw, hdr := failureResponse(err)
	return &provider.IntentOutcome{ChargeID: id, Refused: true, RefusalCode: code,
		HTTPStatus: httpStatusOf(err), Response: raw, Replayed: replayed(hdr)}, nil
}

func failureResponse(err error) ([]byte, http.Header) {
	var se *stripego.Error
	if !errors.As(err, &se) {
		return nil, http.Header{}
	}
	return lastResponse(se.LastResponse)
}

func httpStatusOf(err error) int {
	var se *stripego.Error
	if errors.As(err, &se) {
		return se.HTTPStatusCode
	}
	return 0
}

// intentState is the IntentOutcome of an intent Stripe returned.
func intentState(pi *stripego.PaymentIntent) (*provider.IntentOutcome, error) {
	raw, hdr := lastResponse(pi.LastResponse)
	if raw == nil {
		return nil, &provider.Error{Class: provider.ClassUnknown, Message: "payment intent response has no body"}
	}
	return &provider.IntentOutcome{
		ChargeID: pi.ID, Status: string(pi.Status),
		Amount: pi.Amount, AmountCapturable: pi.AmountCapturable, AmountReceived: pi.AmountReceived,
		HTTPStatus: http.StatusOK, Response: raw, Replayed: replayed(hdr),
	}, nil
}

// refundState is the RefundOutcome of a refund Stripe returned (created,
// or listed: a listed refund has no response of its own).
func refundState(re *stripego.Refund, chargeID string) (*provider.RefundOutcome, error) {
	raw, hdr := lastResponse(re.LastResponse)
	if re.PaymentIntent != nil && re.PaymentIntent.ID != "" {
		chargeID = re.PaymentIntent.ID
	}
	switch re.Status {
	case stripego.RefundStatusPending, stripego.RefundStatusSucceeded, stripego.RefundStatusFailed,
		stripego.RefundStatusCanceled, stripego.RefundStatusRequiresAction:
	default:
		return nil, &provider.Error{Class: provider.ClassUnknown, HTTPStatus: http.StatusOK,
			Message: fmt.Sprintf("refund %s has status %q", re.ID, re.Status)}
	}
	return &provider.RefundOutcome{
		RefundID: re.ID, ChargeID: chargeID, Status: string(re.Status), Amount: re.Amount,
		FailureReason:  string(re.FailureReason),
		MerchantID:     re.Metadata[provider.MetadataMerchantID],
		IdempotencyKey: re.Metadata[provider.MetadataIdempotencyKey],
		HTTPStatus:     http.StatusOK, Response: raw, Replayed: replayed(hdr),
	}, nil
}
