package apikey

import (
	"regexp"
	"strings"
	"testing"
)

// apiKeyShape is the documented shape of a key, which ID checks by
// hand.
var apiKeyShape = regexp.MustCompile(`^pd_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$`)

// TestAPIKeyIDMatchesTheShape: every one-character change, deletion and
// insertion of a valid key, at every position, is judged as the regexp
// judges it, and the id is the regexp's.
func TestAPIKeyIDMatchesTheShape(t *testing.T) {
	valid := "pd_0123456789af_" + strings.Repeat("aZ09-_", 7) + "x"
	if !apiKeyShape.MatchString(valid) {
		t.Fatal("the test's key is not of the shape")
	}
	probes := []string{"", "pd_", valid + valid, strings.ToUpper(valid)}
	for i := range len(valid) + 1 {
		if i < len(valid) {
			probes = append(probes, valid[:i]+valid[i+1:])
			for _, c := range []byte("09afgzAZ_-.:/+= \x00\xff") {
				probes = append(probes, valid[:i]+string(c)+valid[i+1:])
			}
		}
		probes = append(probes, valid[:i]+"a"+valid[i:])
	}
	for _, p := range probes {
		id, ok := ID(p)
		m := apiKeyShape.FindStringSubmatch(p)
		if ok != (m != nil) || (ok && id != m[1]) {
			t.Errorf("%q: ID %q %v, the shape %v", p, id, ok, m)
		}
	}
}
