package redact

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
)

type stringer string

func (s stringer) String() string { return string(s) }

type valuer string

func (v valuer) LogValue() slog.Value { return slog.StringValue(string(v)) }

// Issue 54, item 4: every place a record can carry a card number is masked
// by the handler, in JSON and in text, and the rest of the line is kept.
func TestHandlerMasksEveryAttribute(t *testing.T) {
	t.Parallel()
	const pan = "4111111111111111"
	for _, format := range []string{"json", "text"} {
		var buf bytes.Buffer
		var inner slog.Handler = slog.NewJSONHandler(&buf, nil)
		if format == "text" {
			inner = slog.NewTextHandler(&buf, nil)
		}
		log := slog.New(NewHandler(inner))
		log.Info("payment accepted "+pan, "idempotency_key", pan, "order", "order 42")
		log.Info("x", "description", "４１１１ １１１１ １１１１ １１１１", "metadata", `{"n":"4111\t1111\t1111\t1111"}`)
		log.Warn("dead letter", "error", fmt.Errorf("invalid_currency: %q", "٤١١١-١١١١-١١١١-١١١١"))
		log.Info("x", "s", stringer("card "+pan), "b", []byte(pan), "v", valuer(pan), "m", map[string]string{"k": pan})
		log.Info("x", "n", int64(4111111111111111), "u", uint64(4111111111111111), "f", 4111111111111111.0, "small", 42)
		log.Info("x", slog.Group("g", "k", pan, slog.Group("h", pan, "v")))
		log.With("idempotency_key", pan).WithGroup("g"+pan).Info("x", "k", "𝟒𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏")
		log.LogAttrs(context.Background(), slog.LevelInfo, "x", slog.Any("err", errors.New("card "+pan)))
		out := buf.String()
		if start, end, ok := FindPAN(out); ok {
			t.Errorf("%s: the log shows %q:\n%s", format, out[start:end], out)
		}
		for _, want := range []string{"order 42", "small=42", `"small":42`} {
			if want == "small=42" && format == "json" || want == `"small":42` && format == "text" {
				continue
			}
			if !strings.Contains(out, want) {
				t.Errorf("%s: the log lost %q:\n%s", format, want, out)
			}
		}
		if n := strings.Count(out, PANMask); n < 16 {
			t.Errorf("%s: %d masks, want one per card number:\n%s", format, n, out)
		}
	}
}

// A line without a card number reaches the inner handler as it came.
func TestHandlerPassesCleanRecords(t *testing.T) {
	t.Parallel()
	var plain, masked bytes.Buffer
	opts := &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}
	for _, l := range []*slog.Logger{slog.New(slog.NewJSONHandler(&plain, opts)), slog.New(NewHandler(slog.NewJSONHandler(&masked, opts)))} {
		paymentCompleted(l)
	}
	if plain.String() != masked.String() {
		t.Fatalf("a clean line changed:\n%s\n%s", plain.String(), masked.String())
	}
}

// paymentCompleted logs the worker's INFO line per payment, with its
// message attributes.
func paymentCompleted(l *slog.Logger) {
	l.LogAttrs(context.Background(), slog.LevelInfo, "payment completed",
		slog.Uint64("stream_seq", 1234567), slog.Uint64("deliveries", 1), slog.String("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"),
		slog.String("merchant_id", "m_1"), slog.String("idempotency_key", "550e8400-e29b-41d4-a716-446655440000"), slog.Int("attempt", 1),
		slog.String("charge_id", "ch_3MmlLrLkdIwHu7ix0snN0B15"), slog.Bool("declined", false),
		slog.Bool("processing", false), slog.String("decline_code", ""), slog.Bool("replayed", false))
}

// nopHandler writes nothing: it isolates the mask's own cost.
type nopHandler struct{}

func (nopHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (nopHandler) Handle(context.Context, slog.Record) error { return nil }
func (h nopHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h nopHandler) WithGroup(string) slog.Handler           { return h }

// captureHandler keeps the last record.
type captureHandler struct{ r *slog.Record }

func (captureHandler) Enabled(context.Context, slog.Level) bool        { return true }
func (h captureHandler) Handle(_ context.Context, r slog.Record) error { *h.r = r.Clone(); return nil }
func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h captureHandler) WithGroup(string) slog.Handler                 { return h }

// BenchmarkHandlerPaymentCompleted measures the mask's cost on the
// worker's line per payment: plain is the JSON handler alone, masked the
// same wrapped; nop and nop-masked the same over a handler that writes
// nothing (their difference is the mask's own cost); masked-digit-key a
// line with 16-digit (not Luhn-valid) order numbers, which the filter
// cannot reject.
func BenchmarkHandlerPaymentCompleted(b *testing.B) {
	for _, c := range []struct {
		name string
		h    slog.Handler
	}{
		{"plain", slog.NewJSONHandler(io.Discard, nil)},
		{"masked", NewHandler(slog.NewJSONHandler(io.Discard, nil))},
		{"nop", nopHandler{}},
		{"nop-masked", NewHandler(nopHandler{})},
	} {
		l := slog.New(c.h)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				paymentCompleted(l)
			}
		})
	}
	// The mask alone: Handle on a record built once, over a handler that
	// writes nothing.
	var rec slog.Record
	capture := slog.New(captureHandler{&rec})
	paymentCompleted(capture)
	h := NewHandler(nopHandler{})
	b.Run("handle-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = h.Handle(context.Background(), rec)
		}
	})
	l := slog.New(NewHandler(slog.NewJSONHandler(io.Discard, nil))).With("idempotency_key", "order-1234567890123456")
	b.Run("masked-digit-key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.LogAttrs(context.Background(), slog.LevelInfo, "payment completed", slog.String("order", "1234567890123456"), slog.String("charge_id", "ch_3MmlLrLkdIwHu7ix0snN0B15"))
		}
	})
}
