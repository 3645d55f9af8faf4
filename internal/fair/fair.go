// Package fair is the line of callers waiting for a shared resource (a
// provider call slot, a token of the provider budget), fair between
// merchants: one FIFO per merchant, the merchants served round robin, one
// waiter per turn (deficit round robin with a quantum of one: every waiter
// costs one call). A merchant with ten thousand payments waiting takes one
// grant in every round, as a merchant with one; neither waits behind the
// other's line.
package fair

// Queue is the line of waiters, each a channel its owner closes to grant
// it, round robin by merchant, FIFO within one. Push, Pop and Len are O(1); removing a waiter whose context ended
// scans its merchant's line only. The zero value is an empty queue. Not
// safe for concurrent use: its owner holds a mutex.
type Queue struct {
	byMerchant map[string]*merchantLine
	turns      ring[*merchantLine] // merchants with waiters, in turn order
	n          int                 // waiters in all lines
	spare      *merchantLine       // the last line emptied, reused with its room
}

// merchantLine is one merchant's waiters, oldest first.
type merchantLine struct {
	merchant string
	waiters  ring[chan struct{}]
}

// Push adds a waiter at the end of merchant's line; a merchant that had
// none takes its turn after every merchant waiting now.
func (q *Queue) Push(merchant string, w chan struct{}) {
	if q.byMerchant == nil {
		q.byMerchant = make(map[string]*merchantLine)
	}
	line := q.byMerchant[merchant]
	if line == nil {
		if line = q.spare; line != nil {
			q.spare, line.merchant = nil, merchant
		} else {
			line = &merchantLine{merchant: merchant}
		}
		q.byMerchant[merchant] = line
		q.turns.push(line)
	}
	line.waiters.push(w)
	q.n++
}

// Pop removes and returns the first waiter of the merchant whose turn it
// is, and moves that merchant to the end of the turns. ok is false when
// nobody waits.
func (q *Queue) Pop() (w chan struct{}, ok bool) {
	for q.turns.len() > 0 {
		line := q.turns.pop()
		if line.waiters.len() == 0 {
			// Emptied by remove: its turn lapses.
			delete(q.byMerchant, line.merchant)
			continue
		}
		w = line.waiters.pop()
		q.n--
		if line.waiters.len() > 0 {
			q.turns.push(line)
		} else {
			delete(q.byMerchant, line.merchant)
			q.spare = line
		}
		return w, true
	}
	return nil, false
}

// Remove takes w out of merchant's line; false if it is not there (it
// was granted).
func (q *Queue) Remove(merchant string, w chan struct{}) bool {
	line := q.byMerchant[merchant]
	if line == nil || !line.waiters.remove(w) {
		return false
	}
	q.n--
	return true
}

// Len is the number of waiters.
func (q *Queue) Len() int { return q.n }

// Merchants is the number of merchants with waiters.
func (q *Queue) Merchants() int {
	n := 0
	for _, line := range q.byMerchant {
		if line.waiters.len() > 0 {
			n++
		}
	}
	return n
}

// ring is a FIFO on a slice that reuses its room: push and pop are O(1)
// amortised.
type ring[T comparable] struct {
	buf        []T
	head, size int
}

func (r *ring[T]) len() int { return r.size }

func (r *ring[T]) push(v T) {
	if r.size == len(r.buf) {
		grown := make([]T, max(8, 2*len(r.buf)))
		for i := range r.size {
			grown[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = grown, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = v
	r.size++
}

func (r *ring[T]) pop() T {
	var zero T
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return v
}

// remove deletes the first element equal to v, keeping the order of the
// others; false if there is none.
func (r *ring[T]) remove(v T) bool {
	for i := range r.size {
		if r.buf[(r.head+i)%len(r.buf)] != v {
			continue
		}
		for j := i; j < r.size-1; j++ {
			r.buf[(r.head+j)%len(r.buf)] = r.buf[(r.head+j+1)%len(r.buf)]
		}
		var zero T
		r.buf[(r.head+r.size-1)%len(r.buf)] = zero
		r.size--
		return true
	}
	return false
}
