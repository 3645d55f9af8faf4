package httpidem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/httpidem"
)

// TestDefaultStorableBoundaries: the first and last status of each range.
// A 2xx that is not stored would be executed again on a retry; a 5xx that
// is stored would be replayed instead of retried.
func TestDefaultStorableBoundaries(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]bool{
		199: false, 200: true, 201: true, 299: true, 400: true, 408: false, 425: false, 429: false, 499: true,
		500: false, 503: false,
	} {
		if got := httpidem.DefaultStorable(status); got != want {
			t.Errorf("DefaultStorable(%d) = %v, want %v", status, got, want)
		}
	}
}

// TestParseKeyPrintableBoundaries: space (0x20) and tilde (0x7e) are the
// ends of printable ASCII and are accepted inside a key; 0x1f and 0x7f are
// not; 255 characters is the limit.
func TestParseKeyPrintableBoundaries(t *testing.T) {
	t.Parallel()
	for key, ok := range map[string]bool{
		"a b":                    true,
		"a~b":                    true,
		"a\x1fb":                 false,
		"a\x7fb":                 false,
		strings.Repeat("k", 255): true,
		strings.Repeat("k", 256): false,
		`"ab\`:                   false, // a quoted string whose escape runs off the end
		`"a\"b"`:                 true,
	} {
		h := http.Header{}
		h.Set(httpidem.HeaderIdempotencyKey, key)
		got, err := httpidem.ParseKey(h)
		if want := strings.ReplaceAll(strings.Trim(key, `"`), `\"`, `"`); ok && (err != nil || got != want) {
			t.Errorf("ParseKey(%q) = %q, %v; want it accepted", key, got, err)
		}
		if !ok && err == nil {
			t.Errorf("ParseKey(%q) accepted", key)
		}
	}
}
