package dedup_test

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/migrations/migrate"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/budget"
	budgetstore "github.com/paydedup/paydedup/budget/pgstore"
	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	stripeadapter "github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/reconciler"
	"github.com/paydedup/paydedup/stream"
)

// The worker role migration 00002 creates.
const workerRole = "paydedup_worker"

// asWorker returns a pool on the schema of ownerURL, logged in as the
// worker role (the local Postgres trusts loopback, so no password).
func asWorker(t *testing.T, ownerURL string) *pgxpool.Pool {
	t.Helper()
	return testenv.AsRole(t, ownerURL, workerRole)
}

// TestWorkerRoleRunsTheWorker runs the business step (claim → provider →
// complete, the failure paths, and a reconciler pass) on a pool logged in as
// paydedup_worker, then shows that the role can do nothing else.
func TestWorkerRoleRunsTheWorker(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	pool := asWorker(t, ownerURL)
	ctx := context.Background()
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := stripesim.New(stripesim.Config{Seed: 3})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	stripe, err := stripeadapter.New(stripeadapter.Config{SecretKey: "sk_test_role", APIBase: srv.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumer.Config{
		Holder: "role-test", Lease: 5 * time.Second, Stream: stream.Config{AckWait: 10 * time.Second},
		ProviderTry: provider.RetryPolicy{MaxTries: 1, AttemptTimeout: time.Second},
	}
	if err := cfg.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	proc := consumer.NewProcessor(store, stripe, cfg, nil)
	// refusing's provider is a port nobody listens on: a refused
	// connection, provably not charged.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	refusedStripe, err := stripeadapter.New(stripeadapter.Config{SecretKey: "sk_test_role", APIBase: "http://" + closed, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	refusing := consumer.NewProcessor(store, refusedStripe, cfg, nil)
	cmd := func(key, method string) *payment.Command {
		return &payment.Command{MerchantID: "m_role", IdempotencyKey: key, Amount: 1200, Currency: "eur", PaymentMethod: method}
	}
	processWith := func(proc *consumer.Processor, c *payment.Command, want consumer.Kind) {
		t.Helper()
		claims, err := proc.Claim(ctx, []*payment.Command{c})
		if err != nil {
			t.Fatalf("%s: claim: %v", c.IdempotencyKey, err)
		}
		if res := proc.Handle(ctx, c, claims[0], nil); res.Kind != want {
			t.Fatalf("%s: %s (%v), want %s", c.IdempotencyKey, res.Kind, res.Err, want)
		}
	}
	process := func(c *payment.Command, want consumer.Kind) {
		t.Helper()
		processWith(proc, c, want)
	}

	owner, err := pg.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()

	// Claim → charge → complete, then the duplicate, then a decline.
	process(cmd("charged", "pm_card_visa"), consumer.Completed)
	process(cmd("charged", "pm_card_visa"), consumer.Duplicate)
	process(cmd("declined", "pm_card_chargeDeclined"), consumer.Declined)

	// Known not charged (a refused connection): the row becomes failed,
	// then re-acquired.
	processWith(refusing, cmd("refused", "pm_card_visa"), consumer.Retry)
	if rec, err := store.Get(ctx, "m_role", "refused"); err != nil || rec.Status != ledger.StatusFailed {
		t.Fatalf("refused: %+v %v, want failed", rec, err)
	}
	process(cmd("refused", "pm_card_visa"), consumer.Completed)

	// Rate limited (429): the call waits under its lease, heartbeating as
	// this role, and completes once the provider answers.
	must(t, sim.SetFaults(stripesim.Faults{Rate429: 1}))
	time.AfterFunc(1500*time.Millisecond, func() { must(t, sim.SetFaults(stripesim.Faults{})) })
	process(cmd("limited", "pm_card_visa"), consumer.Completed)

	// The fleet's provider budget, as this role.
	bs, err := budgetstore.New(pool, budgetstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := bs.Take(ctx, budget.Take{Name: "default", Want: 5, Ceiling: 50, Increase: 1, Burst: 0.25}); err != nil || g.Tokens < 1 {
		t.Fatalf("take the provider budget as %s: %+v %v", workerRole, g, err)
	}
	if _, _, err := bs.Slow(ctx, budget.Slow{Name: "default", Lower: true, Factor: 0.7, Interval: time.Second, Floor: 1, RetryAfter: time.Second}); err != nil {
		t.Fatalf("slow the provider budget as %s: %v", workerRole, err)
	}

	// Unknown outcome (500): the row is released pending; the reconciler,
	// on the same role, resolves it by lookup and purges nothing yet.
	must(t, sim.SetFaults(stripesim.Faults{Rate5xx: 1}))
	process(cmd("unknown", "pm_card_visa"), consumer.Retry)
	must(t, sim.SetFaults(stripesim.Faults{}))
	rec, err := reconciler.New(store, stripe, reconciler.Config{Grace: time.Millisecond, SearchLag: time.Millisecond, Holder: "role-reconciler"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := rec.RunOnce(ctx)
		if err != nil {
			t.Fatalf("reconciler as %s: %v", workerRole, err)
		}
		if res.Failed == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reconciler never resolved the pending row: %+v", res)
		}
		time.Sleep(10 * time.Millisecond)
	}
	process(cmd("unknown", "pm_card_visa"), consumer.Completed)
	if n, err := store.Purge(ctx, 10); err != nil || n != 0 {
		t.Fatalf("purge as %s: %d %v", workerRole, n, err)
	}
	// The outbox: the completions above wrote their events as this role,
	// and its relay takes, marks and purges them.
	if b, err := store.OutcomeBacklog(ctx); err != nil || b.Unrelayed == 0 {
		t.Fatalf("outcome backlog as %s: %+v %v, want the completions' events", workerRole, b, err)
	}
	if n, err := store.RelayOutcomes(ctx, 100, func(_ context.Context, evs []ledger.OutcomeEvent) ([]bool, error) {
		done := make([]bool, len(evs))
		for i := range done {
			done[i] = true
		}
		return done, nil
	}); err != nil || n == 0 {
		t.Fatalf("relay outcomes as %s: %d %v", workerRole, n, err)
	}
	if _, err := store.PurgeOutcomes(ctx, time.Hour, 10); err != nil {
		t.Fatalf("purge outcome events as %s: %v", workerRole, err)
	}
	// The role writes no event itself: the ledger's triggers do, as the
	// owner, so a missing grant cannot fail a completion; a refusal's
	// event only through record_refusal, which writes nothing else.
	testenv.Denied(t, pool, `INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, occurred_at)
		VALUES ('m:k:charged', 'm', 'k', 1, 'charged', 'succeeded', 1, 'usd', now())`)
	testenv.Denied(t, pool, `INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, reason, occurred_at)
		VALUES ('m:k:refused:1', 'm', 'k', 0, 'refused', 'refused', 1, 'usd', 'invalid_amount', now())`)
	if wrote, err := store.RecordRefusal(ctx, ledger.Refusal{MerchantID: "m_role", IdempotencyKey: "refused", StreamSeq: 1,
		Reason: "invalid_amount", FiledAt: time.Now()}); err != nil || !wrote {
		t.Fatalf("record refusal as %s: %v %v", workerRole, wrote, err)
	}
	// A command filed for an operator, through record_waiting (00029).
	if wrote, err := store.RecordRefusal(ctx, ledger.Refusal{MerchantID: "m_role", IdempotencyKey: "waiting", StreamSeq: 1,
		Reason: "max_deliveries", FiledAt: time.Now(), Waiting: true}); err != nil || !wrote {
		t.Fatalf("record waiting as %s: %v %v", workerRole, wrote, err)
	}

	// Keys the gateway took in: the group commit notifies them itself and
	// a single Complete through the trigger, both reading gateway_intake.
	for _, key := range []string{"gw-batch", "gw-single"} {
		if _, err := owner.Exec(ctx, `INSERT INTO gateway_intake (merchant_id, idempotency_key, request_hash, amount, currency,
				attempt, locked_until, created_at, expires_at)
			VALUES ('m_role', $1, $2, 1200, 'eur', 1, now(), now(), now() + interval '1 hour')`,
			key, ledger.Fingerprint(cmd(key, "pm_card_visa"))); err != nil {
			t.Fatal(err)
		}
	}
	process(cmd("gw-batch", "pm_card_visa"), consumer.Completed)
	cl, err := store.Claim(ctx, "role-test", time.Minute, ledger.NewClaimRequest(cmd("gw-single", "pm_card_visa")))
	if err != nil || cl.Lease == nil {
		t.Fatalf("claim as %s: %+v %v", workerRole, cl, err)
	}
	if err := store.Complete(ctx, *cl.Lease, ledger.Completion{ChargeID: "ch_single", ResponseStatus: 200, Response: []byte(`{}`)}); err != nil {
		t.Fatalf("complete as %s: %v", workerRole, err)
	}

	var ledgerRows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&ledgerRows); err != nil || ledgerRows != 7 {
		t.Fatalf("%d ledger rows (%v), want 7", ledgerRows, err)
	}
	if got := len(sim.Charges()); got != 5 {
		t.Fatalf("%d charges at the provider, want 5", got)
	}

	// A processing payment: the one ledger change the role may make is
	// settling it, once, through settle_payment (migration 00011); it may
	// not update the ledger itself.
	process(cmd("ach", "pm_usBankAccount_success"), consumer.Completed)
	ach, err := store.GetPayment(ctx, "m_role", "ach")
	if err != nil || ach.Status != ledger.PaymentProcessing {
		t.Fatalf("processing payment as %s: %+v %v", workerRole, ach, err)
	}
	if err := store.SettlePayment(ctx, ach, ledger.PaymentSucceeded, 200, []byte(`{"id":"settled"}`)); err != nil {
		t.Fatalf("settle as %s: %v", workerRole, err)
	}
	if err := store.SettlePayment(ctx, ach, ledger.PaymentFailed, 402, []byte(`{}`)); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("settling twice as %s: %v, want ErrNotFound", workerRole, err)
	}

	// No DDL, no grants, nothing outside its tables, and the ledger is
	// append-only but for settling.
	if _, err := owner.Exec(ctx, `CREATE TABLE not_for_workers (secret text)`); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`UPDATE payments SET amount = amount + 1`,
		`UPDATE payments SET status = 'failed', settled_at = now() WHERE status = 'succeeded'`,
		`UPDATE payments SET status = 'processing' WHERE idempotency_key = 'ach'`,
		`UPDATE payments SET settled_at = now() WHERE status = 'declined'`,
		`SELECT * FROM payments FOR UPDATE`,
		`UPDATE payments SET status = 'declined', charge_id = NULL WHERE status = 'succeeded'`,
		`UPDATE payments SET charge_id = NULL`,
		`DELETE FROM payments`,
		`SELECT * FROM api_keys`,
		`INSERT INTO api_keys (id, merchant_id, key_hash, created_at) VALUES ('0123456789ab', 'm_role', sha256('k'), now())`,
		`UPDATE gateway_intake SET locked_until = now()`,
		`DELETE FROM gateway_intake`,
		`INSERT INTO gateway_intake (merchant_id, idempotency_key, request_hash, amount, currency, locked_until, created_at, expires_at)
			VALUES ('m_role', 'x', sha256('x'), 1, 'eur', now(), now(), now())`,
		`SELECT * FROM http_idempotency`,
		`DELETE FROM http_idempotency`,
		`CREATE TABLE evil (i int)`,
		`CREATE INDEX evil ON idempotency_keys (amount)`,
		`ALTER TABLE payments ADD COLUMN evil int`,
		`ALTER TABLE idempotency_keys DROP CONSTRAINT amount_positive`,
		`DROP TABLE payments`,
		`TRUNCATE idempotency_keys`,
		`CREATE FUNCTION evil() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
		`CREATE VIEW evil AS SELECT 1`,
		`CREATE SCHEMA evil`,
		`SELECT * FROM goose_db_version`,
		`SELECT * FROM not_for_workers`,
		`CREATE ROLE evil`,
	} {
		testenv.Denied(t, pool, sql)
	}
	// A GRANT without the grant option is a warning, not an error, in
	// Postgres: check that it granted nothing.
	if _, err := pool.Exec(ctx, `GRANT SELECT, INSERT ON payments, idempotency_keys TO PUBLIC`); err != nil {
		t.Logf("grant refused: %v", err)
	}
	var granted int
	must(t, owner.QueryRow(ctx, `SELECT count(*) FROM information_schema.role_table_grants
		WHERE grantee = 'PUBLIC' AND table_schema = current_schema()`).Scan(&granted))
	if granted != 0 {
		t.Fatalf("the worker role passed on %d privileges to PUBLIC", granted)
	}
}

// TestSettleFunctionStaysInItsSchema: settle_payment (migration 00011) runs
// with its owner's rights, so it must touch only the tables of the schema it
// was created in, whatever the caller's search_path or temporary tables, and
// only the roles that settle may call it.
func TestSettleFunctionStaysInItsSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA, urlB := testenv.PostgresURL(t), testenv.PostgresURL(t)
	schemaOf := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return u.Query().Get("search_path")
	}
	// The same processing payment (merchant, key, intent) in both schemas.
	stores := map[string]*dedup.Store{}
	for _, u := range []string{urlA, urlB} {
		owner, err := pg.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(owner.Close)
		store, err := dedup.New(owner, dedup.Config{})
		if err != nil {
			t.Fatal(err)
		}
		c := &payment.Command{MerchantID: "m_fn", IdempotencyKey: "ach", Amount: 900, Currency: "usd", PaymentMethod: "pm_usBankAccount_success"}
		cl, err := store.Claim(ctx, "fn-test", time.Minute, ledger.NewClaimRequest(c))
		if err != nil || cl.Lease == nil {
			t.Fatalf("claim: %+v %v", cl, err)
		}
		must(t, store.Complete(ctx, *cl.Lease, ledger.Completion{ChargeID: "pi_fn", Processing: true, ResponseStatus: 202, Response: []byte(`{"id":"pi_fn"}`)}))
		stores[u] = store
	}
	status := func(u string) (string, int) {
		t.Helper()
		p, err := stores[u].GetPayment(ctx, "m_fn", "ach")
		must(t, err)
		rec, err := stores[u].Get(ctx, "m_fn", "ach")
		must(t, err)
		return p.Status, rec.ResponseStatus
	}

	// Called by its schema-qualified name from a session on schema B, A's
	// function settles A's row and leaves B's alone.
	gwB := testenv.AsRole(t, urlB, "paydedup_gateway")
	var settled bool
	must(t, gwB.QueryRow(ctx, `SELECT `+pgx.Identifier{schemaOf(urlA)}.Sanitize()+`.settle_payment('m_fn', 'ach', 'pi_fn', 'succeeded', 200, '{"id":"pi_fn","status":"succeeded"}', NULL)`).Scan(&settled))
	if st, code := status(urlA); !settled || st != ledger.PaymentSucceeded || code != 200 {
		t.Fatalf("schema A after its function: %v %s %d, want settled", settled, st, code)
	}
	if st, code := status(urlB); st != ledger.PaymentProcessing || code != 202 {
		t.Fatalf("schema B after A's function: %s %d, want it untouched", st, code)
	}

	// Temporary tables named like ours do not capture the function: its
	// search_path lists pg_temp last.
	conn, err := gwB.Acquire(ctx)
	must(t, err)
	defer conn.Release()
	for _, sql := range []string{
		`CREATE TEMP TABLE payments (merchant_id text, idempotency_key text, charge_id text, status text, settled_at timestamptz)`,
		`CREATE TEMP TABLE idempotency_keys (merchant_id text, idempotency_key text, charge_id text, status text,
			response_status integer, response bytea, updated_at timestamptz)`,
		`INSERT INTO pg_temp.payments VALUES ('m_fn', 'ach', 'pi_fn', 'processing', NULL)`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	must(t, conn.QueryRow(ctx, `SELECT settle_payment('m_fn', 'ach', 'pi_fn', 'failed', 402, '{"error":{}}', NULL)`).Scan(&settled))
	if st, code := status(urlB); !settled || st != ledger.PaymentFailed || code != 402 {
		t.Fatalf("schema B under temporary look-alikes: %v %s %d, want its own row settled", settled, st, code)
	}
	var tempStatus string
	must(t, conn.QueryRow(ctx, `SELECT status FROM pg_temp.payments`).Scan(&tempStatus))
	if tempStatus != "processing" {
		t.Fatalf("the function settled the caller's temporary table: %s", tempStatus)
	}

	// Its owner's rights, its search_path pinned, and callable only by the
	// two roles that settle.
	owner, err := pg.Connect(ctx, urlB)
	must(t, err)
	defer owner.Close()
	var definer, ownsTables, public bool
	var config []string
	var callers []string
	must(t, owner.QueryRow(ctx, `
		SELECT p.prosecdef, p.proconfig, p.proowner = c.relowner,
			p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0),
			ARRAY(SELECT r.rolname FROM aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee
				WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner ORDER BY 1)
		FROM pg_proc p, pg_class c
		WHERE p.proname = 'settle_payment' AND p.pronamespace = current_schema()::regnamespace
		  AND c.oid = 'payments'::regclass`).Scan(&definer, &config, &ownsTables, &public, &callers))
	wantPath := "search_path=" + schemaOf(urlB) + ", pg_temp"
	if !definer || len(config) != 1 || strings.ReplaceAll(config[0], `"`, "") != wantPath || !ownsTables || public ||
		len(callers) != 2 || callers[0] != "paydedup_gateway" || callers[1] != "paydedup_worker" {
		t.Fatalf("settle_payment: security definer %v, config %q (want %q), owned by the tables' owner %v, PUBLIC may call %v, callers %v",
			definer, config, wantPath, ownsTables, public, callers)
	}
}

// TestWorkerRoleDownKeepsASharedRole rolls migration 00002 back in one
// schema while another schema still grants the role: this schema's grants
// go, the role and the other schema's grants stay, and up restores them.
func TestWorkerRoleDownKeepsASharedRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA, urlB := testenv.PostgresURL(t), testenv.PostgresURL(t)
	ownerA, err := pg.Connect(ctx, urlA)
	if err != nil {
		t.Fatal(err)
	}
	defer ownerA.Close()
	m, err := migrate.NewMigrator(ctx, ownerA, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for {
		v, err := m.Down(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v <= 2 {
			break
		}
	}
	var exists bool
	must(t, ownerA.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, workerRole).Scan(&exists))
	if !exists {
		t.Fatal("the down migration dropped a role another schema still uses")
	}
	workerA, workerB := asWorker(t, urlA), asWorker(t, urlB)
	u, err := url.Parse(urlA)
	if err != nil {
		t.Fatal(err)
	}
	schemaA := pgx.Identifier{u.Query().Get("search_path")}.Sanitize()
	testenv.Denied(t, workerA, `SELECT count(*) FROM `+schemaA+`.idempotency_keys`)
	if _, err := workerB.Exec(ctx, `SELECT count(*) FROM idempotency_keys`); err != nil {
		t.Fatalf("the other schema lost its grants: %v", err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := workerA.Exec(ctx, `SELECT count(*) FROM idempotency_keys`); err != nil {
		t.Fatalf("up did not restore the grants: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
