package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway/apikey"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// The roles migrations 00002 and 00006 create.
const (
	workerRole  = "paydedup_worker"
	gatewayRole = "paydedup_gateway"
)

// TestGatewayRoleRunsTheGateway runs every store call of "paydedup gateway"
// (authenticate, the intake guard, reading a payment's state, the purge of
// guard rows, LISTEN for completions) on a pool logged in as
// paydedup_gateway, while a worker completes the payment as
// paydedup_worker; then shows that the role can do nothing else: it writes
// no key, no ledger row and no API key.
func TestGatewayRoleRunsTheGateway(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	ctx := context.Background()
	owner, err := pg.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	ownerStore, err := pgstore.New(owner, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	token, _, err := ownerStore.CreateAPIKey(ctx, "m_gw", "role test")
	if err != nil {
		t.Fatal(err)
	}
	gwPool := testenv.AsRole(t, ownerURL, gatewayRole)
	records, err := dedup.New(gwPool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := pgstore.New(gwPool, pgstore.Config{Records: records})
	if err != nil {
		t.Fatal(err)
	}
	workerPool := testenv.AsRole(t, ownerURL, workerRole)
	worker, err := dedup.New(workerPool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	workerIntake, err := pgstore.New(workerPool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}

	comp, err := pgstore.NewListener(gwPool, pgstore.ListenerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- comp.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("completions as %s: %v", gatewayRole, err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !comp.Listening() {
		if time.Now().After(deadline) {
			t.Fatalf("never listening as %s", gatewayRole)
		}
		time.Sleep(10 * time.Millisecond)
	}

	merchant, err := gw.Authenticate(ctx, token)
	if err != nil || merchant != "m_gw" {
		t.Fatalf("authenticate as %s: %q %v", gatewayRole, merchant, err)
	}
	req := ledger.NewClaimRequest(&payment.Command{MerchantID: merchant, IdempotencyKey: "k1", Amount: 500, Currency: "usd", PaymentMethod: "pm_card_visa"})
	if _, err := records.Get(ctx, merchant, "k1"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("get as %s before the claim: %v", gatewayRole, err)
	}
	res, err := acquireOne(ctx, gw, req, time.Second, time.Hour)
	if err != nil || res.Outcome != ledger.IntakeAcquired {
		t.Fatalf("acquire intake as %s: %v %v", gatewayRole, res.Outcome, err)
	}
	if again, err := acquireOne(ctx, gw, req, time.Second, time.Hour); err != nil || again.Outcome != ledger.IntakeHeld {
		t.Fatalf("second acquire as %s: %v %v", gatewayRole, again.Outcome, err)
	}
	if err := gw.IntakePublished(ctx, res.Intake, 1, time.Minute); err != nil {
		t.Fatalf("intake published as %s: %v", gatewayRole, err)
	}
	if _, err := gw.GetIntake(ctx, merchant, "k1"); err != nil {
		t.Fatalf("get intake as %s: %v", gatewayRole, err)
	}
	other := req
	other.IdempotencyKey = "k2"
	res2, err := acquireOne(ctx, gw, other, time.Second, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.AbandonIntake(ctx, res2.Intake); err != nil {
		t.Fatalf("abandon intake as %s: %v", gatewayRole, err)
	}
	if _, err := gw.PurgeIntakes(ctx, 10); err != nil {
		t.Fatalf("purge intakes as %s: %v", gatewayRole, err)
	}

	// The worker, as its own role, claims and completes: the gateway hears
	// it and reads the outcome.
	sub := comp.Subscribe(merchant, "k1")
	defer sub.Close()
	cl, err := worker.Claim(ctx, "role-worker", time.Minute, req)
	if err != nil || cl.Lease == nil {
		t.Fatalf("claim as %s: %+v %v", workerRole, cl, err)
	}
	if err := worker.Complete(ctx, *cl.Lease, ledger.Completion{ChargeID: "ch_gw", ResponseStatus: 200, Response: []byte(`{"id":"ch_gw"}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C:
	case <-time.After(10 * time.Second):
		t.Fatalf("the gateway, as %s, never heard the completion", gatewayRole)
	}
	if rec, err := records.Get(ctx, merchant, "k1"); err != nil || rec.Status != ledger.StatusCompleted {
		t.Fatalf("get as %s: %+v %v", gatewayRole, rec, err)
	}
	if recs, err := records.GetMany(ctx, []ledger.KeyRef{{MerchantID: merchant, IdempotencyKey: "k1"}}); err != nil || len(recs) != 1 {
		t.Fatalf("get many as %s: %d %v", gatewayRole, len(recs), err)
	}
	if rb, err := gw.ReadBatch(ctx, [][]byte{apikey.Hash(token)}, []ledger.KeyRef{{MerchantID: merchant, IdempotencyKey: "k1"}}); err != nil ||
		rb.Active[string(apikey.Hash(token))] != "m_gw" || len(rb.Records) != 1 || len(rb.Payments) != 1 {
		t.Fatalf("read a batch as %s: %+v %v", gatewayRole, rb, err)
	}
	// The batch's first statement probes records and ledger (a key the
	// worker charged is left to be read) and takes in a new key.
	fresh, err := gw.AcquireNewIntakes(ctx, []ledger.ClaimRequest{req, ledger.NewClaimRequest(&payment.Command{MerchantID: merchant,
		IdempotencyKey: "k-new", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"})},
		[][]byte{apikey.Hash(token), apikey.Hash(token)}, 10*time.Second, time.Hour)
	if err != nil || fresh[0].Outcome != ledger.IntakeReadFirst || fresh[1].Outcome != ledger.IntakeAcquired {
		t.Fatalf("acquire new intakes as %s: %+v %v", gatewayRole, fresh, err)
	}
	if _, err := records.Stats(ctx, time.Minute); err != nil {
		t.Fatalf("stats as %s: %v", gatewayRole, err)
	}
	// Before it publishes a key whose record was purged, the gateway reads
	// the ledger.
	if p, err := records.GetPayment(ctx, merchant, "k1"); err != nil || p.ChargeID != "ch_gw" {
		t.Fatalf("ledger read as %s: %+v %v", gatewayRole, p, err)
	}
	// A processing payment the Stripe webhook settles, as the reconciler
	// does: through the settle_payment function of migration 00011, the
	// gateway's only way to change a key or a ledger row.
	achReq := ledger.NewClaimRequest(&payment.Command{MerchantID: merchant, IdempotencyKey: "ach", Amount: 700, Currency: "usd", PaymentMethod: "pm_usBankAccount_success"})
	achCl, err := worker.Claim(ctx, "role-worker", time.Minute, achReq)
	if err != nil || achCl.Lease == nil {
		t.Fatalf("claim as %s: %+v %v", workerRole, achCl, err)
	}
	if err := worker.Complete(ctx, *achCl.Lease, ledger.Completion{ChargeID: "pi_ach", Processing: true, ResponseStatus: 202, Response: []byte(`{"id":"pi_ach"}`)}); err != nil {
		t.Fatal(err)
	}
	ach, err := records.GetPayment(ctx, merchant, "ach")
	if err != nil || ach.Status != ledger.PaymentProcessing {
		t.Fatalf("processing payment as %s: %+v %v", gatewayRole, ach, err)
	}
	if err := records.SettlePayment(ctx, ach, ledger.PaymentSucceeded, 200, []byte(`{"id":"pi_ach","status":"succeeded"}`)); err != nil {
		t.Fatalf("settle as %s: %v", gatewayRole, err)
	}
	if rec, err := records.Get(ctx, merchant, "ach"); err != nil || rec.ResponseStatus != 200 {
		t.Fatalf("settled key as %s: %+v %v", gatewayRole, rec, err)
	}
	// A final row is left alone: settling again, or settling a payment that
	// never was processing, changes neither the ledger nor the stored answer.
	if err := records.SettlePayment(ctx, ach, ledger.PaymentFailed, 402, []byte(`{"evil":true}`)); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("settling a settled payment as %s: %v, want ErrNotFound", gatewayRole, err)
	}
	final, err := records.GetPayment(ctx, merchant, "k1")
	if err != nil {
		t.Fatal(err)
	}
	answers := map[string]ledger.Record{}
	for _, key := range []string{"ach", "k1"} {
		if answers[key], err = records.Get(ctx, merchant, key); err != nil {
			t.Fatal(err)
		}
	}
	var settled bool
	if err := gwPool.QueryRow(ctx, `SELECT settle_payment($1, 'k1', 'ch_gw', 'failed', 402, '{"evil":true}', NULL)`, merchant).Scan(&settled); err != nil || settled {
		t.Fatalf("settle_payment of a succeeded payment as %s: %v %v, want false", gatewayRole, settled, err)
	}
	// The outbox takes a refused command's event from the workers only
	// (record_refusal, migration 00026): the internet-facing role may not
	// announce refusals.
	testenv.Denied(t, gwPool, `SELECT record_refusal('m_gw', 'k1', 1, 'invalid_amount', 0, '', now())`)
	testenv.Denied(t, gwPool, `SELECT record_waiting('m_gw', 'k1', 1, 'max_deliveries', 0, '', now())`)
	for key, before := range answers {
		rec, err := records.Get(ctx, merchant, key)
		if err != nil || rec.ResponseStatus != before.ResponseStatus || string(rec.Response) != string(before.Response) || !rec.UpdatedAt.Equal(before.UpdatedAt) {
			t.Fatalf("key %s after settling a final row as %s: %+v %v, want %+v", key, gatewayRole, rec, err, before)
		}
	}
	if p, err := records.GetPayment(ctx, merchant, "k1"); err != nil || p != final {
		t.Fatalf("ledger row after settling a final row as %s: %+v %v, want %+v", gatewayRole, p, err, final)
	}
	if p, err := records.GetPayment(ctx, merchant, "ach"); err != nil || p.Status != ledger.PaymentSucceeded {
		t.Fatalf("settled ledger row as %s: %+v %v", gatewayRole, p, err)
	}
	// The worker tells the intake of a command it dead-lettered.
	if ok, err := workerIntake.MarkIntakeDeadLettered(ctx, merchant, "k1", 1, "key_mismatch", "x"); err != nil || !ok {
		t.Fatalf("dead letter on the intake as %s: %v %v", workerRole, ok, err)
	}
	if err := records.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	// Managing API keys is the owner's job.
	if _, _, err := gw.CreateAPIKey(ctx, "m_gw", "evil"); err == nil {
		t.Fatalf("%s created an API key", gatewayRole)
	} else if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) {
		t.Fatalf("a pgx error left the gateway's store: %v", err)
	}
	if _, err := gw.RevokeAPIKey(ctx, token); err == nil {
		t.Fatalf("%s revoked an API key", gatewayRole)
	}
	if _, err := owner.Exec(ctx, `CREATE TABLE not_for_gateways (secret text)`); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`INSERT INTO idempotency_keys (merchant_id, idempotency_key, request_hash, status, provider_key, amount, currency,
			locked_by, locked_until, key_window_start, created_at, updated_at, expires_at)
			VALUES ('m_gw', 'evil', sha256('x'), 'pending', 'pk_evil', 1, 'usd', 'h', now(), now(), now(), now(), now())`,
		`UPDATE idempotency_keys SET status = 'failed', response = NULL, response_status = NULL, completed_at = NULL`,
		`DELETE FROM idempotency_keys`,
		`UPDATE idempotency_keys SET response = '{}', response_status = 200, updated_at = now()`,
		`SELECT * FROM idempotency_keys FOR UPDATE`,
		`SELECT * FROM idempotency_keys FOR SHARE`,
		`INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at)
			VALUES ('m_gw', 'evil', 'pk_evil', 'ch_evil', 'succeeded', 1, 'usd', now())`,
		`UPDATE payments SET amount = amount + 1`,
		`UPDATE payments SET status = 'failed', settled_at = now() WHERE status = 'processing'`,
		`SELECT * FROM payments FOR UPDATE`,
		`DELETE FROM payments`,
		`INSERT INTO api_keys (id, merchant_id, key_hash, created_at) VALUES ('0123456789ab', 'm_gw', sha256('k'), now())`,
		`UPDATE api_keys SET revoked_at = NULL`,
		`DELETE FROM api_keys`,
		`SELECT * FROM http_idempotency`,
		`DELETE FROM http_idempotency`,
		`TRUNCATE gateway_intake`,
		`CREATE TABLE evil (i int)`,
		`ALTER TABLE gateway_intake ADD COLUMN evil int`,
		`DROP TABLE gateway_intake`,
		`CREATE FUNCTION evil() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
		`CREATE SCHEMA evil`,
		`SELECT * FROM goose_db_version`,
		`SELECT * FROM not_for_gateways`,
		`CREATE ROLE evil`,
	} {
		testenv.Denied(t, gwPool, sql)
	}
}
