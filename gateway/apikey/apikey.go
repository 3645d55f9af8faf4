// Package apikey holds what the gateway and its store agree an API key is:
// its shape (Prefix, ID, ValidShape), what is stored of it (Hash), and the
// one error for a key that does not authenticate. It links no driver: the
// keys themselves live in the gateway's store (gateway/pgstore).
package apikey

import (
	"crypto/sha256"
	"errors"
)

// ErrUnauthenticated means an API key is malformed, unknown or revoked. The
// three are deliberately not told apart.
var ErrUnauthenticated = errors.New("invalid API key")

// Prefix starts every API key, so a leaked key is recognisable (and
// secret scanners can be taught to find it).
const Prefix = "pd_"

// The shape of a key: prefix, idLen lowercase hex characters of
// public id, underscore, secretLen base64url characters (256 random
// bits); `^pd_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$`.
const (
	idLen     = 12
	secretLen = 43
)

// ID returns the public id of a key of the right shape. Checked by
// hand rather than by a regexp: every POST checks its key's shape.
func ID(key string) (string, bool) {
	p := len(Prefix)
	if len(key) != p+idLen+1+secretLen || key[:p] != Prefix || key[p+idLen] != '_' {
		return "", false
	}
	id := key[p : p+idLen]
	for i := range len(id) {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	for _, c := range []byte(key[p+idLen+1:]) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && c != '_' && c != '-' {
			return "", false
		}
	}
	return id, true
}

// Hash returns what a store keeps of a key: its SHA-256. A key carries
// 256 random bits, so no salt or slow hash is needed.
func Hash(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	return sum[:]
}

// ValidShape reports whether key has the shape of an API key; a key
// of another shape is never looked up.
func ValidShape(key string) bool {
	_, ok := ID(key)
	return ok
}
