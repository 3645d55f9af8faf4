package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

// The settings of River's own `river bench` (cmd/river/riverbench in
// River's repository), kept so that its figures and ours measure one thing.
const (
	// insertBatch jobs go into each InsertMany call while the backlog is made.
	insertBatch = 5_000
	// maxWorkers is the default queue's worker count; River's authors found
	// about a thousand or two fastest, far above the client's default.
	maxWorkers = 2_000
	// fetchCooldown and fetchPollInterval are the client's fetch timings,
	// tuned by River's authors for throughput.
	fetchCooldown     = 2 * time.Millisecond
	fetchPollInterval = 20 * time.Millisecond
	// minEventBuffer is the least room in the subscription channel: an event
	// that does not fit is dropped, and a dropped event is a job never seen
	// done.
	minEventBuffer = 75_000
	// progressEvery is how often the available jobs are counted and shown;
	// River's bench runs the same count once a second throughout.
	progressEvery = time.Second
	// stopTimeout bounds the client's stop after the measurement.
	stopTimeout = 30 * time.Second
)

// noopArgs is a benchmark job; Num only makes each job's args its own.
type noopArgs struct {
	Num int `json:"num"`
}

// Kind names the job kind for River's worker registry.
func (noopArgs) Kind() string { return "paydedup_bench_noop" }

// noopWorker does nothing, so that what is timed is River's own work:
// fetch, run, complete.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

// Work returns at once.
func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// bench empties River's tables, inserts n jobs, starts a client and times it
// from the moment Start returns to the moment the n-th job's completion
// event is received, then prints the closing line: jobs worked, jobs
// inserted, jobs worked per second over that span, and the span.
func bench(ctx context.Context, pool *pgxpool.Pool, n int, logger *slog.Logger, stdout io.Writer) error {
	driver := riverpgxv5.New(pool)
	if err := resetTables(ctx, driver); err != nil {
		return err
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{})
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     fetchCooldown,
		FetchPollInterval: fetchPollInterval,
		Logger:            logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           workers,
	})
	if err != nil {
		return fmt.Errorf("new client: %w", err)
	}
	// The subscription, not the worker, says a job is done: its event comes
	// after the completer has recorded the job, which the worker's return
	// does not wait for.
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: max(n, minEventBuffer),
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobCancelled, river.EventKindJobFailed},
	})
	defer unsubscribe()

	if err := insertJobs(ctx, client, n); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "bench: inserted [ %10d ] jobs; starting the client\n", n)

	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("start client: %w", err)
	}
	start := time.Now()
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		if err := client.Stop(stopCtx); err != nil {
			logger.Error("stop client", "err", err)
		}
	}()

	var worked atomic.Int64
	progressCtx, stopProgress := context.WithCancel(ctx)
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		showProgress(progressCtx, driver, n, &worked, logger, stdout)
	}()
	defer func() { stopProgress(); <-progressDone }()

	var last time.Time
	for worked.Load() < int64(n) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted after %d of %d jobs: %w", worked.Load(), n, ctx.Err())
		case ev, ok := <-events:
			if !ok {
				return errors.New("River's event subscription closed before every job was worked")
			}
			if ev.Kind != river.EventKindJobCompleted {
				return fmt.Errorf("job %d: %s (state %s); a no-op job should only complete", ev.Job.ID, ev.Kind, ev.Job.State)
			}
			last = time.Now()
			worked.Add(1)
		}
	}
	stopProgress()
	<-progressDone

	span := last.Sub(start)
	fmt.Fprintf(stdout, "bench: total jobs worked [ %10d ], total jobs inserted [ %10d ], overall job/sec [ %10.1f ], running %s\n",
		worked.Load(), n, float64(worked.Load())/span.Seconds(), span)
	return nil
}

// resetTables truncates every table of River's main migration line and
// rewrites river_job with VACUUM FULL, so that each run starts from the same
// empty, compact table whatever the runs before it left.
func resetTables(ctx context.Context, driver riverdriver.Driver[pgx.Tx]) error {
	exec := driver.GetExecutor()
	if err := exec.TableTruncate(ctx, &riverdriver.TableTruncateParams{
		Table: driver.GetMigrationTruncateTables(riverdriver.MigrationLineMain, 0),
	}); err != nil {
		return fmt.Errorf("truncate River's tables: %w", err)
	}
	if err := exec.Exec(ctx, "VACUUM FULL river_job"); err != nil {
		return fmt.Errorf("vacuum river_job: %w", err)
	}
	return nil
}

// insertJobs makes the backlog of n jobs, insertBatch at a time through
// InsertMany (River's bench uses it, not InsertManyFast), before the client
// starts; none of this is timed.
func insertJobs(ctx context.Context, client *river.Client[pgx.Tx], n int) error {
	batch := make([]river.InsertManyParams, 0, insertBatch)
	for num := 1; num <= n; num++ {
		batch = append(batch, river.InsertManyParams{Args: noopArgs{Num: num}})
		if len(batch) == insertBatch || num == n {
			if _, err := client.InsertMany(ctx, batch); err != nil {
				return fmt.Errorf("insert jobs %d–%d: %w", num-len(batch)+1, num, err)
			}
			batch = batch[:0]
		}
	}
	return nil
}

// showProgress prints, every progressEvery until ctx ends, the jobs still
// available in the table and the jobs worked so far.
func showProgress(ctx context.Context, driver riverdriver.Driver[pgx.Tx], n int, worked *atomic.Int64, logger *slog.Logger, stdout io.Writer) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		available, err := driver.GetExecutor().JobCountByState(ctx, &riverdriver.JobCountByStateParams{State: rivertype.JobStateAvailable})
		if err != nil {
			if ctx.Err() == nil {
				logger.Error("count available jobs", "err", err)
			}
			continue
		}
		fmt.Fprintf(stdout, "bench: available [ %10d ], worked [ %10d ] of %d\n", available, worked.Load(), n)
	}
}
