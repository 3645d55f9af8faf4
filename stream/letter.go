package stream

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/payment"
)

// Dead-letter headers. The Nats- prefix is reserved by NATS, hence Dlq-.
const (
	HeaderDLQReason      = "Dlq-Reason"
	HeaderDLQError       = "Dlq-Error"
	HeaderDLQOrigSubject = "Dlq-Orig-Subject"
	HeaderDLQOrigStream  = "Dlq-Orig-Stream"
	HeaderDLQOrigSeq     = "Dlq-Orig-Seq"
	HeaderDLQDeliveries  = "Dlq-Deliveries"
	HeaderDLQFailedAt    = "Dlq-Failed-At"
	HeaderDLQOrigMsgID   = "Dlq-Orig-Msg-Id"
	// HeaderDLQAuth authenticates a dead letter: v1=<hex HMAC-SHA256> over
	// its body, its other headers and its original subject, keyed with the
	// DLQ key the workers and the operator's CLI share.
	HeaderDLQAuth = "Dlq-Auth"
	// HeaderDLQKeyID names the DLQ key that made Dlq-Auth (DLQKeyID), so
	// a letter is checked against that key alone and dlq show can say it
	// was signed with a previous key. Letters filed before it existed lack
	// it and are checked against each configured key.
	HeaderDLQKeyID = "Dlq-Key-Id"
	// A dead letter that would exceed the server's max_payload keeps a
	// prefix of the body and says so: Dlq-Body-Truncated: true, with the
	// original body's length and SHA-256 (the original stays in its stream,
	// at Dlq-Orig-Seq, until MaxAge). Original headers too large to fit are
	// dropped (Dlq-Headers-Dropped: their size in bytes).
	HeaderDLQBodyTruncated = "Dlq-Body-Truncated"
	HeaderDLQBodyLength    = "Dlq-Body-Length"
	HeaderDLQBodySHA256    = "Dlq-Body-Sha256"
	HeaderDLQHeadersDrop   = "Dlq-Headers-Dropped"
	// HeaderIdempotencyKey is the optional key header of a payment command.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// dlqDuplicateWindow is the dead-letter stream's duplicate window.
const dlqDuplicateWindow = time.Hour

// DLQHeadroom is what the payments stream's MaxMsgSize leaves under the
// server's max_payload for the headers a dead letter adds: Dlq-Error is at
// most maxDLQErrorLen, the others (reason, subject, stream, sequences,
// times, Dlq-Auth, the truncation headers) a few hundred bytes.
const DLQHeadroom = 4096

// maxDLQErrorLen bounds Dlq-Error: header values are not the place for
// unbounded text.
const maxDLQErrorLen = 1024

// Letter describes one message to file in the dead-letter stream.
type Letter struct {
	Reason      string
	Err         error
	OrigSubject string
	OrigStream  string
	OrigSeq     uint64
	Deliveries  uint64
	Header      nats.Header // the original headers
	Data        []byte      // the original body, byte for byte (masked for card_data: see Msg)
	FailedAt    time.Time
}

// MinDLQKeyLen is the shortest DLQ key accepted, in bytes: an HMAC-SHA256
// key shorter than the hash gives less than its strength.
const MinDLQKeyLen = 32

// ErrDLQKey means the DLQ key is missing or too short to authenticate dead
// letters.
var ErrDLQKey = errors.New("DLQ key missing or too short")

// ValidateDLQKey checks that key can authenticate dead letters.
func ValidateDLQKey(key []byte) error {
	if len(key) < MinDLQKeyLen {
		return fmt.Errorf("%w: %d bytes, need at least %d (e.g. openssl rand -hex 32), the same on every worker and wherever dlq replay runs",
			ErrDLQKey, len(key), MinDLQKeyLen)
	}
	return nil
}

// ValidateDLQPreviousKeys checks each previous DLQ key as ValidateDLQKey
// checks the current one; the error says which, by its position (1-based),
// never by its value.
func ValidateDLQPreviousKeys(keys [][]byte) error {
	var errs []error
	for i, k := range keys {
		if err := ValidateDLQKey(k); err != nil {
			errs = append(errs, fmt.Errorf("previous key %d of %d: %w", i+1, len(keys), err))
		}
	}
	return errors.Join(errs...)
}

// DLQKeyID names a DLQ key without revealing it: the first 8 bytes of its
// SHA-256, in hex (printf %s "$PAYDEDUP_DLQ_KEY" | sha256sum | cut -c1-16).
// It is no easier to guess a key from than from the letters' HMACs.
func DLQKeyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// Msg builds the dead-letter message: the original body and headers (NATS
// control headers dropped, the original Nats-Msg-Id kept as Dlq-Orig-Msg-Id)
// plus the Dlq-* headers, on <DLQPrefix>.<reason>, authenticated with
// cfg.DLQKey (Dlq-Auth, Dlq-Key-Id). Its Nats-Msg-Id is dlq:<stream>:<seq>, so one
// stream message is filed at most once within the dead-letter stream's
// duplicate window.
//
// A card_data letter keeps no card number: its body, its original headers
// (names and values, Nats-Msg-Id included) and its original subject are
// masked (maskCardData) before anything else, so Dlq-Auth is computed over
// what is stored, and the original is kept nowhere (its error names the
// field, never the value). Such a letter cannot be replayed: the masked body
// would be another command.
func (d Letter) Msg(cfg Config) *nats.Msg { return d.MsgWithin(cfg, 0) }

// MsgWithin is Msg for a server whose max_payload is maxSize (0: no bound).
// A letter that would not fit keeps a prefix of the body (Dlq-Body-Truncated,
// Dlq-Body-Length, Dlq-Body-Sha256) and, if the original headers alone are
// too large, drops them (Dlq-Headers-Dropped).
func (d Letter) MsgWithin(cfg Config, maxSize int) *nats.Msg {
	cfg = cfg.WithDefaults()
	if d.Reason == string(payment.ReasonCardData) {
		d = d.maskCardData()
	}
	h := nats.Header{}
	for k, vs := range d.Header {
		if strings.HasPrefix(k, "Nats-") || strings.HasPrefix(k, "Dlq-") {
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	if id := d.Header.Get(nats.MsgIdHdr); id != "" {
		h.Set(HeaderDLQOrigMsgID, id)
	}
	errText := ""
	if d.Err != nil {
		errText = SanitizeHeader(d.Err.Error())
	}
	h.Set(HeaderDLQReason, d.Reason)
	h.Set(HeaderDLQError, errText)
	h.Set(HeaderDLQOrigSubject, d.OrigSubject)
	h.Set(HeaderDLQOrigStream, d.OrigStream)
	h.Set(HeaderDLQOrigSeq, strconv.FormatUint(d.OrigSeq, 10))
	h.Set(HeaderDLQDeliveries, strconv.FormatUint(d.Deliveries, 10))
	h.Set(HeaderDLQFailedAt, d.FailedAt.UTC().Format(time.RFC3339Nano))
	h.Set(nats.MsgIdHdr, fmt.Sprintf("dlq:%s:%d", d.OrigStream, d.OrigSeq))
	// Set before the size is measured: the key id has a fixed size too.
	h.Set(HeaderDLQKeyID, DLQKeyID(cfg.DLQKey))
	data := d.Data
	// The Dlq-Auth value's size is fixed: "v1=" and 64 hex digits.
	const authLen = len(HeaderDLQAuth) + len(": v1=\r\n") + 2*sha256.Size
	if maxSize > 0 && headerLen(h)+authLen+len(data) > maxSize {
		sum := sha256.Sum256(data)
		h.Set(HeaderDLQBodyTruncated, "true")
		h.Set(HeaderDLQBodyLength, strconv.Itoa(len(data)))
		h.Set(HeaderDLQBodySHA256, hex.EncodeToString(sum[:]))
		// The letter's own headers must fit with room for some body.
		if headerLen(h)+authLen > maxSize/2 {
			dropped := 0
			for k, vs := range h {
				if !strings.HasPrefix(k, "Dlq-") && k != nats.MsgIdHdr {
					dropped += headerLen(nats.Header{k: vs}) - headerLen(nats.Header{})
					delete(h, k)
				}
			}
			h.Set(HeaderDLQHeadersDrop, strconv.Itoa(dropped))
		}
		data = data[:max(0, min(len(data), maxSize-headerLen(h)-authLen))]
	}
	h.Set(HeaderDLQAuth, letterMAC(cfg.DLQKey, h, data))
	return &nats.Msg{Subject: cfg.DLQSubject(d.Reason), Header: h, Data: data}
}

// SignLetter signs a stored dead letter's headers h and body data anew
// with cfg.DLQKey: Dlq-Key-Id names the current key and Dlq-Auth is its
// HMAC; every other header, Dlq-Failed-At included, is kept. dlq resign
// uses it on letters that verified with a previous key, before that key
// is dropped. h is changed in place.
func SignLetter(cfg Config, h nats.Header, data []byte) {
	h.Set(HeaderDLQKeyID, DLQKeyID(cfg.DLQKey))
	h.Set(HeaderDLQAuth, letterMAC(cfg.DLQKey, h, data))
}

// maskCardData is d with every card number in its body, original headers
// and original subject masked. The body is masked as JSON too
// (redact.Body), since an escape in a string hides a number from a byte
// scan. In the subject and header names, where white space cannot go, the
// mask's spaces become underscores.
func (d Letter) maskCardData() Letter {
	noSpace := func(s string) string { return strings.ReplaceAll(s, " ", "_") }
	d.Data = redact.Body(d.Data)
	d.OrigSubject = noSpace(redact.PANs(d.OrigSubject))
	h := make(nats.Header, len(d.Header))
	for k, vs := range d.Header {
		masked := make([]string, len(vs))
		for i, v := range vs {
			masked[i] = redact.PANs(v)
		}
		h[noSpace(redact.PANs(k))] = masked
	}
	d.Header = h
	return d
}

// headerLen is the size of h as NATS sends it: NATS/1.0, one line per
// value, a blank line.
func headerLen(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// letterMAC is the Dlq-Auth value of a dead letter with headers h and body
// data: an HMAC-SHA256 over the original subject, every header but
// Dlq-Auth and the server's Nats-* ones (sorted, each key and value length
// prefixed, values as NATS parses them back) and the body.
func letterMAC(key []byte, h nats.Header, data []byte) string {
	mac := hmac.New(sha256.New, key)
	write := func(b []byte) {
		writeCount(mac, len(b))
		mac.Write(b)
	}
	mac.Write([]byte("paydedup-dlq-v1"))
	write([]byte(h.Get(HeaderDLQOrigSubject)))
	keys := make([]string, 0, len(h))
	for k := range h {
		if k != HeaderDLQAuth && !strings.HasPrefix(k, "Nats-") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		write([]byte(k))
		writeCount(mac, len(h[k]))
		for _, v := range h[k] {
			write([]byte(strings.TrimSpace(v)))
		}
	}
	write(data)
	return "v1=" + hex.EncodeToString(mac.Sum(nil))
}

func writeCount(h hash.Hash, n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	h.Write(b[:])
}

// ErrUnverified means a dead letter's Dlq-Auth does not match: it was not
// filed by a worker holding the DLQ key (forged, altered, or filed with
// another key), or there is no key to check it with.
var ErrUnverified = errors.New("dead letter not authenticated")

// Verification says which configured key verified a dead letter.
type Verification struct {
	// KeyID is the Dlq-Key-Id of the key that verified it.
	KeyID string
	// Previous: that key is one of Config.DLQPreviousKeys, not DLQKey.
	// The letter stops verifying when that key is dropped, unless it is
	// re-signed first (dlq resign).
	Previous bool
}

// VerifyLetter checks a stored dead letter's Dlq-Auth against cfg.DLQKey
// and cfg.DLQPreviousKeys. A letter that names its key (Dlq-Key-Id, which
// the HMAC covers) is checked against that key alone; one filed before
// letters named their key, against each key in turn.
func VerifyLetter(cfg Config, h nats.Header, data []byte) (Verification, error) {
	type candidate struct {
		key      []byte
		previous bool
	}
	var keys []candidate
	if len(cfg.DLQKey) > 0 {
		keys = append(keys, candidate{cfg.DLQKey, false})
	}
	for _, k := range cfg.DLQPreviousKeys {
		if len(k) > 0 {
			keys = append(keys, candidate{k, true})
		}
	}
	if len(keys) == 0 {
		return Verification{}, fmt.Errorf("%w: no DLQ key to check it with", ErrUnverified)
	}
	got := h.Get(HeaderDLQAuth)
	if got == "" {
		return Verification{}, fmt.Errorf("%w: no %s header", ErrUnverified, HeaderDLQAuth)
	}
	id := h.Get(HeaderDLQKeyID)
	tried := false
	for _, k := range keys {
		kid := DLQKeyID(k.key)
		if id != "" && id != kid {
			continue
		}
		tried = true
		if hmac.Equal([]byte(got), []byte(letterMAC(k.key, h, data))) {
			return Verification{KeyID: kid, Previous: k.previous}, nil
		}
	}
	if !tried {
		return Verification{}, fmt.Errorf("%w: signed with DLQ key %s, which is neither the current DLQ key nor a previous one configured here (forged, or its key was dropped)",
			ErrUnverified, SanitizeHeader(id))
	}
	return Verification{}, fmt.Errorf("%w: %s does not match (forged, altered, or filed with another key)", ErrUnverified, HeaderDLQAuth)
}

// SanitizeHeader keeps a header value on one line and bounded, as the
// dead-letter headers require, with its card numbers masked before the
// cut (an error may quote what a publisher wrote).
func SanitizeHeader(s string) string {
	// Valid UTF-8 and one line first, then the cut: strings.Map writes an
	// invalid byte as U+FFFD, three bytes, which after the cut could take
	// the header past its bound.
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	s, _ = redact.Cut(s, maxDLQErrorLen)
	return s
}

// subjectToken makes a reason safe as one subject token.
func subjectToken(s string) string {
	if s == "" {
		return "unknown"
	}
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '*' || r == '>' || r <= ' ' || r > '~' {
			return '_'
		}
		return r
	}, s)
}

// ParsedDeadLetter is a dead letter read back from the stream.
type ParsedDeadLetter struct {
	Reason      string
	Error       string
	OrigSubject string
	OrigStream  string
	OrigSeq     uint64
	Deliveries  uint64
	FailedAt    time.Time
	// Truncated: the letter keeps only a prefix of the body (or dropped
	// the original headers) to fit under max_payload; it cannot be replayed.
	Truncated bool `json:"truncated,omitempty"`
}

// ParseDeadLetter reads the Dlq-* headers of a dead letter. It fails on a
// message that is not a dead letter or whose headers were tampered with.
func ParseDeadLetter(h nats.Header) (ParsedDeadLetter, error) {
	var p ParsedDeadLetter
	p.Reason = h.Get(HeaderDLQReason)
	if p.Reason == "" {
		return p, errors.New("not a dead letter: no " + HeaderDLQReason + " header")
	}
	p.Error = h.Get(HeaderDLQError)
	p.OrigSubject = h.Get(HeaderDLQOrigSubject)
	p.OrigStream = h.Get(HeaderDLQOrigStream)
	if p.OrigSubject == "" || strings.ContainsAny(p.OrigSubject, " \t\r\n*>") {
		return p, fmt.Errorf("dead letter has an invalid %s %q", HeaderDLQOrigSubject, p.OrigSubject)
	}
	var err error
	if p.OrigSeq, err = strconv.ParseUint(h.Get(HeaderDLQOrigSeq), 10, 64); err != nil {
		return p, fmt.Errorf("dead letter has an invalid %s: %w", HeaderDLQOrigSeq, err)
	}
	if p.Deliveries, err = strconv.ParseUint(h.Get(HeaderDLQDeliveries), 10, 64); err != nil {
		return p, fmt.Errorf("dead letter has an invalid %s: %w", HeaderDLQDeliveries, err)
	}
	if p.FailedAt, err = time.Parse(time.RFC3339Nano, h.Get(HeaderDLQFailedAt)); err != nil {
		return p, fmt.Errorf("dead letter has an invalid %s: %w", HeaderDLQFailedAt, err)
	}
	p.Truncated = h.Get(HeaderDLQBodyTruncated) != "" || h.Get(HeaderDLQHeadersDrop) != ""
	return p, nil
}

// AdvisorySubject is where the server announces that a message of the
// consumer ran out of deliveries.
func AdvisorySubject(stream, durable string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + durable
}

// DefaultMaxDeliverDurable is the durable consumer of the advisory stream
// that the workers share.
const DefaultMaxDeliverDurable = "paydedup-maxdeliver"

// maxDeliverAckWait is how long one advisory may take to handle before the
// server hands it to another worker.
const maxDeliverAckWait = 30 * time.Second

// Dead-letter reasons besides payment.Reason's bad-input reasons.
const (
	ReasonKeyReused        = "key_reused"
	ReasonProviderMismatch = "provider_idempotency_mismatch"
	ReasonLedgerConflict   = "ledger_conflict"
	ReasonMaxDeliveries    = "max_deliveries"
	// ReasonProviderRejected: the provider refused our request (a 400
	// invalid_request_error, a 404): not charged, not a decline; the
	// request or the account is wrong. Dlq-Error carries the provider's
	// error.
	ReasonProviderRejected = "provider_rejected"
)

// NeedsInvestigation reports whether a dead letter with this reason needs a
// person to look before it is replayed: the provider's record disagrees with
// ours, the ledger conflicts, or the provider rejected the request (replayed
// unchanged before someone fixes the account or the request, it is rejected
// again). replay All skips them unless Reason names them.
func NeedsInvestigation(reason string) bool {
	return reason == ReasonProviderMismatch || reason == ReasonLedgerConflict || reason == ReasonProviderRejected
}

// ReplayableReason reports whether a dead letter with this reason can
// succeed when replayed unchanged: not bad input, not a reused key.
func ReplayableReason(reason string) bool {
	return !payment.IsInputReason(reason) && reason != ReasonKeyReused
}
