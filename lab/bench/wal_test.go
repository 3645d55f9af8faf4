package bench

import "testing"

// TestParseLSN reads pg_lsn's text form, and the WAL per payment between
// two marks; a mark the server did not give makes no figure.
func TestParseLSN(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want uint64
		bad  bool
	}{
		{"0/0", 0, false},
		{"16/B374D848", 0x16_B374D848, false},
		{"FFFFFFFF/FFFFFFFF", 1<<64 - 1, false},
		{"16B374D848", 0, true},
		{"x/1", 0, true},
		{"1/100000000", 0, true},
	} {
		got, err := parseLSN(c.in)
		if c.bad != (err != nil) || got != c.want {
			t.Errorf("parseLSN(%q) = %x, %v; want %x, error %v", c.in, got, err, c.want, c.bad)
		}
	}
	before := walMark{lsn: "1/FFFFF000", checkpoints: 3, ok: true}
	after := walMark{lsn: "2/00001000", checkpoints: 4, ok: true}
	if b, n := after.since(before, 16); b != 512 || n != 1 {
		t.Errorf("since: %v bytes per payment, %d checkpoints; want 512 and 1", b, n)
	}
	if b, n := after.since(walMark{}, 16); b != -1 || n != -1 {
		t.Errorf("since a missing mark: %v, %d; want -1, -1", b, n)
	}
}
