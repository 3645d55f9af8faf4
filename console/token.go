package console

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
)

// NewTokenBytes is the randomness of a token NewToken draws: 256 bits.
const NewTokenBytes = 32

// NewToken draws an operator token from crypto/rand: NewTokenBytes bytes in
// hex (`paydedup console token` prints one).
func NewToken() (string, error) {
	b := make([]byte, NewTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("draw a console token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// minRepeat is the shortest repeat of an earlier stretch of a token that
// counts as predictable: in 64 random hex characters a 4-character repeat
// turns up about once in eight tokens, and costs it 4 characters.
const minRepeat = 4

// tokenEstimate is what ValidateToken estimates of a token.
type tokenEstimate struct {
	bits float64
	// predictable counts the characters an attacker's guesser gets for
	// free: all but the first of a run of three or more that repeat one
	// character, count up or down by one, or walk across neighbouring
	// keys; and a stretch of minRepeat or more that repeats an earlier one.
	predictable int
	// pattern names the longest such stretch, for the error.
	pattern string
}

// estimateToken estimates a token's entropy as its unpredictable
// characters times the bits of one character: the lesser of what its
// character classes allow (lower, upper, digits, others) and the Shannon
// entropy of its characters' frequencies (so "aaaa..." or "abab..." has
// next to none). Only the characters outside sequences ("abcdef...",
// "0123..."), repeats ("0123456789abcdef" twice) and keyboard walks
// ("qwertyuiop", "1qaz2wsx") count. It is a lower-bound guess in the
// spirit of zxcvbn without its dictionaries: a token is made by a machine
// (NewToken), not remembered, so a word list adds little.
func estimateToken(token string) tokenEstimate {
	rs := []rune(token)
	n := len(rs)
	if n == 0 {
		return tokenEstimate{}
	}
	var lower, upper, digit, other bool
	count := map[rune]int{}
	for _, r := range rs {
		switch {
		case r >= 'a' && r <= 'z':
			lower = true
		case r >= 'A' && r <= 'Z':
			upper = true
		case r >= '0' && r <= '9':
			digit = true
		default:
			other = true
		}
		count[r]++
	}
	alphabet := 0
	for _, c := range []struct {
		has  bool
		size int
	}{{lower, 26}, {upper, 26}, {digit, 10}, {other, 33}} {
		if c.has {
			alphabet += c.size
		}
	}
	shannon := 0.0
	for _, k := range count {
		p := float64(k) / float64(n)
		shannon -= p * math.Log2(p)
	}
	perChar := min(math.Log2(float64(alphabet)), shannon)

	free := make([]bool, n)
	longest, pattern := 0, ""
	// mark gives away rs[from:to], part of a stretch of shown characters.
	mark := func(from, to, shown int, kind string) {
		for i := from; i < to; i++ {
			free[i] = true
		}
		if shown > longest {
			longest, pattern = shown, fmt.Sprintf("%s of %d characters", kind, shown)
		}
	}
	// Runs: each step from one character to the next is of a kind; three
	// characters joined by two steps of one kind give the later ones away.
	for start := 0; start+2 < n; {
		kind := step(rs[start], rs[start+1])
		end := start + 1
		for kind != "" && end+1 < n && step(rs[end], rs[end+1]) == kind {
			end++
		}
		if end-start >= 2 {
			mark(start+1, end+1, end+1-start, kind)
			start = end
			continue
		}
		start++
	}
	// Repeats of an earlier stretch (overlapping allowed, so a period is
	// one).
	for i := 1; i < n; {
		best := 0
		for j := 0; j < i; j++ {
			l := 0
			for i+l < n && rs[j+l] == rs[i+l] {
				l++
			}
			best = max(best, l)
		}
		if best >= minRepeat {
			mark(i, i+best, best, "a repeat of an earlier stretch")
			i += best
			continue
		}
		i++
	}
	predictable := 0
	for _, f := range free {
		if f {
			predictable++
		}
	}
	return tokenEstimate{bits: float64(n-predictable) * perChar, predictable: predictable, pattern: pattern}
}

// step names how b follows a: the same character, the next or previous
// code point, or a neighbouring key on a US keyboard; "" when it does not.
func step(a, b rune) string {
	switch {
	case a == b:
		return "one character repeated"
	case b == a+1:
		return "an ascending sequence"
	case b == a-1:
		return "a descending sequence"
	}
	pa, okA := keyPos[unshift(a)]
	pb, okB := keyPos[unshift(b)]
	if okA && okB {
		dr, dc := pb[0]-pa[0], pb[1]-pa[1]
		// Rows are staggered: a key touches the two below it at the
		// same column and one to the left.
		if (dr == 0 && (dc == 1 || dc == -1)) || (dr == 1 && (dc == 0 || dc == -1)) || (dr == -1 && (dc == 0 || dc == 1)) {
			return "a keyboard walk"
		}
	}
	return ""
}

// keyRows is a US keyboard's character keys, unshifted.
var keyRows = []string{"`1234567890-=", "qwertyuiop[]\\", "asdfghjkl;'", "zxcvbnm,./"}

// keyPos is each key's row and column; a row's column 0 sits half a key to
// the right of the row above's.
var keyPos = func() map[rune][2]int {
	m := map[rune][2]int{}
	for r, row := range keyRows {
		for c, k := range row {
			// Row 1 starts under "1", not "`": shift rows below the
			// first by one column so that columns line up.
			off := 0
			if r > 0 {
				off = 1
			}
			m[k] = [2]int{r, c + off}
		}
	}
	return m
}()

// unshift is the key a character is typed on.
func unshift(r rune) rune {
	const shifted, plain = `~!@#$%^&*()_+{}|:"<>?`, "`1234567890-=[]\\;',./"
	if r >= 'A' && r <= 'Z' {
		return r + ('a' - 'A')
	}
	for i, s := range shifted {
		if s == r {
			return []rune(plain)[i]
		}
	}
	return r
}
