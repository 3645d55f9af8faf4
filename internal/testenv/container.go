package testenv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// postgresContainer starts PostgreSQL 15 in a container when a Docker
// engine answers, and returns its URL. The container lives as long as the
// test process; testcontainers' reaper removes it after. It is the last
// resort, after TEST_DATABASE_URL and the local server.
func postgresContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return "", fmt.Errorf("no Docker engine: %w", err)
	}
	defer p.Close()
	hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
	defer hcancel()
	if err := p.Health(hctx); err != nil {
		return "", errors.New("no Docker engine answers")
	}
	c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithDatabase("test"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return "", fmt.Errorf("start a PostgreSQL container: %w", err)
	}
	return c.ConnectionString(ctx, "sslmode=disable")
}
