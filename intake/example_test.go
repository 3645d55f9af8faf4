package intake_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/payment"
)

// The order and its payment commit together: if the transaction rolls
// back, no payment is ever published; once it commits, a worker publishes
// it and charges it once. The example needs the database paydedup
// migrated, so it has no output to check.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // search_path includes paydedup's schema
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	cmd := payment.Command{MerchantID: "m_123", IdempotencyKey: "order-42-payment", Amount: 1999, Currency: "usd",
		PaymentMethod: "pm_card_visa", Metadata: map[string]string{"order_id": "42"}}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total) VALUES ($1, $2)`, "42", 1999); err != nil {
			return err
		}
		return intake.Enqueue(ctx, tx, cmd)
	})
	switch {
	case errors.Is(err, intake.ErrMismatch):
		log.Fatalf("order 42's payment key already holds another payment: %v", err)
	case err != nil:
		log.Fatal(err) // nothing committed: retry the whole transaction
	}
}

// A command holding card data is refused before anything is written,
// with the worker's error, naming the field and never the value.
func ExampleEnqueue_cardData() {
	cmd := payment.Command{MerchantID: "m_123", IdempotencyKey: "order-43-payment", Amount: 1999, Currency: "usd",
		PaymentMethod: "pm_card_visa", Description: "card 4242 4242 4242 4242"}
	err := intake.Enqueue(context.Background(), nil, cmd)
	var verr *payment.ValidationError
	if errors.As(err, &verr) {
		fmt.Println(verr.Reason, verr.Field)
	}
	// Output: card_data description
}
