package demo

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/testenv"
)

// With no DATABASE_URL and no local server, the demo gets its database on
// a private cluster, which closing removes.
func TestDemoWithoutLocalPostgresStartsAPrivateCluster(t *testing.T) {
	t.Parallel()
	if _, err := localpg.FindBin(); err != nil && !testenv.InCI() {
		t.Skip(err)
	}
	var errOut testenv.Buffer
	d := &demoCmd{Config: Config{ErrOut: &errOut, AdminURL: "postgres://postgres@127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "/postgres?sslmode=disable&connect_timeout=2"}}
	ctx := context.Background()
	u, closeDB, err := d.database(ctx)
	if err != nil {
		t.Fatal(err)
	}
	said := errOut.String()
	if !strings.Contains(said, "private PostgreSQL cluster in ") {
		closeDB()
		t.Fatalf("the demo does not say where its database is:\n%s", said)
	}
	dir := strings.Fields(said[strings.Index(said, "cluster in ")+len("cluster in "):])[0]
	pool, err := pg.Connect(ctx, u)
	if err == nil {
		err = pool.Ping(ctx)
		pool.Close()
	}
	closeDB()
	if err != nil {
		t.Fatalf("database %s: %v", u, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory %s is still there after close (%v)", dir, err)
	}
}
