package stream_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/stream"
)

// A letter verifies with the key that signed it, whether that key is the
// current one or a previous one, and says which; a letter signed with a
// key configured nowhere does not verify, and says that its key is
// unknown. Letters filed before Dlq-Key-Id existed verify with whichever
// configured key signed them. An altered key id breaks the HMAC.
func TestVerifyLetterWithPreviousKeys(t *testing.T) {
	t.Parallel()
	k1 := []byte("rotate-test-key-one-0123456789abcdef")
	k2 := []byte("rotate-test-key-two-0123456789abcdef")
	k0 := []byte("rotate-test-key-nil-0123456789abcdef")
	letter := func(key []byte) *nats.Msg {
		d := stream.Letter{Reason: stream.ReasonMaxDeliveries, OrigSubject: "payments.requests.m_1", OrigStream: "PAYMENTS", OrigSeq: 3,
			Deliveries: 2, Header: nats.Header{}, Data: []byte(`{"amount":1}`), FailedAt: time.Unix(1_700_000_000, 0)}
		return d.Msg(stream.Config{DLQKey: key})
	}
	legacy := func(key []byte) *nats.Msg {
		m := letter(key)
		stream.LegacySignForTest(key, m)
		return m
	}
	if got := letter(k1).Header.Get(stream.HeaderDLQKeyID); got != stream.DLQKeyID(k1) || len(got) != 16 {
		t.Fatalf("Dlq-Key-Id %q, want %q", got, stream.DLQKeyID(k1))
	}
	rotated := stream.Config{DLQKey: k2, DLQPreviousKeys: [][]byte{k0[:0], k1}}
	for _, c := range []struct {
		name     string
		cfg      stream.Config
		m        *nats.Msg
		previous bool
		keyID    string
		err      string // "" verifies
	}{
		{"current", rotated, letter(k2), false, stream.DLQKeyID(k2), ""},
		{"previous", rotated, letter(k1), true, stream.DLQKeyID(k1), ""},
		{"legacy current", rotated, legacy(k2), false, stream.DLQKeyID(k2), ""},
		{"legacy previous", rotated, legacy(k1), true, stream.DLQKeyID(k1), ""},
		{"unknown key", rotated, letter(k0), false, "", "neither the current DLQ key nor a previous one"},
		{"legacy unknown key", rotated, legacy(k0), false, "", "does not match"},
		{"previous key dropped", stream.Config{DLQKey: k2}, letter(k1), false, "", "neither the current DLQ key nor a previous one"},
		{"no key", stream.Config{}, letter(k1), false, "", "no DLQ key"},
	} {
		v, err := stream.VerifyLetter(c.cfg, c.m.Header, c.m.Data)
		switch {
		case c.err == "" && (err != nil || v.Previous != c.previous || v.KeyID != c.keyID):
			t.Errorf("%s: %+v %v, want key %s previous %v", c.name, v, err, c.keyID, c.previous)
		case c.err != "" && (!errors.Is(err, stream.ErrUnverified) || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %+v %v, want an error saying %q", c.name, v, err, c.err)
		}
	}
	// Pointing a letter at another configured key breaks its HMAC.
	m := letter(k1)
	m.Header.Set(stream.HeaderDLQKeyID, stream.DLQKeyID(k2))
	if _, err := stream.VerifyLetter(rotated, m.Header, m.Data); !errors.Is(err, stream.ErrUnverified) {
		t.Errorf("a letter whose Dlq-Key-Id was changed verified: %v", err)
	}

	// SignLetter moves a letter to the current key and keeps the rest.
	m = letter(k1)
	failedAt := m.Header.Get(stream.HeaderDLQFailedAt)
	stream.SignLetter(rotated, m.Header, m.Data)
	if v, err := stream.VerifyLetter(stream.Config{DLQKey: k2}, m.Header, m.Data); err != nil || v.Previous || m.Header.Get(stream.HeaderDLQFailedAt) != failedAt {
		t.Errorf("re-signed letter: %+v %v, failed at %q (was %q)", v, err, m.Header.Get(stream.HeaderDLQFailedAt), failedAt)
	}
}

// Each previous key is checked as the current one is, and named by its
// position, never by its value.
func TestValidateDLQPreviousKeys(t *testing.T) {
	t.Parallel()
	good := []byte("rotate-test-key-one-0123456789abcdef")
	if err := stream.ValidateDLQPreviousKeys(nil); err != nil {
		t.Errorf("no previous keys: %v", err)
	}
	if err := stream.ValidateDLQPreviousKeys([][]byte{good, good}); err != nil {
		t.Errorf("two good keys: %v", err)
	}
	err := stream.ValidateDLQPreviousKeys([][]byte{good, []byte("secret-short"), nil})
	if !errors.Is(err, stream.ErrDLQKey) || !strings.Contains(err.Error(), "previous key 2 of 3") ||
		!strings.Contains(err.Error(), "previous key 3 of 3") || strings.Contains(err.Error(), "secret-short") {
		t.Errorf("short keys: %v", err)
	}
}
