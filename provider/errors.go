package provider

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// Class says what a failed provider call tells us about the money.
type Class int

// The classes, from the safest answer to the most specific.
const (
	// ClassUnknown means the provider may have charged: a timeout, a
	// connection dropped after the request was written, a 5xx, a 409
	// (idempotency_key_in_use: another request under this provider key is
	// running and can charge), a lock_timeout, or anything unrecognised.
	// Keep the key pending; re-call with the same provider key or look it
	// up.
	ClassUnknown Class = iota
	// ClassRetryable means the provider provably did not execute this
	// request and holds nothing under its key because of it: a 429 rate
	// limit, a 4xx with a provider error body that no other class claims,
	// connection refused or a failure before the request was sent.
	ClassRetryable
	// ClassDeclined is a definitive business failure (a 402 card_error);
	// Charge reports it as an Outcome with Declined set rather than as an
	// error.
	ClassDeclined
	// ClassMismatch is the provider's idempotency_error (same key, other
	// parameters) or a request that cannot be sent as it is: a bug, never
	// retried.
	ClassMismatch
	// ClassRejected means the provider refused our request as malformed or
	// aimed at something that does not exist (a 400 invalid_request_error
	// other than idempotency_error, or a 404 on create): nothing was charged,
	// but no retry of the same request can succeed and it is not the
	// customer's decline either. The message waits for a person
	// (dead-lettered provider_rejected), never stored as a decline.
	ClassRejected
	// ClassUnauthorized means the provider refused our API key (401, or 403
	// for a key without permission): nothing was charged, and every other
	// call fails the same way until someone fixes the key. The worker stops
	// consuming and retries later instead of failing each message.
	ClassUnauthorized
)

// String returns the class's stable name, used in logs, metrics and
// dead-letter reasons.
func (c Class) String() string {
	switch c {
	case ClassUnknown:
		return "unknown_outcome"
	case ClassRetryable:
		return "retryable"
	case ClassDeclined:
		return "declined"
	case ClassMismatch:
		return "idempotency_mismatch"
	case ClassRejected:
		return "rejected"
	case ClassUnauthorized:
		return "unauthorized"
	default:
		return fmt.Sprintf("class(%d)", int(c))
	}
}

// ErrInvalidRequest is wrapped, in an *Error of ClassMismatch, when a request
// cannot be sent as it is (an empty or over-long ProviderKey, a lookup with no
// key): a bug that no retry fixes.
var ErrInvalidRequest = errors.New("invalid request")

// ErrInvalidConfig is wrapped by the configuration errors of the adapters and
// the simulator.
var ErrInvalidConfig = errors.New("invalid config")

// Error is every non-definitive failure returned by Charge and Lookup.
type Error struct {
	// Class decides what the caller may do next.
	Class Class
	// HTTPStatus is the provider's status code, 0 when no response arrived.
	HTTPStatus int
	// Type, Code and Message are the provider's error fields when present.
	Type, Code, Message string
	// RetryAfter is the provider's Retry-After hint, 0 when none.
	RetryAfter time.Duration
	// RateLimitReason is the provider's Stripe-Rate-Limited-Reason header
	// on a 429 (global-rate, global-concurrency, endpoint-rate,
	// endpoint-concurrency, resource-specific, or a local budget's
	// ReasonBudget); empty when none.
	RateLimitReason string
	// ShouldRetry is the provider's Stripe-Should-Retry header.
	ShouldRetry Advice
	// Err is the underlying transport (or local) error, if any.
	Err error
}

// Advice is a provider's Stripe-Should-Retry header: whether it says a
// retry of the same request may succeed.
type Advice int8

// The values of Advice.
const (
	// AdviceNone: the header was absent.
	AdviceNone Advice = iota
	// AdviceRetry: "Stripe-Should-Retry: true".
	AdviceRetry
	// AdviceNoRetry: "Stripe-Should-Retry: false".
	AdviceNoRetry
)

// ParseAdvice reads a Stripe-Should-Retry header value.
func ParseAdvice(v string) Advice {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true":
		return AdviceRetry
	case "false":
		return AdviceNoRetry
	}
	return AdviceNone
}

// Stripe's rate-limit answer: its headers, and the reasons a 429 names.
// A reason ending in "-concurrency" means too many requests at once, one
// ending in "-rate" too many per second.
const (
	HeaderRateLimitedReason = "Stripe-Rate-Limited-Reason"
	HeaderShouldRetry       = "Stripe-Should-Retry"

	ReasonGlobalRate          = "global-rate"
	ReasonGlobalConcurrency   = "global-concurrency"
	ReasonEndpointRate        = "endpoint-rate"
	ReasonEndpointConcurrency = "endpoint-concurrency"
	ReasonResourceSpecific    = "resource-specific"
	// ReasonBudget is no provider's: a request the deployment's own
	// provider budget held back (it was never sent).
	ReasonBudget = "budget"
)

// RateLimited reports whether e is a rate-limit answer: a 429 (other than
// Stripe's lock_timeout, which is about one key, not the account) or the
// code rate_limit. A rate limit proves the request was not executed, and
// says nothing about the request or about an outage: the provider asks
// for fewer requests.
func (e *Error) RateLimited() bool {
	if e.Code == "lock_timeout" {
		return false
	}
	return e.HTTPStatus == http.StatusTooManyRequests || e.Code == "rate_limit" ||
		e.Type == "rate_limit_error" || e.RateLimitReason == ReasonBudget
}

// RateLimitOf returns the first *Error in err's chain when it is a rate
// limit (see Error.RateLimited), else nil.
func RateLimitOf(err error) *Error {
	var pe *Error
	if errors.As(err, &pe) && pe.RateLimited() {
		return pe
	}
	return nil
}

// Error describes the failure without request data; payment method ids in
// provider messages are redacted.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("provider: ")
	b.WriteString(e.Class.String())
	if e.HTTPStatus != 0 {
		fmt.Fprintf(&b, ": status %d", e.HTTPStatus)
	}
	if e.Type != "" {
		b.WriteString(" ")
		b.WriteString(e.Type)
	}
	if e.Code != "" {
		b.WriteString("/")
		b.WriteString(e.Code)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(redactPaymentMethods(e.Message))
	}
	if e.RateLimitReason != "" {
		b.WriteString(" [")
		b.WriteString(e.RateLimitReason)
		b.WriteString("]")
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(redactPaymentMethods(e.Err.Error()))
	}
	return b.String()
}

// Unwrap returns the underlying error so errors.Is sees through an *Error.
func (e *Error) Unwrap() error { return e.Err }

// ClassOf returns the Class of err: the Class of the first *Error in its
// chain, else ClassUnknown — context.DeadlineExceeded, context.Canceled and
// anything unrecognised may hide a charge. ClassOf(nil) is ClassUnknown too;
// check for nil first.
func ClassOf(err error) Class {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Class
	}
	return ClassUnknown
}

// asError returns err as an *Error, wrapping anything else as ClassUnknown.
func asError(err error) *Error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	return &Error{Class: ClassUnknown, Err: err}
}

// Classify maps what came back from a provider call to a Class. httpStatus is
// 0 when no response arrived; errType and errCode are the provider's error
// fields (Stripe's "type" and "code"); transportErr is the error from the HTTP
// client, if any. A transport error that arrives after a status line (e.g. a
// body cut short) is ClassUnknown unless the status alone proves nothing was
// charged (401, 403, 409, 429). Classify is meant for failures: a 2xx without
// an error is not one and yields ClassUnknown.
func Classify(httpStatus int, errType, errCode string, transportErr error) Class {
	if httpStatus == 0 {
		if transportErr == nil {
			return ClassUnknown
		}
		return classifyTransport(transportErr)
	}
	notCharged := httpStatus == http.StatusTooManyRequests ||
		httpStatus == http.StatusUnauthorized ||
		httpStatus == http.StatusForbidden
	if transportErr != nil && !notCharged {
		return ClassUnknown
	}
	switch {
	case httpStatus >= 500 || errType == "api_error":
		// The provider may have done the work before failing.
		return ClassUnknown
	case errType == "idempotency_error":
		return ClassMismatch
	case errCode == "idempotency_key_in_use" || errCode == "lock_timeout" ||
		httpStatus == http.StatusConflict:
		// Another request under this key is running: it may charge.
		return ClassUnknown
	case httpStatus == http.StatusTooManyRequests || errCode == "rate_limit" ||
		errType == "rate_limit_error":
		return ClassRetryable
	case httpStatus == http.StatusUnauthorized || httpStatus == http.StatusForbidden ||
		errType == "authentication_error":
		return ClassUnauthorized
	case errType == "card_error" || httpStatus == http.StatusPaymentRequired:
		return ClassDeclined
	case errType == "invalid_request_error" && httpStatus == http.StatusBadRequest,
		errType != "" && httpStatus == http.StatusNotFound:
		// Stripe validated the request and refused it (a parameter, a
		// missing payment method, a wrong URL or account): nothing was
		// charged, and it is our request that is wrong, not the card.
		return ClassRejected
	case errType != "" && httpStatus >= 400 && httpStatus < 500:
		// The provider answered with its own error and never charges on
		// one of these.
		return ClassRetryable
	default:
		// A 2xx passed here, or a 4xx without a provider error body (a proxy,
		// a wrong base URL): we cannot prove the provider never saw it.
		return ClassUnknown
	}
}

// classifyTransport classifies an error that arrived instead of a response.
// Only failures that provably happened before the request left this process
// (dialing, DNS, verifying the server's certificate in the handshake) are
// ClassRetryable; everything else — timeouts, EOF, resets, context ends, a
// malformed TLS record — is ClassUnknown. A tls.RecordHeaderError is read
// where a TLS record was expected; on a reused keep-alive connection that is
// after the request was written (the provider may be running it), so it
// proves nothing.
func classifyTransport(err error) Class {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return ClassRetryable
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return ClassRetryable
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return ClassRetryable
	}
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	if errors.As(err, &certErr) || errors.As(err, &unknownAuth) ||
		errors.As(err, &hostErr) {
		return ClassRetryable
	}
	// Timeouts, context.DeadlineExceeded/Canceled, EOF and resets all land
	// here: the request may have been written and processed.
	return ClassUnknown
}

// redactPaymentMethods replaces payment method ids ("pm_...") in s, so that an
// error string never carries one into a log.
func redactPaymentMethods(s string) string {
	if !strings.Contains(s, "pm_") {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "pm_")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		// Only a token start counts: "pm_" inside a word ("xpm_") is kept.
		if i > 0 && isIDByte(s[i-1]) {
			b.WriteString(s[:i+3])
			s = s[i+3:]
			continue
		}
		b.WriteString(s[:i])
		b.WriteString("pm_[redacted]")
		j := i + 3
		for j < len(s) && isIDByte(s[j]) {
			j++
		}
		s = s[j:]
	}
}

func isIDByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
