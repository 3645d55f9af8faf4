package redact

import (
	"context"
	"encoding"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
)

// Handler is a slog.Handler that masks card numbers (PANs) in everything a
// record carries before its inner handler writes it: the message, every
// attribute's key and value (strings; integers and floats of 13 or more
// digits; errors, fmt.Stringers, encoding.TextMarshalers, json.Marshalers,
// byte slices and any other value as it would print; LogValuers resolved
// first; groups at any depth), the attributes of With and the names of
// WithGroup. Wrapping a binary's handler once masks every line, so no call
// site can forget (an idempotency key, a description quoted in an error).
//
// A record with nothing to mask goes to the inner handler as it came, with
// no allocation: the common line has short strings, which the scan's
// filter rejects in a pass over their bytes.
type Handler struct{ inner slog.Handler }

// NewHandler wraps inner.
func NewHandler(inner slog.Handler) *Handler { return &Handler{inner: inner} }

// Enabled is the inner handler's.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

// Handle masks the record, only copying it when something is masked.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	dirty := ContainsPAN(r.Message)
	if !dirty {
		r.Attrs(func(a slog.Attr) bool {
			dirty = attrHoldsPAN(a)
			return !dirty
		})
	}
	if !dirty {
		return h.inner.Handle(ctx, r)
	}
	out := slog.NewRecord(r.Time, r.Level, PANs(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(maskAttr(a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

// WithAttrs masks the attributes once, when they are added.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	masked := make([]slog.Attr, len(as))
	for i, a := range as {
		masked[i] = maskAttr(a)
	}
	return &Handler{inner: h.inner.WithAttrs(masked)}
}

// WithGroup masks the group's name.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{inner: h.inner.WithGroup(PANs(name))}
}

// attrHoldsPAN reports whether maskAttr would change a.
func attrHoldsPAN(a slog.Attr) bool {
	if ContainsPAN(a.Key) {
		return true
	}
	v := resolve(a.Value)
	switch v.Kind() {
	case slog.KindString:
		return ContainsPAN(v.String())
	case slog.KindInt64, slog.KindUint64, slog.KindFloat64, slog.KindAny:
		s, ok := rendered(v)
		return ok && ContainsPAN(s)
	case slog.KindGroup:
		for _, g := range v.Group() {
			if attrHoldsPAN(g) {
				return true
			}
		}
	}
	return false
}

// maskAttr returns a with its card numbers masked; a value that held one
// becomes a string.
func maskAttr(a slog.Attr) slog.Attr {
	a.Key = PANs(a.Key)
	v := resolve(a.Value)
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(PANs(v.String()))
		return a
	case slog.KindInt64, slog.KindUint64, slog.KindFloat64, slog.KindAny:
		if s, ok := rendered(v); ok && ContainsPAN(s) {
			a.Value = slog.StringValue(PANs(s))
			return a
		}
	case slog.KindGroup:
		g := v.Group()
		masked := make([]slog.Attr, len(g))
		for i := range g {
			masked[i] = maskAttr(g[i])
		}
		a.Value = slog.GroupValue(masked...)
		return a
	}
	a.Value = v
	return a
}

// resolve is v.Resolve, called only for a LogValuer: Resolve defers a
// recover, a cost the check would otherwise pay for every value.
func resolve(v slog.Value) slog.Value {
	if v.Kind() == slog.KindLogValuer {
		return v.Resolve()
	}
	return v
}

// minPANNumber is the least integer with 13 digits: smaller numbers are
// never rendered.
const minPANNumber = 1_000_000_000_000

// rendered is v as a handler would print it, when it could hold a card
// number: numbers of 13 digits or more and any value of KindAny.
func rendered(v slog.Value) (string, bool) {
	switch v.Kind() {
	case slog.KindInt64:
		if n := v.Int64(); n >= minPANNumber || n <= -minPANNumber {
			return strconv.FormatInt(n, 10), true
		}
	case slog.KindUint64:
		if n := v.Uint64(); n >= minPANNumber {
			return strconv.FormatUint(n, 10), true
		}
	case slog.KindFloat64:
		if f := v.Float64(); f >= minPANNumber || f <= -minPANNumber {
			return strconv.FormatFloat(f, 'f', -1, 64), true
		}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case nil:
			return "", false
		case error:
			return x.Error(), true
		case fmt.Stringer:
			return x.String(), true
		case []byte:
			return string(x), true
		case encoding.TextMarshaler:
			b, err := x.MarshalText()
			return string(b), err == nil
		case json.Marshaler:
			b, err := x.MarshalJSON()
			return string(b), err == nil
		default:
			return fmt.Sprintf("%+v", x), true
		}
	}
	return "", false
}
