package localpg_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/procstat"
	"github.com/paydedup/paydedup/lab/testenv"
)

// bench compare meters the whole server with procstat.TreeCPU of the
// postmaster: a backend that burned CPU and then closed, as a pool's
// connections do when a contestant exits, is still counted.
func TestPostmasterMetersABackendThatClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := testenv.PostgresURL(t)
	pm, err := localpg.Postmaster(ctx, u)
	if err != nil {
		if testenv.InCI() {
			t.Fatalf("CI runs PostgreSQL on this machine: %v", err)
		}
		t.Skipf("the server is not on this machine's /proc: %v", err)
	}
	before, err := procstat.TreeCPU(pm)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if ppid, comm, err := procstat.PPID(backend); err != nil || ppid != pm || comm != "postgres" {
		t.Fatalf("backend %d (%q): parent %d (%v), want the postmaster %d", backend, comm, ppid, err, pm)
	}
	if _, err := conn.Exec(ctx, "SELECT count(*) FROM generate_series(1, 4000000)"); err != nil {
		t.Fatal(err)
	}
	spent, ok := procstat.PIDCPU(backend)
	if !ok || spent < 50*time.Millisecond {
		t.Fatalf("the backend's CPU: %v (%v), want a query's worth", spent, ok)
	}
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", backend)); os.IsNotExist(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("backend %d still there", backend)
		}
		time.Sleep(10 * time.Millisecond)
	}
	after, err := procstat.TreeCPU(pm)
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got < spent-30*time.Millisecond {
		t.Errorf("the server's CPU grew by %v; the closed backend alone had spent %v", got, spent)
	}
}
