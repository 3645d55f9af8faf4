// Package migrations holds paydedup's schema as goose SQL files, embedded so
// the binary migrates its database without files on disk. Package
// migrations/migrate applies them.
package migrations

import "embed"

// FS holds the goose migrations, applied in file-name order.
//
//go:embed *.sql
var FS embed.FS
