package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	// HeaderIdempotencyKey is the optional key header of a payment command.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// dlqDuplicateWindow is the dead-letter stream's duplicate window.
const dlqDuplicateWindow = time.Hour

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
	Data        []byte      // the original body, byte for byte
	FailedAt    time.Time
}

// Msg builds the dead-letter message: the original body and headers (NATS
// control headers dropped, the original Nats-Msg-Id kept as Dlq-Orig-Msg-Id)
// plus the Dlq-* headers, on <dlqPrefix>.<reason>. Its Nats-Msg-Id is
// dlq:<stream>:<seq>, so one stream message is filed at most once within the
// dead-letter stream's duplicate window.
func (d Letter) Msg(dlqPrefix string) *nats.Msg {
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
		errText = sanitizeHeader(d.Err.Error())
	}
	h.Set(HeaderDLQReason, d.Reason)
	h.Set(HeaderDLQError, errText)
	h.Set(HeaderDLQOrigSubject, d.OrigSubject)
	h.Set(HeaderDLQOrigStream, d.OrigStream)
	h.Set(HeaderDLQOrigSeq, strconv.FormatUint(d.OrigSeq, 10))
	h.Set(HeaderDLQDeliveries, strconv.FormatUint(d.Deliveries, 10))
	h.Set(HeaderDLQFailedAt, d.FailedAt.UTC().Format(time.RFC3339Nano))
	h.Set(nats.MsgIdHdr, fmt.Sprintf("dlq:%s:%d", d.OrigStream, d.OrigSeq))
	return &nats.Msg{Subject: dlqPrefix + "." + subjectToken(d.Reason), Header: h, Data: d.Data}
}

// sanitizeHeader keeps a header value on one line and bounded.
func sanitizeHeader(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > maxDLQErrorLen {
		s = s[:maxDLQErrorLen]
	}
	return strings.ToValidUTF8(s, "?")
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
	return p, nil
}

// publishDeadLetter files d and waits for the PubAck.
func publishDeadLetter(ctx context.Context, js jetstream.JetStream, dlqPrefix string, d Letter) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, d.Msg(dlqPrefix)); err != nil {
		return fmt.Errorf("publish dead letter (%s): %w", d.Reason, err)
	}
	return nil
}

// maxDeliveriesAdvisory is the part of the server's advisory we use.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// AdvisorySubject is where the server announces that a message of the
// consumer ran out of deliveries.
func AdvisorySubject(stream, durable string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + durable
}

// ListenMaxDeliveries copies into the dead-letter stream every message that
// ran out of deliveries without a worker filing it (a worker that died on
// every attempt never got to). Pods share a queue group so one copies each;
// the dead letter's Nats-Msg-Id makes a second copy a no-op.
func ListenMaxDeliveries(nc *nats.Conn, js jetstream.JetStream, stream jetstream.Stream, cfg Config, logger *slog.Logger) (*nats.Subscription, error) {
	cfg = cfg.WithDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return nc.QueueSubscribe(AdvisorySubject(cfg.Stream, cfg.Durable), "paydedup-advisory", func(m *nats.Msg) {
		var adv maxDeliveriesAdvisory
		if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
			logger.Error("unreadable MAX_DELIVERIES advisory", "error", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		raw, err := stream.GetMsg(ctx, adv.StreamSeq)
		if err != nil {
			logger.Error("message that ran out of deliveries cannot be read; not dead-lettered",
				"stream_seq", adv.StreamSeq, "error", err)
			return
		}
		d := Letter{
			Reason:      ReasonMaxDeliveries,
			Err:         fmt.Errorf("delivery limit %d reached without a worker settling the message", adv.Deliveries),
			OrigSubject: raw.Subject, OrigStream: cfg.Stream, OrigSeq: adv.StreamSeq,
			Deliveries: adv.Deliveries, Header: raw.Header, Data: raw.Data, FailedAt: time.Now(),
		}
		if err := publishDeadLetter(ctx, js, cfg.DLQPrefix, d); err != nil {
			logger.Error("could not dead-letter a message that ran out of deliveries", "stream_seq", adv.StreamSeq, "error", err)
			return
		}
		logger.Warn("dead-lettered a message that ran out of deliveries", "stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries)
	})
}
