package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/client"
)

// The key is the caller's: made once per payment and stored with the order
// before the first call, so that a retry, also after a crash, uses it again.
// The example needs a running gateway, so it has no output to check.
func Example() {
	c, err := client.New("http://localhost:8080", os.Getenv("PAYDEDUP_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := "550e8400-e29b-41d4-a716-446655440000" // the order's payment key
	p := client.Payment{Amount: 1999, Currency: "usd", PaymentMethod: "pm_card_visa", Description: "order 42"}

	res, err := c.Create(ctx, key, p)
	switch {
	case errors.Is(err, client.ErrOutcomeUnknown):
		// It may be charged: call Create again later with the same key and
		// payment. Never pay under a new key.
		log.Printf("payment %s: outcome unknown, retry later: %v", key, err)
		return
	case errors.Is(err, client.ErrKeyReused), errors.Is(err, client.ErrCardData), errors.Is(err, client.ErrInvalidRequest):
		log.Fatalf("a bug in the order's payment: %v", err) // nothing charged under this request
	case err != nil:
		log.Fatal(err)
	}
	if !res.Final() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if res, err = c.Wait(wctx, key); err != nil {
			log.Printf("payment %s still %s: ask again later", key, res.Status)
			return
		}
	}
	switch res.Status {
	case client.StatusSucceeded:
		fmt.Println("charged", res.ChargeID)
	case client.StatusDeclined:
		fmt.Println("declined: another attempt is a new payment with a new key")
	case client.StatusWaitingForOperator:
		fmt.Println("set aside for an operator:", res.Reason) // not final: never pay again under a new key
	}
}

// A publisher of payment commands straight on the payments stream.
func ExamplePublisher_Publish() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	pub, err := client.NewPublisher(nc, client.PublisherConfig{MerchantID: "m_123"})
	if err != nil {
		log.Fatal(err)
	}
	p := client.Payment{Amount: 1999, Currency: "usd", PaymentMethod: "pm_card_visa"}
	res, err := pub.Publish(context.Background(), "550e8400-e29b-41d4-a716-446655440000", p)
	if err != nil {
		log.Fatal(err) // ErrOutcomeUnknown: publish it again later, same key and payment
	}
	fmt.Printf("stored at %s #%d (duplicate of an earlier publish: %v)\n", res.Stream, res.Seq, res.Duplicate)
}
