package stream_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/stream"
)

// Under a small max_payload, original headers too large to leave room for
// the letter are dropped and counted, and the letter fits.
func TestLetterWithinMaxPayload(t *testing.T) {
	t.Parallel()
	size := func(m *nats.Msg) int {
		n := len("NATS/1.0\r\n\r\n") + len(m.Data)
		for k, vs := range m.Header {
			for _, v := range vs {
				n += len(k) + 2 + len(v) + 2
			}
		}
		return n
	}
	cfg := stream.Config{DLQKey: []byte("a-dlq-key-of-thirty-two-bytes-or-more")}
	for _, c := range []struct {
		name          string
		header, body  int
		truncated     bool
		headersDroped bool
	}{
		{"fits", 100, 1000, false, false},
		{"large body", 100, 8000, true, false},
		{"large headers", 7900, 10, true, true},
		{"both", 6000, 8000, true, true},
	} {
		h := nats.Header{}
		h.Set("X-Big", strings.Repeat("h", c.header))
		d := stream.Letter{Reason: "malformed_json", OrigSubject: "payments.requests.m_1", OrigStream: "PAYMENTS", OrigSeq: 9,
			Header: h, Data: bytes.Repeat([]byte("b"), c.body)}
		m := d.MsgWithin(cfg, 8192)
		if n := size(m); n > 8192 {
			t.Errorf("%s: letter of %d bytes exceeds max_payload 8192", c.name, n)
		}
		if got := m.Header.Get(stream.HeaderDLQBodyTruncated) == "true"; got != c.truncated {
			t.Errorf("%s: truncated %v, want %v", c.name, got, c.truncated)
		}
		if got := m.Header.Get(stream.HeaderDLQHeadersDrop) != ""; got != c.headersDroped || (got && m.Header.Get("X-Big") != "") {
			t.Errorf("%s: headers dropped %v, want %v", c.name, got, c.headersDroped)
		}
		if _, err := stream.VerifyLetter(cfg, m.Header, m.Data); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if p, err := stream.ParseDeadLetter(m.Header); err != nil || p.Truncated != c.truncated || p.OrigSeq != 9 {
			t.Errorf("%s: parsed %+v %v", c.name, p, err)
		}
	}
}
