package gateway_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/ledger"
)

const clientTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// publishedTrace returns the trace context the command of key carries.
func publishedTrace(t *testing.T, w *world) trace.SpanContext {
	t.Helper()
	s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(w.ctx, w.cfg.Stream.SubjectPrefix+".m_a")
	if err != nil {
		t.Fatal(err)
	}
	// NATS headers keep their case: read the W3C lower-case names as sent.
	carrier := propagation.MapCarrier{}
	for k, v := range msg.Header {
		carrier[k] = v[0]
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(w.ctx, carrier))
}

// TestGatewayServerSpan: with a tracer the gateway makes a server span per
// request, a child of the client's traceparent, and the published command
// carries that span's context, so the worker's span is its child; without
// one the client's context travels on unchanged.
func TestGatewayServerSpan(t *testing.T) {
	t.Parallel()
	t.Run("traced", func(t *testing.T) {
		t.Parallel()
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		w := setup(t, gateway.Config{TracerProvider: tp,
			Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})})
		r := w.post("trace-1", payBody(100, "pm_card_visa"), "traceparent", clientTraceparent, "baggage", "tenant=t1")
		wantStatus(t, r, http.StatusAccepted)
		var server sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindServer {
				server = s
			}
		}
		if server == nil {
			t.Fatalf("no server span among %d", len(rec.Ended()))
		}
		if got := server.Parent().SpanID().String(); got != "00f067aa0ba902b7" || server.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("server span %s, parent %s: want a child of the client's traceparent", server.SpanContext().TraceID(), got)
		}
		pub := publishedTrace(t, w)
		if pub.TraceID() != server.SpanContext().TraceID() || pub.SpanID() != server.SpanContext().SpanID() {
			t.Errorf("the command carries %s/%s, want the server span %s/%s", pub.TraceID(), pub.SpanID(),
				server.SpanContext().TraceID(), server.SpanContext().SpanID())
		}
	})
	t.Run("untraced", func(t *testing.T) {
		t.Parallel()
		w := setup(t, gateway.Config{})
		r := w.post("trace-2", payBody(100, "pm_card_visa"), "traceparent", clientTraceparent)
		wantStatus(t, r, http.StatusAccepted)
		pub := publishedTrace(t, w)
		if pub.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || pub.SpanID().String() != "00f067aa0ba902b7" {
			t.Errorf("without a tracer the command carries %s/%s, want the client's traceparent", pub.TraceID(), pub.SpanID())
		}
	})
}

// TestTraceTree: one payment makes one trace, from the client's traceparent
// through the gateway's POST (server span), the worker's message span, the
// claim with its statements (pgx), the Stripe call (a client span whose
// traceparent reaches Stripe) and the commit with its statements, in that
// order; over Postgres, NATS and the simulator behind the Stripe adapter.
func TestTraceTree(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	w := setup(t, gateway.Config{TracerProvider: tp,
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})})
	w.startWorker()
	r := w.post("tree-1", payBody(100, "pm_card_visa"), "traceparent", clientTraceparent)
	wantStatus(t, r, http.StatusAccepted)
	w.waitStatus("m_a", "tree-1", ledger.StatusCompleted)
	// The message span ends when the message is acked, after the commit.
	w.eventually("message span ended", func() bool { return len(named(exp.GetSpans(), "paydedup.payment")) == 1 })

	spans := exp.GetSpans()
	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range spans {
		if s.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("span %q is in trace %s, want the client's", s.Name, s.SpanContext.TraceID())
		}
		byID[s.SpanContext.SpanID()] = s
	}
	// one returns the one span that pick chooses among the children of parent.
	one := func(what string, parent tracetest.SpanStub, pick func(tracetest.SpanStub) bool) tracetest.SpanStub {
		t.Helper()
		var found []tracetest.SpanStub
		for _, s := range spans {
			if s.Parent.SpanID() == parent.SpanContext.SpanID() && pick(s) {
				found = append(found, s)
			}
		}
		if len(found) != 1 {
			var all []string
			for _, s := range spans {
				all = append(all, fmt.Sprintf("%s(%s kind %s parent %q)", s.Name, s.SpanContext.SpanID(), s.SpanKind, byID[s.Parent.SpanID()].Name))
			}
			t.Fatalf("%s: %d spans under %q, want 1; spans: %s", what, len(found), parent.Name, strings.Join(all, ", "))
		}
		return found[0]
	}
	var client tracetest.SpanStub
	client.SpanContext = trace.NewSpanContext(trace.SpanContextConfig{SpanID: mustSpanID(t, "00f067aa0ba902b7")})
	server := one("gateway POST", client, func(s tracetest.SpanStub) bool {
		return s.SpanKind == trace.SpanKindServer && strings.HasPrefix(s.Name, http.MethodPost)
	})
	msg := one("message", server, func(s tracetest.SpanStub) bool {
		return s.Name == "paydedup.payment" && s.SpanKind == trace.SpanKindConsumer
	})
	claim := one("claim", msg, func(s tracetest.SpanStub) bool { return s.Name == "paydedup.claim" })
	claimBatch := one("claim's statement batch", claim, pgxNamed("batch start"))
	one("claim statement", claimBatch, pgxQuery("INSERT INTO idempotency_keys"))
	call := one("Stripe call", msg, func(s tracetest.SpanStub) bool {
		return s.SpanKind == trace.SpanKindClient && strings.Contains(attr(s, "url.full"), "/v1/payment_intents")
	})
	commit := one("commit", msg, func(s tracetest.SpanStub) bool { return s.Name == "paydedup.commit" })
	commitBatch := one("commit's statement batch", commit, pgxNamed("batch start"))
	one("commit statement", commitBatch, pgxQuery("INSERT INTO payments"))
	for _, step := range []struct {
		before, after tracetest.SpanStub
	}{{claim, call}, {call, commit}} {
		if step.before.EndTime.After(step.after.StartTime) {
			t.Errorf("%q ended at %s, after %q started at %s", step.before.Name, step.before.EndTime, step.after.Name, step.after.StartTime)
		}
	}
	want := fmt.Sprintf("00-%s-%s-01", call.SpanContext.TraceID(), call.SpanContext.SpanID())
	if saw := w.stripeSaw.all(); !slices.Contains(saw, want) {
		t.Errorf("Stripe saw traceparents %q, want %q (the client span's)", saw, want)
	}
}

// named returns the spans called name.
func named(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// fromPgx says whether s is a pgx span (otelpgx).
func fromPgx(s tracetest.SpanStub) bool {
	return s.InstrumentationScope.Name == "github.com/exaring/otelpgx" && s.SpanKind == trace.SpanKindClient
}

// pgxNamed picks the pgx span called name.
func pgxNamed(name string) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool { return fromPgx(s) && s.Name == name }
}

// pgxQuery picks the pgx span of the statement whose text holds sql.
func pgxQuery(sql string) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool { return fromPgx(s) && strings.Contains(attr(s, "db.query.text"), sql) }
}

// attr returns the string attribute key of s ("" when absent).
func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func mustSpanID(t *testing.T, h string) trace.SpanID {
	t.Helper()
	id, err := trace.SpanIDFromHex(h)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
