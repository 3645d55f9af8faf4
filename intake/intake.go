// Package intake is paydedup's transactional intake for publishers: a
// service that shares paydedup's database commits a payment command in its
// own transaction, with the rows it belongs to ("insert the order and its
// payment atomically"), and the workers relay it to the payments stream.
// A rolled-back transaction publishes nothing; a committed one is
// published at least once, under the command's own Nats-Msg-Id
// (<merchant_id>:<idempotency_key>, the id the HTTP gateway and `paydedup
// publish` use), so the stream stores it once within its duplicate window
// and the worker's claim charges it once whatever path it came by.
//
// Enqueue (a pgx.Tx) and EnqueueSQL (a *sql.Tx) validate the command with
// the payment package's rules, card data refused, before they insert it
// into intake_commands (migration 00025). A retry with the same key and
// the same command is a no-op; the same key with another command is
// ErrMismatch. Publishers in other languages run the same INSERT
// (docs/intake.md).
//
// It is a PostgreSQL implementation, so it links pgx; Source is the
// relay's side, run by every worker through package outbox.
package intake

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/payment"
)

// ErrMismatch is returned by Enqueue when the merchant's key already holds
// another command: a key names one payment, so the second command is a
// bug of its publisher and is not stored. Nothing was inserted; the
// caller's transaction is still usable.
var ErrMismatch = errors.New("the idempotency key already holds another command")

// ErrNotVisible is returned by Enqueue when the key is taken by a row the
// caller may not read: another publisher's role inserted it (each
// publisher reads only its own rows).
var ErrNotVisible = errors.New("the idempotency key is taken by another publisher's command")

// insertSQL is the publisher's statement: a retry of a committed command
// inserts nothing.
const insertSQL = `INSERT INTO intake_commands (merchant_id, idempotency_key, body) VALUES ($1, $2, $3)
ON CONFLICT (merchant_id, idempotency_key) DO NOTHING`

// storedSQL reads the command a key holds, to tell a retry from a reuse.
const storedSQL = `SELECT body FROM intake_commands WHERE merchant_id = $1 AND idempotency_key = $2`

// Enqueue adds cmd to the intake in tx: it is published once tx commits,
// and never if tx rolls back. An invalid command is refused with the
// worker's *payment.ValidationError (card data as card_data, naming the
// field, never the value) and nothing is inserted. The same command again
// under its key (a retry) is a no-op; another command under the same key
// is ErrMismatch. Commands are checked against payment's default limits;
// a worker configured with a lower maximum amount marks a command above
// it rejected when it relays it.
func Enqueue(ctx context.Context, tx pgx.Tx, cmd payment.Command) error {
	body, err := check(cmd)
	if err != nil {
		return err
	}
	if tx == nil {
		return errors.New("enqueue payment command: nil transaction")
	}
	tag, err := tx.Exec(ctx, insertSQL, cmd.MerchantID, cmd.IdempotencyKey, string(body))
	if err != nil {
		return fmt.Errorf("enqueue payment command: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var stored string
	if err := tx.QueryRow(ctx, storedSQL, cmd.MerchantID, cmd.IdempotencyKey).Scan(&stored); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("enqueue payment command: %w", ErrNotVisible)
		}
		return fmt.Errorf("enqueue payment command: read the key's command: %w", err)
	}
	return same(&cmd, stored)
}

// EnqueueSQL is Enqueue in a database/sql transaction (the pgx stdlib
// driver, lib/pq, or any driver that takes $1 placeholders).
func EnqueueSQL(ctx context.Context, tx *sql.Tx, cmd payment.Command) error {
	body, err := check(cmd)
	if err != nil {
		return err
	}
	if tx == nil {
		return errors.New("enqueue payment command: nil transaction")
	}
	res, err := tx.ExecContext(ctx, insertSQL, cmd.MerchantID, cmd.IdempotencyKey, string(body))
	if err != nil {
		return fmt.Errorf("enqueue payment command: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("enqueue payment command: %w", err)
	} else if n == 1 {
		return nil
	}
	var stored string
	if err := tx.QueryRowContext(ctx, storedSQL, cmd.MerchantID, cmd.IdempotencyKey).Scan(&stored); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("enqueue payment command: %w", ErrNotVisible)
		}
		return fmt.Errorf("enqueue payment command: read the key's command: %w", err)
	}
	return same(&cmd, stored)
}

// check encodes cmd as the stream carries it and decodes that as the
// worker will: what it refuses, the worker would dead-letter.
func check(cmd payment.Command) ([]byte, error) {
	// The relay carries the key in a header too, and NATS trims a
	// header's value: blanks around the key would reach the worker as
	// another key (key_mismatch), and the command would never be charged.
	if k := cmd.IdempotencyKey; k != "" && strings.TrimSpace(k) != k {
		return nil, fmt.Errorf("enqueue payment command: %w", &payment.ValidationError{Reason: payment.ReasonInvalidKey,
			Field: "idempotency_key", Msg: "has blanks at its start or end, which the stream's header would drop"})
	}
	body, err := encode(&cmd)
	if err != nil {
		return nil, err
	}
	if _, err := payment.Decode(body, payment.Envelope{}, payment.Limits{}); err != nil {
		return nil, fmt.Errorf("enqueue payment command: %w", err)
	}
	return body, nil
}

// same returns nil when stored is cmd (equal canonical encodings, whatever
// the JSON's order or spacing: a publisher in another language may have
// written it), else ErrMismatch.
func same(cmd *payment.Command, stored string) error {
	prev, err := payment.Decode([]byte(stored), payment.Envelope{}, payment.Limits{})
	if err == nil && bytes.Equal(prev.AppendCanonical(nil), cmd.AppendCanonical(nil)) {
		return nil
	}
	return fmt.Errorf("enqueue payment command %s:%s: %w", cmd.MerchantID, cmd.IdempotencyKey, ErrMismatch)
}

// encode is the command's JSON as publishers send it (stream.EncodeCommand):
// without HTML escaping, which would grow a body past the worker's limit.
func encode(cmd *payment.Command) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(cmd); err != nil {
		return nil, fmt.Errorf("encode payment command: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
