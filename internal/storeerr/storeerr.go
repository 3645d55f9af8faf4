// Package storeerr holds the one error every store of the module returns
// alike, whatever its driver: ErrUnavailable. It is its own package, with
// no imports, so that the driver-free core (ledger.ErrUnavailable) and the
// Postgres helpers (pg.ErrUnavailable) name the same value without the
// basement (internal/) importing the core or the core linking pgx.
package storeerr

import "errors"

// ErrUnavailable means the database could not be reached or the statement
// did not finish; the operation may be retried.
var ErrUnavailable = errors.New("database unavailable")
