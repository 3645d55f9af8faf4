package httpidem_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"os"

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/paydedup/paydedup/httpidem"
	"github.com/paydedup/paydedup/httpidem/pgstore"
)

type accountKey struct{}

// accountID is what the application's authentication put in the context.
func accountID(ctx context.Context) string {
	id, _ := ctx.Value(accountKey{}).(string)
	return id
}

// createOrder has a side effect and knows nothing about idempotency.
func createOrder(w http.ResponseWriter, r *http.Request) {
	var order struct{ SKU string }
	if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
		http.Error(w, "bad order", http.StatusBadRequest) // 4xx: stored and replayed
		return
	}
	// ... insert the order, charge the card (passing the request's
	// Idempotency-Key on to the provider) ...
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated) // 2xx: stored and replayed byte for byte
	_ = json.NewEncoder(w).Encode(map[string]string{"id": "ord_1", "sku": order.SKU})
}

func Example() {
	ctx := context.Background()
	pool, err := pg.Connect(ctx, os.Getenv("DATABASE_URL")) // migrated with paydedup migrate up
	if err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	idem, err := httpidem.New(store, httpidem.Config{
		// Keys are per client: put the authenticated account in the scope
		// (authentication runs before this middleware).
		Scope: func(r *http.Request) string { return accountID(r.Context()) + " " + r.URL.Path },
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idem.Wrap(http.HandlerFunc(createOrder)))
	log.Fatal(http.ListenAndServe(":8080", mux))
}
