package provider_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paydedup/paydedup/provider"
)

func urlErr(err error) error {
	return &url.Error{Op: "Post", URL: "https://api.stripe.com/v1/payment_intents", Err: err}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	tests := []struct {
		name      string
		status    int
		errType   string
		errCode   string
		transport error
		want      provider.Class
	}{
		// Answers from the provider.
		{"500 api_error", 500, "api_error", "", nil, provider.ClassUnknown},
		{"502 from a proxy", 502, "", "", nil, provider.ClassUnknown},
		{"503", 503, "", "", nil, provider.ClassUnknown},
		{"504 gateway timeout", 504, "", "", nil, provider.ClassUnknown},
		{"api_error on a 4xx", 400, "api_error", "", nil, provider.ClassUnknown},
		{"402 card declined", 402, "card_error", "card_declined", nil, provider.ClassDeclined},
		{"402 without type", 402, "", "", nil, provider.ClassDeclined},
		// A rejection is our request refused, not the card: never a decline.
		{"400 invalid amount", 400, "invalid_request_error", "parameter_invalid_integer", nil, provider.ClassRejected},
		{"400 no such payment method", 400, "invalid_request_error", "resource_missing", nil, provider.ClassRejected},
		{"400 unknown parameter", 400, "invalid_request_error", "parameter_unknown", nil, provider.ClassRejected},
		{"400 idempotency_error", 400, "idempotency_error", "", nil, provider.ClassMismatch},
		// A 409 proves only that this copy did not run: another request
		// under the key is running and can charge.
		{"409 key in use", 409, "invalid_request_error", "idempotency_key_in_use", nil, provider.ClassUnknown},
		{"409 lock timeout", 409, "invalid_request_error", "lock_timeout", nil, provider.ClassUnknown},
		{"429 lock timeout (as Stripe sends it)", 429, "invalid_request_error", "lock_timeout", nil, provider.ClassUnknown},
		{"409 bare", 409, "", "", nil, provider.ClassUnknown},
		{"409 body cut short", 409, "invalid_request_error", "idempotency_key_in_use", io.ErrUnexpectedEOF, provider.ClassUnknown},
		{"429 rate limit", 429, "invalid_request_error", "rate_limit", nil, provider.ClassRetryable},
		{"429 bare", 429, "", "", nil, provider.ClassRetryable},
		{"401 auth", 401, "authentication_error", "", nil, provider.ClassUnauthorized},
		{"401 invalid_request_error", 401, "invalid_request_error", "", nil, provider.ClassUnauthorized},
		{"403 permission", 403, "invalid_request_error", "", nil, provider.ClassUnauthorized},
		{"401 body cut short", 401, "authentication_error", "", io.ErrUnexpectedEOF, provider.ClassUnauthorized},
		{"404 resource missing", 404, "invalid_request_error", "resource_missing", nil, provider.ClassRejected},
		{"422 with a provider body", 422, "invalid_request_error", "", nil, provider.ClassRetryable},
		{"404 without provider body", 404, "", "", nil, provider.ClassUnknown},
		{"200 is not a failure", 200, "", "", nil, provider.ClassUnknown},

		// Transport errors: before sending is retryable, after is unknown.
		{"connection refused", 0, "", "", urlErr(refused), provider.ClassRetryable},
		{"refused errno alone", 0, "", "", urlErr(syscall.ECONNREFUSED), provider.ClassRetryable},
		{"dns failure", 0, "", "", urlErr(&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "api.stripe.invalid", IsNotFound: true}}), provider.ClassRetryable},
		{"dns error alone", 0, "", "", urlErr(&net.DNSError{Err: "server misbehaving", Name: "x", IsTemporary: true}), provider.ClassRetryable},
		{"dial timeout", 0, "", "", urlErr(&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}), provider.ClassRetryable},
		{"tls unknown authority", 0, "", "", urlErr(x509.UnknownAuthorityError{}), provider.ClassRetryable},
		// Read where a response was awaited on a reused connection: the
		// request had been written.
		{"tls record header on a reused connection", 0, "", "", urlErr(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), provider.ClassUnknown},
		{"tls record header, wrapped", 0, "", "", urlErr(fmt.Errorf("readLoopPeekFailLocked: %w", tls.RecordHeaderError{Msg: "unsupported SSL record version"})), provider.ClassUnknown},
		{"read timeout", 0, "", "", urlErr(&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), provider.ClassUnknown},
		{"client timeout", 0, "", "", urlErr(fmt.Errorf("net/http: request canceled (Client.Timeout exceeded while awaiting headers): %w", context.DeadlineExceeded)), provider.ClassUnknown},
		{"context deadline", 0, "", "", urlErr(context.DeadlineExceeded), provider.ClassUnknown},
		{"bare context deadline", 0, "", "", context.DeadlineExceeded, provider.ClassUnknown},
		{"context canceled", 0, "", "", urlErr(context.Canceled), provider.ClassUnknown},
		{"EOF after writing", 0, "", "", urlErr(io.EOF), provider.ClassUnknown},
		{"unexpected EOF", 0, "", "", urlErr(io.ErrUnexpectedEOF), provider.ClassUnknown},
		{"connection reset", 0, "", "", urlErr(&net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}), provider.ClassUnknown},
		{"broken pipe", 0, "", "", urlErr(&net.OpError{Op: "write", Net: "tcp", Err: &os.SyscallError{Syscall: "write", Err: syscall.EPIPE}}), provider.ClassUnknown},
		{"undecodable body", 0, "", "", errors.New("Couldn't deserialize JSON"), provider.ClassUnknown},
		{"nothing at all", 0, "", "", nil, provider.ClassUnknown},

		// A transport error after a status line.
		{"200 body cut short", 200, "", "", io.ErrUnexpectedEOF, provider.ClassUnknown},
		{"402 body cut short", 402, "", "", io.ErrUnexpectedEOF, provider.ClassUnknown},
		{"429 body cut short", 429, "", "", io.ErrUnexpectedEOF, provider.ClassRetryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := provider.Classify(tt.status, tt.errType, tt.errCode, tt.transport); got != tt.want {
				t.Fatalf("Classify(%d, %q, %q, %v) = %s, want %s", tt.status, tt.errType, tt.errCode, tt.transport, got, tt.want)
			}
		})
	}
}

// TestClassifyRealTransportErrors classifies errors produced by a real dial,
// not hand-built ones.
func TestClassifyRealTransportErrors(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = net.Dial("tcp", addr)
	if err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	if got := provider.Classify(0, "", "", urlErr(err)); got != provider.ClassRetryable {
		t.Fatalf("refused dial %v: class %s", err, got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if got := provider.Classify(0, "", "", urlErr(ctx.Err())); got != provider.ClassUnknown {
		t.Fatalf("deadline: class %s", got)
	}
}

func TestClassOf(t *testing.T) {
	t.Parallel()
	mismatch := &provider.Error{Class: provider.ClassMismatch}
	tests := []struct {
		name string
		err  error
		want provider.Class
	}{
		{"nil", nil, provider.ClassUnknown},
		{"deadline", context.DeadlineExceeded, provider.ClassUnknown},
		{"canceled", context.Canceled, provider.ClassUnknown},
		{"unrecognised", errors.New("boom"), provider.ClassUnknown},
		{"provider error", mismatch, provider.ClassMismatch},
		{"wrapped provider error", fmt.Errorf("charge: %w", mismatch), provider.ClassMismatch},
		{"retryable", &provider.Error{Class: provider.ClassRetryable}, provider.ClassRetryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := provider.ClassOf(tt.err); got != tt.want {
				t.Fatalf("ClassOf(%v) = %s, want %s", tt.err, got, tt.want)
			}
		})
	}
}

func TestClassString(t *testing.T) {
	t.Parallel()
	for c, want := range map[provider.Class]string{
		provider.ClassUnknown:      "unknown_outcome",
		provider.ClassRetryable:    "retryable",
		provider.ClassDeclined:     "declined",
		provider.ClassMismatch:     "idempotency_mismatch",
		provider.ClassRejected:     "rejected",
		provider.ClassUnauthorized: "unauthorized",
		provider.Class(9):          "class(9)",
	} {
		if got := c.String(); got != want {
			t.Errorf("Class(%d).String() = %q, want %q", int(c), got, want)
		}
	}
}

func TestErrorStringRedactsPaymentMethods(t *testing.T) {
	t.Parallel()
	err := &provider.Error{
		Class: provider.ClassDeclined, HTTPStatus: 400, Type: "invalid_request_error", Code: "resource_missing",
		Message: "No such PaymentMethod: 'pm_1NqXYZabc'; try pm_card_visa. Keep xpm_1.",
		Err:     errors.New("body mentions pm_secret"),
	}
	s := err.Error()
	for _, leak := range []string{"pm_1NqXYZabc", "pm_card_visa", "pm_secret"} {
		if strings.Contains(s, leak) {
			t.Fatalf("Error() = %q leaks %s", s, leak)
		}
	}
	for _, keep := range []string{"declined", "status 400", "invalid_request_error/resource_missing", "pm_[redacted]", "xpm_1"} {
		if !strings.Contains(s, keep) {
			t.Fatalf("Error() = %q, want it to contain %q", s, keep)
		}
	}
	inner := errors.New("inner")
	if !errors.Is(&provider.Error{Err: inner}, inner) {
		t.Fatal("Unwrap does not expose Err")
	}
}
