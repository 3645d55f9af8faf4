package stripesim

import (
	"crypto/sha256"
	"encoding/binary"
	"strings"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// How the simulator stores its intents and keys. A provider keeps every
// intent and key for its window, so a long bench keeps hundreds of
// thousands: each intent is one simRec, a value in Simulator.recs (no
// object of its own), whose strings are packed back to back in one string,
// the short ones that recur (currency, payment method, metadata keys) as an
// index in Simulator.strTable; the id index and the key store point at it by
// its place, and a create key's digest and time are its intent's. Answers
// are rendered from a simIntent unpacked for the purpose, whose strings are
// pieces of the packed one or of the table.

// simRec is one intent as stored.
type simRec struct {
	// strs packs, each as appendPacked or appendShortLocked write it: id,
	// latest charge, currency, provider key, payment method, description,
	// the number of metadata entries, then each entry's key and value
	// (sorted by key), then, with recOwnTypes, the number of payment method
	// types and each.
	strs string
	// params is the digest of the create's request, created its time: its
	// idempotency key's (zero without a key).
	params  [sha256.Size]byte
	created time.Time
	amount  int64
	pending *simPending // a processing intent's end, else nil
	account uint32      // index in Simulator.accountNames
	status  uint8       // index in simStatuses
	decline uint8       // index in simDeclines: the card error of a declined intent
	flags   uint8
}

// simRecs holds the records in pages of recPage, so that the store
// neither copies them as it grows nor holds room it does not use.
type simRecs struct {
	pages [][]simRec
	n     int
}

const recPage = 1024

func (rs *simRecs) len() int { return rs.n }

func (rs *simRecs) at(ord int32) *simRec { return &rs.pages[ord/recPage][ord%recPage] }

// add appends r and returns its place.
func (rs *simRecs) add(r simRec) int32 {
	if rs.n%recPage == 0 {
		rs.pages = append(rs.pages, make([]simRec, 0, recPage))
	}
	last := len(rs.pages) - 1
	rs.pages[last] = append(rs.pages[last], r)
	rs.n++
	return int32(rs.n - 1)
}

// simDeclines are the declines an intent can carry, by simRec.decline; 0
// is none.
var simDeclines = [...]*simDecline{nil, simGenericDecline, simInsufficientFunds, simExpiredCard, simAuthRequired, simAccountClosed}

func declineIndex(d *simDecline) uint8 {
	for i, x := range simDeclines {
		if x == d {
			return uint8(i)
		}
	}
	panic("stripesim: unknown decline " + d.code)
}

// simRec flags.
const (
	recHasDescription = 1 << iota
	// recLostPaymentMethod: a failed bank debit, which Stripe leaves
	// without its payment method.
	recLostPaymentMethod
	recBankOnly // payment_method_types is simBankOnly
	recOwnTypes // payment_method_types are packed; else simCardOnly
	// recManualCapture: created with capture_method=manual.
	recManualCapture
)

// simPending is when a processing intent ends: succeeded, or failed with
// fails when not nil.
type simPending struct {
	settleAt time.Time
	fails    *simDecline
}

// simStatuses are the statuses an intent can have, by simRec.status.
var simStatuses = [...]string{simSucceeded, simRequiresPaymentMethod, simRequiresConfirmation, simRequiresAction, simProcessing, simCanceled, simRequiresCapture}

func statusIndex(status string) uint8 {
	for i, s := range simStatuses {
		if s == status {
			return uint8(i)
		}
	}
	panic("stripesim: unknown status " + status)
}

func (r *simRec) statusIs(status string) bool { return simStatuses[r.status] == status }

// packed reads the fields of simRec.strs in turn; tbl is the string table
// (Simulator.strTable) as it stood when the record was read.
type packed struct {
	s   string
	tbl []string
}

// str reads one string: behind a uvarint tag, its length times two, then
// its bytes; or an odd tag, its index in the table times two plus one.
func (p *packed) str() string {
	n := p.num()
	if n&1 == 1 {
		return p.tbl[n>>1]
	}
	n >>= 1
	v := p.s[:n]
	p.s = p.s[n:]
	return v
}

func (p *packed) num() int {
	var n uint64
	for shift, i := 0, 0; ; shift, i = shift+7, i+1 {
		c := p.s[i]
		n |= uint64(c&0x7f) << shift
		if c < 0x80 {
			p.s = p.s[i+1:]
			return int(n)
		}
	}
}

// packedFixed is the number of strings before the metadata: id, latest
// charge, currency, provider key, payment method, description.
const packedFixed = 6

// appendPacked appends s in place.
func appendPacked(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s))<<1)
	return append(b, s...)
}

// The string table holds short strings that recur, at most maxTable of
// them, each at most maxTableLen bytes; the first ones seen, never removed.
const (
	maxTable    = 4096
	maxTableLen = 32
)

// appendShortLocked appends s by its index in the string table when it is
// there or can be added, else in place.
func (s *Simulator) appendShortLocked(b []byte, str string) []byte {
	i, ok := s.strIndex[str]
	if !ok {
		if len(str) > maxTableLen || len(s.strTable) >= maxTable {
			return appendPacked(b, str)
		}
		str = strings.Clone(str)
		i = uint32(len(s.strTable))
		s.strTable = append(s.strTable, str)
		s.strIndex[str] = i
	}
	return binary.AppendUvarint(b, uint64(i)<<1|1)
}

// id returns the record's id, always the first string and in place.
func (r *simRec) id() string {
	p := packed{s: r.strs}
	return p.str()
}

// metadata returns the packed metadata entries: their count and the
// reader positioned at the first.
func (r *simRec) metadata(tbl []string) (int, packed) {
	p := packed{r.strs, tbl}
	for range packedFixed {
		p.str()
	}
	n := p.num()
	return n, p
}

// meta returns the metadata value for key and whether it is set.
func (r *simRec) meta(tbl []string, key string) (string, bool) {
	n, p := r.metadata(tbl)
	for range n {
		k, v := p.str(), p.str()
		if k == key {
			return v, true
		}
	}
	return "", false
}

func (r *simRec) matches(tbl []string, clauses []SearchClause) bool {
	for _, c := range clauses {
		if v, ok := r.meta(tbl, c.Key); !ok || v != c.Value {
			return false
		}
	}
	return true
}

// view unpacks r into the simIntent its answers are rendered from.
func (r *simRec) view(tbl []string) *simIntent {
	p := packed{r.strs, tbl}
	in := &simIntent{
		id:             p.str(),
		latestCharge:   p.str(),
		currency:       p.str(),
		providerKey:    p.str(),
		paymentMethod:  p.str(),
		description:    p.str(),
		hasDescription: r.flags&recHasDescription != 0,
		status:         simStatuses[r.status],
		decline:        simDeclines[r.decline],
		amount:         r.amount,
		created:        r.created,
		manual:         r.flags&recManualCapture != 0,
	}
	if r.statusIs(simRequiresCapture) {
		in.capturable = r.amount
	}
	if r.flags&recLostPaymentMethod != 0 {
		in.paymentMethod = ""
	}
	n := p.num()
	in.metadata = make([]simMeta, n)
	for i := range in.metadata {
		in.metadata[i] = simMeta{p.str(), p.str()}
	}
	switch {
	case r.flags&recOwnTypes != 0:
		in.methodTypes = make([]string, p.num())
		for i := range in.methodTypes {
			in.methodTypes[i] = p.str()
		}
	case r.flags&recBankOnly != 0:
		in.methodTypes = simBankOnly
	default:
		in.methodTypes = simCardOnly
	}
	return in
}

// charge returns the ledger entry of a succeeded intent.
func (r *simRec) charge(tbl []string) Charge {
	p := packed{r.strs, tbl}
	c := Charge{ID: p.str(), Amount: r.amount, Status: simStatuses[r.status], Created: r.created}
	p.str()
	c.Currency = p.str()
	c.ProviderKey = p.str()
	c.MerchantID, _ = r.meta(tbl, provider.MetadataMerchantID)
	c.IdempotencyKey, _ = r.meta(tbl, provider.MetadataIdempotencyKey)
	return c
}

// simKeyID names an idempotency key within its account.
type simKeyID struct {
	key     string
	account uint32
}

// simKey is one remembered idempotency key. It answers with the intent at
// ord (none while in flight): a create key with the intent as its create
// made it (firstLocked), whose params and created are the key's; a cancel
// key with the canceled intent, which no longer changes. An in-flight or
// cancel key's params and created are in Simulator.keyMeta.
type simKey struct {
	ord  int32
	kind uint8
}

// simKey kinds.
const (
	keyCreate uint8 = iota
	keyInFlight
	keyCancel
)

// simKeyMeta is what a key remembers of the request that first used it:
// params, a digest of the request's canonical form, enough to tell another
// request; and when it came.
type simKeyMeta struct {
	params  [sha256.Size]byte
	created time.Time
}

func (e simKey) inFlight() bool { return e.kind == keyInFlight }

// keyMetaLocked returns what key id, whose entry is e, remembers.
func (s *Simulator) keyMetaLocked(id simKeyID, e simKey) simKeyMeta {
	if e.kind == keyCreate {
		r := s.firstLocked(e.ord)
		return simKeyMeta{r.params, r.created}
	}
	return s.keyMeta[id]
}

func (s *Simulator) forgetKeyLocked(id simKeyID) {
	delete(s.keys, id)
	delete(s.keyMeta, id)
}

// firstLocked is the intent at ord as its create made it.
func (s *Simulator) firstLocked(ord int32) *simRec {
	if r, ok := s.firsts[ord]; ok {
		return &r
	}
	return s.recs.at(ord)
}

// answerLocked is the intent that e replays.
func (s *Simulator) answerLocked(e simKey) *simIntent {
	if e.kind == keyCreate {
		return s.firstLocked(e.ord).view(s.strTable)
	}
	return s.viewLocked(e.ord, s.recs.at(e.ord))
}

// accountLocked returns the index of account, adding it if new.
func (s *Simulator) accountLocked(account string) uint32 {
	if i, ok := s.accounts[account]; ok {
		return i
	}
	a := string([]byte(account))
	i := uint32(len(s.accountNames))
	s.accounts[a] = i
	s.accountNames = append(s.accountNames, a)
	return i
}
