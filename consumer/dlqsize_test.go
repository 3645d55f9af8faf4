package consumer_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/stream"
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
	e.cfg.Stream.MaxDeliver = 3
	maxPayload := int(e.nc.MaxPayload())
	// The stream as an older release created it: no MaxMsgSize.
	e.waitStreamsCreate()
	s, err := e.js.Stream(e.ctx, e.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	old := s.CachedInfo().Config
	old.MaxMsgSize = -1
	if _, err := e.js.UpdateStream(e.ctx, old); err != nil {
		t.Fatal(err)
	}
	huge := bytes.Repeat([]byte("x"), maxPayload-100)
	m := nats.NewMsg(e.cfg.Stream.SubjectPrefix + ".m_1")
	m.Data = huge
	ack, err := e.js.PublishMsg(e.ctx, m)
	if err != nil {
		t.Fatalf("publish %d bytes to a stream without MaxMsgSize: %v", len(huge), err)
	}

	// Headers as large as JetStream takes (64 KiB) and a body that fills
	// the rest of max_payload.
	hm := nats.NewMsg(e.cfg.Stream.SubjectPrefix + ".m_1")
	hm.Header.Set("X-Huge", strings.Repeat("h", 60<<10))
	hm.Header.Set(stream.HeaderIdempotencyKey, "huge-headers")
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
		hl.Header.Get(stream.HeaderDLQOrigSeq) != strconv.FormatUint(hack.Sequence, 10) || hl.Header.Get(stream.HeaderDLQReason) != "body_too_large" {
		t.Fatalf("dead letter of the huge headers: %d bytes, truncated %q, reason %q", len(hl.Data), hl.Header.Get("Dlq-Body-Truncated"), hl.Header.Get(stream.HeaderDLQReason))
	}
	sum := sha256.Sum256(huge)
	if dl.Header.Get("Dlq-Body-Truncated") != "true" || dl.Header.Get("Dlq-Body-Length") != strconv.Itoa(len(huge)) ||
		dl.Header.Get("Dlq-Body-Sha256") != hex.EncodeToString(sum[:]) || dl.Header.Get(stream.HeaderDLQOrigSeq) != strconv.FormatUint(ack.Sequence, 10) ||
		dl.Header.Get(stream.HeaderDLQReason) != "body_too_large" || !bytes.HasPrefix(huge, dl.Data) {
		t.Fatalf("dead letter of %d bytes, truncated %q, length %q, reason %q", len(dl.Data), dl.Header.Get("Dlq-Body-Truncated"),
			dl.Header.Get("Dlq-Body-Length"), dl.Header.Get(stream.HeaderDLQReason))
	}
	d, err := dlq.Get(e.ctx, e.js, e.cfg.Stream, dl.Sequence)
	if err != nil || !d.Verified {
		t.Fatalf("truncated letter does not verify: %+v %v", d.Unverified, err)
	}
	rep, err := dlq.Replay(e.ctx, e.js, e.cfg.Stream, dlq.ReplayOptions{Seqs: []uint64{dl.Sequence}, Force: true})
	if err != nil || rep.Refused != 1 || !strings.Contains(rep.Results[0].Detail, "truncated") {
		t.Fatalf("replay of a truncated letter: %+v %v", rep, err)
	}

	// The stream the worker set up leaves room for the dead-letter headers.
	s, err = e.js.Stream(e.ctx, e.cfg.Stream.Name)
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
	m = nats.NewMsg(e.cfg.Stream.SubjectPrefix + ".m_1")
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
