package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ledger"
)

type apikeyCmd struct {
	app      *app
	db       databaseFlag
	merchant string
	label    string
}

func newAPIKeyCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "apikey",
		Short: "Create, list and revoke the gateway's API keys",
		Long: `apikey manages the API keys "paydedup gateway" accepts as
Authorization: Bearer <key>. Each key belongs to one merchant: the gateway
takes the merchant of a payment from its key. Only a key's SHA-256 is stored;
"create" prints the key once and it cannot be shown again. Run these as the
schema owner (the runtime role may only read keys).`,
		Args: cobra.NoArgs,
	}
	create := &apikeyCmd{app: a}
	createCmd := &cobra.Command{
		Use:   "create --merchant M",
		Short: "Create an API key for a merchant and print it (once)",
		Example: `  paydedup apikey create --merchant m_123 --label "checkout service"
  KEY=$(paydedup apikey create --merchant m_123)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return explainDBError(create.create(cmd.Context()), create.db.url)
		},
	}
	create.db.bind(createCmd, a)
	createCmd.Flags().StringVar(&create.merchant, "merchant", "", "merchant id the key acts for (required)")
	createCmd.Flags().StringVar(&create.label, "label", "", "a note to recognise the key by in apikey list")

	list := &apikeyCmd{app: a}
	listCmd := &cobra.Command{
		Use:   "list [--merchant M]",
		Short: "List API keys (ids, merchants, labels; never the keys)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return explainDBError(list.list(cmd.Context()), list.db.url)
		},
	}
	list.db.bind(listCmd, a)
	listCmd.Flags().StringVar(&list.merchant, "merchant", "", "only this merchant's keys")

	revoke := &apikeyCmd{app: a}
	revokeCmd := &cobra.Command{
		Use:     "revoke ID|KEY",
		Short:   "Revoke an API key by its id (from apikey list) or by the key itself",
		Example: `  paydedup apikey revoke 3f9a2c1d0b7e`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return explainDBError(revoke.revoke(cmd.Context(), args[0]), revoke.db.url)
		},
	}
	revoke.db.bind(revokeCmd, a)

	root.AddCommand(createCmd, listCmd, revokeCmd)
	return root
}

func (c *apikeyCmd) open(ctx context.Context) (*pgstore.Store, func(), error) {
	if err := c.db.validate(); err != nil {
		return nil, nil, err
	}
	pool, err := pg.Connect(ctx, c.db.url)
	if err != nil {
		return nil, nil, err
	}
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return store, pool.Close, nil
}

func (c *apikeyCmd) create(ctx context.Context) error {
	if c.merchant == "" {
		return errors.New("apikey create: --merchant is required")
	}
	store, closeDB, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	key, k, err := store.CreateAPIKey(ctx, c.merchant, c.label)
	if err != nil {
		return err
	}
	// The key alone on stdout, so scripts can capture it; the note on stderr.
	fmt.Fprintln(c.app.out, key)
	fmt.Fprintf(c.app.errOut, "apikey: created key %s for merchant %s; it is shown only this once, store it now\n", k.ID, k.MerchantID)
	return nil
}

func (c *apikeyCmd) list(ctx context.Context) error {
	store, closeDB, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	keys, err := store.ListAPIKeys(ctx, c.merchant)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(c.app.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tMERCHANT\tCREATED\tREVOKED\tLABEL")
	for _, k := range keys {
		revoked := "-"
		if !k.RevokedAt.IsZero() {
			revoked = k.RevokedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.MerchantID, k.CreatedAt.UTC().Format(time.RFC3339), revoked, k.Label)
	}
	return w.Flush()
}

func (c *apikeyCmd) revoke(ctx context.Context, idOrKey string) error {
	store, closeDB, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	k, err := store.RevokeAPIKey(ctx, idOrKey)
	if errors.Is(err, ledger.ErrNotFound) {
		return errors.New("apikey revoke: no such key (see paydedup apikey list)")
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(c.app.out, "apikey: revoked key %s of merchant %s\n", k.ID, k.MerchantID)
	return nil
}
