package intake_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/outbox"
)

// BenchmarkEnqueue is a publisher's cost per command: one transaction
// holding one Enqueue, committed.
func BenchmarkEnqueue(b *testing.B) {
	w := setup(b)
	i := 0
	for b.Loop() {
		i++
		if err := pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
			return intake.Enqueue(w.ctx, tx, command(fmt.Sprintf("e%07d", i), 500))
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelayBacklog: 20,000 committed commands wait; one relay (the
// worker's defaults: batches of 256) publishes them all. It reports the
// time until the last is relayed, the throughput and the cost per
// command. Run with -benchtime=1x.
func BenchmarkRelayBacklog(b *testing.B) {
	const n = 20_000
	for range b.N {
		b.StopTimer()
		w := setup(b)
		w.fill(n)
		r, err := outbox.New(outbox.Config{}, w.source(w.pub))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		for w.backlog().Waiting > 0 {
			if _, err := r.RunOnce(w.ctx); err != nil {
				b.Fatal(err)
			}
		}
		d := time.Since(start)
		b.StopTimer()
		if got := len(w.stored()); got != n {
			b.Fatalf("the stream holds %d commands, want %d", got, n)
		}
		b.ReportMetric(d.Seconds(), "s-to-relay-20k")
		b.ReportMetric(n/d.Seconds(), "cmds/s")
		b.ReportMetric(float64(d.Microseconds())/n, "µs/cmd")
	}
}

// BenchmarkRelayLagAtRate: publishers commit up to 2,000 commands a
// second (20 per transaction every 10 ms; the rate they reached is
// reported) while a relay runs with the worker's defaults (a 1 s wait when
// it finds fewer than a batch); it reports each command's lag from its
// insert to its mark (relayed_at - created_at).
// Run with -benchtime=1x.
func BenchmarkRelayLagAtRate(b *testing.B) {
	const (
		perTx = 20
		every = 10 * time.Millisecond
		total = 20_000
	)
	for range b.N {
		b.StopTimer()
		w := setup(b)
		r, err := outbox.New(outbox.Config{}, w.source(w.pub))
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Start(w.ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		tick := time.NewTicker(every)
		for i := 0; i < total; i += perTx {
			<-tick.C
			if err := pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
				for j := range perTx {
					if err := intake.Enqueue(w.ctx, tx, command(fmt.Sprintf("r%07d", i+j), 500)); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		tick.Stop()
		rate := total / time.Since(start).Seconds()
		for w.backlog().Waiting > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		b.StopTimer()
		r.Stop()
		var p50, p99, maxLag float64
		if err := w.pool.QueryRow(w.ctx, `SELECT
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM relayed_at - created_at)),
			percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM relayed_at - created_at)),
			max(extract(epoch FROM relayed_at - created_at))
			FROM intake_commands`).Scan(&p50, &p99, &maxLag); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(rate, "committed-cmds/s")
		b.ReportMetric(p50*1000, "p50-lag-ms")
		b.ReportMetric(p99*1000, "p99-lag-ms")
		b.ReportMetric(maxLag*1000, "max-lag-ms")
	}
}

// fill commits n valid commands at once, as publishers would have.
func (w *world) fill(n int) {
	w.t.Helper()
	if _, err := w.pool.Exec(w.ctx, `INSERT INTO intake_commands (merchant_id, idempotency_key, body)
		SELECT 'm_1', 'b' || i, format('{"merchant_id":"m_1","idempotency_key":"b%s","amount":500,"currency":"usd","payment_method":"pm_card_visa"}', i)
		FROM generate_series(1, $1) AS i`, n); err != nil {
		w.t.Fatal(err)
	}
}
