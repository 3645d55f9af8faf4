package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/stream"
)

// Deleting dead letters: for what will never be replayed (bad input the
// publisher has since resent, a key reused by a client bug, a test's
// leftovers). A deleted max_deliveries letter is a payment never charged
// that nothing will retry: the commands say so before they delete.

// Delete removes dead letter seq from the DLQ stream and returns what it
// was. It wraps ErrNotFound when there is none (already replayed or
// deleted).
func Delete(ctx context.Context, js jetstream.JetStream, cfg stream.Config, seq uint64) (Info, error) {
	cfg = cfg.WithDefaults()
	d, err := Get(ctx, js, cfg, seq)
	if err != nil {
		return Info{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	dlqs, err := js.Stream(ctx, cfg.DLQStream)
	if err != nil {
		return Info{}, notSetUp("stream "+cfg.DLQStream, err)
	}
	if err := dlqs.DeleteMsg(ctx, seq); err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
			return Info{}, fmt.Errorf("no dead letter %d in %s: %w", seq, cfg.DLQStream, ErrNotFound)
		}
		return Info{}, fmt.Errorf("delete dead letter %d from %s: %w", seq, cfg.DLQStream, err)
	}
	return d, nil
}

// PurgeFilter selects the dead letters a purge deletes: those with Reason
// stored in the DLQ stream longer than OlderThan before Now. Age is the
// stream's own time, not the letter's Dlq-Failed-At header, which anyone
// who can publish to the DLQ's subjects could write.
type PurgeFilter struct {
	Reason    string        // required
	OlderThan time.Duration // required, positive
	Now       time.Time     // time.Now() when zero
}

// Validate says what is missing.
func (f PurgeFilter) Validate() error {
	var errs []error
	if f.Reason == "" {
		errs = append(errs, errors.New("purge dead letters: give the reason to purge (e.g. malformed_json); dlq list shows them"))
	}
	if f.OlderThan <= 0 {
		errs = append(errs, fmt.Errorf("purge dead letters: the age must be positive (e.g. 168h), got %v", f.OlderThan))
	}
	return errors.Join(errs...)
}

// PurgeCandidates returns the dead letters f selects, oldest first, for a
// confirmation before they are deleted one by one with Delete.
func PurgeCandidates(ctx context.Context, js jetstream.JetStream, cfg stream.Config, f PurgeFilter) ([]Info, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	now := f.Now
	if now.IsZero() {
		now = time.Now()
	}
	cutoff := now.Add(-f.OlderThan)
	var out []Info
	err := eachDeadLetter(ctx, js, cfg, Filter{Reason: f.Reason}, func(d Info) error {
		if d.Stored.Before(cutoff) {
			out = append(out, d)
		}
		return nil
	})
	return out, err
}
