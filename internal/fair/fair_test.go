package fair_test

import (
	"testing"

	"github.com/paydedup/paydedup/internal/fair"
)

// TestQueueRemove: removing waiters keeps each merchant's order and
// the turns; a merchant whose line emptied loses its turn.
func TestQueueRemove(t *testing.T) {
	t.Parallel()
	var q fair.Queue
	ch := make([]chan struct{}, 6)
	for i := range ch {
		ch[i] = make(chan struct{})
	}
	q.Push("a", ch[0])
	q.Push("a", ch[1])
	q.Push("b", ch[2])
	q.Push("a", ch[3])
	q.Push("c", ch[4])
	q.Push("b", ch[5])
	if !q.Remove("a", ch[1]) || q.Remove("a", ch[1]) || q.Remove("x", ch[0]) || !q.Remove("c", ch[4]) {
		t.Fatal("remove")
	}
	var got []chan struct{}
	for {
		w, ok := q.Pop()
		if !ok {
			break
		}
		got = append(got, w)
	}
	want := []chan struct{}{ch[0], ch[2], ch[3], ch[5]}
	if len(got) != len(want) || q.Len() != 0 || q.Merchants() != 0 {
		t.Fatalf("popped %d, want %d; %d left", len(got), len(want), q.Len())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pop %d: wrong waiter", i)
		}
	}
}
