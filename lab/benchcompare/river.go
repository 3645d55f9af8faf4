package benchcompare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/paydedup/paydedup/lab/localpg"
)

// RiverDatabase is River's own database on the paydedup bench's server, so
// that River's tables never touch the project's.
const RiverDatabase = "paydedup_river"

// RiverInstall says how to get the river binary, for the error when it is
// missing.
const RiverInstall = "make bench-compare builds bin/river, paydedup's measurement of River (the library, v0.51.2) by the method of River's own river bench, from lab/benchcompare/river; or pass --river PATH"

// River is our measurement of River's library by the method of River's own
// "river bench --num-total-jobs N" (the program in ./river): it inserts n
// jobs, then times a client with a no-op worker until all are worked; its
// schema is raised once first with "river migrate-up". dbURL is River's
// database.
func River(bin, dbURL string, n int) Contestant {
	return Contestant{
		Name:    "river",
		Unit:    "jobs/s",
		Prepare: [][]string{{bin, "migrate-up", "--database-url", dbURL}},
		Command: []string{bin, "bench", "--database-url", dbURL, "--num-total-jobs", strconv.Itoa(n)},
		Parse: func(stdout []byte) (Figures, error) {
			f, err := ParseRiver(stdout)
			if err == nil && f.Items != n {
				err = fmt.Errorf("river bench worked %d jobs, want %d", f.Items, n)
			}
			return f, err
		},
	}
}

// RiverDatabaseURL returns the URL of RiverDatabase on the server at
// adminURL (a superuser's), creating the database when missing. The URL
// sets no pool size, so the river program opens pgx's default pool, as
// River's own CLI does.
func RiverDatabaseURL(ctx context.Context, adminURL string) (string, error) {
	u, _, err := localpg.Database(ctx, adminURL, RiverDatabase, 1)
	if err != nil {
		return "", err
	}
	p, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	q := p.Query()
	q.Del("pool_max_conns")
	p.RawQuery = q.Encode()
	return p.String(), nil
}

// riverTotal is the closing line of river bench, the same in River's own
// CLI (cmd/river/riverbench) and in our program in ./river:
//
//	bench: total jobs worked [ %10d ], total jobs inserted [ %10d ], overall job/sec [ %10.1f ], running %s
var riverTotal = regexp.MustCompile(`total jobs worked\s*\[\s*(\d+)\s*\],\s*total jobs inserted\s*\[\s*(\d+)\s*\],\s*overall job/sec\s*\[\s*([^\]\s]+)\s*\],\s*running\s+(\S+)`)

// ErrRiverOutput is returned when river bench's output has no closing line
// that can be read.
var ErrRiverOutput = errors.New("cannot read river bench's output")

// ParseRiver reads the rate, jobs and timed span from the last closing line
// of river bench's standard output; the per-interval lines before it are
// ignored.
func ParseRiver(stdout []byte) (Figures, error) {
	all := riverTotal.FindAllSubmatch(stdout, -1)
	if len(all) == 0 {
		return Figures{}, fmt.Errorf(`%w: no "total jobs worked [ … ], … overall job/sec [ … ], running …" line in what it printed:%s`, ErrRiverOutput, quote(stdout))
	}
	m := all[len(all)-1]
	worked, err1 := strconv.Atoi(string(m[1]))
	rate, err2 := strconv.ParseFloat(string(m[3]), 64)
	span, err3 := time.ParseDuration(string(m[4]))
	if err := errors.Join(err1, err2, err3); err != nil {
		return Figures{}, fmt.Errorf("%w: %q: %v", ErrRiverOutput, m[0], err)
	}
	if math.IsNaN(rate) || math.IsInf(rate, 0) || rate <= 0 || worked <= 0 {
		return Figures{}, fmt.Errorf("%w: %q: no jobs worked at a finite rate", ErrRiverOutput, m[0])
	}
	return Figures{Rate: rate, Items: worked, Seconds: span.Seconds()}, nil
}

// quote is what a command printed, cut to its last lines, for an error.
func quote(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return " nothing"
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > 8 {
		lines = append([]string{"…"}, lines[len(lines)-8:]...)
	}
	return "\n  " + strings.Join(lines, "\n  ")
}
