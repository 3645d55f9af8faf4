package localpg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// Container starts PostgreSQL 15 in a container when a Docker engine
// answers, and returns the superuser's URL of database name and a func that
// removes the container (testcontainers' reaper removes it anyway once this
// process is gone). It says promptly when no engine answers.
func Container(ctx context.Context, name string) (string, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return "", nil, fmt.Errorf("no Docker engine: %w", err)
	}
	defer p.Close()
	hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
	defer hcancel()
	if err := p.Health(hctx); err != nil {
		return "", nil, errors.New("no Docker engine answers")
	}
	c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithDatabase(name), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return "", nil, fmt.Errorf("start a PostgreSQL container: %w", err)
	}
	stop := func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		_ = c.Terminate(sctx)
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		stop()
		return "", nil, err
	}
	return u, stop, nil
}
