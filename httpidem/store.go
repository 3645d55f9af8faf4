package httpidem

import "time"

// StoredResponse is an HTTP response kept for replay, byte for byte.
type StoredResponse struct {
	Status int
	Header map[string][]string
	Body   []byte
}

// ResponseClaim is the right to run a handler for one (scope, key): the
// net/http middleware's lease. Attempt fences a holder that was taken over.
type ResponseClaim struct {
	Scope          string
	IdempotencyKey string
	Attempt        int
	Until          time.Time
}

// ResponseOutcome is what ClaimResponse found.
type ResponseOutcome int

// ClaimResponse outcomes.
const (
	// ResponseClaimed: the caller holds the claim and runs the handler.
	ResponseClaimed ResponseOutcome = iota + 1
	// ResponseReplay: a response is stored; replay it.
	ResponseReplay
	// ResponseInFlight: another request holds a live claim.
	ResponseInFlight
	// ResponseMismatch: the key was used with another request fingerprint.
	ResponseMismatch
)

func (o ResponseOutcome) String() string {
	switch o {
	case ResponseClaimed:
		return "claimed"
	case ResponseReplay:
		return "replay"
	case ResponseInFlight:
		return "in_flight"
	case ResponseMismatch:
		return "mismatch"
	}
	return "unknown"
}

// ResponseClaimResult is the result of ClaimResponse.
type ResponseClaimResult struct {
	Outcome  ResponseOutcome
	Claim    *ResponseClaim  // ResponseClaimed
	Response *StoredResponse // ResponseReplay
	RetryIn  time.Duration   // ResponseInFlight
}
