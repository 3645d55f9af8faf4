package console

import (
	"testing"
)

// Every token NewToken draws passes ValidateToken with room to spare:
// 5000 draws, and the least estimate among them is logged.
func TestNewTokensAreStrong(t *testing.T) {
	t.Parallel()
	least := 1e9
	for range 5000 {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		if err := ValidateToken(tok); err != nil {
			t.Fatalf("a drawn token is refused: %v", err)
		}
		least = min(least, estimateToken(tok).bits)
	}
	if least < 1.25*MinTokenBits {
		t.Fatalf("a drawn token estimated at %.0f bits, want at least %d", least, 5*MinTokenBits/4)
	}
	t.Logf("least estimate of 5000 drawn tokens: %.0f bits (256 drawn)", least)
}
