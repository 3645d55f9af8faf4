package growth

import (
	"bytes"
	"context"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/bench"
)

// TestCurve runs the curve with a stand-in for the bench: each run gets
// its preload (keys capped), the table compares each point with the first,
// and the plot is a PNG.
func TestCurve(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var got []bench.Config
	measure := func(_ context.Context, c bench.Config) (bench.Result, error) {
		got = append(got, c)
		n := float64(c.PreloadRows) / 1e6
		wal := 900 + 10*n
		if c.PreloadRows == 1_000_000 {
			wal = -1 // the server did not tell
		}
		return bench.Result{PreloadRows: c.PreloadRows, PreloadKeys: c.PreloadKeys, PaymentsPerSec: 1000 - 10*n,
			WorkerCPUUSPerPayment: 50, PGCPUUSPerPayment: 100 + n, PGWALBytesPerPayment: wal, PGCheckpoints: int(n) / 10}, nil
	}
	cfg := Config{Rows: []int{0, 1_000_000, 20_000_000}, Bench: bench.Config{Payments: 10},
		PNG: filepath.Join(dir, "perf", "growth.png"), Table: filepath.Join(dir, "perf", "growth.md"), Out: io.Discard, Measure: measure}
	pts, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 3 || len(got) != 3 || got[2].PreloadRows != 20_000_000 || got[2].PreloadKeys != bench.DefaultPreloadKeysCap ||
		got[1].PreloadKeys != 1_000_000 || got[0].PreloadRows != 0 || got[1].Payments != 10 {
		t.Fatalf("runs %+v", got)
	}
	table, err := os.ReadFile(cfg.Table)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 0 | 0 | 1000 | +0.0 % |", "| 20000000 | 10000000 | 800 | -20.0 % | 50.0 | +0.0 % | 120.0 | +20.0 % |",
		"| 1100 | 2 |\n", "| n/a | n/a |\n"} {
		if !strings.Contains(string(table), want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	b, err := os.ReadFile(cfg.PNG)
	if err != nil {
		t.Fatal(err)
	}
	if img, err := png.Decode(bytes.NewReader(b)); err != nil || img.Bounds().Dx() < 500 {
		t.Errorf("plot: %v", err)
	}
}

// TestTitle says what each run timed: after a warm-up, or right after the
// preload.
func TestTitle(t *testing.T) {
	t.Parallel()
	warm := []Point{{Result: bench.Result{Payments: 60000, WarmupPayments: 30000}}}
	cold := []Point{{Result: bench.Result{Payments: 20000}}}
	if got, want := Title(warm), "bench as the tables grow (60000 payments per run, after a warm-up of 30000)"; got != want {
		t.Errorf("warm: %q, want %q", got, want)
	}
	if got, want := Title(cold), "bench as the tables grow (20000 payments per run, right after the preload)"; got != want {
		t.Errorf("cold: %q, want %q", got, want)
	}
}

func TestChange(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		v, base float64
		want    string
	}{{110, 100, "+10.0 %"}, {90, 100, "-10.0 %"}, {5, 0, "n/a"}, {-1, 100, "n/a"}} {
		if got := Change(c.v, c.base); got != c.want {
			t.Errorf("Change(%v, %v) = %q, want %q", c.v, c.base, got, c.want)
		}
	}
}
