package redact

import (
	"bytes"
	"encoding/json"
)

// Body masks the card numbers of a message body. A JSON body is also read
// as JSON, since an escape in a string ("4111\t1111...", "\u0034111...")
// hides a card number from a byte scan: when any string (a member name or a
// value) holds one, the body comes back re-encoded, compact, with its
// strings masked, then scanned as bytes too (a number split across JSON
// numbers). Otherwise, and for a body that is not JSON, it comes back byte
// for byte with only PANBytes applied: a body without a card number is
// shown exactly as sent.
func Body(b []byte) []byte {
	if countDigits(string(b)) < minPANDigits && !bytes.Contains(b, []byte(`\u`)) {
		return b
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil || dec.More() {
		return PANBytes(b)
	}
	masked, changed := maskJSON(v)
	if !changed {
		return PANBytes(b)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(masked); err != nil {
		return PANBytes(b)
	}
	return PANBytes(bytes.TrimSuffix(out.Bytes(), []byte("\n")))
}

// maskJSON masks every string of a decoded JSON value and reports whether
// any changed.
func maskJSON(v any) (any, bool) {
	switch x := v.(type) {
	case string:
		m := PANs(x)
		return m, m != x
	case map[string]any:
		out, changed := make(map[string]any, len(x)), false
		for k, val := range x {
			mk := PANs(k)
			mv, c := maskJSON(val)
			out[mk] = mv
			changed = changed || c || mk != k
		}
		return out, changed
	case []any:
		out, changed := make([]any, len(x)), false
		for i := range x {
			var c bool
			out[i], c = maskJSON(x[i])
			changed = changed || c
		}
		return out, changed
	}
	return v, false
}
