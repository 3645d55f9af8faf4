package consumer

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/paydedup/paydedup/ledger"
)

// committer group-commits completions: concurrent Complete calls within
// CommitWait of each other (or until CommitBatch of them) share one
// transaction. The first caller of a batch leads it: it waits, flushes with
// the store's CompleteBatch, and hands every caller its own result. No
// message is acked before the commit that covers it, because each caller
// returns only after its batch is flushed.
type committer struct {
	store    Store
	maxBatch int
	maxWait  time.Duration
	observer Observer // never nil: NopObserver until NewWorker sets one
	// tracer makes the span of each commit: a child of the leader's
	// message span, linked to the other messages' spans, which link back
	// to it. A no-op tracer until Worker.SetTracer, which sets tracing:
	// without it the messages' spans are not collected for the links.
	tracer  trace.Tracer
	tracing bool
	// rows recycles the batches' item and span slices: a batch's were
	// made for maxBatch items, a 35 KB allocation per commit at the
	// default size, whatever the batch's own.
	rows sync.Pool

	mu  sync.Mutex
	cur *commitBatch
}

type commitBatch struct {
	*commitRows
	span trace.Span    // the commit's, set by the leader before done
	full chan struct{} // closed when the batch reaches maxBatch
	done chan struct{} // closed when the flush is over
	errs []error
	err  error
}

// commitRows is what a batch's leader flushes; the committer recycles it
// once the flush is over (the callers then read only errs and err).
type commitRows struct {
	items []ledger.CompleteItem
	spans []trace.Span // each item's message span, for the links (tracing only)
}

func newCommitter(store Store, maxBatch int, maxWait time.Duration) *committer {
	return &committer{store: store, maxBatch: max(maxBatch, 1), maxWait: maxWait, observer: NopObserver{},
		tracer: noop.NewTracerProvider().Tracer("")}
}

// Complete records one completion by deadline and returns its own result:
// nil, ledger.ErrLeaseLost, ledger.ErrLedgerConflict, or the flush's error.
// The flush runs on the leader's ctx without its cancellation (a commit
// must happen even when a drain cancelled the work) and with the leader's
// deadline; the others wait for that flush, so only the leader makes a
// context of its own.
func (c *committer) Complete(ctx context.Context, deadline time.Time, l ledger.Lease, comp ledger.Completion) error {
	if c.maxBatch == 1 {
		ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		defer cancel()
		ctx, span := c.tracer.Start(ctx, "paydedup.commit", trace.WithAttributes(attribute.Int("paydedup.commit.size", 1)))
		start := time.Now()
		err := c.store.Complete(ctx, l, comp)
		c.observer.Committed(time.Since(start), 1)
		endSpan(span, err)
		return err
	}
	c.mu.Lock()
	b, leader := c.cur, false
	if b == nil {
		rows, _ := c.rows.Get().(*commitRows)
		if rows == nil {
			rows = &commitRows{items: make([]ledger.CompleteItem, 0, c.maxBatch)}
		}
		b = &commitBatch{commitRows: rows, full: make(chan struct{}), done: make(chan struct{})}
		c.cur, leader = b, true
	}
	idx := len(b.items)
	b.items = append(b.items, ledger.CompleteItem{Lease: l, Completion: comp})
	if c.tracing {
		b.spans = append(b.spans, trace.SpanFromContext(ctx))
	}
	if len(b.items) >= c.maxBatch {
		c.cur = nil
		close(b.full)
	}
	c.mu.Unlock()

	if leader {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), deadline)
		defer cancel()
		if c.maxWait > 0 {
			t := time.NewTimer(c.maxWait)
			select {
			case <-b.full:
			case <-t.C:
			}
			t.Stop()
		}
		c.mu.Lock()
		if c.cur == b {
			c.cur = nil
		}
		c.mu.Unlock()
		var links []trace.Link
		if len(b.spans) > 1 {
			links = make([]trace.Link, 0, len(b.spans)-1)
			for _, s := range b.spans[1:] {
				links = append(links, trace.Link{SpanContext: s.SpanContext()})
			}
		}
		var span trace.Span
		ctx, span = c.tracer.Start(ctx, "paydedup.commit", trace.WithLinks(links...),
			trace.WithAttributes(attribute.Int("paydedup.commit.size", len(b.items))))
		start := time.Now()
		b.errs, b.err = c.store.CompleteBatch(ctx, b.items)
		c.observer.Committed(time.Since(start), len(b.items))
		endSpan(span, b.err)
		b.span = span
		c.recycle(b.commitRows)
		b.commitRows = nil
		close(b.done)
	}
	<-b.done
	if !leader && b.span.SpanContext().IsValid() {
		trace.SpanFromContext(ctx).AddLink(trace.Link{SpanContext: b.span.SpanContext()})
	}
	if b.err != nil {
		return b.err
	}
	return b.errs[idx]
}

// recycle clears rows (so they hold no payment or span) and keeps them for
// the next batch.
func (c *committer) recycle(rows *commitRows) {
	clear(rows.items)
	clear(rows.spans)
	rows.items, rows.spans = rows.items[:0], rows.spans[:0]
	c.rows.Put(rows)
}

// endSpan ends a commit's span, marked failed when err is not nil.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
