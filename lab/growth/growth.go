// Package growth runs the bench against tables already full: one run per
// number of preloaded ledger rows, and a plot and a table of payments/s
// and CPU per payment against the rows present.
package growth

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/paydedup/paydedup/lab/bench"
)

// DefaultRows are the preloads of the curve.
var DefaultRows = []int{0, 1_000_000, 3_000_000, 10_000_000}

// Config is one curve: Bench is every run's configuration but its
// preload, which is each of Rows in turn.
type Config struct {
	Rows    []int
	Bench   bench.Config
	PNG     string // the plot; "" for none
	Table   string // the figures as a Markdown table; "" for none
	Out     io.Writer
	Measure func(context.Context, bench.Config) (bench.Result, error) // bench.Measure; a test may stand in
}

// Point is one run of the curve.
type Point struct {
	Rows   int          `json:"rows"`
	Result bench.Result `json:"result"`
}

// Run runs the curve, writes the plot and the table, and returns the
// points. A run that fails stops the curve.
func Run(ctx context.Context, cfg Config) ([]Point, error) {
	if len(cfg.Rows) == 0 {
		return nil, fmt.Errorf("growth: no preloads to run")
	}
	if cfg.Measure == nil {
		cfg.Measure = bench.Measure
	}
	var pts []Point
	for _, n := range cfg.Rows {
		bc := cfg.Bench
		bc.PreloadRows, bc.PreloadKeys = n, min(n, bench.DefaultPreloadKeysCap)
		fmt.Fprintf(cfg.Out, "growth: bench with %d rows preloaded\n", n)
		res, err := cfg.Measure(ctx, bc)
		if err != nil {
			return pts, fmt.Errorf("growth: preload %d: %w", n, err)
		}
		pts = append(pts, Point{Rows: n, Result: res})
		fmt.Fprintf(cfg.Out, "growth: %d rows: %.0f payments/s, worker %.1f µs, Postgres %.1f µs per payment\n",
			n, res.PaymentsPerSec, res.WorkerCPUUSPerPayment, res.PGCPUUSPerPayment)
	}
	if cfg.Table != "" {
		if err := writeFile(cfg.Table, []byte(Table(pts))); err != nil {
			return pts, err
		}
	}
	if cfg.PNG != "" {
		if err := Plot(pts, cfg.PNG); err != nil {
			return pts, err
		}
	}
	return pts, nil
}

// Table is the figures as a Markdown table, each relative to the first
// point (the empty database when the curve starts at 0).
func Table(pts []Point) string {
	var b strings.Builder
	b.WriteString("| ledger rows | key rows | payments/s | vs first | worker µs/payment | vs first | Postgres µs/payment | vs first | preload s (+ vacuum s) | WAL bytes/payment | checkpoints begun |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	if len(pts) == 0 {
		return b.String()
	}
	base := pts[0].Result
	for _, p := range pts {
		r := p.Result
		wal, ckpt := "n/a", "n/a"
		if r.PGWALBytesPerPayment >= 0 {
			wal, ckpt = fmt.Sprintf("%.0f", r.PGWALBytesPerPayment), fmt.Sprint(r.PGCheckpoints)
		}
		fmt.Fprintf(&b, "| %d | %d | %.0f | %s | %.1f | %s | %.1f | %s | %.0f (+%.0f) | %s | %s |\n",
			p.Rows, r.PreloadKeys, r.PaymentsPerSec, Change(r.PaymentsPerSec, base.PaymentsPerSec),
			r.WorkerCPUUSPerPayment, Change(r.WorkerCPUUSPerPayment, base.WorkerCPUUSPerPayment),
			r.PGCPUUSPerPayment, Change(r.PGCPUUSPerPayment, base.PGCPUUSPerPayment),
			r.PreloadSeconds, r.PreloadVacuumSeconds, wal, ckpt)
	}
	return b.String()
}

// Change is v against base as a signed percentage, "n/a" without a base.
func Change(v, base float64) string {
	if base <= 0 || v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f %%", 100*(v-base)/base)
}

// Title says what each run of the curve timed.
func Title(pts []Point) string {
	if len(pts) == 0 {
		return "bench as the tables grow"
	}
	r := pts[0].Result
	if r.WarmupPayments > 0 {
		return fmt.Sprintf("bench as the tables grow (%d payments per run, after a warm-up of %d)", r.Payments, r.WarmupPayments)
	}
	return fmt.Sprintf("bench as the tables grow (%d payments per run, right after the preload)", r.Payments)
}

// Plot draws payments/s (top) and CPU per payment, worker and Postgres
// (bottom), against the ledger rows present, into a PNG at path.
func Plot(pts []Point, path string) error {
	rate, worker, pgcpu := make(plotter.XYs, len(pts)), make(plotter.XYs, len(pts)), make(plotter.XYs, 0, len(pts))
	for i, p := range pts {
		x := float64(p.Rows) / 1e6
		rate[i] = plotter.XY{X: x, Y: p.Result.PaymentsPerSec}
		worker[i] = plotter.XY{X: x, Y: p.Result.WorkerCPUUSPerPayment}
		if p.Result.PGCPUUSPerPayment >= 0 {
			pgcpu = append(pgcpu, plotter.XY{X: x, Y: p.Result.PGCPUUSPerPayment})
		}
	}
	top := plot.New()
	top.Title.Text = Title(pts)
	top.X.Label.Text = "ledger rows present (millions)"
	top.Y.Label.Text = "payments/s"
	top.Y.Min = 0
	if err := addLine(top, "payments/s", rate, 0); err != nil {
		return err
	}
	bottom := plot.New()
	bottom.X.Label.Text = "ledger rows present (millions)"
	bottom.Y.Label.Text = "CPU µs per payment"
	bottom.Y.Min = 0
	if err := addLine(bottom, "worker", worker, 1); err != nil {
		return err
	}
	if err := addLine(bottom, "Postgres backends", pgcpu, 2); err != nil {
		return err
	}
	bottom.Legend.Top = true
	bottom.Legend.Left = true

	const w, h = 8 * vg.Inch, 8 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	plots := [][]*plot.Plot{{top}, {bottom}}
	canvases := plot.Align(plots, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("growth: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("growth: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("growth: write %s: %w", path, err)
	}
	return f.Close()
}

func addLine(p *plot.Plot, name string, xys plotter.XYs, style int) error {
	if len(xys) == 0 {
		return nil
	}
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("growth: plot %s: %w", name, err)
	}
	l.Color, s.Color = plotColor(style), plotColor(style)
	s.Shape = draw.CircleGlyph{}
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

func plotColor(i int) color.Color {
	return []color.Color{color.RGBA{R: 31, G: 119, B: 180, A: 255}, color.RGBA{R: 44, G: 160, B: 44, A: 255},
		color.RGBA{R: 214, G: 39, B: 40, A: 255}}[i%3]
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("growth: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("growth: %w", err)
	}
	return nil
}
