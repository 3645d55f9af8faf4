package consumer_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/consumer"
)

// A body 100 bytes under the server's max_payload cannot be dead-lettered
// whole: with the Dlq-* headers it would exceed max_payload. Such a message
// (published before the stream had a MaxMsgSize) is dead-lettered with a
// truncated body, its original length, its SHA-256 and its original
// sequence, and replay refuses the truncated letter. Streams set up now
// refuse such a message at publish, and one that fits is dead-lettered
// whole.
func TestOversizedMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.cfg.MaxDeliver = 3
	maxPayload := int(e.nc.MaxPayload())
	// The stream as an older release created it: no MaxMsgSize.
	e.waitStreamsCreate()
	s, err := e.js.Stream(e.ctx, e.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	old := s.CachedInfo().Config
	old.MaxMsgSize = -1
	if _, err := e.js.UpdateStream(e.ctx, old); err != nil {
		t.Fatal(err)
	}
	huge := bytes.Repeat([]byte("x"), maxPayload-100)
	m := nats.NewMsg(e.cfg.SubjectPrefix + ".m_1")
	m.Data = huge
	ack, err := e.js.PublishMsg(e.ctx, m)
	if err != nil {
		t.Fatalf("publish %d bytes to a stream without MaxMsgSize: %v", len(huge), err)
	}

	// Headers as large as JetStream takes (64 KiB) and a body that fills
	// the rest of max_payload.
	hm := nats.NewMsg(e.cfg.SubjectPrefix + ".m_1")
	hm.Header.Set("X-Huge", strings.Repeat("h", 60<<10))
	hm.Header.Set(consumer.HeaderIdempotencyKey, "huge-headers")
	hm.Data = bytes.Repeat([]byte("z"), maxPayload-60<<10-200)
	hack, err := e.js.PublishMsg(e.ctx, hm)
	if err != nil {
		t.Fatalf("publish huge headers to a stream without MaxMsgSize: %v", err)
	}

	e.startWorker("big", nil)
	e.eventually("the oversized messages dead-lettered", func() bool { return len(e.deadLetters()) == 2 })
	e.quiescent()
	dl, hl := e.deadLetters()[0], e.deadLetters()[1]
	if hl.Header.Get("Dlq-Body-Truncated") != "true" || hl.Header.Get("X-Huge") != hm.Header.Get("X-Huge") || !bytes.HasPrefix(hm.Data, hl.Data) ||
		hl.Header.Get(consumer.HeaderDLQOrigSeq) != strconv.FormatUint(hack.Sequence, 10) || hl.Header.Get(consumer.HeaderDLQReason) != "body_too_large" {
		t.Fatalf("dead letter of the huge headers: %d bytes, truncated %q, reason %q", len(hl.Data), hl.Header.Get("Dlq-Body-Truncated"), hl.Header.Get(consumer.HeaderDLQReason))
	}
	sum := sha256.Sum256(huge)
	if dl.Header.Get("Dlq-Body-Truncated") != "true" || dl.Header.Get("Dlq-Body-Length") != strconv.Itoa(len(huge)) ||
		dl.Header.Get("Dlq-Body-Sha256") != hex.EncodeToString(sum[:]) || dl.Header.Get(consumer.HeaderDLQOrigSeq) != strconv.FormatUint(ack.Sequence, 10) ||
		dl.Header.Get(consumer.HeaderDLQReason) != "body_too_large" || !bytes.HasPrefix(huge, dl.Data) {
		t.Fatalf("dead letter of %d bytes, truncated %q, length %q, reason %q", len(dl.Data), dl.Header.Get("Dlq-Body-Truncated"),
			dl.Header.Get("Dlq-Body-Length"), dl.Header.Get(consumer.HeaderDLQReason))
	}
	d, err := consumer.GetDeadLetter(e.ctx, e.js, e.cfg, dl.Sequence)
	if err != nil || !d.Verified {
		t.Fatalf("truncated letter does not verify: %+v %v", d.Unverified, err)
	}
	rep, err := consumer.ReplayDeadLetters(e.ctx, e.js, e.cfg, consumer.ReplayOptions{Seqs: []uint64{dl.Sequence}, Force: true})
	if err != nil || rep.Refused != 1 || !strings.Contains(rep.Results[0].Detail, "truncated") {
		t.Fatalf("replay of a truncated letter: %+v %v", rep, err)
	}

	// The stream the worker set up leaves room for the dead-letter headers.
	s, err = e.js.Stream(e.ctx, e.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	limit := int(info.Config.MaxMsgSize)
	if limit <= 0 || limit > maxPayload-2048 {
		t.Fatalf("MaxMsgSize %d leaves no room for the dead-letter headers under max_payload %d", limit, maxPayload)
	}
	m.Data = huge
	if _, err := e.js.PublishMsg(e.ctx, m); err == nil {
		t.Fatal("the stream accepted a body 100 bytes under max_payload")
	}
	fits := bytes.Repeat([]byte("y"), limit-200)
	m = nats.NewMsg(e.cfg.SubjectPrefix + ".m_1")
	m.Header.Set("X-Trace", "t")
	m.Data = fits
	if _, err := e.js.PublishMsg(e.ctx, m); err != nil {
		t.Fatalf("publish %d bytes under MaxMsgSize %d: %v", len(fits), limit, err)
	}
	e.eventually("the largest accepted message dead-lettered", func() bool { return len(e.deadLetters()) == 3 })
	whole := e.deadLetters()[2]
	if whole.Header.Get("Dlq-Body-Truncated") != "" || !bytes.Equal(whole.Data, fits) {
		t.Fatalf("a message within MaxMsgSize was truncated: %d bytes of %d", len(whole.Data), len(fits))
	}
}

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
	cfg := consumer.Config{DLQKey: []byte("a-dlq-key-of-thirty-two-bytes-or-more")}
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
		d := consumer.Letter{Reason: "malformed_json", OrigSubject: "payments.requests.m_1", OrigStream: "PAYMENTS", OrigSeq: 9,
			Header: h, Data: bytes.Repeat([]byte("b"), c.body)}
		m := d.MsgWithin(cfg, 8192)
		if n := size(m); n > 8192 {
			t.Errorf("%s: letter of %d bytes exceeds max_payload 8192", c.name, n)
		}
		if got := m.Header.Get(consumer.HeaderDLQBodyTruncated) == "true"; got != c.truncated {
			t.Errorf("%s: truncated %v, want %v", c.name, got, c.truncated)
		}
		if got := m.Header.Get(consumer.HeaderDLQHeadersDrop) != ""; got != c.headersDroped || (got && m.Header.Get("X-Big") != "") {
			t.Errorf("%s: headers dropped %v, want %v", c.name, got, c.headersDroped)
		}
		if err := consumer.VerifyLetter(cfg.DLQKey, m.Header, m.Data); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if p, err := consumer.ParseDeadLetter(m.Header); err != nil || p.Truncated != c.truncated || p.OrigSeq != 9 {
			t.Errorf("%s: parsed %+v %v", c.name, p, err)
		}
	}
}
