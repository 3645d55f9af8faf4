package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/paydedup/paydedup/httpidem"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/payment"
)

// Header names.
const (
	HeaderIdempotencyKey    = httpidem.HeaderIdempotencyKey
	HeaderIdempotentReplay  = httpidem.HeaderIdempotentReplay
	HeaderPrefer            = "Prefer"
	HeaderPreferenceApplied = "Preference-Applied"
)

// problemTypePrefix starts every problem type URI. They are URNs: stable
// identifiers, not links (RFC 9457 allows non-dereferenceable types).
const problemTypePrefix = "urn:paydedup:problem:"

// Problem types.
const (
	ProblemUnauthenticated  = problemTypePrefix + "unauthenticated"
	ProblemMissingKey       = problemTypePrefix + "missing-idempotency-key"
	ProblemInvalidKey       = problemTypePrefix + "invalid-idempotency-key"
	ProblemInvalidRequest   = problemTypePrefix + "invalid-request"
	ProblemTooLarge         = problemTypePrefix + "request-too-large"
	ProblemUnsupportedMedia = problemTypePrefix + "unsupported-media-type"
	ProblemKeyReused        = problemTypePrefix + "idempotency-key-reused"
	ProblemKeyInUse         = problemTypePrefix + "idempotency-key-in-use"
	ProblemNotFound         = problemTypePrefix + "not-found"
	ProblemNotAccepted      = problemTypePrefix + "not-accepted"
	ProblemRejected         = problemTypePrefix + "payment-rejected"
	ProblemInternal         = problemTypePrefix + "internal"
	ProblemUnavailable      = problemTypePrefix + "unavailable"
	ProblemMethodNotAllowed = problemTypePrefix + "method-not-allowed"
	ProblemRateLimited      = problemTypePrefix + "rate-limited"
	// ProblemCardData: a field (or the Idempotency-Key) holds what looks
	// like a card number; the payment is refused before anything is
	// stored, published or logged, and the answer names the field only.
	ProblemCardData = problemTypePrefix + "card-data"
	// ProblemPublishUnknown: the command was sent to the stream but its
	// PubAck never came; it may be queued (503).
	ProblemPublishUnknown      = problemTypePrefix + "publish-outcome-unknown"
	problemContentType         = "application/problem+json"
	jsonContentType            = "application/json"
	maxRetryAfter              = time.Minute
	bearerRealm                = `Bearer realm="paydedup"`
	bearerInvalid              = `Bearer realm="paydedup", error="invalid_token"`
	unavailableRetryAfter      = 1 * time.Second
	problemDetailUnauthorized  = "Send a valid API key as Authorization: Bearer <key>."
	problemDetailNotFound      = "No payment with this idempotency key exists for your account."
	problemDetailNotAccepted   = "The payment was not accepted (it could not be queued); retry the POST with the same Idempotency-Key."
	problemDetailInternal      = "The payment could not be queued because of a fault of the service; it was not accepted."
	problemDetailUnavailable   = "The service cannot take the request now; retry with the same Idempotency-Key."
	problemDetailKeyReused     = "This Idempotency-Key was already used with a different request; use a new key for a new payment."
	problemDetailKeyInUse      = "A request with this Idempotency-Key is being processed; retry later with the same key."
	problemDetailMissingKey    = "Send an Idempotency-Key header (for example a UUID) and reuse it for every retry of this payment."
	problemDetailUnsupported   = "Send the payment as application/json."
	problemDetailMethodAllowed = "This method is not allowed on this resource."
	problemDetailRateLimited   = "Your account has too many payments waiting to be taken in; retry after Retry-After with the same Idempotency-Key."
	problemDetailUnknown       = "The payment may have been queued: it was sent but not confirmed, so its outcome is unknown. " +
		"Retry with the same Idempotency-Key and the same body (it is charged at most once); do not pay again under a new key. " +
		"Another body under this key is refused (422)."
	problemDetailNotQueued = "The payment could not be queued and nothing was accepted; retry with the same Idempotency-Key."
	problemDetailNoStream  = "The payments stream does not exist, so nothing was accepted: the service's operator must start a worker " +
		"(`paydedup worker` creates the streams). Retry with the same Idempotency-Key once it runs."
)

// Problem is an RFC 9457 problem detail. Field and Reason name what was
// wrong with an invalid request (payment.ValidationError).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// writeProblem answers with p, its texts' card numbers masked: a detail
// or a field can quote what the client sent.
func writeProblem(w http.ResponseWriter, p Problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	p.Detail, p.Field, p.Reason = redact.PANs(p.Detail), redact.PANs(p.Field), redact.PANs(p.Reason)
	b, _ := json.Marshal(p)
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(b, '\n'))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, Problem{Type: ProblemUnavailable, Status: http.StatusInternalServerError})
		return
	}
	h := w.Header()
	h.Set("Content-Type", jsonContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	secs := int((min(max(d, time.Second), maxRetryAfter) + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
}

func unavailable(w http.ResponseWriter) {
	setRetryAfter(w, unavailableRetryAfter)
	writeProblem(w, Problem{Type: ProblemUnavailable, Status: http.StatusServiceUnavailable, Detail: problemDetailUnavailable})
}

// publishUnknown answers a POST whose publish has an unknown outcome: the
// command may be in the stream, and the key stays bound to its body.
func publishUnknown(w http.ResponseWriter) {
	setRetryAfter(w, unavailableRetryAfter)
	writeProblem(w, Problem{Type: ProblemPublishUnknown, Status: http.StatusServiceUnavailable, Detail: problemDetailUnknown})
}

// notQueued answers a POST whose publish the stream refused: nothing was
// stored, and the key is free.
func notQueued(w http.ResponseWriter, detail string) {
	setRetryAfter(w, unavailableRetryAfter)
	writeProblem(w, Problem{Type: ProblemUnavailable, Status: http.StatusServiceUnavailable, Detail: detail})
}

func notAccepted(w http.ResponseWriter) {
	writeProblem(w, Problem{Type: ProblemNotAccepted, Status: http.StatusNotFound, Detail: problemDetailNotAccepted})
}

func notFound(w http.ResponseWriter) {
	writeProblem(w, Problem{Type: ProblemNotFound, Status: http.StatusNotFound, Detail: problemDetailNotFound})
}

// parseIdempotencyKey reads the Idempotency-Key header (httpidem.ParseKey:
// a quoted sf-string or a bare value, once, 1..255 printable ASCII).
func parseIdempotencyKey(h http.Header) (string, *Problem) {
	key, err := httpidem.ParseKey(h)
	switch {
	case errors.Is(err, httpidem.ErrMissingKey):
		return "", &Problem{Type: ProblemMissingKey, Status: http.StatusBadRequest, Detail: problemDetailMissingKey}
	case err != nil:
		return "", &Problem{Type: ProblemInvalidKey, Status: http.StatusBadRequest,
			Detail: "The Idempotency-Key must be sent once, with 1 to 255 printable ASCII characters (" + err.Error() + ").",
			Field:  "Idempotency-Key", Reason: string(payment.ReasonInvalidKey)}
	}
	if strings.Trim(key, " ") != key {
		// NATS trims header values: the worker would see another key.
		return "", &Problem{Type: ProblemInvalidKey, Status: http.StatusBadRequest,
			Detail: "The Idempotency-Key must not begin or end with a space.",
			Field:  "Idempotency-Key", Reason: string(payment.ReasonInvalidKey)}
	}
	return key, nil
}

// parseWait returns the Prefer: wait=N preference (RFC 7240), in seconds,
// cut to limit; 0 when absent or malformed.
func parseWait(h http.Header, limit time.Duration) time.Duration {
	var wait time.Duration
	for _, line := range h.Values(HeaderPrefer) {
		for pref := range strings.SplitSeq(line, ",") {
			tok, _, _ := strings.Cut(pref, ";") // parameters do not apply to wait
			name, val, ok := strings.Cut(strings.TrimSpace(tok), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(val), `"`))
			if err != nil || n < 0 {
				continue
			}
			wait = time.Duration(min(n, 1<<20)) * time.Second
		}
	}
	return min(wait, limit)
}

// jsonBody reports whether a Content-Type is acceptable: absent, JSON, or a
// +json type.
func jsonBody(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == jsonContentType || strings.HasSuffix(mt, "+json"))
}

type merchantKey struct{}

func merchantFrom(ctx context.Context) string {
	m, _ := ctx.Value(merchantKey{}).(string)
	return m
}

type apiKeyHashKey struct{}

// apiKeyHashFrom is the hash of the request's API key (POSTs: the batch
// re-checks it).
func apiKeyHashFrom(ctx context.Context) []byte {
	h, _ := ctx.Value(apiKeyHashKey{}).([]byte)
	return h
}

// statusRecorder remembers the status for metrics.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
