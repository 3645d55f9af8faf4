package stream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// A payments stream made by an older worker (Limits retention, a max age,
// DiscardOld, no bound) is updated in place on NATS 2.9: no max age,
// DiscardNew, the configured bounds; its commands stay.
func TestEnsureStreamsUpdatesAMaxAgeStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.Streams(t, js).WithDefaults()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: cfg.Name, Subjects: []string{cfg.SubjectPrefix + ".>"}, Storage: jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy, MaxAge: 24 * time.Hour, Duplicates: 2 * time.Minute, Discard: jetstream.DiscardOld,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, cfg.SubjectPrefix+".m_1", body("m_1", "old", 100)); err != nil {
		t.Fatal(err)
	}
	s, _, err := stream.EnsureStreams(ctx, js, cfg)
	if err != nil {
		t.Fatalf("update of a max-age stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if c.MaxAge != 0 || c.Discard != jetstream.DiscardNew || c.MaxBytes != cfg.StreamMaxBytes || c.MaxMsgs != cfg.StreamMaxMsgs {
		t.Errorf("updated stream: max age %v, discard %v, max bytes %d, max msgs %d; want 0, DiscardNew, %d, %d",
			c.MaxAge, c.Discard, c.MaxBytes, c.MaxMsgs, cfg.StreamMaxBytes, cfg.StreamMaxMsgs)
	}
	if info.State.Msgs != 1 {
		t.Errorf("the update left %d messages, want the 1 stored", info.State.Msgs)
	}
	adv, err := js.Stream(ctx, cfg.AdvisoryStream)
	if err != nil {
		t.Fatal(err)
	}
	if a := adv.CachedInfo().Config.MaxAge; a != 0 {
		t.Errorf("advisory stream max age %v, want none: an advisory must outlive the pause that delays its filing", a)
	}
}

// Two workers with different settings start one after the other, in both
// orders: the stream keeps the wider duplicate window and the larger
// bounds, never flipping back; a worker reads the effective window.
func TestEnsureStreamsSettingsDoNotFlap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	base := testenv.Streams(t, js)
	narrow, wide := base, base
	narrow.DuplicateWindow, narrow.StreamMaxBytes, narrow.StreamMaxMsgs = 2*time.Minute, 64<<20, 5000
	wide.DuplicateWindow, wide.StreamMaxBytes, wide.StreamMaxMsgs = 10*time.Minute, 32<<20, 9000
	for i, c := range []stream.Config{narrow, wide, narrow, wide, narrow} {
		s, _, err := stream.EnsureStreams(ctx, js, c)
		if err != nil {
			t.Fatal(err)
		}
		got := s.CachedInfo().Config
		wantDup := 2 * time.Minute
		if i > 0 {
			wantDup = 10 * time.Minute
		}
		wantBytes, wantMsgs := int64(64<<20), int64(5000)
		if i > 0 {
			wantMsgs = 9000
		}
		if got.Duplicates != wantDup || got.MaxBytes != wantBytes || got.MaxMsgs != wantMsgs {
			t.Errorf("start %d: duplicates %v, max bytes %d, max msgs %d; want %v, %d, %d", i, got.Duplicates, got.MaxBytes, got.MaxMsgs, wantDup, wantBytes, wantMsgs)
		}
	}
}

// A full payments stream refuses a command at the door, and the publisher
// says so (a refusal, ErrStreamFull): the client is told it was not
// stored, never that it was accepted; the commands stored stay.
func TestFullStreamRefusesAtTheDoor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.Streams(t, js)
	cfg.StreamMaxMsgs = 3
	cfg = cfg.WithDefaults()
	if _, _, err := stream.EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	pub, err := stream.NewCommandPublisher(js.Conn(), cfg, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cmd := func(key string) *payment.Command {
		return &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	}
	for _, k := range []string{"a", "b", "c"} {
		if _, err := pub.Publish(ctx, cmd(k), nil, 0); err != nil {
			t.Fatalf("publish %s: %v", k, err)
		}
	}
	_, err = pub.Publish(ctx, cmd("d"), nil, 0)
	if !stream.Refused(err) || !errors.Is(err, stream.ErrStreamFull) {
		t.Fatalf("publish to a full stream: %v, want a refusal wrapping ErrStreamFull", err)
	}
	res := pub.PublishBatch(ctx, []stream.BatchCommand{{Cmd: cmd("e")}})
	if err := res[0].Err; !stream.Refused(err) || !errors.Is(err, stream.ErrStreamFull) {
		t.Fatalf("batch publish to a full stream: %v, want a refusal wrapping ErrStreamFull", err)
	}
	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 || info.State.FirstSeq != 1 {
		t.Fatalf("the full stream holds %d messages from %d, want the 3 stored from 1", info.State.Msgs, info.State.FirstSeq)
	}
}

// The publisher of `paydedup publish` counts a full stream's answer as a
// refusal at once (not stored: publish the line again later), not as an
// unknown outcome after retrying it for its whole retry time.
func TestPublisherFullStreamIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.Streams(t, js)
	cfg.StreamMaxMsgs = 1
	cfg = cfg.WithDefaults()
	if _, _, err := stream.EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	pub, err := stream.NewPublisher(js.Conn(), stream.PublisherConfig{Window: 1, Retry: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, k := range []string{"a", "b"} {
		if err := pub.Publish(ctx, stream.CommandMsg(cfg, "m_1", k, body("m_1", k, 100))); err != nil {
			t.Fatal(err)
		}
	}
	st := pub.Close()
	if st.Stored != 1 || st.Refused != 1 || st.Unknown != 0 || time.Since(start) > 10*time.Second {
		t.Fatalf("stats %+v after %v: want 1 stored, 1 refused at once", st, time.Since(start))
	}
}
