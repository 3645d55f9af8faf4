package demo

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/internal/testenv"
)

func TestDemoWithoutPostgresSaysWhatToDo(t *testing.T) {
	t.Parallel()
	var errOut testenv.Buffer
	d := &demoCmd{Config: Config{ErrOut: &errOut, AdminURL: "postgres://postgres@127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "/postgres?sslmode=disable&connect_timeout=2"}}
	_, err := d.database(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no PostgreSQL answers") || !strings.Contains(err.Error(), "DATABASE_URL=") {
		t.Fatalf("error %v: it must say that no Postgres answers and how to set DATABASE_URL", err)
	}
}
