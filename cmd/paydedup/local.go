package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/nats-io/nats-server/v2/server"
)

// localPostgres is where demo and bench look for a database when
// DATABASE_URL is not set.
const localPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// startEmbeddedNATS starts an in-process JetStream server on a random
// loopback port with a temporary store, for demo and bench when NATS_URL is
// not set. stop shuts it down and removes the store.
func startEmbeddedNATS() (clientURL string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "paydedup-nats-")
	if err != nil {
		return "", nil, fmt.Errorf("temporary NATS store: %w", err)
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		os.RemoveAll(dir)
		return "", nil, errors.New("the embedded NATS server did not start within 10s")
	}
	return srv.ClientURL(), func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
	}, nil
}

// localDatabase returns the URL of database name on the local PostgreSQL
// (adminURL), creating the database if missing, with the pool size given.
func localDatabase(ctx context.Context, adminURL, name string, poolSize int) (u string, created bool, err error) {
	admin, err := pg.Connect(ctx, adminURL)
	if err != nil {
		return "", false, fmt.Errorf(`no DATABASE_URL, and no PostgreSQL answers at %s (%v).
Start one (Debian: apt-get install postgresql; or docker compose -f deploy/compose.yaml up -d),
or point paydedup at yours:
  DATABASE_URL='postgres://USER:PASSWORD@HOST:5432/DB?sslmode=disable'`, redactURL(adminURL), err)
	}
	defer admin.Close()
	var exists bool
	check := func() error {
		return admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists)
	}
	if err := check(); err != nil {
		return "", false, fmt.Errorf("look for database %s: %w", name, err)
	}
	if !exists {
		if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
			// Another process may have created it meanwhile.
			if cerr := check(); cerr != nil || !exists {
				return "", false, fmt.Errorf("create database %s: %w (or set DATABASE_URL to a database you may use)", name, err)
			}
		} else {
			created = true
		}
	}
	p, err := url.Parse(adminURL)
	if err != nil {
		return "", false, err
	}
	p.Path = "/" + name
	q := p.Query()
	q.Set("pool_max_conns", fmt.Sprint(poolSize))
	p.RawQuery = q.Encode()
	return p.String(), created, nil
}
