package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/stream"
)

// build compiles ./cmd/paydedup into the work directory, unless -bin names
// a binary.
func (h *harness) build(ctx context.Context) error {
	if h.cfg.bin != "" {
		abs, err := filepath.Abs(h.cfg.bin)
		h.bin = abs
		return err
	}
	h.bin = filepath.Join(h.work, "paydedup")
	h.logf("building ./cmd/paydedup")
	return runOnce(ctx, "go build ./cmd/paydedup", filepath.Join(h.logs, "build.log"), os.Environ(),
		"go", "build", "-o", h.bin, "./cmd/paydedup")
}

// migrate creates the database and migrates it with the binary, as the
// owner; the workers connect as paydedup_worker, the role the migration
// creates, so the run also proves that role is enough.
func (h *harness) migrate(ctx context.Context) error {
	pool, err := pg.Connect(ctx, h.dbURL("postgres", "postgres"))
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE DATABASE paydedup`)
	pool.Close()
	if err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	return runOnce(ctx, "paydedup migrate up", filepath.Join(h.logs, "migrate.log"),
		[]string{"DATABASE_URL=" + h.dbURL("postgres", "paydedup")}, h.bin, "migrate", "up")
}

// connectNATS connects the harness (reconnecting forever, across the
// restarts) and creates the streams, the outcomes stream among them, as
// the workers will.
func (h *harness) connectNATS(ctx context.Context) error {
	nc, err := nats.Connect(h.natsURL(), nats.Name("paydedup-chaos"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true), nats.Timeout(2*time.Second))
	if err != nil {
		return err
	}
	h.nc = nc
	if h.js, err = jetstream.New(nc); err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, "the streams", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, _, err := stream.EnsureStreams(cctx, h.js, h.streamConfig().Stream); err != nil {
			return false
		}
		_, err := stream.EnsureOutcomeStream(cctx, h.js, h.streamConfig().Stream)
		return err == nil
	})
}

// publishAll publishes every message, spread evenly over spread, from a few
// goroutines. Each publish is retried until it is PubAcked: NATS may be
// down meanwhile. A retry keeps its Nats-Msg-Id, so one that did land is
// dropped by the duplicate window.
func (h *harness) publishAll(ctx context.Context, pubs []workload.Publish, spread time.Duration) error {
	ch := make(chan workload.Publish)
	var wg sync.WaitGroup
	var failures sync.Map
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range ch {
				if err := h.publishOne(ctx, p, true); err != nil {
					failures.Store(p.Header[workload.HeaderID], err)
				}
			}
		}()
	}
	start := time.Now()
	var err error
	for i, p := range pubs {
		at := start.Add(spread * time.Duration(i) / time.Duration(len(pubs)))
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			err = ctx.Err()
			break
		}
		ch <- p
	}
	close(ch)
	wg.Wait()
	failures.Range(func(k, v any) bool {
		err = errors.Join(err, fmt.Errorf("%v: %v", k, v))
		return true
	})
	return err
}

// publishOne publishes p until it is PubAcked; count adds it to the
// workload's publishes.
func (h *harness) publishOne(ctx context.Context, p workload.Publish, count bool) error {
	m := nats.NewMsg(p.Subject)
	for k, v := range p.Header {
		m.Header.Set(k, v)
	}
	m.Data = p.Body
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		ack, err := h.js.PublishMsg(pctx, m)
		cancel()
		if err == nil {
			h.witness.published(ack.Sequence, p)
			if count {
				h.published.Add(1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// settle waits for quiescence (the consumer idle and no pending rows), runs
// the reconciler in the meantime when rows stay pending, then replays the
// max_deliveries dead letters and waits again. It returns how many dead
// letters were replayed.
func (h *harness) settle(ctx context.Context) (int, error) {
	pool, err := pg.Connect(ctx, h.dbURL("postgres", "paydedup"))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	pendingRows := func(ctx context.Context) (int, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'pending'`).Scan(&n)
		return n, err
	}
	deadline := time.Now().Add(h.cfg.quiesce)
	replayed := 0
	for round := 0; ; round++ {
		if err := h.waitQuiet(ctx, pendingRows, deadline); err != nil {
			h.logf("%v", err)
			return replayed, nil // verified as it is: what is left is reported
		}
		dls, err := h.deadLetters(ctx)
		if err != nil {
			return replayed, err
		}
		n := 0
		for _, d := range dls {
			if d.Reason == stream.ReasonMaxDeliveries {
				n++
			}
		}
		h.logf("quiescent: %d dead letters, %d of them max_deliveries", len(dls), n)
		if n == 0 || round == 2 || h.cfg.replay == "none" {
			return replayed, nil
		}
		done, err := h.replay(ctx)
		if err != nil {
			return replayed, err
		}
		h.logf("replayed %d max_deliveries dead letters", done)
		replayed += done
	}
}

// waitQuiet polls until the consumer is idle and no row is pending, three
// polls in a row. Rows that stay pending while the consumer is idle (their
// message was dead-lettered, e.g. max_deliveries after an unknown outcome)
// are resolved by `paydedup reconcile --once` with a short grace (the
// workers' in-process reconciler would get there too, after its default
// grace of a minute).
func (h *harness) waitQuiet(ctx context.Context, pendingRows func(context.Context) (int, error), deadline time.Time) error {
	calm, idlePending := 0, 0
	var lastReconcile time.Time
	for calm < 3 {
		if time.Now().After(deadline) {
			return fmt.Errorf("not quiescent before the deadline (consumer idle %d polls, rows pending %d polls)", calm, idlePending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		idle := false
		if c, err := h.js.Consumer(qctx, stream.DefaultStream, stream.DefaultDurable); err == nil {
			if info, err := c.Info(qctx); err == nil {
				idle = info.NumPending == 0 && info.NumAckPending == 0
			}
		}
		pending, err := pendingRows(qctx)
		if err != nil {
			pending = -1
		}
		cancel()
		switch {
		case idle && pending == 0:
			calm++
		case idle && pending > 0:
			calm, idlePending = 0, idlePending+1
			if idlePending >= 3 && time.Since(lastReconcile) > 2*time.Second {
				lastReconcile = time.Now()
				h.logf("consumer idle with %d pending rows: paydedup reconcile --once", pending)
				if err := runOnce(ctx, "paydedup reconcile", filepath.Join(h.logs, "reconcile.log"), h.workerEnv(),
					h.bin, "reconcile", "--once", "--grace", "1s", "--search-lag", "1s"); err != nil {
					h.logf("%v", err)
				}
			}
		default:
			calm, idlePending = 0, 0
		}
	}
	return nil
}

// replay files the max_deliveries dead letters back to their subjects,
// with `paydedup dlq replay` when the binary has it, else by itself.
func (h *harness) replay(ctx context.Context) (int, error) {
	before, err := h.countReason(ctx, stream.ReasonMaxDeliveries)
	if err != nil {
		return 0, err
	}
	if h.cfg.replay == "cli" || (h.cfg.replay == "auto" && h.hasDLQReplay(ctx)) {
		err := runOnce(ctx, "paydedup dlq replay", filepath.Join(h.logs, "dlq-replay.log"), h.workerEnv(),
			h.bin, "dlq", "replay", "--all", "--reason", stream.ReasonMaxDeliveries)
		if err != nil {
			h.logf("%v", err)
		}
	} else if err := h.replaySelf(ctx); err != nil {
		return 0, err
	}
	after, err := h.countReason(ctx, stream.ReasonMaxDeliveries)
	return before - after, err
}

func (h *harness) hasDLQReplay(ctx context.Context) bool {
	return runOnce(ctx, "paydedup dlq replay --help", filepath.Join(h.logs, "probe.log"), nil,
		h.bin, "dlq", "replay", "--help") == nil
}

// replaySelf is the harness's own replay, for a binary without dlq replay: the body and headers (minus Dlq-* and
// Nats-*) republished to Dlq-Orig-Subject with a new Nats-Msg-Id, and the
// dead letter deleted only after the PubAck.
func (h *harness) replaySelf(ctx context.Context) error {
	s, err := h.js.Stream(ctx, stream.DefaultDLQStream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		p, err := stream.ParseDeadLetter(raw.Header)
		if err != nil || p.Reason != stream.ReasonMaxDeliveries {
			continue
		}
		if !strings.HasPrefix(p.OrigSubject, stream.DefaultSubjectPrefix+".") {
			h.logf("dead letter %d: original subject %q is not a payments subject; not replayed", seq, p.OrigSubject)
			continue
		}
		hdr := map[string]string{}
		for k, vs := range raw.Header {
			if len(vs) > 0 && !strings.HasPrefix(k, "Dlq-") && !strings.HasPrefix(k, "Nats-") {
				hdr[k] = vs[0]
			}
		}
		hdr[workload.HeaderMsgID] = fmt.Sprintf("replay:%d:%d", seq, time.Now().UnixNano())
		if err := h.publishOne(ctx, workload.Publish{Subject: p.OrigSubject, Header: hdr, Body: raw.Data}, false); err != nil {
			return err
		}
		if err := s.DeleteMsg(ctx, seq); err != nil {
			return fmt.Errorf("delete dead letter %d: %w", seq, err)
		}
	}
	return nil
}

func (h *harness) countReason(ctx context.Context, reason string) (int, error) {
	dls, err := h.deadLetters(ctx)
	n := 0
	for _, d := range dls {
		if d.Reason == reason {
			n++
		}
	}
	return n, err
}

// deadLetters reads every dead letter back.
func (h *harness) deadLetters(ctx context.Context) ([]workload.DeadLetter, error) {
	s, err := h.js.Stream(ctx, stream.DefaultDLQStream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []workload.DeadLetter
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read dead letter %d: %w", seq, err)
		}
		d := workload.DeadLetter{Seq: seq, ChaosID: raw.Header.Get(workload.HeaderID)}
		p, err := stream.ParseDeadLetter(raw.Header)
		if err != nil {
			d.Reason = "unparseable: " + err.Error()
		} else {
			d.Reason = p.Reason
			if merchant, ok := strings.CutPrefix(p.OrigSubject, stream.DefaultSubjectPrefix+"."); ok {
				d.Key = merchant + ":" + raw.Header.Get(workload.HeaderKey)
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// collect reads the database and the provider's ledger.
func (h *harness) collect(ctx context.Context) (workload.Evidence, error) {
	ev := workload.Evidence{Rows: map[string]workload.Row{}}
	pool, err := pg.Connect(ctx, h.dbURL("postgres", "paydedup"))
	if err != nil {
		return ev, err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT k.merchant_id, k.idempotency_key, k.status, k.amount,
			coalesce(p.status, ''), coalesce(p.charge_id, '')
		FROM idempotency_keys k LEFT JOIN payments p USING (merchant_id, idempotency_key)`)
	if err != nil {
		return ev, fmt.Errorf("read rows: %w", err)
	}
	for rows.Next() {
		var merchant, key string
		var r workload.Row
		if err := rows.Scan(&merchant, &key, &r.Status, &r.Amount, &r.PaymentStatus, &r.ChargeID); err != nil {
			rows.Close()
			return ev, err
		}
		ev.Rows[merchant+":"+key] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return ev, err
	}
	if ev.DeadLetters, err = h.deadLetters(ctx); err != nil {
		return ev, err
	}
	ledger, err := h.ledger(ctx)
	if err != nil {
		return ev, err
	}
	ev.ChargesByKey = ledger.ChargesByKey
	for _, c := range ledger.Charges {
		ev.Charges = append(ev.Charges, workload.Charge{Key: c.MerchantID + ":" + c.IdempotencyKey, Amount: c.Amount})
	}
	return ev, nil
}

// report prints the violations and the summary line, and returns the exit
// status.
func (h *harness) report(v workload.Verdict) int {
	list := func(what string, items []string) {
		for i, it := range items {
			if i == 50 {
				fmt.Fprintf(h.out, "chaos: VIOLATION %s: … and %d more\n", what, len(items)-50)
				break
			}
			fmt.Fprintf(h.out, "chaos: VIOLATION %s: %s\n", what, it)
		}
	}
	list("double", v.Double)
	list("lost", v.Lost)
	list("stuck", v.Stuck)
	list("inconsistent", v.Inconsistent)
	restarts := 0
	for _, s := range h.slots {
		restarts += s.restarts
	}
	promisesOK := h.reportGateway()
	outcomesOK := h.reportOutcomes()
	if !v.OK() || !promisesOK || !outcomesOK {
		fmt.Fprintf(h.out, "chaos: FAILED; repeat with -seed %d -keep to keep the logs\n", h.cfg.seed)
	}
	fmt.Fprintf(h.out, "chaos: %s\n", h.load.providerLine())
	fmt.Fprintf(h.out, "chaos: worker processes started %d times in all (kills and failed starts while a service was down)\n", restarts+len(h.slots))
	fmt.Fprintf(h.out, "chaos: payments=%d publishes=%d double=%d lost=%d stuck=%d dead_letters=%d (malformed=%d key_reused=%d max_deliveries=%d) kills=%d nats_restarts=%d pg_restarts=%d%s seconds=%s\n",
		h.cfg.payments, h.published.Load(), len(v.Double), len(v.Lost), len(v.Stuck), v.DeadLetters,
		v.Malformed, v.KeyReused, v.MaxDeliveries, h.kills.Load(), h.natsRestarts.Load(), h.pgRestarts.Load(), h.modeSummary(),
		strconv.Itoa(int(time.Since(h.start).Seconds())))
	if !v.OK() || !promisesOK || !outcomesOK {
		return 1
	}
	return 0
}
