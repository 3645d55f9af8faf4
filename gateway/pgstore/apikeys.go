package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/gateway/apikey"
	"github.com/paydedup/paydedup/payment"
)

// maxLabelLen bounds an API key's label (the schema checks it too).
const maxLabelLen = 200

// APIKey describes a stored API key. The key itself is never stored: only
// its SHA-256.
type APIKey struct {
	ID         string
	MerchantID string
	Label      string
	CreatedAt  time.Time
	RevokedAt  time.Time // zero while active
}

// CreateAPIKey creates a key for a merchant and returns it with its
// description. The key is returned once and cannot be recovered.
func (s *Store) CreateAPIKey(ctx context.Context, merchantID, label string) (string, APIKey, error) {
	if err := payment.ValidateMerchant(merchantID); err != nil {
		return "", APIKey{}, fmt.Errorf("create API key: %w", err)
	}
	if len(label) > maxLabelLen {
		return "", APIKey{}, fmt.Errorf("create API key: label is %d bytes, limit is %d", len(label), maxLabelLen)
	}
	var id [6]byte
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", APIKey{}, fmt.Errorf("create API key: %w", err)
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", APIKey{}, fmt.Errorf("create API key: %w", err)
	}
	k := APIKey{ID: hex.EncodeToString(id[:]), MerchantID: merchantID, Label: label, CreatedAt: s.db.Clock.Now()}
	token := apikey.Prefix + k.ID + "_" + base64.RawURLEncoding.EncodeToString(secret[:])
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		_, err := s.db.Pool.Exec(ctx, `INSERT INTO api_keys (id, merchant_id, key_hash, label, created_at)
			VALUES ($1, $2, $3, $4, $5)`, k.ID, k.MerchantID, apikey.Hash(token), k.Label, k.CreatedAt)
		return err
	})
	if err != nil {
		return "", APIKey{}, interpretError("create API key", err)
	}
	return token, k, nil
}

// Authenticate returns the merchant an active key belongs to, or
// apikey.ErrUnauthenticated.
func (s *Store) Authenticate(ctx context.Context, key string) (string, error) {
	if _, ok := apikey.ID(key); !ok {
		return "", apikey.ErrUnauthenticated
	}
	var merchant string
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT merchant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL`,
			apikey.Hash(key)).Scan(&merchant)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return "", apikey.ErrUnauthenticated
	}
	if err != nil {
		return "", interpretError("authenticate", err)
	}
	return merchant, nil
}

// RevokeAPIKey revokes a key by its id (or by the key itself) and returns
// it. Revoking a revoked key keeps its first revocation time. An unknown id
// is ledger.ErrNotFound.
func (s *Store) RevokeAPIKey(ctx context.Context, idOrKey string) (APIKey, error) {
	id := idOrKey
	if kid, ok := apikey.ID(idOrKey); ok {
		id = kid
	}
	var k APIKey
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		var revoked *time.Time
		err := s.db.Pool.QueryRow(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, $2)
			WHERE id = $1 RETURNING id, merchant_id, label, created_at, revoked_at`, id, s.db.Clock.Now()).
			Scan(&k.ID, &k.MerchantID, &k.Label, &k.CreatedAt, &revoked)
		if revoked != nil {
			k.RevokedAt = *revoked
		}
		return err
	})
	if err != nil {
		return APIKey{}, interpretError("revoke API key", err)
	}
	return k, nil
}

// ListAPIKeys lists a merchant's keys (all merchants' when merchantID is
// empty), newest first.
func (s *Store) ListAPIKeys(ctx context.Context, merchantID string) ([]APIKey, error) {
	var out []APIKey
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.db.Pool.Query(ctx, `SELECT id, merchant_id, label, created_at, revoked_at FROM api_keys
			WHERE $1 = '' OR merchant_id = $1 ORDER BY created_at DESC, id`, merchantID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k APIKey
			var revoked *time.Time
			if err := rows.Scan(&k.ID, &k.MerchantID, &k.Label, &k.CreatedAt, &revoked); err != nil {
				return err
			}
			if revoked != nil {
				k.RevokedAt = *revoked
			}
			out = append(out, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError("list API keys", err)
	}
	return out, nil
}
