package stripesim

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// The list endpoint, GET /v1/payment_intents: Stripe's list of an account's
// intents, newest first, filtered on created and paged with limit and
// starting_after. Unlike search it is not lagged (Stripe's list reads what
// was written). The audit reads the provider's records through it.

// maxListLimit is the largest page a list may ask for, as at Stripe.
const maxListLimit = 100

// defaultListLimit is Stripe's page size when limit is not given.
const defaultListLimit = 10

// listFilter is the created range of a list, in Unix seconds, inclusive.
type listFilter struct{ from, to int64 }

func (f listFilter) match(created time.Time) bool {
	c := created.Unix()
	return c >= f.from && c <= f.to
}

// errListCursor is listPage's answer to a starting_after the account does
// not have.
var errListCursor = errors.New("no such object to start after")

// listPage returns account's intents matching f, newest first, after the
// intent named after ("" from the start), at most limit of them; more
// reports that others follow.
func (s *Simulator) listPage(account string, f listFilter, after string, limit int) (page []*simIntent, more bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, known := s.accounts[account]
	i := s.recs.len() - 1
	if after != "" {
		for ; i >= 0 && (!known || s.recs.at(int32(i)).account != a || s.recs.at(int32(i)).id() != after); i-- {
		}
		if i < 0 {
			return nil, false, errListCursor
		}
		i--
	}
	if !known {
		return nil, false, nil
	}
	for ; i >= 0; i-- {
		r := s.recs.at(int32(i))
		if r.account != a || !f.match(r.created) {
			continue
		}
		if len(page) == limit {
			return page, true, nil
		}
		page = append(page, s.viewLocked(int32(i), r))
	}
	return page, false, nil
}

// parseList reads the parameters of a list request, rejecting any the
// simulator does not know as Stripe does.
func parseList(form url.Values) (f listFilter, after string, limit int, e *simError) {
	f = listFilter{from: math.MinInt64, to: math.MaxInt64}
	limit = defaultListLimit
	for name := range form {
		v := form.Get(name)
		var n int64
		switch name {
		case "created", "created[gte]", "created[gt]", "created[lt]", "created[lte]":
			var err error
			if n, err = strconv.ParseInt(v, 10, 64); err != nil {
				return f, "", 0, invalidParam(name, "parameter_invalid_integer", "Invalid integer: "+v)
			}
		}
		switch name {
		case "created":
			f.from, f.to = max(f.from, n), min(f.to, n)
		case "created[gte]":
			f.from = max(f.from, n)
		case "created[gt]":
			f.from = max(f.from, n+1)
		case "created[lte]":
			f.to = min(f.to, n)
		case "created[lt]":
			f.to = min(f.to, n-1)
		case "limit":
			l, err := strconv.Atoi(v)
			if err != nil || l < 1 || l > maxListLimit {
				return f, "", 0, invalidParam("limit", "parameter_invalid_integer", "limit must be an integer between 1 and 100.")
			}
			limit = l
		case "starting_after":
			after = v
		default:
			// ending_before included: the adapter pages forward only.
			return f, "", 0, invalidParam(name, "parameter_unknown", "Received unknown parameter: "+name)
		}
	}
	return f, after, limit, nil
}

func (s *Simulator) listIntents(w http.ResponseWriter, r *http.Request, account string, _ roll) {
	f, after, limit, e := parseList(r.Form)
	if e != nil {
		writeSimError(w, http.StatusBadRequest, e)
		return
	}
	page, more, err := s.listPage(account, f, after, limit)
	if err != nil {
		writeSimReply(w, badCursorReply(after))
		return
	}
	writeSimRendered(w, http.StatusOK, func(b []byte) []byte { return appendListPage(b, page, more) })
}

func badCursorReply(after string) *simReply {
	return simReplyFor(http.StatusBadRequest, &simError{Type: "invalid_request_error", Code: "resource_missing",
		Param: "starting_after", Message: "No such payment_intent: '" + after + "'"})
}

// appendListPage appends Stripe's list object for one page.
func appendListPage(b []byte, page []*simIntent, more bool) []byte {
	b = append(b, `{"object":"list","data":[`...)
	for i, in := range page {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendIntentJSON(b, in)
	}
	b = append(b, `],"has_more":`...)
	b = strconv.AppendBool(b, more)
	return append(b, `,"url":"`+simPathCreate+`"}`...)
}

// simIntentOf is in as the adapter's ListIntents decodes it from JSON.
func simIntentOf(in *simIntent) provider.Intent {
	merchant, _ := in.meta(provider.MetadataMerchantID)
	key, _ := in.meta(provider.MetadataIdempotencyKey)
	return provider.Intent{
		ID:             in.id,
		Status:         in.status,
		Amount:         in.amount,
		Currency:       in.currency,
		MerchantID:     afterJSON(merchant),
		IdempotencyKey: afterJSON(key),
		Created:        time.Unix(in.created.Unix(), 0).UTC(),
	}
}

// ListIntents yields the account's intents created in [req.From, req.To),
// newest first, as stripe.Client.ListIntents does over HTTP: the same
// whole-second rounding, one fault roll per page of 100.
func (c *Client) ListIntents(ctx context.Context, req provider.ListRequest) iter.Seq2[provider.Intent, error] {
	return func(yield func(provider.Intent, error) bool) {
		if !req.From.Before(req.To) {
			return
		}
		to := req.To.Unix()
		if req.To.Truncate(time.Second).Equal(req.To) {
			to--
		}
		f := listFilter{from: req.From.Unix(), to: to}
		start := time.Now()
		after := req.StartingAfter
		for first := true; ; first = false {
			_, reply, err := c.call(ctx, start, first, http.MethodGet, simPathCreate)
			switch {
			case err != nil:
				yield(provider.Intent{}, fmt.Errorf("list payment intents: %w", noAnswer(err)))
				return
			case reply != nil:
				rej := reply.failure()
				yield(provider.Intent{}, fmt.Errorf("list payment intents: %w", rej.LookupError()))
				return
			}
			// Each page has its own timeout at the adapter; so here.
			start = time.Now()
			page, more, _ := c.sim.listPage(c.account, f, after, maxListLimit)
			for _, in := range page {
				if !yield(simIntentOf(in), nil) {
					return
				}
			}
			if !more || len(page) == 0 {
				return
			}
			after = page[len(page)-1].id
		}
	}
}

// GetIntent retrieves one intent by id, as stripe.Client.GetIntent does; an
// id the account does not have wraps provider.ErrNoSuchIntent.
func (c *Client) GetIntent(ctx context.Context, id string) (provider.Intent, error) {
	in, f, err := c.retrieve(ctx, time.Now(), true, id)
	switch {
	case err != nil:
		return provider.Intent{}, fmt.Errorf("retrieve payment intent %s: %w", id, noAnswer(err))
	case f != nil && resourceMissing(f):
		return provider.Intent{}, fmt.Errorf("retrieve payment intent %s: %w", id, provider.ErrNoSuchIntent)
	case f != nil:
		return provider.Intent{}, fmt.Errorf("retrieve payment intent %s: %w", id, f.LookupError())
	}
	return simIntentOf(in), nil
}

// dotSegment reports a path ending in "." or "..": the router would
// redirect it to the cleaned path, and /v1/payment_intents/. to the list.
// Stripe answers a 404 to a retrieve of such an id; so does the simulator,
// before any fault roll (Client.retrieve relies on it).
func dotSegment(p string) bool {
	return strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..")
}

func writeUnrecognized(w http.ResponseWriter, r *http.Request) {
	writeSimError(w, http.StatusNotFound, &simError{Type: "invalid_request_error",
		Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path)})
}
