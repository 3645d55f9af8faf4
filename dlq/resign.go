package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/stream"
)

// Re-signing dead letters: after a DLQ key rotation, the letters signed
// with a previous key verify only while that key stays listed. Resign
// files each anew signed with the current key (every other header, the
// authenticated Dlq-Failed-At included, and the body unchanged), so the
// previous key can be dropped without stranding a letter.

// ResignOptions chooses the dead letters to re-sign.
type ResignOptions struct {
	// Seqs are the DLQ sequences to re-sign. Either Seqs or All.
	Seqs []uint64
	// All re-signs every letter that verifies with a previous key.
	All bool
	// DryRun reports what would be re-signed and changes nothing.
	DryRun bool
}

// ResignOutcome is what happened to one dead letter.
type ResignOutcome string

// Re-sign outcomes.
const (
	// Resigned: filed anew under the current key (PubAck received), then
	// the old letter deleted.
	Resigned ResignOutcome = "resigned"
	// WouldResign: a dry run would have re-signed it.
	WouldResign ResignOutcome = "would_resign"
	// AlreadyCurrent: it verifies with the current key; nothing to do.
	AlreadyCurrent ResignOutcome = "current"
	// ResignRefused: it verifies with no configured key, so it is never
	// re-signed (that would make a forgery verify).
	ResignRefused ResignOutcome = "refused"
	// ResignNotFound: no dead letter at that sequence.
	ResignNotFound ResignOutcome = "not_found"
	// ResignFailed: filing the copy or deleting the old letter failed;
	// Detail says which.
	ResignFailed ResignOutcome = "failed"
)

// ResignResult is the fate of one dead letter.
type ResignResult struct {
	Seq     uint64        `json:"seq"`
	Reason  string        `json:"reason,omitempty"`
	KeyID   string        `json:"key_id,omitempty"` // the key that signed it
	Outcome ResignOutcome `json:"outcome"`
	NewSeq  uint64        `json:"new_seq,omitempty"` // its sequence once re-signed
	Detail  string        `json:"detail,omitempty"`
}

// ResignReport lists every dead letter considered, in order, and counts
// them by outcome.
type ResignReport struct {
	Results     []ResignResult `json:"results"`
	Resigned    int            `json:"resigned"`
	WouldResign int            `json:"would_resign"`
	Current     int            `json:"current"`
	Refused     int            `json:"refused"`
	NotFound    int            `json:"not_found"`
	Failed      int            `json:"failed"`
}

func (r *ResignReport) add(res ResignResult) {
	r.Results = append(r.Results, res)
	switch res.Outcome {
	case Resigned:
		r.Resigned++
	case WouldResign:
		r.WouldResign++
	case AlreadyCurrent:
		r.Current++
	case ResignRefused:
		r.Refused++
	case ResignNotFound:
		r.NotFound++
	case ResignFailed:
		r.Failed++
	}
}

// Resign files each selected dead letter that verifies with one of
// cfg.DLQPreviousKeys anew, signed with cfg.DLQKey, and deletes the old
// one only after the new one's PubAck. The copy keeps the body and every
// header but Dlq-Auth and Dlq-Key-Id, so replay still judges its age by
// its original Dlq-Failed-At. A crash between the PubAck and the delete
// leaves both (the next run, within the dead-letter stream's duplicate
// window, files no second copy and deletes the old one; replaying both
// charges once: PostgreSQL guards the charge). Without a valid cfg.DLQKey
// it re-signs nothing and returns an error wrapping ErrDLQKey.
//
// The error is for failures that stop the whole run; per-letter failures
// are in the report.
func Resign(ctx context.Context, js jetstream.JetStream, cfg stream.Config, opts ResignOptions) (ResignReport, error) {
	cfg = cfg.WithDefaults()
	var rep ResignReport
	if opts.All == (len(opts.Seqs) > 0) {
		return rep, errors.New("re-sign dead letters: give either sequences or All")
	}
	if err := errors.Join(stream.ValidateDLQKey(cfg.DLQKey), stream.ValidateDLQPreviousKeys(cfg.DLQPreviousKeys)); err != nil {
		return rep, fmt.Errorf("re-sign dead letters: %w", err)
	}
	var dlqs jetstream.Stream
	judge := func(d Info) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		res := ResignResult{Seq: d.Seq, Reason: d.Reason, KeyID: d.KeyID}
		switch {
		case !d.Verified:
			res.Outcome, res.Detail = ResignRefused, d.Unverified+": never re-signed"
		case !d.PreviousKey:
			res.Outcome = AlreadyCurrent
		case opts.DryRun:
			res.Outcome = WouldResign
		default:
			if err := openDLQ(ctx, js, cfg, &dlqs); err != nil {
				return err
			}
			resignOne(ctx, js, dlqs, cfg, d, &res)
		}
		rep.add(res)
		return nil
	}
	// eachDeadLetter stops at the letters the stream held when it began:
	// the copies filed meanwhile are not read again.
	err := eachChosen(ctx, js, cfg, opts.All, Filter{}, opts.Seqs, judge, func(seq uint64) {
		rep.add(ResignResult{Seq: seq, Outcome: ResignNotFound,
			Detail: fmt.Sprintf("no dead letter %d in %s (already replayed, re-signed, or expired)", seq, cfg.DLQStream)})
	})
	if err != nil {
		return rep, fmt.Errorf("re-sign dead letters: %w", err)
	}
	return rep, nil
}

// resignOne files d anew under the current key, then deletes it.
func resignOne(ctx context.Context, js jetstream.JetStream, dlqs jetstream.Stream, cfg stream.Config, d Info, res *ResignResult) {
	m := nats.NewMsg(d.Subject)
	m.Data = d.Data
	for k, vs := range d.Header {
		if strings.HasPrefix(k, "Nats-") || k == stream.HeaderDLQAuth || k == stream.HeaderDLQKeyID {
			continue
		}
		m.Header[k] = append([]string(nil), vs...)
	}
	stream.SignLetter(cfg, m.Header, m.Data)
	m.Header.Set(nats.MsgIdHdr, stream.ResignMsgID(cfg, d.Seq, stream.DLQKeyID(cfg.DLQKey)))

	pctx, cancel := context.WithTimeout(ctx, adminTimeout)
	ack, err := js.PublishMsg(pctx, m, jetstream.WithExpectStream(cfg.DLQStream))
	cancel()
	if err != nil {
		res.Outcome, res.Detail = ResignFailed, fmt.Sprintf("file the re-signed copy on %s: %v; the letter is kept, signed with the previous key", d.Subject, err)
		return
	}
	res.NewSeq = ack.Sequence
	if ack.Duplicate {
		// Another run filed this copy already: delete the old letter
		// only if the stored copy is this one, signed as we would.
		gctx, cancel := context.WithTimeout(ctx, adminTimeout)
		got, err := dlqs.GetMsg(gctx, ack.Sequence)
		cancel()
		if err != nil || got.Header.Get(stream.HeaderDLQAuth) != m.Header.Get(stream.HeaderDLQAuth) || !bytes.Equal(got.Data, m.Data) {
			res.Outcome = ResignFailed
			res.Detail = fmt.Sprintf("the copy was dropped as a duplicate of %s #%d, which is not this letter re-signed (%v); the letter is kept", ack.Stream, ack.Sequence, err)
			return
		}
		res.Detail = "already re-signed by another run"
	}
	if err := deleteLetter(ctx, dlqs, d.Seq); err != nil {
		res.Outcome = ResignFailed
		res.Detail = fmt.Sprintf("re-signed as %s #%d, but deleting the old letter failed: %v; delete it (dlq delete %d) before dropping its key, or it is listed unverified",
			ack.Stream, ack.Sequence, err, d.Seq)
		return
	}
	res.Outcome = Resigned
}
