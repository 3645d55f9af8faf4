package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestGatewayRoleReadsRefunds: the gateway, as paydedup_gateway, reads a
// payment's refunds and a refund by its key (migration 00030), a capture
// or a cancel by its key (00031, the columns it shows only), and may
// write none.
func TestGatewayRoleReadsRefunds(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	ctx := context.Background()
	gwPool := testenv.AsRole(t, ownerURL, gatewayRole)
	gw, err := pgstore.New(gwPool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.GetRefund(ctx, "m_gw", "r1"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("get refund as %s: %v, want not found", gatewayRole, err)
	}
	if rs, _, _, err := gw.RefundsOf(ctx, "m_gw", "p1"); err != nil || len(rs) != 0 {
		t.Fatalf("refunds of a payment as %s: %v %v, want none", gatewayRole, rs, err)
	}
	if _, ok, err := gw.RefusalOf(ctx, "m_gw", "r1", 7); err != nil || ok {
		t.Fatalf("refusal of a command as %s: %v %v, want none", gatewayRole, ok, err)
	}
	if _, err := gw.GetPaymentOp(ctx, "m_gw", "c1"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("get capture as %s: %v, want not found", gatewayRole, err)
	}
	if _, _, err := gw.PaymentLife(ctx, "m_gw", "p1"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("a payment's ledger row as %s: %v, want not found", gatewayRole, err)
	}
	// Only the columns it shows (migration 00031): never a provider key.
	var pk string
	err = gwPool.QueryRow(ctx, `SELECT provider_key FROM payment_ops LIMIT 1`).Scan(&pk)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("read a capture's provider key as %s: %v, want permission denied", gatewayRole, err)
	}
	_, err = gwPool.Exec(ctx, `INSERT INTO refunds (merchant_id, idempotency_key, payment_key, request_hash, provider_key, charge_id,
		amount, currency, status, attempts, key_window_start, refund_id, response_status, response, created_at, updated_at, completed_at)
		VALUES ('m_gw', 'r1', 'p1', '\x00', 'pdr_x', 'pi_x', 1, 'usd', 'succeeded', 1, now(), 're_x', 200, '{}', now(), now(), now())`)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("insert a refund as %s: %v, want permission denied", gatewayRole, err)
	}
}

// TestOperationIntakes: a refund's (capture's, cancel's) guard row has no
// currency and may ask for amount 0 (the rest, the whole: migration
// 00030); a payment's may not, and an operation's with a currency is
// refused before any SQL, as is a negative amount.
func TestOperationIntakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := pgstore.New(testenv.Pool(t), pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	refund := ledger.NewClaimRequest(&payment.Command{MerchantID: "m_1", IdempotencyKey: "ref-all", Kind: payment.KindRefund, PaymentKey: "pay-1"})
	res, err := acquireOne(ctx, s, refund, time.Minute, time.Hour)
	if err != nil || res.Outcome != ledger.IntakeAcquired || res.Intake.Amount != 0 || res.Intake.Currency != "" {
		t.Fatalf("a refund of the rest: %+v %v, want acquired with amount 0 and no currency", res, err)
	}
	unreachable := unreachableStore(t)
	for _, r := range []ledger.ClaimRequest{
		{MerchantID: "m_1", IdempotencyKey: "pay-0", RequestHash: refund.RequestHash, Currency: "usd"},                             // a payment of 0
		{MerchantID: "m_1", IdempotencyKey: "ref-usd", RequestHash: refund.RequestHash, Kind: payment.KindRefund, Currency: "usd"}, // an operation with a currency
		{MerchantID: "m_1", IdempotencyKey: "ref-neg", RequestHash: refund.RequestHash, Kind: payment.KindRefund, Amount: -1},
	} {
		if _, err := acquireOne(ctx, unreachable, r, time.Minute, time.Hour); err == nil || errors.Is(err, ledger.ErrUnavailable) {
			t.Errorf("%+v: %v, want refused before SQL", r, err)
		}
	}
	if _, err := s.AcquireNewIntakes(ctx, []ledger.ClaimRequest{{MerchantID: "m_1", IdempotencyKey: "pay-0", RequestHash: refund.RequestHash,
		Currency: "usd", Amount: 0}}, [][]byte{make([]byte, 32)}, time.Minute, time.Hour); err == nil {
		t.Fatal("a payment of 0 taken in")
	}
}

// TestRefundsOfSumsThemAll: a payment's refunds are listed up to
// MaxRefundsShown, and counted and summed over all of them: the
// succeeded ones and those the provider holds pending (processing), as
// Stripe's amount_refunded; a failed one or one whose call is under way
// is not refunded.
func TestRefundsOfSumsThemAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	s, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const n = pgstore.MaxRefundsShown + 1
	if _, err := pool.Exec(ctx, `INSERT INTO refunds (merchant_id, idempotency_key, payment_key, request_hash, provider_key, charge_id,
			amount, currency, status, attempts, key_window_start, refund_id, response_status, response, created_at, updated_at, completed_at)
		SELECT 'm_1', 'r' || i, 'p1', '\x00', 'pdr_' || i, 'pi_1', 1, 'usd', 'succeeded', 1, now(), 're_' || i, 200, '{}', now(), now(), now()
		FROM generate_series(1, $1) AS i`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO refunds (merchant_id, idempotency_key, payment_key, request_hash, provider_key, charge_id,
			amount, currency, status, attempts, key_window_start, refund_id, response_status, response, created_at, updated_at, completed_at,
			locked_by, locked_until)
		VALUES ('m_1', 'held', 'p1', '\x00', 'pdr_held', 'pi_1', 5, 'usd', 'processing', 1, now(), 're_held', 200, '{}', now(), now(), now(), NULL, NULL),
		       ('m_1', 'undone', 'p1', '\x00', 'pdr_undone', 'pi_1', 7, 'usd', 'failed', 1, now(), 're_undone', 200, '{}', now(), now(), now(), NULL, NULL),
		       ('m_1', 'calling', 'p1', '\x00', 'pdr_calling', 'pi_1', 9, 'usd', 'pending', 1, now(), NULL, NULL, NULL, now(), now(), NULL, 'w1', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	refunds, total, refunded, err := s.RefundsOf(ctx, "m_1", "p1")
	if err != nil {
		t.Fatal(err)
	}
	if len(refunds) != pgstore.MaxRefundsShown || total != n+3 || refunded != n+5 {
		t.Fatalf("%d listed, %d in all, %d refunded; want %d, %d, %d", len(refunds), total, refunded, pgstore.MaxRefundsShown, n+3, n+5)
	}
}
