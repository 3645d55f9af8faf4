package benchcompare

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Paydedup is "paydedup bench --payments n --json" of the binary exe: the
// worker as batched in process, timed from a published backlog to
// quiescence, the simulator's ledger checked at the end.
func Paydedup(exe string, n int) Contestant {
	return Contestant{
		Name:    "paydedup",
		Unit:    "payments/s",
		Command: []string{exe, "bench", "--payments", strconv.Itoa(n), "--json"},
		Parse: func(stdout []byte) (Figures, error) {
			f, err := ParsePaydedup(stdout)
			if err == nil && f.Items != n {
				err = fmt.Errorf("paydedup bench charged %d payments, want %d", f.Items, n)
			}
			return f, err
		},
	}
}

// ErrPaydedupOutput is returned when paydedup bench's last line is not its
// JSON report.
var ErrPaydedupOutput = errors.New("cannot read paydedup bench's JSON report")

// paydedupReport holds the fields of lab/bench's Result that the
// comparison reads; pointers, so that a renamed field is an error and not a
// zero.
type paydedupReport struct {
	Payments       *int     `json:"payments"`
	Seconds        *float64 `json:"seconds"`
	PaymentsPerSec *float64 `json:"payments_per_sec"`
	DoubleCharges  int      `json:"double_charges"`
	Lost           int      `json:"lost"`
}

// ParsePaydedup reads the last non-empty line of paydedup bench --json as
// its report; the whole report is kept as the run's detail (its CPU split,
// PostgreSQL round trips and latencies).
func ParsePaydedup(stdout []byte) (Figures, error) {
	lines := bytes.Split(bytes.TrimSpace(stdout), []byte("\n"))
	last := bytes.TrimSpace(lines[len(lines)-1])
	var r paydedupReport
	if err := json.Unmarshal(last, &r); err != nil {
		return Figures{}, fmt.Errorf("%w: last line: %v:%s", ErrPaydedupOutput, err, quote(stdout))
	}
	if r.Payments == nil || r.Seconds == nil || r.PaymentsPerSec == nil {
		return Figures{}, fmt.Errorf("%w: no payments, seconds or payments_per_sec in %s", ErrPaydedupOutput, last)
	}
	if r.DoubleCharges != 0 || r.Lost != 0 {
		return Figures{}, fmt.Errorf("paydedup bench charged %d twice and lost %d", r.DoubleCharges, r.Lost)
	}
	if *r.PaymentsPerSec <= 0 {
		return Figures{}, fmt.Errorf("%w: payments_per_sec %v", ErrPaydedupOutput, *r.PaymentsPerSec)
	}
	return Figures{Rate: *r.PaymentsPerSec, Items: *r.Payments, Seconds: *r.Seconds, Detail: json.RawMessage(last)}, nil
}
