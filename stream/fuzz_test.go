package stream_test

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// FuzzParseDeadLetter feeds ParseDeadLetter arbitrary Dlq-* header values
// (what anyone able to publish on the dead-letter subjects could write).
// Properties: it never panics; what it accepts is what the headers say, with
// a usable original subject (no white space or wildcards) and numbers and a
// time that round-trip.
func FuzzParseDeadLetter(f *testing.F) {
	f.Add("malformed_json", "malformed_json: unexpected end", "payments.requests.m_1", "PAYMENTS", "42", "1", "2026-01-02T03:04:05.123456789Z")
	f.Add("max_deliveries", "", "payments.requests.m_1", "PAYMENTS", "18446744073709551615", "20", "2026-01-02T03:04:05Z")
	f.Add("", "", "", "", "", "", "")
	f.Add("x", "e", "payments.requests.>", "S", "-1", "1", "2026-01-02T03:04:05Z")
	f.Add("x", "e", "a b", "S", "1", "1", "yesterday")
	f.Add("x", "e\r\nNats-Msg-Id: forged", "payments.requests.m", "S", "+1", "0x10", "2026-13-40T25:61:61Z")
	f.Add("x", "e", "$JS.API.STREAM.PURGE.PAYMENTS", "S", "1", "1", "2026-01-02T03:04:05+02:00")
	f.Fuzz(func(t *testing.T, reason, errText, subject, origStream, seq, deliveries, failedAt string) {
		h := nats.Header{}
		for k, v := range map[string]string{
			stream.HeaderDLQReason: reason, stream.HeaderDLQError: errText, stream.HeaderDLQOrigSubject: subject,
			stream.HeaderDLQOrigStream: origStream, stream.HeaderDLQOrigSeq: seq, stream.HeaderDLQDeliveries: deliveries,
			stream.HeaderDLQFailedAt: failedAt,
		} {
			if v != "" {
				h.Set(k, v)
			}
		}
		p, err := stream.ParseDeadLetter(h)
		if err != nil {
			return
		}
		if p.Reason != reason || p.Reason == "" || p.Error != errText || p.OrigSubject != subject || p.OrigStream != origStream {
			t.Fatalf("parsed %+v from different headers", p)
		}
		if subject == "" || strings.ContainsAny(subject, " \t\r\n*>") {
			t.Fatalf("accepted an unusable original subject %q", subject)
		}
		if n, err := strconv.ParseUint(seq, 10, 64); err != nil || n != p.OrigSeq {
			t.Fatalf("sequence %q accepted as %d (%v)", seq, p.OrigSeq, err)
		}
		if n, err := strconv.ParseUint(deliveries, 10, 64); err != nil || n != p.Deliveries {
			t.Fatalf("deliveries %q accepted as %d (%v)", deliveries, p.Deliveries, err)
		}
		if ft, err := time.Parse(time.RFC3339Nano, failedAt); err != nil || !ft.Equal(p.FailedAt) {
			t.Fatalf("failed-at %q accepted as %v (%v)", failedAt, p.FailedAt, err)
		}
	})
}

// FuzzLetterRoundTrip builds a dead letter from arbitrary parts, then reads
// it back. Properties: Letter.Msg never panics; the body is kept byte for
// byte; the original's Nats-* and Dlq-* headers never survive (a publisher
// cannot forge a reason or a message id), the original Nats-Msg-Id becomes
// Dlq-Orig-Msg-Id; the subject is <prefix>.<one token>; Dlq-Error is one
// bounded line; and ParseDeadLetter gives back what was filed.
func FuzzLetterRoundTrip(f *testing.F) {
	f.Add("malformed_json", "bad body", "payments.requests.m_1", "PAYMENTS", uint64(7), uint64(1), int64(1767225600123456789),
		"X-Case", "one", "m_1:k", []byte(`{"a":1}`))
	f.Add("key.reused *>", "line1\r\nline2\x00\x7f", "payments.requests.m", "S", uint64(1<<63), uint64(0), int64(0),
		"Dlq-Reason", "forged", "", []byte{0xff, 0x00})
	f.Add("max_deliveries", strings.Repeat("é", 2000), "p.r.m", "PAYMENTS", uint64(1), uint64(20), int64(-1<<63),
		"Nats-Expected-Stream", "X", "id", []byte(nil))
	f.Add("", "", "", "", uint64(0), uint64(0), int64(0), "", "", "", []byte(""))
	f.Fuzz(func(t *testing.T, reason, errText, subject, origStream string, seq, deliveries uint64, failedAtNano int64,
		hdrKey, hdrVal, msgID string, data []byte) {
		orig := nats.Header{}
		if hdrKey != "" {
			orig.Set(hdrKey, hdrVal)
		}
		orig.Set(stream.HeaderDLQReason, "forged-reason")
		orig.Set("Nats-Expected-Last-Sequence", "1")
		if msgID != "" {
			orig.Set(nats.MsgIdHdr, msgID)
		}
		var err error
		if errText != "" {
			err = errors.New(errText)
		}
		failedAt := time.Unix(0, failedAtNano)
		d := stream.Letter{Reason: reason, Err: err, OrigSubject: subject, OrigStream: origStream, OrigSeq: seq,
			Deliveries: deliveries, Header: orig, Data: data, FailedAt: failedAt}
		m := d.Msg(stream.Config{DLQKey: []byte(testenv.DLQKey)})

		if !bytes.Equal(m.Data, data) {
			t.Fatal("body changed")
		}
		if _, err := stream.VerifyLetter(stream.Config{DLQKey: []byte(testenv.DLQKey)}, m.Header, m.Data); err != nil {
			t.Fatalf("a filed letter does not verify: %v", err)
		}
		tok, ok := strings.CutPrefix(m.Subject, "payments.dlq.")
		if !ok || tok == "" || strings.ContainsAny(tok, ". \t\r\n*>") {
			t.Fatalf("dead-letter subject %q is not payments.dlq.<token>", m.Subject)
		}
		for k := range m.Header {
			if strings.HasPrefix(k, "Nats-") && k != nats.MsgIdHdr {
				t.Fatalf("original header %s survived", k)
			}
		}
		if got := m.Header.Get(stream.HeaderDLQReason); got != reason {
			t.Fatalf("Dlq-Reason %q, want %q (the original's forged value must not survive)", got, reason)
		}
		if want := "dlq:" + origStream + ":" + strconv.FormatUint(seq, 10); m.Header.Get(nats.MsgIdHdr) != want {
			t.Fatalf("Nats-Msg-Id %q, want %q", m.Header.Get(nats.MsgIdHdr), want)
		}
		if msgID != "" && m.Header.Get(stream.HeaderDLQOrigMsgID) != msgID {
			t.Fatalf("Dlq-Orig-Msg-Id %q, want %q", m.Header.Get(stream.HeaderDLQOrigMsgID), msgID)
		}
		if hdrKey != "" && !strings.HasPrefix(hdrKey, "Nats-") && !strings.HasPrefix(hdrKey, "Dlq-") && m.Header.Get(hdrKey) != hdrVal {
			t.Fatalf("original header %s lost", hdrKey)
		}
		e := m.Header.Get(stream.HeaderDLQError)
		if len(e) > 1024 || strings.ContainsAny(e, "\r\n\x00") {
			t.Fatalf("Dlq-Error is %d bytes or spans lines: %.100q", len(e), e)
		}

		p, perr := stream.ParseDeadLetter(m.Header)
		validSubject := subject != "" && !strings.ContainsAny(subject, " \t\r\n*>")
		validTime := failedAt.UTC().Year() >= 0 && failedAt.UTC().Year() <= 9999
		switch {
		case reason == "" || !validSubject || !validTime:
			if perr == nil && (reason == "" || !validSubject) {
				t.Fatalf("accepted a letter without a reason or with subject %q", subject)
			}
			return
		case perr != nil:
			t.Fatalf("filed letter does not parse: %v", perr)
		}
		if p.Reason != reason || p.OrigSubject != subject || p.OrigStream != origStream || p.OrigSeq != seq || p.Deliveries != deliveries {
			t.Fatalf("round trip changed the letter: %+v", p)
		}
		if !p.FailedAt.Equal(failedAt) {
			t.Fatalf("failed-at %v came back as %v", failedAt, p.FailedAt)
		}
	})
}
