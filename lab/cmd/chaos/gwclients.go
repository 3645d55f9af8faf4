package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/paydedup/paydedup/client"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/workload"
)

// The gateway mode (-gateway-clients N): a `paydedup gateway` process in
// the run, reaching NATS through a toxiproxy link of its own (the PubAck
// loss fault, outage.go), and N HTTP clients that each pay their share of
// -gateway-payments over real HTTP with an API key made by `paydedup
// apikey create`, following the documented client contract:
//
//   - 202 and 201 are remembered; 402 and a 4xx with a reason are final;
//   - 503 (any), a timeout or a reset: ask GET /v1/payments/{key} whether
//     it went through, then retry with the same key and body after
//     Retry-After, for at most -client-give-up;
//   - 409 and 429: retry later with the same key and body;
//   - "not accepted" (a problem type ending not-accepted, or 500
//     internal: "nothing was accepted"): pay again under a new key.
//
// Each answer is recorded per key. After the run settles, each client asks
// once more for its accepted payments (GET), and checkPromises judges every
// key against the provider's ledger.

// gwMerchant is the merchant of the clients' payments (the mixed
// workload's are m_0..m_6 and m_bad), so their keys are told apart.
const gwMerchant = "m_gw"

type gatewayRun struct {
	addr    string // the gateway's HTTP address
	apiKey  string
	slot    *slot
	server  *toxiproxy.ApiServer
	links   []*netLink    // gateway → each NATS node
	http    *http.Client  // the clients' transport
	attempt time.Duration // the clients' timeout of one request
	run     string        // makes keys unique to this run

	mu     sync.Mutex
	keys   []*keyLog
	byKey  map[string]*keyLog
	counts map[string]int

	verdict promiseVerdict
	checked bool

	ops        opsLog // the lifecycle's operations (lifecycle.go)
	opsVerdict opsVerdict

	pubAckLosses atomic.Int64
	kills        atomic.Int64
	holding      atomic.Bool // a PubAck loss is on (a kill waits it out)
}

func (h *harness) gatewayOn() bool { return h.cfg.gatewayClients > 0 }

// initGateway makes the merchant's API key and the gateway's NATS link;
// it must run after the migration and before the first workerEnv.
func (h *harness) initGateway(ctx context.Context) error {
	if !h.gatewayOn() {
		return nil
	}
	var out bytes.Buffer
	log, err := os.OpenFile(filepath.Join(h.logs, "apikey.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, h.bin, "apikey", "create", "--merchant", gwMerchant, "--label", "chaos clients")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "DATABASE_URL=" + h.dbURL("postgres", "paydedup")}
	cmd.Stdout, cmd.Stderr = &out, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("paydedup apikey create: %w (see %s)", err, log.Name())
	}
	g := &gatewayRun{
		apiKey: strings.TrimSpace(out.String()), counts: map[string]int{}, byKey: map[string]*keyLog{},
		server:  toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()),
		run:     fmt.Sprintf("gw%x", h.cfg.seed&0xffffff),
		attempt: 10 * time.Second,
		http: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: h.cfg.gatewayClients, IdleConnTimeout: 30 * time.Second,
		}},
	}
	if g.apiKey == "" {
		return fmt.Errorf("paydedup apikey create printed no key (see %s)", log.Name())
	}
	h.gw = g // from here on, stopGateway closes the links made
	upstreams := []string{h.natsAddr}
	if h.cluster != nil {
		upstreams = h.cluster.addrs // the nodes do not advertise each other
	}
	for i, u := range upstreams {
		port, err := localpg.FreePort()
		if err != nil {
			return err
		}
		l := &netLink{name: fmt.Sprintf("gateway-nats-%d", i), addr: fmt.Sprintf("127.0.0.1:%d", port)}
		l.proxy = toxiproxy.NewProxy(g.server, l.name, l.addr, u)
		if err := l.proxy.Start(); err != nil {
			return fmt.Errorf("proxy %s: %w", l.name, err)
		}
		g.links = append(g.links, l)
	}
	port, err := localpg.FreePort()
	if err != nil {
		return err
	}
	g.addr = fmt.Sprintf("127.0.0.1:%d", port)
	return nil
}

// stopGateway closes the gateway's NATS links.
func (h *harness) stopGateway() {
	if h.gw == nil {
		return
	}
	for _, l := range h.gw.links {
		l.proxy.Stop()
	}
}

// gatewayNATSURL is the gateway's NATS_URL: its links, one per node.
func (g *gatewayRun) natsURL() string {
	urls := make([]string, len(g.links))
	for i, l := range g.links {
		urls[i] = "nats://" + l.addr
	}
	return strings.Join(urls, ",")
}

// startGateway starts the gateway process, kept running by a supervisor
// until ctx ends, and waits for it to listen.
func (h *harness) startGateway(ctx context.Context, wg *sync.WaitGroup) error {
	g := h.gw
	env := append(h.workerEnv(),
		"DATABASE_URL="+h.dbURL("paydedup_gateway", "paydedup"),
		"NATS_URL="+g.natsURL(),
		"PAYDEDUP_HTTP_ADDR="+g.addr,
		"PAYDEDUP_PUBLISH_TIMEOUT="+h.cfg.gatewayPublishTimeout.String(),
	)
	g.slot = &slot{proc: h.procs.add(&proc{
		name: "gateway", path: h.bin, args: []string{"gateway"}, env: env,
		log: filepath.Join(h.logs, "gateway.log"),
	})}
	wg.Add(1)
	go func() { defer wg.Done(); h.superviseWorker(ctx, g.slot) }()
	return waitFor(ctx, 30*time.Second, "the gateway to listen", func() bool { return tcpUp(g.addr) })
}

// gwOrder is one payment a client makes (under one or more keys).
type gwOrder struct {
	n        int
	payment  client.Payment
	declines bool
	invalid  bool
	plan     lifePlan // what follows the payment (lifecycle.go)
}

func (h *harness) newOrder(n int) gwOrder {
	rng := rand.New(rand.NewPCG(h.cfg.seed, uint64(n)))
	o := gwOrder{n: n, declines: rng.Float64() < 0.05, invalid: rng.Float64() < 0.02}
	amount := 100 + rng.Int64N(99_900)
	if o.invalid {
		amount = 0 // refused 400 invalid_amount, as the worker would
	}
	pm := "pm_card_visa"
	if o.declines {
		pm = "pm_card_chargeDeclined"
	}
	o.payment = client.Payment{Amount: amount, Currency: "usd", PaymentMethod: pm,
		Description: "chaos gateway client", Metadata: map[string]string{"order_id": strconv.Itoa(n)}}
	if !o.declines && !o.invalid {
		o.plan = drawPlan(rng)
	}
	if o.plan == planAuthCapture || o.plan == planAuthCancel {
		o.payment.CaptureMethod = "manual"
	}
	return o
}

// newClient is one HTTP client of the run: the Go client package, its
// every answer recorded (observe), giving up on a payment after
// -client-give-up.
func (h *harness) newClient() (*client.Client, error) {
	g := h.gw
	return client.New("http://"+g.addr, g.apiKey, client.WithHTTPClient(g.http),
		client.WithAttemptTimeout(g.attempt), client.WithRetryFor(h.cfg.clientGiveUp), client.WithObserver(g.observe))
}

// runClients pays -gateway-payments payments spread evenly over spread,
// from -gateway-clients clients, each paying one at a time; it returns
// when every client is done.
func (h *harness) runClients(ctx context.Context, spread time.Duration) error {
	g := h.gw
	orders := make(chan gwOrder)
	var wg sync.WaitGroup
	for range h.cfg.gatewayClients {
		c, err := h.newClient()
		if err != nil {
			close(orders)
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range orders {
				h.pay(ctx, c, o)
			}
		}()
	}
	start := time.Now()
	for i := range h.cfg.gatewayPayments {
		at := start.Add(spread * time.Duration(i) / time.Duration(h.cfg.gatewayPayments))
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(at)):
		}
		if ctx.Err() != nil {
			break
		}
		orders <- h.newOrder(i)
	}
	close(orders)
	wg.Wait()
	g.ops.wg.Wait()
	g.mu.Lock()
	n := len(g.keys)
	g.mu.Unlock()
	h.logf("gateway clients done: %d payments under %d keys, %d operations on them", h.cfg.gatewayPayments, n, len(g.ops.all))
	return nil
}

// pay makes one payment: under a first key, and under a new one only
// when the client said the last was not accepted.
func (h *harness) pay(ctx context.Context, c *client.Client, o gwOrder) {
	g := h.gw
	deadline := time.Now().Add(h.cfg.clientGiveUp)
	for attempt := 0; ; attempt++ {
		k := &keyLog{order: o.n, key: fmt.Sprintf("%s-o%d-k%d", g.run, o.n, attempt), declines: o.declines, invalid: o.invalid,
			authorize: o.payment.CaptureMethod == "manual"}
		g.mu.Lock()
		g.keys = append(g.keys, k)
		g.byKey[k.key] = k
		g.mu.Unlock()
		t := h.payKey(ctx, c, k, o.payment, deadline)
		if (t == toldCharged || t == toldAccepted) && o.plan != planNone {
			g.ops.wg.Add(1)
			go func() { defer g.ops.wg.Done(); h.lifecycle(ctx, c, o, k.key) }()
		}
		if t != toldNotAccepted || attempt == 4 || time.Now().After(deadline) {
			return
		}
		c.Forget(k.key)
	}
}

// payKey pays p under k with the client (which retries by the contract)
// until it is told how the key stands, the deadline passes or ctx ends;
// it returns what the client was told.
func (h *harness) payKey(ctx context.Context, c *client.Client, k *keyLog, p client.Payment, deadline time.Time) told {
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if h.cfg.clientsNewKeyOn503 {
		k.slip = cancel // the negative control's slip: on a 503 it stops and pays anew
	}
	res, err := c.Create(pctx, k.key, p)
	var prob *client.Problem
	switch {
	case k.slipped:
		return toldNotAccepted // it was not told so
	case err == nil && res.Status == client.StatusSucceeded:
		return toldCharged
	case err == nil && res.Status == client.StatusDeclined:
		return toldRefused
	case err == nil:
		return toldAccepted
	case errors.Is(err, client.ErrNotAccepted) && !errors.Is(err, client.ErrOutcomeUnknown) && ctx.Err() == nil && time.Now().Before(deadline):
		return toldNotAccepted
	case errors.As(err, &prob) && !errors.Is(err, client.ErrOutcomeUnknown) && prob.Status >= 400 && prob.Status < 500:
		return toldRefused // final for the key, with a reason
	}
	k.gaveUp = true
	return toldUnknown
}

// observe records one answer the clients were given, as the client saw
// it, on its key's log.
func (g *gatewayRun) observe(x client.Exchange) {
	a := answer{method: x.Method, status: x.Status, err: x.Err}
	if x.Problem != nil {
		a.problem = x.Problem.Type[strings.LastIndex(x.Problem.Type, ":")+1:]
	}
	if x.Kind != "" {
		if x.Operation != nil {
			a.state = string(x.Operation.Status)
		}
		if g.ops.observeOp(x, a) {
			g.mu.Lock()
			g.counts[x.Kind+" "+a.label()]++
			g.mu.Unlock()
		}
		return
	}
	g.mu.Lock()
	k := g.byKey[x.Key]
	g.mu.Unlock()
	if k == nil {
		return // not a key of the run's clients
	}
	if x.Result != nil {
		a.state = string(x.Result.Status)
	}
	k.answers = append(k.answers, a) // each key is one client's at a time
	g.mu.Lock()
	g.counts[a.label()]++
	g.mu.Unlock()
	if k.slip != nil && a.status == http.StatusServiceUnavailable {
		k.slipped = true
		k.slip()
	}
}

// askFinal asks, once the run has settled, for each payment the client
// was told is accepted and not yet how it ended (Get, which retries while
// the answer is unknown, for a few seconds): as a client would, to learn
// of a decline. A payment still in flight now that the run is quiet is not
// going to end. The clients ask side by side.
func (h *harness) askFinal(ctx context.Context) error {
	g := h.gw
	keys := make(chan *keyLog)
	var wg sync.WaitGroup
	for range h.cfg.gatewayClients {
		c, err := h.newClient()
		if err != nil {
			close(keys)
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range keys {
				gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, _ = c.Get(gctx, k.key) // the answers are recorded by observe
				cancel()
			}
		}()
	}
	for _, k := range g.keys {
		k.slip = nil
		if accepted, charged, refused, notAccepted := k.what(); accepted && !charged && !refused && !notAccepted && !k.authorized() {
			keys <- k
		}
	}
	close(keys)
	wg.Wait()
	return nil
}

// takeGateway moves the gateway's keys out of ev (so the mixed workload's
// verdict judges only its own) and judges them.
func (h *harness) takeGateway(ev *workload.Evidence) {
	g := h.gw
	prefix := gwMerchant + ":"
	charges, rows := map[string]int{}, map[string]string{}
	for key, n := range ev.ChargesByKey {
		if strings.HasPrefix(key, prefix) {
			charges[key] = n
			delete(ev.ChargesByKey, key)
		}
	}
	for key, r := range ev.Rows {
		if strings.HasPrefix(key, prefix) {
			rows[key] = r.Status
			delete(ev.Rows, key)
		}
	}
	ev.Charges = slices.DeleteFunc(ev.Charges, func(c workload.Charge) bool { return strings.HasPrefix(c.Key, prefix) })
	dls := 0
	reasons := map[string][]string{}
	ev.DeadLetters = slices.DeleteFunc(ev.DeadLetters, func(d workload.DeadLetter) bool {
		ours := strings.HasPrefix(d.Key, prefix)
		if ours {
			dls++
			reasons[d.Key] = append(reasons[d.Key], d.Reason)
		}
		return ours
	})
	for _, k := range g.keys {
		k.deadLetters = reasons[prefix+k.key]
	}
	g.verdict, g.checked = checkPromises(gwMerchant, g.keys, charges, rows), true
	h.logf("gateway: %d dead letters of the clients' keys", dls)
}

// reportGateway prints the promise violations and the figures of the
// gateway mode; it returns whether every promise held.
func (h *harness) reportGateway() bool {
	g := h.gw
	if g == nil {
		return true
	}
	if !g.checked {
		fmt.Fprintln(h.out, "chaos: VIOLATION promise: the clients' promises were not checked")
		return false
	}
	v := g.verdict
	for i, b := range v.broken {
		if i == 50 {
			fmt.Fprintf(h.out, "chaos: VIOLATION promise: … and %d more\n", len(v.broken)-50)
			break
		}
		fmt.Fprintf(h.out, "chaos: VIOLATION promise: %s\n", b)
	}
	labels := make([]string, 0, len(g.counts))
	for l := range g.counts {
		labels = append(labels, l)
	}
	slices.Sort(labels)
	parts := make([]string, len(labels))
	for i, l := range labels {
		parts[i] = fmt.Sprintf("%q=%d", l, g.counts[l])
	}
	fmt.Fprintf(h.out, "chaos: gateway answers: %s\n", strings.Join(parts, " "))
	fmt.Fprintf(h.out, "chaos: gateway promises: payments=%d keys=%d accepted=%d told_charged=%d refused=%d not_accepted=%d unknown=%d charged_once=%d broken=%d\n",
		v.orders, v.keys, v.accepted, v.charged, v.refused, v.notAccept, v.unknown, v.chargedOnce, len(v.broken))
	opsOK := h.reportOps()
	return v.ok() && opsOK
}

// gatewayKillLoop kills the gateway (-9) -gateway-kills times, spread
// over the first 80 % of the phase, between the PubAck losses; its
// supervisor starts it again.
func (h *harness) gatewayKillLoop(ctx context.Context) {
	if h.gw == nil || h.cfg.gatewayKills <= 0 {
		return
	}
	start := time.Now()
	for i := range h.cfg.gatewayKills {
		at := start.Add(h.cfg.duration * 8 / 10 * time.Duration(4*i+3) / time.Duration(4*h.cfg.gatewayKills))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		select {
		case <-h.gw.slot.proc.exited():
			continue // down already
		default:
		}
		// A kill while Postgres or NATS is down, or PubAcks are held back,
		// would blur the faults: wait them out (at most 20 s).
		_ = waitFor(ctx, 20*time.Second, "the services", func() bool { return h.restarting.Load() == 0 && !h.gw.holding.Load() })
		h.logf("gateway: kill -9")
		h.gw.slot.proc.kill()
		h.gw.kills.Add(1)
	}
}

func (h *harness) pubAckSummary() string {
	if h.gw == nil {
		return ""
	}
	return fmt.Sprintf(" puback_losses=%d gateway_kills=%d", h.gw.pubAckLosses.Load(), h.gw.kills.Load())
}

func (h *harness) gatewaySummary() string {
	if h.gw == nil {
		return ""
	}
	return fmt.Sprintf(" gateway_keys=%d promises_broken=%d", h.gw.verdict.keys, len(h.gw.verdict.broken)) + h.gw.opsVerdict.summary() + h.pubAckSummary()
}
