package stripesim

import (
	"strconv"
	"sync"
	"unicode/utf8"
)

// The simulator renders its JSON by hand rather than with encoding/json:
// intents are kept as compact fields (not as response bodies) and rendered on
// every answer, so this is the hot path of both the HTTP handlers and
// Client. The output is byte for byte what encoding/json produced from the
// simulator's former struct types (field order, omitempty, sorted metadata
// keys, HTML-safe string escaping); simjson_internal_test.go holds those
// types and checks the two agree.

// appendIntentJSON appends in as a Stripe PaymentIntent object.
func appendIntentJSON(b []byte, in *simIntent) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, in.id)
	b = append(b, `,"object":"payment_intent","amount":`...)
	b = strconv.AppendInt(b, in.amount, 10)
	if in.manual {
		// Only a manual-capture intent carries amount_capturable, so that
		// the others' answers stay byte for byte what they were (it is 0
		// on them at Stripe, as a decoder reads it absent).
		b = append(b, `,"amount_capturable":`...)
		b = strconv.AppendInt(b, in.capturable, 10)
	}
	b = append(b, `,"amount_received":`...)
	switch {
	case in.manual:
		b = strconv.AppendInt(b, in.received, 10)
	case in.status == simSucceeded:
		b = strconv.AppendInt(b, in.amount, 10)
	default:
		b = append(b, '0')
	}
	if in.manual {
		b = append(b, `,"capture_method":"manual","confirmation_method":"automatic","created":`...)
	} else {
		b = append(b, `,"capture_method":"automatic","confirmation_method":"automatic","created":`...)
	}
	b = strconv.AppendInt(b, in.created.Unix(), 10)
	b = append(b, `,"currency":`...)
	b = appendJSONString(b, in.currency)
	b = append(b, `,"description":`...)
	if in.hasDescription {
		b = appendJSONString(b, in.description)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"last_payment_error":`...)
	if d := in.decline; d != nil {
		e := d.cardError()
		b = appendErrorObject(b, &e, nil)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"latest_charge":`...)
	b = appendJSONStringOrNull(b, in.latestCharge)
	b = append(b, `,"livemode":false,"metadata":{`...)
	for i, m := range in.metadata {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, m.key)
		b = append(b, ':')
		b = appendJSONString(b, m.value)
	}
	b = append(b, `},"payment_method":`...)
	b = appendJSONStringOrNull(b, in.paymentMethod)
	b = append(b, `,"payment_method_types":[`...)
	for i, t := range in.methodTypes {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, t)
	}
	b = append(b, `],"status":`...)
	b = appendJSONString(b, in.status)
	return append(b, '}')
}

// cardError is the error object of the decline d.
func (d *simDecline) cardError() simError {
	return simError{Type: "card_error", Code: d.code, DeclineCode: d.declineCode, Message: d.message}
}

// appendCreateAnswer appends the body of the create answer that made in: the
// intent, or for a decline the 402 card_error carrying it.
func appendCreateAnswer(b []byte, in *simIntent) []byte {
	if d := in.decline; d != nil {
		e := d.cardError()
		return appendErrorJSON(b, &e, in)
	}
	return appendIntentJSON(b, in)
}

// appendErrorJSON appends Stripe's error envelope {"error":{...}} for e, with
// the payment intent in when not nil.
func appendErrorJSON(b []byte, e *simError, in *simIntent) []byte {
	b = append(b, `{"error":`...)
	b = appendErrorObject(b, e, in)
	return append(b, '}')
}

func appendErrorObject(b []byte, e *simError, in *simIntent) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, e.Type)
	if e.Code != "" {
		b = append(b, `,"code":`...)
		b = appendJSONString(b, e.Code)
	}
	if e.DeclineCode != "" {
		b = append(b, `,"decline_code":`...)
		b = appendJSONString(b, e.DeclineCode)
	}
	b = append(b, `,"message":`...)
	b = appendJSONString(b, e.Message)
	if e.Param != "" {
		b = append(b, `,"param":`...)
		b = appendJSONString(b, e.Param)
	}
	if in != nil {
		b = append(b, `,"payment_intent":`...)
		b = appendIntentJSON(b, in)
	}
	return append(b, '}')
}

// appendSearchPage appends a search_result page holding page, which starts at
// offset.
func appendSearchPage(b []byte, page []*simIntent, more bool, offset int) []byte {
	b = append(b, `{"object":"search_result","data":[`...)
	for i, in := range page {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendIntentJSON(b, in)
	}
	b = append(b, `],"has_more":`...)
	if more {
		b = append(b, `true,"next_page":"`+searchPagePrefix...)
		b = strconv.AppendInt(b, int64(offset+len(page)), 10)
		b = append(b, '"')
	} else {
		b = append(b, `false,"next_page":null`...)
	}
	return append(b, `,"url":"`+simPathSearch+`"}`...)
}

// renderSim renders with render into a recycled buffer and returns an exact
// copy: one allocation the caller owns.
func renderSim(render func([]byte) []byte) []byte {
	bp := simBufs.Get().(*[]byte)
	*bp = render((*bp)[:0])
	out := append([]byte(nil), *bp...)
	putSimBuf(bp)
	return out
}

// simBufs recycles the buffers answers are rendered into.
var simBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func putSimBuf(bp *[]byte) {
	if cap(*bp) <= 64<<10 {
		simBufs.Put(bp)
	}
}

func appendJSONStringOrNull(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendJSONString(b, s)
}

const jsonHex = "0123456789abcdef"

// jsonSafe reports the ASCII bytes encoding/json writes unescaped when it
// escapes HTML (its htmlSafeSet).
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	for _, c := range `"\<>&` {
		t[c] = false
	}
	return t
}()

// appendJSONString appends s as a JSON string exactly as encoding/json's
// Marshal does: <, > and & escaped, invalid UTF-8 replaced by \ufffd per
// byte, U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if jsonSafe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', jsonHex[c>>4], jsonHex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', jsonHex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// afterJSON returns s as a client reads it back from the simulator's JSON:
// each invalid UTF-8 byte became U+FFFD.
func afterJSON(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return string(b)
}
