// Package shipbench measures the worker as it is deployed: the paydedup
// binary's own `worker` command in its own process, with its defaults,
// against a NATS server and a provider in processes of their own, over
// TCP, draining a backlog published by the binary's `publish` command. Its
// CPU per payment is read from /proc for each process apart: the worker,
// its PostgreSQL backends, the simulator standing in for Stripe and the
// NATS server.
package shipbench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/procstat"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/stream"
)

// Providers the worker can be measured with.
const (
	// ProviderStripe is the Stripe adapter (stripe-go over HTTP) calling
	// `paydedup provider-sim` in its own process: what production runs,
	// with the simulator's CPU counted apart, as Stripe's would be.
	ProviderStripe = "stripe"
	// ProviderStripeTLS is ProviderStripe over HTTPS: provider-sim serves
	// TLS with a certificate made for the run, and the worker, trusting it
	// through SSL_CERT_FILE, speaks HTTP/2 to it as it does to
	// api.stripe.com. The worker's TLS and HTTP/2 CPU is counted as its own.
	ProviderStripeTLS = "stripe-tls"
	// ProviderSim is PAYDEDUP_PROVIDER=sim: the adapter calling a
	// simulator served inside the worker's own process, whose CPU then
	// counts as the worker's.
	ProviderSim = "sim"
)

func validProvider(p string) bool {
	return p == ProviderStripeTLS || p == ProviderStripe || p == ProviderSim
}

func providerError(p string) error {
	return fmt.Errorf("--provider must be %s, %s or %s, got %q", ProviderStripeTLS, ProviderStripe, ProviderSim, p)
}

// Database is the database the runs' schemas are made in when no
// DATABASE_URL is given, the in-process bench's.
const Database = "paydedup_bench"

// Setup is what every run of the shipped binary shares: the binary, the
// provider, where NATS and PostgreSQL are, and where the report goes.
type Setup struct {
	Binary   string // the paydedup executable to run
	Provider string // ProviderStripeTLS, ProviderStripe or ProviderSim
	// NATSURL is the NATS server; empty starts nats-server from PATH on a
	// free loopback port, whose CPU is then measured too.
	NATSURL     string
	DatabaseURL string // a database to make the run's schema in; empty: AdminURL's server
	AdminURL    string // the local server's superuser URL (localpg.Find)
	Timeout     time.Duration
	JSON        bool
	Out, ErrOut io.Writer
}

// Config is one run of bench shipped.
type Config struct {
	Setup
	Payments  int      // distinct payments published, then drained
	WorkerEnv []string // KEY=VALUE settings for the worker beyond its defaults
}

// Validate names the first bad setting.
func (c Config) Validate() error {
	switch {
	case c.Payments < 1:
		return fmt.Errorf("--payments must be at least 1, got %d", c.Payments)
	case !validProvider(c.Provider):
		return providerError(c.Provider)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, got %s", c.Timeout)
	}
	return validWorkerEnv(c.WorkerEnv)
}

// validWorkerEnv names the first --worker-env setting that is not KEY=VALUE.
func validWorkerEnv(env []string) error {
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("--worker-env %q is not KEY=VALUE", kv)
		}
	}
	return nil
}

// Result is one run's figures. A CPU figure is -1 where it could not be
// read (a server on another machine).
type Result struct {
	Mode                  string   `json:"mode"`
	Provider              string   `json:"provider"`
	WorkerEnv             []string `json:"worker_env,omitempty"`
	Payments              int      `json:"payments"`
	Seconds               float64  `json:"seconds"`
	PaymentsPerSec        float64  `json:"payments_per_sec"`
	WorkerCPUUSPerPayment float64  `json:"worker_cpu_us_per_payment"`
	WorkerCores           float64  `json:"worker_cores"`
	WorkerRSSMB           float64  `json:"worker_rss_mb"`
	PGCPUUSPerPayment     float64  `json:"pg_cpu_us_per_payment"`
	PGBackends            int      `json:"pg_backends"`
	// PGServerCPUUSPerPayment is the whole PostgreSQL server's CPU over
	// the drain, per payment: the worker's backends, the background
	// workers (autovacuum, the WAL writer, the checkpointer) and the
	// bench's own observer, and whatever else the server ran meanwhile
	// (so it is the deployment's figure only on a server the run has to
	// itself). -1 when the server is not on this machine.
	PGServerCPUUSPerPayment float64 `json:"pg_server_cpu_us_per_payment"`
	SimCPUUSPerPayment      float64 `json:"sim_cpu_us_per_payment"`
	NATSCPUUSPerPayment     float64 `json:"nats_cpu_us_per_payment"`
	// The worker's mean batches, from its own /metrics: messages per claim
	// statement, and completions per group commit (-1: not read).
	ClaimBatchMean  float64 `json:"claim_batch_mean"`
	CommitBatchMean float64 `json:"commit_batch_mean"`
	DoubleCharges   int     `json:"double_charges"` // -1: the simulator's ledger is inside the worker (ProviderSim)
	Lost            int     `json:"lost"`
}

// Run runs one measurement and prints it.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	r := &run{cfg: cfg, say: func(format string, args ...any) { fmt.Fprintf(cfg.ErrOut, "bench shipped: "+format+"\n", args...) }}
	defer r.cleanup()
	res, err := r.measure(ctx)
	if err != nil {
		return res, fmt.Errorf("bench shipped: %w", err)
	}
	r.report(res)
	if res.DoubleCharges > 0 || res.Lost > 0 {
		return res, fmt.Errorf("bench shipped: %d double charges, %d lost payments", res.DoubleCharges, res.Lost)
	}
	return res, nil
}

// run is one measurement's state; cleanup undoes what it set up, in reverse.
type run struct {
	cfg      Config
	say      func(string, ...any)
	cleanups []func()
	tmp      string
	simHTTP  *http.Client // reads provider-sim's ledger (trusting its certificate with ProviderStripeTLS)
}

func (r *run) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func (r *run) defer_(f func()) { r.cleanups = append(r.cleanups, f) }

func (r *run) measure(ctx context.Context) (Result, error) {
	res := Result{Mode: "shipped", Provider: r.cfg.Provider, WorkerEnv: r.cfg.WorkerEnv, Payments: r.cfg.Payments,
		NATSCPUUSPerPayment: -1, SimCPUUSPerPayment: -1, PGCPUUSPerPayment: -1, PGServerCPUUSPerPayment: -1}
	w, err := r.setUp(ctx, "paydedup-shipbench-")
	if err != nil {
		return res, err
	}
	suffix, natsPID, dbURL, observer, scfg, env := w.suffix, w.natsPID, w.dbURL, w.observer, w.scfg, w.env
	r.say("publishing %d payments with `paydedup publish --generate` to %s", r.cfg.Payments, scfg.Name)
	if err := r.exec(ctx, "publish", env, "publish", "--generate", fmt.Sprint(r.cfg.Payments), "--merchant", "m_bench"); err != nil {
		return res, err
	}

	simURL, simPID, provEnv, err := r.provider(ctx, nil)
	if err != nil {
		return res, err
	}
	env = append(env, provEnv...)
	appName := "paydedup-shipbench-" + suffix
	workerURL, err := localpg.WithAppName(dbURL, appName)
	if err != nil {
		return res, err
	}
	// The admin listener is on, as the deploy tree has it (its probes and
	// Prometheus need it): the bench reads the worker's batches there.
	adminAddr := adminAddrOf(r.cfg.WorkerEnv)
	if adminAddr == "" {
		port, err := freePort()
		if err != nil {
			return res, err
		}
		adminAddr = fmt.Sprintf("127.0.0.1:%d", port)
		env = append(env, "PAYDEDUP_ADMIN_ADDR="+adminAddr)
	}
	env = append(append(env, "DATABASE_URL="+workerURL), r.cfg.WorkerEnv...)

	server, serverErr := localpg.MeterServer(ctx, dbURL)
	if serverErr != nil {
		r.say("the PostgreSQL server's own CPU is not reported: %v", serverErr)
	}
	simCPU0, natsCPU0 := cpuOf(simPID), cpuOf(natsPID)
	server0, server0Err := server.CPU()
	r.say("draining with `paydedup worker` (provider %s)", r.cfg.Provider)
	start := time.Now()
	worker, err := r.start(ctx, "worker", env, "worker")
	if err != nil {
		return res, err
	}
	settled, err := waitSettled(ctx, observer, r.cfg.Payments, worker)
	elapsed := time.Since(start)
	workerCPU := cpuOf(worker.Process.Pid)
	res.WorkerRSSMB = procstat.PIDPeakRSSMB(worker.Process.Pid)
	pgCPU, backends := backendsCPU(ctx, observer, appName)
	simCPU, natsCPU := cpuOf(simPID), cpuOf(natsPID)
	server1, server1Err := server.CPU()
	if err != nil {
		return res, fmt.Errorf("%w (%d of %d settled; the worker's log: %s)", err, settled, r.cfg.Payments, filepath.Join(r.tmp, "worker.log"))
	}
	n := float64(r.cfg.Payments)
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	res.Seconds = elapsed.Seconds()
	res.PaymentsPerSec = n / elapsed.Seconds()
	res.WorkerCPUUSPerPayment = us(workerCPU)
	res.WorkerCores = workerCPU.Seconds() / elapsed.Seconds()
	if backends > 0 {
		res.PGCPUUSPerPayment, res.PGBackends = us(pgCPU), backends
	}
	if serverErr == nil && server0Err == nil && server1Err == nil {
		res.PGServerCPUUSPerPayment = us(server1 - server0)
	}
	if simPID != 0 {
		res.SimCPUUSPerPayment = us(simCPU - simCPU0)
	}
	if natsPID != 0 {
		res.NATSCPUUSPerPayment = us(natsCPU - natsCPU0)
	}
	res.ClaimBatchMean, res.CommitBatchMean = -1, -1
	if claim, commit, err := workerBatches(ctx, adminAddr); err == nil {
		res.ClaimBatchMean, res.CommitBatchMean = claim, commit
	} else {
		r.say("the worker's batches are not reported: %v", err)
	}
	res.Lost = r.cfg.Payments - settled
	res.DoubleCharges = -1
	if simURL != "" {
		if res.DoubleCharges, err = r.doubles(ctx, simURL); err != nil {
			return res, err
		}
	}
	return res, nil
}

// streamConfig is the run's own streams, named after its suffix.
// world is what every bench sets up before it starts paydedup's
// processes: NATS, a database with the schema migrated, the streams, and
// the environment every process gets (without DATABASE_URL).
type world struct {
	suffix   string
	natsURL  string
	natsPID  int // 0 when the bench uses a NATS it did not start
	dbURL    string
	observer *localpg.Observer
	scfg     stream.Config
	env      []string
}

// setUp makes a scratch directory (removed at cleanup) named after
// tmpPrefix, then the world.
func (r *run) setUp(ctx context.Context, tmpPrefix string) (world, error) {
	var w world
	tmp, err := os.MkdirTemp("", tmpPrefix)
	if err != nil {
		return w, err
	}
	r.tmp = tmp
	r.defer_(func() { _ = os.RemoveAll(tmp) })
	w.suffix = procstat.RunSuffix()
	if w.natsURL, w.natsPID, err = r.nats(ctx); err != nil {
		return w, err
	}
	if w.dbURL, w.observer, err = r.database(ctx, w.suffix); err != nil {
		return w, err
	}
	w.scfg = streamConfig(w.suffix)
	if err := r.streams(ctx, w.natsURL, w.scfg); err != nil {
		return w, err
	}
	w.env = commonEnv(w.natsURL, w.scfg)
	if err := r.exec(ctx, "migrate", append(w.env, "DATABASE_URL="+w.dbURL), "migrate", "up"); err != nil {
		return w, err
	}
	return w, nil
}

func streamConfig(suffix string) stream.Config {
	return stream.Config{
		Name: "SHIP_" + suffix, SubjectPrefix: "ship." + suffix + ".requests",
		DLQStream: "SHIP_" + suffix + "_DLQ", DLQPrefix: "ship." + suffix + ".dlq", Durable: "paydedup-worker",
	}.WithDefaults()
}

// commonEnv is what each of the binary's commands is given: the NATS
// server, a fresh dead-letter key and the run's streams.
func commonEnv(natsURL string, scfg stream.Config) []string {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return []string{
		"NATS_URL=" + natsURL, "PAYDEDUP_DLQ_KEY=" + hex.EncodeToString(key),
		"PAYDEDUP_STREAM=" + scfg.Name, "PAYDEDUP_SUBJECT_PREFIX=" + scfg.SubjectPrefix,
		"PAYDEDUP_DLQ_STREAM=" + scfg.DLQStream, "PAYDEDUP_DLQ_PREFIX=" + scfg.DLQPrefix, "PAYDEDUP_DURABLE=" + scfg.Durable,
	}
}

// provider starts what cfg.Provider needs (provider-sim for stripe, with
// simArgs added to its flags) and returns the simulator's URL and pid
// (empty for sim) and the worker's settings for it.
func (r *run) provider(ctx context.Context, simArgs []string) (string, int, []string, error) {
	if r.cfg.Provider == ProviderSim {
		return "", 0, []string{"PAYDEDUP_PROVIDER=sim"}, nil
	}
	env := []string{"PAYDEDUP_PROVIDER=stripe", "STRIPE_SECRET_KEY=sk_test_paydedup_shipbench"}
	args := append([]string{"provider-sim", "--addr", "127.0.0.1:0", "--log-level", "warn"}, simArgs...)
	r.simHTTP = http.DefaultClient
	if r.cfg.Provider == ProviderStripeTLS {
		cert, key, client, err := selfSigned(r.tmp)
		if err != nil {
			return "", 0, nil, fmt.Errorf("make provider-sim's certificate: %w", err)
		}
		args = append(args, "--tls-cert", cert, "--tls-key", key)
		env = append(env, "SSL_CERT_FILE="+cert)
		r.simHTTP = client
		r.defer_(client.CloseIdleConnections)
	}
	simURL, simPID, err := r.providerSim(ctx, args)
	if err != nil {
		return "", 0, nil, err
	}
	return simURL, simPID, append(env, "STRIPE_API_BASE="+simURL), nil
}

// nats returns the NATS server's URL, and its pid when this run started it.
func (r *run) nats(ctx context.Context) (string, int, error) {
	if r.cfg.NATSURL != "" {
		return r.cfg.NATSURL, 0, nil
	}
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		return "", 0, errors.New("no NATS_URL and no nats-server on PATH: set NATS_URL or install nats-server")
	}
	port, err := freePort()
	if err != nil {
		return "", 0, err
	}
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", filepath.Join(r.tmp, "js"))
	if err := r.spawn(cmd, "nats-server"); err != nil {
		return "", 0, err
	}
	u := fmt.Sprintf("nats://127.0.0.1:%d", port)
	for ctx.Err() == nil {
		if nc, err := nats.Connect(u); err == nil {
			nc.Close()
			r.say("NATS: nats-server %s in its own process", u)
			return u, cmd.Process.Pid, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", 0, fmt.Errorf("nats-server did not answer on %s: %w", u, ctx.Err())
}

// database makes the run's schema and returns its URL for the binary's
// commands (without the lab's pool size, so the worker sizes its own pool)
// and a pool to watch it with.
func (r *run) database(ctx context.Context, suffix string) (string, *localpg.Observer, error) {
	dbURL := r.cfg.DatabaseURL
	if dbURL == "" {
		srv, err := localpg.Find(ctx, r.cfg.AdminURL)
		if err != nil {
			return "", nil, err
		}
		r.defer_(srv.Close)
		r.say("PostgreSQL: %s", srv.Where)
		if dbURL, _, err = localpg.Database(ctx, srv.AdminURL, Database, 2); err != nil {
			return "", nil, err
		}
	}
	schemaURL, drop, err := localpg.FreshSchema(ctx, dbURL, "ship_"+suffix)
	if err != nil {
		return "", nil, err
	}
	r.defer_(func() { _ = drop() })
	u, err := url.Parse(schemaURL)
	if err != nil {
		return "", nil, err
	}
	q := u.Query()
	q.Del("pool_max_conns")
	u.RawQuery = q.Encode()
	observerURL, err := localpg.WithAppName(u.String(), "paydedup-shipbench-observer")
	if err != nil {
		return "", nil, err
	}
	obs, err := localpg.Observe(ctx, observerURL)
	if err != nil {
		return "", nil, err
	}
	r.defer_(obs.Close)
	return u.String(), obs, nil
}

// streams creates the run's streams as the worker would, so the backlog can
// be published before the worker starts; they are deleted at the end.
func (r *run) streams(ctx context.Context, natsURL string, cfg stream.Config) error {
	nc, err := nats.Connect(natsURL, nats.Name("paydedup-shipbench"))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", natsURL, err)
	}
	r.defer_(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, _, err := stream.EnsureStreams(ctx, js, cfg); err != nil {
		return err
	}
	r.defer_(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{cfg.Name, cfg.DLQStream, cfg.AdvisoryStream} {
			_ = js.DeleteStream(cctx, s)
		}
	})
	return nil
}

// providerSim starts `paydedup provider-sim` with args (a free port).
func (r *run) providerSim(ctx context.Context, args []string) (string, int, error) {
	cmd := exec.Command(r.cfg.Binary, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, err
	}
	if err := r.spawn(cmd, "provider-sim"); err != nil {
		return "", 0, err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if _, u, ok := strings.Cut(sc.Text(), "listening on "); ok {
				found <- strings.TrimSpace(u)
			}
		}
	}()
	select {
	case u := <-found:
		r.say("provider: the Stripe adapter calling `paydedup provider-sim` at %s in its own process", u)
		return u, cmd.Process.Pid, nil
	case <-time.After(15 * time.Second):
		return "", 0, errors.New("provider-sim did not say where it listens within 15s")
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
}

// exec runs one of the binary's commands to its end.
func (r *run) exec(ctx context.Context, name string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, r.cfg.Binary, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("paydedup %s: %w\n%s", name, err, tail(out))
	}
	return nil
}

// start starts one of the binary's commands, its output to a log file; it
// is stopped with SIGTERM at the end.
func (r *run) start(ctx context.Context, name string, env []string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(r.cfg.Binary, args...)
	cmd.Env = append(os.Environ(), env...)
	log, err := os.Create(filepath.Join(r.tmp, name+".log"))
	if err != nil {
		return nil, err
	}
	r.defer_(func() { _ = log.Close() })
	cmd.Stdout, cmd.Stderr = log, log
	if err := r.spawn(cmd, name); err != nil {
		return nil, err
	}
	return cmd, ctx.Err()
}

// spawn starts cmd and registers its stop: SIGTERM, then SIGKILL after 30s.
func (r *run) spawn(cmd *exec.Cmd, name string) error {
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.defer_(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return nil
}

// waitSettled polls the ledger until n payments are settled (succeeded or
// declined), the worker exits or ctx ends, and returns how many settled.
func waitSettled(ctx context.Context, obs *localpg.Observer, n int, worker *exec.Cmd) (int, error) {
	return waitCount(ctx, obs, n, worker, 50*time.Millisecond, "settled payments", obs.Settled)
}

// waitCount polls count (of what) every tick until it reaches n, the worker exits or
// ctx ends, and returns the last count. The observer shares the machine
// with what it measures, and count scans a table that grows with the run:
// polled every tick it took a tenth of a core from a run on two. So the
// ledger's ids (a page of its sequence, a bound on every count here) are
// read each tick, and count runs only once they reach n, and every 20th
// tick regardless, so that the poll never depends on the bound alone.
func waitCount(ctx context.Context, obs *localpg.Observer, n int, worker *exec.Cmd, every time.Duration,
	what string, count func(context.Context) (int, error)) (int, error) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	got := 0
	for i := 0; ; i++ {
		ids, err := obs.LedgerIDs(ctx)
		if err == nil && (ids >= int64(n) || i%20 == 0) {
			got, err = count(ctx)
		}
		if err != nil && ctx.Err() == nil {
			return got, fmt.Errorf("count %s: %w", what, err)
		}
		if got >= n {
			return got, nil
		}
		if !alive(worker.Process.Pid) {
			return got, errors.New("the worker exited before the backlog was drained")
		}
		select {
		case <-ctx.Done():
			return got, fmt.Errorf("backlog not drained: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// backendsCPU is the CPU time of the PostgreSQL backends whose
// application_name is app, and how many there are; 0 backends when they
// cannot be read (another machine).
func backendsCPU(ctx context.Context, obs *localpg.Observer, app string) (time.Duration, int) {
	pids, err := obs.BackendPIDs(ctx, app)
	if err != nil {
		return 0, 0
	}
	var total time.Duration
	for _, pid := range pids {
		d, ok := procstat.PIDCPU(pid)
		if !ok {
			return 0, 0
		}
		total += d
	}
	return total, len(pids)
}

// doubles reads the simulator's ledger and counts the keys charged more
// than once.
func (r *run) doubles(ctx context.Context, simURL string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, simURL+"/_sim/ledger", nil)
	if err != nil {
		return 0, err
	}
	resp, err := r.simHTTP.Do(req)
	if err != nil {
		return 0, fmt.Errorf("read the simulator's ledger: %w", err)
	}
	defer resp.Body.Close()
	var l stripesim.Ledger
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return 0, fmt.Errorf("read the simulator's ledger: %w", err)
	}
	n := 0
	for _, c := range l.ChargesByKey {
		if c > 1 {
			n++
		}
	}
	return n, nil
}

func (r *run) report(res Result) {
	out := r.cfg.Out
	fmt.Fprintf(out, "paydedup worker (its own process, defaults%s), provider %s\n", envNote(res.WorkerEnv), res.Provider)
	fmt.Fprintf(out, "  %d payments in %.2fs: %.0f payments/s\n", res.Payments, res.Seconds, res.PaymentsPerSec)
	fmt.Fprintf(out, "  CPU per payment: worker %.0f µs (%.2f cores, peak RSS %.0f MiB), PostgreSQL %s, provider-sim %s, nats-server %s\n",
		res.WorkerCPUUSPerPayment, res.WorkerCores, res.WorkerRSSMB, figure(res.PGCPUUSPerPayment), figure(res.SimCPUUSPerPayment), figure(res.NATSCPUUSPerPayment))
	if res.PGServerCPUUSPerPayment >= 0 {
		fmt.Fprintf(out, "  the whole PostgreSQL server over the drain (background workers included): %.0f µs per payment\n", res.PGServerCPUUSPerPayment)
	}
	if res.ClaimBatchMean >= 0 {
		fmt.Fprintf(out, "  the worker's batches: %.1f messages per claim, %.1f completions per group commit\n", res.ClaimBatchMean, res.CommitBatchMean)
	}
	dbl := fmt.Sprint(res.DoubleCharges)
	if res.DoubleCharges < 0 {
		dbl = "not checked (the simulator is inside the worker)"
	}
	fmt.Fprintf(out, "  double charges %s, lost %d\n", dbl, res.Lost)
	if r.cfg.JSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(out, string(b))
	}
}

func envNote(env []string) string {
	if len(env) == 0 {
		return ""
	}
	return " with " + strings.Join(env, " ")
}

func figure(us float64) string {
	if us < 0 {
		return "not measured"
	}
	return fmt.Sprintf("%.0f µs", us)
}

func cpuOf(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	d, _ := procstat.PIDCPU(pid)
	return d
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// adminAddrOf is the PAYDEDUP_ADMIN_ADDR among env (the last one wins, as
// in the worker's environment), or "".
func adminAddrOf(env []string) string {
	addr := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PAYDEDUP_ADMIN_ADDR="); ok {
			addr = v
		}
	}
	return addr
}

// workerBatches reads the worker's /metrics at addr: the messages it
// settled per claim statement (paydedup_messages_total over
// paydedup_claim_duration_seconds' count) and the completions per group
// commit (paydedup_complete_batch_size's mean).
func workerBatches(ctx context.Context, addr string) (claim, commit float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, fmt.Errorf("GET %s/metrics: %w", addr, err)
	}
	var messages float64
	for _, m := range families["paydedup_messages_total"].GetMetric() {
		messages += m.GetCounter().GetValue()
	}
	var claims, commits, completions float64
	for _, m := range families["paydedup_claim_duration_seconds"].GetMetric() {
		claims += float64(m.GetHistogram().GetSampleCount())
	}
	for _, m := range families["paydedup_complete_batch_size"].GetMetric() {
		commits += float64(m.GetHistogram().GetSampleCount())
		completions += m.GetHistogram().GetSampleSum()
	}
	if claims == 0 || commits == 0 {
		return 0, 0, fmt.Errorf("GET %s/metrics: %v claims and %v group commits counted", addr, claims, commits)
	}
	return messages / claims, completions / commits, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail is the last lines of a command's output, for an error.
func tail(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}
