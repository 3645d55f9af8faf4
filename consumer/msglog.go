package consumer

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/payment"
)

// msgLog is one message's logger: the worker's logger with the message's
// attributes (stream sequence, deliveries, trace id, merchant and key, the
// attempt of a claimed key), as l.With(...) would give, in the same order.
// But the attributes are made only when a record is logged: a With per
// message put each value in an interface and copied the handler, for every
// payment, for lines that are mostly not logged at all.
type msgLog struct {
	h msgHandler
	l slog.Logger
}

// init makes m's logger; logger returns it afterwards. m must not move
// after init (the logger points into it).
func (m *msgLog) init(base *slog.Logger, meta *jetstream.MsgMetadata, traceID string, cmd *payment.Command, attempt int) {
	m.h = msgHandler{inner: base.Handler(), meta: meta, traceID: traceID, cmd: cmd, attempt: attempt}
	m.l = *slog.New(&m.h)
}

func (m *msgLog) logger() *slog.Logger { return &m.l }

// msgHandler adds one message's attributes in front of each record's own.
type msgHandler struct {
	inner   slog.Handler
	meta    *jetstream.MsgMetadata
	traceID string
	cmd     *payment.Command
	attempt int
}

// attrs appends the message's attributes to buf.
func (h *msgHandler) attrs(buf []slog.Attr) []slog.Attr {
	buf = append(buf, slog.Uint64("stream_seq", h.meta.Sequence.Stream), slog.Uint64("deliveries", h.meta.NumDelivered))
	if h.traceID != "" {
		buf = append(buf, slog.String("trace_id", h.traceID))
	}
	if h.cmd != nil {
		buf = append(buf, slog.String("merchant_id", h.cmd.MerchantID), slog.String("idempotency_key", h.cmd.IdempotencyKey))
	}
	if h.attempt > 0 {
		buf = append(buf, slog.Int("attempt", h.attempt))
	}
	return buf
}

func (h *msgHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *msgHandler) Handle(ctx context.Context, r slog.Record) error {
	// The message's attributes and the record's, gathered first and added
	// in one call: a record keeps five inline and the rest in a slice, which
	// an AddAttrs per attribute grew several times per line.
	var buf [16]slog.Attr
	all := h.attrs(buf[:0])
	r.Attrs(func(a slog.Attr) bool {
		all = append(all, a)
		return true
	})
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(all...)
	return h.inner.Handle(ctx, out)
}

// WithAttrs and WithGroup give the handler l.With would have made, with
// the message's attributes first.
func (h *msgHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return h.inner.WithAttrs(h.attrs(nil)).WithAttrs(as)
}

func (h *msgHandler) WithGroup(name string) slog.Handler {
	return h.inner.WithAttrs(h.attrs(nil)).WithGroup(name)
}
