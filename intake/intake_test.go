package intake_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/payment"
)

// enqueuer is Enqueue or EnqueueSQL, each in a transaction of its own
// that commits when it succeeds.
type enqueuer func(w *world, cmd payment.Command) error

func viaPgx(w *world, cmd payment.Command) error {
	return pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error { return intake.Enqueue(w.ctx, tx, cmd) })
}

func viaSQL(w *world, cmd payment.Command) error {
	db := stdlib.OpenDBFromPool(w.pool)
	defer db.Close()
	tx, err := db.BeginTx(w.ctx, nil)
	if err != nil {
		return err
	}
	if err := intake.EnqueueSQL(w.ctx, tx, cmd); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestEnqueue: a retry of the same command is a no-op, whatever the
// stored JSON's order (a publisher in another language); another command
// under the key is ErrMismatch; an invalid command or one holding card
// data is refused with the worker's ValidationError; nothing of a refused
// command is stored.
func TestEnqueue(t *testing.T) {
	t.Parallel()
	for name, enqueue := range map[string]enqueuer{"pgx": viaPgx, "database/sql": viaSQL} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := setup(t)
			cmd := command("o1", 500)
			if err := enqueue(w, cmd); err != nil {
				t.Fatal(err)
			}
			if err := enqueue(w, command("o1", 500)); err != nil {
				t.Errorf("the same command again: %v, want a no-op", err)
			}
			if _, err := w.pool.Exec(w.ctx, `INSERT INTO intake_commands (merchant_id, idempotency_key, body) VALUES ('m_1', 'o2',
				'{ "metadata": {"order_id": "o2"}, "payment_method": "pm_card_visa", "currency": "usd", "amount": 700, "idempotency_key": "o2", "merchant_id": "m_1" }')`); err != nil {
				t.Fatal(err)
			}
			if err := enqueue(w, command("o2", 700)); err != nil {
				t.Errorf("the same command as another publisher wrote it: %v, want a no-op", err)
			}
			other := command("o1", 501)
			if err := enqueue(w, other); !errors.Is(err, intake.ErrMismatch) {
				t.Errorf("another command under the key: %v, want ErrMismatch", err)
			}
			card := command("o3", 500)
			card.Metadata["note"] = "4242 4242 4242 4242"
			var verr *payment.ValidationError
			if err := enqueue(w, card); !errors.As(err, &verr) || verr.Reason != payment.ReasonCardData || verr.Field != "metadata.note" {
				t.Errorf("card data: %v, want card_data naming metadata.note", err)
			} else if want := payment.CardDataError("metadata.note").Error(); !errors.Is(err, verr) || err.Error() != "enqueue payment command: "+want {
				t.Errorf("card data error %q, want the worker's %q", err, want)
			}
			bad := command("o4", 0)
			if err := enqueue(w, bad); !errors.As(err, &verr) || verr.Reason != payment.ReasonInvalidAmount {
				t.Errorf("amount 0: %v, want invalid_amount", err)
			}
			noKey := command("", 500)
			if err := enqueue(w, noKey); !errors.As(err, &verr) || verr.Reason != payment.ReasonMissingKey {
				t.Errorf("no key: %v, want missing_key", err)
			}
			if n := w.count(`SELECT count(*) FROM intake_commands`); n != 2 {
				t.Errorf("%d rows, want the two commands", n)
			}
			if n := w.count(`SELECT count(*) FROM intake_commands WHERE body LIKE '%4242%'`); n != 0 {
				t.Errorf("card data stored in %d rows", n)
			}
		})
	}
}

// TestEnqueueMismatchKeepsTransaction: a mismatch leaves the caller's
// transaction usable: it may roll back its order, or commit the rest.
func TestEnqueueMismatchKeepsTransaction(t *testing.T) {
	t.Parallel()
	w := setup(t)
	if err := w.order("o1", 500, true); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
		if err := intake.Enqueue(w.ctx, tx, command("o1", 900)); !errors.Is(err, intake.ErrMismatch) {
			t.Errorf("another command under the key: %v, want ErrMismatch", err)
		}
		return intake.Enqueue(w.ctx, tx, command("o2", 900))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := w.count(`SELECT count(*) FROM intake_commands`); n != 2 {
		t.Errorf("%d rows, want 2", n)
	}
}

// TestEnqueueRefusesKeysTheStreamWouldChange: NATS trims a header's
// value, so a key with blanks around it would reach the worker as another
// key and never be charged; Enqueue refuses it before the publisher's
// transaction commits, and nothing is inserted.
func TestEnqueueRefusesKeysTheStreamWouldChange(t *testing.T) {
	t.Parallel()
	w := setup(t)
	for _, key := range []string{"o1 ", " o1"} {
		var verr *payment.ValidationError
		if err := w.order(key, 500, true); !errors.As(err, &verr) || verr.Reason != payment.ReasonInvalidKey || verr.Field != "idempotency_key" {
			t.Fatalf("Enqueue of key %q: %v, want invalid_key on idempotency_key", key, err)
		}
	}
	if n := w.count(`SELECT count(*) FROM intake_commands`); n != 0 {
		t.Fatalf("%d rows inserted, want none", n)
	}
}
