//go:build !unix

package localpg

import (
	"context"
	"errors"
)

// Cluster is a private PostgreSQL cluster; this system has none.
type Cluster struct{}

// URL is the URL of database as user.
func (c *Cluster) URL(user, database string) string { return "" }

// Dir is the data directory.
func (c *Cluster) Dir() string { return "" }

// Throwaway is not available on this system.
func Throwaway(context.Context) (*Cluster, func(), error) {
	return nil, nil, errors.New("a private PostgreSQL cluster needs a Unix system")
}
