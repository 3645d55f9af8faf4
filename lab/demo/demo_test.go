package demo

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/testenv"
)

// With no DATABASE_URL and no local server, the demo gets its database on
// a private cluster, which closing removes.
func TestDemoWithoutLocalPostgresStartsAPrivateCluster(t *testing.T) {
	t.Parallel()
	if _, err := localpg.FindBin(); err != nil && !testenv.InCI() {
		t.Skip(err)
	}
	var errOut testenv.Buffer
	d := &demoCmd{Config: Config{ErrOut: &errOut, AdminURL: "postgres://postgres@127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "/postgres?sslmode=disable&connect_timeout=2"}}
	ctx := context.Background()
	u, closeDB, err := d.database(ctx)
	if err != nil {
		t.Fatal(err)
	}
	said := errOut.String()
	if !strings.Contains(said, "private PostgreSQL cluster in ") {
		closeDB()
		t.Fatalf("the demo does not say where its database is:\n%s", said)
	}
	dir := strings.Fields(said[strings.Index(said, "cluster in ")+len("cluster in "):])[0]
	pool, err := pg.Connect(ctx, u)
	if err == nil {
		err = pool.Ping(ctx)
		pool.Close()
	}
	closeDB()
	if err != nil {
		t.Fatalf("database %s: %v", u, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory %s is still there after close (%v)", dir, err)
	}
}

// TestDemoRunsTheLifecycle runs the demo, reduced, on the test's own
// schema and streams: besides its charges it runs the lifecycle's flows
// (authorize, captures full and partial, partial refunds, a cancel, a
// refund of a charge, a refund refused for more than was captured), and
// its report proves them against the provider's ledger and the audit.
func TestDemoRunsTheLifecycle(t *testing.T) {
	t.Parallel()
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	streams := testenv.Streams(t, js)
	streams.OutcomeStream, streams.OutcomePrefix = streams.Name+"_OUTCOMES", strings.TrimSuffix(streams.SubjectPrefix, ".req")+".outcomes"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, streams.OutcomeStream)
	})
	var out, errOut testenv.Buffer
	err = Run(context.Background(), Config{
		DatabaseURL: testenv.PostgresURL(t), NATSURL: testenv.NATSURL(t), Streams: streams,
		Payments: 120, Workers: 2, Seed: 7, Duplicates: 0.4, Declines: 0.05, Timeout: 2 * time.Minute,
		DLQKey: []byte(testenv.DLQKey), Out: &out, ErrOut: &errOut, Logger: slog.New(slog.DiscardHandler),
	})
	report := out.String()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s\n%s", err, report, errOut.String())
	}
	for _, want := range []string{
		"lifecycle: 4 flows (",
		"8 operations published after what they act on settled, 16 duplicates of them",
		"authorize 1 canceled, 2 succeeded; capture 2 succeeded; cancel 1 succeeded; refund 1 refused over_refundable, 4 succeeded",
		"lifecycle checked against the provider's ledger: 0 refunds made twice, 0 payments refunded past what was captured, 0 operations not as planned or disagreeing with the provider; " +
			"audit of 4 provider refunds against 4 ledger refunds: 0 double_refund, 0 unrecorded_refund, 0 missing_refund, 0 refund_mismatch",
		"over_refundable 2",
		"120 intents, 120 ledger rows: no drift",
		" 1 canceled, 0 double charges, 0 lost, 0 double refunds,",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report does not say %q:\n%s", want, report)
		}
	}
}
