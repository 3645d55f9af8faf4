package stream_test

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/stream"
)

// msgIDKind is which publisher made a Nats-Msg-Id.
type msgIDKind string

const (
	kindCommand   msgIDKind = "command"
	kindRepublish msgIDKind = "republish"
	kindReplay    msgIDKind = "replay"
	kindRequeue   msgIDKind = "requeue"
)

// parsedMsgID is what a Nats-Msg-Id says, read back.
type parsedMsgID struct {
	kind     msgIDKind
	merchant string
	key      string
	n        int    // republish
	seq      uint64 // replay
	dlq      string // replay: the DLQ stream; requeue: the payments stream
}

// parseMsgID reads an id back by the scheme MsgID documents: a command's
// starts with its merchant id (never "~"), the project's own copies with
// "~<word>:"; every field but the last has no ':'. ok is false for an id
// no publisher makes.
func parseMsgID(id string) (p parsedMsgID, ok bool) {
	if rest, own := strings.CutPrefix(id, "~"); own {
		word, rest, ok := strings.Cut(rest, ":")
		if !ok {
			return p, false
		}
		num, rest, ok := strings.Cut(rest, ":")
		if !ok || num == "" || strings.TrimLeft(num, "0123456789") != "" {
			return p, false
		}
		switch word {
		case "republish":
			n, err := strconv.Atoi(num)
			merchant, key, ok := strings.Cut(rest, ":")
			if err != nil || !ok || merchant == "" || key == "" {
				return p, false
			}
			return parsedMsgID{kind: kindRepublish, n: n, merchant: merchant, key: key}, true
		case "replay":
			seq, err := strconv.ParseUint(num, 10, 64)
			if err != nil || rest == "" {
				return p, false
			}
			return parsedMsgID{kind: kindReplay, seq: seq, dlq: rest}, true
		case "requeue":
			seq, err := strconv.ParseUint(num, 10, 64)
			if err != nil || rest == "" {
				return p, false
			}
			return parsedMsgID{kind: kindRequeue, seq: seq, dlq: rest}, true
		}
		return p, false
	}
	merchant, key, ok := strings.Cut(id, ":")
	if !ok || merchant == "" || key == "" {
		return p, false
	}
	return parsedMsgID{kind: kindCommand, merchant: merchant, key: key}, true
}

// msgIDCases are the merchants and keys that broke the old scheme
// (replay:<dlq stream>:<seq>, <merchant>:<key>:r<n>) and their neighbours.
var (
	msgIDMerchants = []string{"replay", "republish", "m", "m_1", "r1", "dlq", "PAYMENTS_DLQ", "-", "_", "a-b_C9"}
	msgIDKeys      = []string{
		"k", "k:r1", "k:r2", "r1", ":r1", "PAYMENTS_DLQ:2", "PAYMENTS_DLQ:18446744073709551615", "~replay:2:PAYMENTS_DLQ", "~requeue:2:PAYMENTS",
		"~", "~~", ":", "::", "replay", "replay:", "republish:1:m:k", "~republish:1:m:k", "2:PAYMENTS_DLQ", "a b",
		" ", "x:~y", strings.Repeat(":", 255), strings.Repeat("~", 255),
	}
	msgIDDLQs = []string{"PAYMENTS_DLQ", "P", "X_DLQ", "m", "replay"}
)

// randomPrintable is a key of 1..n printable ASCII bytes, biased towards the
// id scheme's own bytes.
func randomPrintable(r *rand.Rand, n int) string {
	b := make([]byte, 1+r.IntN(n))
	for i := range b {
		switch r.IntN(4) {
		case 0:
			b[i] = ":~r"[r.IntN(3)]
		default:
			b[i] = byte(0x20 + r.IntN(0x7f-0x20))
		}
	}
	return string(b)
}

func randomMerchant(r *rand.Rand) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
	b := make([]byte, 1+r.IntN(12))
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// No command's Nats-Msg-Id, for any merchant id of the valid alphabet and
// any printable-ASCII key (with ':' and '~', and words like replay or r1),
// equals a replay's or a republish's, and each of the three kinds reads back
// one way: the stream's duplicate window never drops one publisher's
// message as another's.
func TestMsgIDsOfPublishersNeverCollide(t *testing.T) {
	t.Parallel()
	type built struct {
		id   string
		want parsedMsgID
	}
	var ids []built
	command := func(m, k string) {
		ids = append(ids, built{stream.MsgID(m, k), parsedMsgID{kind: kindCommand, merchant: m, key: k}})
	}
	republish := func(m, k string, n int) {
		ids = append(ids, built{stream.RepublishMsgID(m, k, n), parsedMsgID{kind: kindRepublish, merchant: m, key: k, n: n}})
	}
	replay := func(dlq string, seq uint64) {
		id := stream.ReplayMsgID(stream.Config{DLQStream: dlq}, seq)
		ids = append(ids, built{id, parsedMsgID{kind: kindReplay, dlq: dlq, seq: seq}})
		id = stream.RequeueMsgID(stream.Config{Name: dlq}, seq)
		ids = append(ids, built{id, parsedMsgID{kind: kindRequeue, dlq: dlq, seq: seq}})
	}
	for _, m := range msgIDMerchants {
		for _, k := range msgIDKeys {
			command(m, k)
			for _, n := range []int{1, 2, 10} {
				republish(m, k, n)
			}
		}
	}
	for _, d := range msgIDDLQs {
		for _, seq := range []uint64{1, 2, 10, 1<<64 - 1} {
			replay(d, seq)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		m, k := randomMerchant(r), randomPrintable(r, 40)
		command(m, k)
		republish(m, k, 1+r.IntN(5))
		if r.IntN(10) == 0 {
			replay(msgIDDLQs[r.IntN(len(msgIDDLQs))], uint64(r.IntN(100)))
		}
	}

	// The collisions the old scheme had, by name.
	for _, c := range []struct{ a, b string }{
		{stream.MsgID("replay", "PAYMENTS_DLQ:2"), stream.ReplayMsgID(stream.Config{DLQStream: "PAYMENTS_DLQ"}, 2)},
		{stream.MsgID("m", "k:r1"), stream.RepublishMsgID("m", "k", 1)},
	} {
		if c.a == c.b {
			t.Errorf("a command's id %q is another publisher's", c.a)
		}
	}
	seen := make(map[string]parsedMsgID, len(ids))
	for _, b := range ids {
		if prev, dup := seen[b.id]; dup && prev != b.want {
			t.Fatalf("id %q is both %+v and %+v: the duplicate window would drop one as the other", b.id, prev, b.want)
		}
		seen[b.id] = b.want
	}
	for _, b := range ids {
		if got, ok := parseMsgID(b.id); !ok || got != b.want {
			t.Fatalf("id %q reads back as %+v (ok %v), was built as %+v", b.id, got, ok, b.want)
		}
	}
}
