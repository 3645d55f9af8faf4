package shipbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/procstat"
)

// Door bench defaults.
const (
	DefaultDoorSeconds     = 10
	DefaultDoorConnections = 128
	DefaultDoorThreads     = 2
	// DoorMerchant is the merchant the run's API key acts for.
	DoorMerchant = "m_bench"
)

// ErrNoWrk is returned when wrk is not on PATH.
var ErrNoWrk = errors.New("wrk is not on PATH: install Debian's wrk (apt-get install -y wrk) or run make bench-door")

// DoorConfig is one run of the door bench.
type DoorConfig struct {
	Setup
	Seconds     int // length of each wrk phase
	Connections int // wrk -c
	Threads     int // wrk -t
}

// Validate names the first bad setting.
func (c DoorConfig) Validate() error {
	switch {
	case c.Seconds < 1:
		return fmt.Errorf("--seconds must be at least 1, got %d", c.Seconds)
	case c.Threads < 1:
		return fmt.Errorf("--threads must be at least 1, got %d", c.Threads)
	case c.Connections < c.Threads:
		return fmt.Errorf("--connections must be at least --threads (%d), got %d", c.Threads, c.Connections)
	case !validProvider(c.Provider):
		return providerError(c.Provider)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, got %s", c.Timeout)
	}
	return nil
}

// DoorResult is one run's figures. A CPU figure is -1 where it could not
// be read.
type DoorResult struct {
	Mode        string `json:"mode"`
	Provider    string `json:"provider"`
	Connections int    `json:"connections"`
	Threads     int    `json:"threads"`

	// Phase "door": wrk against the gateway, no worker.
	DoorSeconds         float64 `json:"door_seconds"`
	DoorRequests        int     `json:"door_requests"`
	DoorAccepted        int     `json:"door_accepted"`
	DoorNon202          int     `json:"door_non_202"`
	DoorSocketErrors    int     `json:"door_socket_errors"`
	DoorAcceptedPerSec  float64 `json:"door_accepted_per_sec"`
	DoorP50US           float64 `json:"door_p50_us"`
	DoorP99US           float64 `json:"door_p99_us"`
	DoorMaxUS           float64 `json:"door_max_us"`
	GatewayCPUUSPerPOST float64 `json:"gateway_cpu_us_per_post"`
	GatewayCores        float64 `json:"gateway_cores"`
	GatewayRSSMB        float64 `json:"gateway_rss_mb"`
	PGCPUUSPerPOST      float64 `json:"pg_cpu_us_per_post"`

	// Phase "worker": the worker drains the door's backlog.
	WorkerPayments       int     `json:"worker_payments"`
	WorkerSeconds        float64 `json:"worker_seconds"`
	WorkerPaymentsPerSec float64 `json:"worker_payments_per_sec"`
	// DoorOverWorker is door_accepted_per_sec / worker_payments_per_sec.
	DoorOverWorker float64 `json:"door_over_worker"`
	// CPU per payment drained, by process: the worker, its PostgreSQL
	// backends, and the idle gateway, which hears every completion of a
	// key it took in (dedup.CompletedChannel). provider-sim's is
	// sim_cpu_us_per_payment (-1 with ProviderSim).
	WorkerCPUUSPerPayment          float64 `json:"worker_cpu_us_per_payment"`
	WorkerPGCPUUSPerPayment        float64 `json:"worker_pg_cpu_us_per_payment"`
	GatewayCPUUSPerPaymentDraining float64 `json:"gateway_cpu_us_per_payment_draining"`
	SimCPUUSPerPayment             float64 `json:"sim_cpu_us_per_payment"`

	// Phase "post-to-charged": wrk again with the worker running.
	P2CRequests        int     `json:"p2c_requests"`
	P2CAccepted        int     `json:"p2c_accepted"`
	P2CNon202          int     `json:"p2c_non_202"`
	P2CPOSTP99US       float64 `json:"p2c_post_p99_us"`
	P2CCompleted       int     `json:"p2c_completed"`
	P2CSeconds         float64 `json:"p2c_seconds"`
	ChargedPerSec      float64 `json:"charged_per_sec"`
	POSTToChargedP50MS float64 `json:"post_to_charged_p50_ms"`
	POSTToChargedP99MS float64 `json:"post_to_charged_p99_ms"`

	DoubleCharges int `json:"double_charges"` // -1: the ledger is inside the worker (ProviderSim)
	Lost          int `json:"lost"`           // 202s whose payment did not complete
}

// doorLua is the wrk script: a POST /v1/payments with a fresh
// Idempotency-Key (prefix, thread id, counter) each request, responses
// counted by status per thread, and one JSON line in done(). Its arguments
// (after --) are the key prefix and the API key.
const doorLua = `
local threads = {}
local nthreads = 0

function setup(thread)
  nthreads = nthreads + 1
  thread:set("id", nthreads)
  table.insert(threads, thread)
end

function init(args)
  prefix = args[1]
  counter = 0
  accepted = 0
  other = 0
  wrk.method = "POST"
  wrk.headers["Authorization"] = "Bearer " .. args[2]
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = '{"amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"bench door"}'
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = prefix .. "-" .. id .. "-" .. counter
  return wrk.format()
end

function response(status, headers, body)
  if status == 202 then
    accepted = accepted + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local a, o = 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("accepted")
    o = o + t:get("other")
  end
  local e = summary.errors
  io.write(string.format('paydedup-door {"requests":%d,"duration_us":%d,"accepted":%d,"non_202":%d,"socket_errors":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, a, o, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
`

// wrkReport is the script's done() line.
type wrkReport struct {
	Requests     int     `json:"requests"`
	DurationUS   float64 `json:"duration_us"`
	Accepted     int     `json:"accepted"`
	Non202       int     `json:"non_202"`
	SocketErrors int     `json:"socket_errors"`
	P50US        float64 `json:"p50_us"`
	P99US        float64 `json:"p99_us"`
	MaxUS        float64 `json:"max_us"`
}

// RunDoor runs the door bench and prints it.
func RunDoor(ctx context.Context, cfg DoorConfig) (DoorResult, error) {
	if err := cfg.Validate(); err != nil {
		return DoorResult{}, err
	}
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		return DoorResult{}, fmt.Errorf("bench door: %w", ErrNoWrk)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	r := &run{
		cfg: Config{Setup: cfg.Setup},
		say: func(format string, args ...any) { fmt.Fprintf(cfg.ErrOut, "bench door: "+format+"\n", args...) },
	}
	defer r.cleanup()
	d := &door{run: r, dcfg: cfg, wrk: wrk}
	res, err := d.measure(ctx)
	if err != nil {
		return res, fmt.Errorf("bench door: %w", err)
	}
	d.report(res)
	if res.DoubleCharges > 0 || res.Lost > 0 {
		return res, fmt.Errorf("bench door: %d double charges, %d lost payments", res.DoubleCharges, res.Lost)
	}
	return res, nil
}

type door struct {
	*run
	dcfg   DoorConfig
	wrk    string
	script string
	apiKey string
	url    string
	obs    *localpg.Observer
}

func (d *door) measure(ctx context.Context) (DoorResult, error) {
	res := DoorResult{Mode: "door", Provider: d.dcfg.Provider, Connections: d.dcfg.Connections, Threads: d.dcfg.Threads,
		GatewayCPUUSPerPOST: -1, PGCPUUSPerPOST: -1, DoubleCharges: -1,
		WorkerCPUUSPerPayment: -1, WorkerPGCPUUSPerPayment: -1, GatewayCPUUSPerPaymentDraining: -1, SimCPUUSPerPayment: -1}
	w, err := d.setUp(ctx, "paydedup-doorbench-")
	if err != nil {
		return res, err
	}
	d.script = filepath.Join(d.tmp, "door.lua")
	if err := os.WriteFile(d.script, []byte(doorLua), 0o600); err != nil {
		return res, err
	}
	suffix, dbURL, observer, env := w.suffix, w.dbURL, w.observer, w.env
	d.obs = observer
	if d.apiKey, err = d.createKey(ctx, append(env, "DATABASE_URL="+dbURL)); err != nil {
		return res, err
	}
	simURL, simPID, provEnv, err := d.provider(ctx, nil)
	if err != nil {
		return res, err
	}

	gwApp := "paydedup-doorbench-gw-" + suffix
	gw, err := d.gateway(ctx, env, dbURL, gwApp)
	if err != nil {
		return res, err
	}

	// Phase door: no worker.
	d.say("phase door: wrk -t%d -c%d -d%ds against `paydedup gateway` at %s, no worker", d.dcfg.Threads, d.dcfg.Connections, d.dcfg.Seconds, d.url)
	gwCPU0 := cpuOf(gw.Process.Pid)
	pgCPU0, _ := backendsCPU(ctx, observer, gwApp)
	w1, err := d.runWrk(ctx, "door-"+suffix)
	if err != nil {
		return res, err
	}
	gwCPU := cpuOf(gw.Process.Pid) - gwCPU0
	pgCPU, backends := backendsCPU(ctx, observer, gwApp)
	secs := w1.DurationUS / 1e6
	res.DoorSeconds, res.DoorRequests, res.DoorAccepted, res.DoorNon202, res.DoorSocketErrors = secs, w1.Requests, w1.Accepted, w1.Non202, w1.SocketErrors
	res.DoorAcceptedPerSec = float64(w1.Accepted) / secs
	res.DoorP50US, res.DoorP99US, res.DoorMaxUS = w1.P50US, w1.P99US, w1.MaxUS
	if w1.Requests > 0 {
		res.GatewayCPUUSPerPOST = float64(gwCPU.Microseconds()) / float64(w1.Requests)
		res.GatewayCores = gwCPU.Seconds() / secs
		if backends > 0 {
			res.PGCPUUSPerPOST = float64((pgCPU - pgCPU0).Microseconds()) / float64(w1.Requests)
		}
	}
	res.GatewayRSSMB = procstat.PIDPeakRSSMB(gw.Process.Pid)
	d.say("phase door: %d accepted in %.2fs: %.0f accepted/s, p99 %.1f ms, %d not 202", w1.Accepted, secs, res.DoorAcceptedPerSec, w1.P99US/1000, w1.Non202)
	if w1.Accepted == 0 {
		return res, fmt.Errorf("the gateway accepted no POST (%d answered otherwise, %d socket errors; its log: %s)", w1.Non202, w1.SocketErrors, filepath.Join(d.tmp, "gateway.log"))
	}

	// Phase worker: drain the door's backlog.
	workerApp := "paydedup-doorbench-worker-" + suffix
	workerURL, err := localpg.WithAppName(dbURL, workerApp)
	if err != nil {
		return res, err
	}
	backlog, err := d.obs.Published(ctx, DoorMerchant, "door-"+suffix+"-")
	if err != nil {
		return res, err
	}
	d.say("phase worker: `paydedup worker` (provider %s) drains the %d published (%d answered 202 before wrk stopped)", d.dcfg.Provider, backlog, w1.Accepted)
	gwCPU0, simCPU0 := cpuOf(gw.Process.Pid), cpuOf(simPID)
	start := time.Now()
	worker, err := d.start(ctx, "worker", append(append(env, provEnv...), "DATABASE_URL="+workerURL), "worker")
	if err != nil {
		return res, err
	}
	done, err := d.waitCompleted(ctx, backlog, worker)
	elapsed := time.Since(start)
	if err != nil {
		return res, fmt.Errorf("%w (%d of %d completed; the worker's log: %s)", err, done, backlog, filepath.Join(d.tmp, "worker.log"))
	}
	perPayment := func(c time.Duration) float64 { return float64(c.Microseconds()) / float64(backlog) }
	res.WorkerCPUUSPerPayment = perPayment(cpuOf(worker.Process.Pid))
	res.GatewayCPUUSPerPaymentDraining = perPayment(cpuOf(gw.Process.Pid) - gwCPU0)
	if wpg, n := backendsCPU(ctx, observer, workerApp); n > 0 {
		res.WorkerPGCPUUSPerPayment = perPayment(wpg)
	}
	if simPID != 0 {
		res.SimCPUUSPerPayment = perPayment(cpuOf(simPID) - simCPU0)
	}
	res.WorkerPayments, res.WorkerSeconds = backlog, elapsed.Seconds()
	res.WorkerPaymentsPerSec = float64(backlog) / elapsed.Seconds()
	res.DoorOverWorker = res.DoorAcceptedPerSec / res.WorkerPaymentsPerSec
	d.say("phase worker: %d completed in %.2fs: %.0f payments/s", done, res.WorkerSeconds, res.WorkerPaymentsPerSec)

	// Phase post-to-charged: wrk again, the worker on.
	d.say("phase post-to-charged: wrk again with the worker running")
	w2, err := d.runWrk(ctx, "p2c-"+suffix)
	if err != nil {
		return res, err
	}
	res.P2CRequests, res.P2CAccepted, res.P2CNon202, res.P2CPOSTP99US = w2.Requests, w2.Accepted, w2.Non202, w2.P99US
	published2, err := d.obs.Published(ctx, DoorMerchant, "p2c-"+suffix+"-")
	if err != nil {
		return res, err
	}
	if total, err := d.waitCompleted(ctx, backlog+published2, worker); err != nil {
		return res, fmt.Errorf("%w (%d of %d completed; the worker's log: %s)", err, total, backlog+published2, filepath.Join(d.tmp, "worker.log"))
	}
	var p50, p99 float64
	if res.P2CCompleted, res.P2CSeconds, p50, p99, err = d.obs.POSTToCharged(ctx, DoorMerchant, "p2c-"+suffix+"-"); err != nil {
		return res, fmt.Errorf("read POST to charged times: %w", err)
	}
	res.POSTToChargedP50MS, res.POSTToChargedP99MS = p50*1000, p99*1000
	if res.P2CSeconds > 0 {
		res.ChargedPerSec = float64(res.P2CCompleted) / res.P2CSeconds
	}
	d.say("phase post-to-charged: %d completed in %.2fs from the first POST: %.0f charged/s, POST to charged p50 %.1f ms, p99 %.1f ms",
		res.P2CCompleted, res.P2CSeconds, res.ChargedPerSec, res.POSTToChargedP50MS, res.POSTToChargedP99MS)

	// Checks: every published POST completed (and so every 202, which wrk
	// may have seen fewer of), no key charged twice.
	for _, prefix := range []string{"door-" + suffix, "p2c-" + suffix} {
		n, err := d.obs.Uncompleted(ctx, DoorMerchant, prefix+"-")
		if err != nil {
			return res, err
		}
		res.Lost += n
	}
	if res.P2CCompleted < w2.Accepted {
		res.Lost = max(res.Lost, w2.Accepted-res.P2CCompleted)
	}
	if simURL != "" {
		if res.DoubleCharges, err = d.doubles(ctx, simURL); err != nil {
			return res, err
		}
	}
	return res, nil
}

// createKey runs `paydedup apikey create`, which prints the key alone on
// stdout.
func (d *door) createKey(ctx context.Context, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, d.cfg.Binary, "apikey", "create", "--merchant", DoorMerchant, "--label", "bench door")
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("paydedup apikey create: %w\n%s", err, tail(stderr.Bytes()))
	}
	key := strings.TrimSpace(string(out))
	if key == "" || strings.ContainsAny(key, " \n") {
		return "", fmt.Errorf("paydedup apikey create printed %q, not one key", out)
	}
	return key, nil
}

// gateway starts `paydedup gateway` with its defaults on free loopback
// ports and waits for its /readyz.
func (d *door) gateway(ctx context.Context, env []string, dbURL, app string) (*exec.Cmd, error) {
	httpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	adminPort, err := freePort()
	if err != nil {
		return nil, err
	}
	gwURL, err := localpg.WithAppName(dbURL, app)
	if err != nil {
		return nil, err
	}
	d.url = fmt.Sprintf("http://127.0.0.1:%d/v1/payments", httpPort)
	env = append(env, "DATABASE_URL="+gwURL,
		fmt.Sprintf("PAYDEDUP_HTTP_ADDR=127.0.0.1:%d", httpPort), fmt.Sprintf("PAYDEDUP_ADMIN_ADDR=127.0.0.1:%d", adminPort))
	gw, err := d.start(ctx, "gateway", env, "gateway")
	if err != nil {
		return nil, err
	}
	ready := fmt.Sprintf("http://127.0.0.1:%d/readyz", adminPort)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get(ready); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				d.say("gateway: `paydedup gateway` at %s in its own process, ready", d.url)
				return gw, nil
			}
		}
		if !alive(gw.Process.Pid) {
			return nil, fmt.Errorf("the gateway exited before it was ready; its log: %s", filepath.Join(d.tmp, "gateway.log"))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("the gateway was not ready at %s within 30s; its log: %s", ready, filepath.Join(d.tmp, "gateway.log"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runWrk runs wrk with the door script, keys starting with prefix, and
// parses the script's done() line.
func (d *door) runWrk(ctx context.Context, prefix string) (wrkReport, error) {
	cmd := exec.CommandContext(ctx, d.wrk, fmt.Sprintf("-t%d", d.dcfg.Threads), fmt.Sprintf("-c%d", d.dcfg.Connections),
		fmt.Sprintf("-d%ds", d.dcfg.Seconds), "--latency", "-s", d.script, d.url, "--", prefix, d.apiKey)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkReport{}, fmt.Errorf("wrk: %w\n%s", err, tail(out))
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "paydedup-door "); ok {
			var w wrkReport
			if err := json.Unmarshal([]byte(rest), &w); err != nil {
				return w, fmt.Errorf("wrk script's report %q: %w", rest, err)
			}
			if w.DurationUS <= 0 {
				return w, fmt.Errorf("wrk reported no duration: %s", rest)
			}
			return w, nil
		}
	}
	return wrkReport{}, fmt.Errorf("wrk printed no report line:\n%s", tail(out))
}

// waitCompleted polls idempotency_keys until n keys are completed, the
// worker exits or ctx ends, and returns how many completed.
func (d *door) waitCompleted(ctx context.Context, n int, worker *exec.Cmd) (int, error) {
	return waitCount(ctx, d.obs, n, worker, 100*time.Millisecond, "completed keys", d.obs.Completed)
}

// report prints the figures on stderr, and with --json the JSON object on
// stdout.
func (d *door) report(res DoorResult) {
	out := d.dcfg.ErrOut
	fmt.Fprintf(out, "paydedup gateway (its own process, defaults), wrk -t%d -c%d, provider %s\n", res.Threads, res.Connections, res.Provider)
	fmt.Fprintf(out, "  door (no worker): %d accepted in %.2fs: %.0f accepted/s, p50 %.1f ms, p99 %.1f ms, max %.1f ms; %d not 202, %d socket errors\n",
		res.DoorAccepted, res.DoorSeconds, res.DoorAcceptedPerSec, res.DoorP50US/1000, res.DoorP99US/1000, res.DoorMaxUS/1000, res.DoorNon202, res.DoorSocketErrors)
	fmt.Fprintf(out, "  CPU per POST: gateway %s (%.2f cores, peak RSS %.0f MiB), PostgreSQL %s\n",
		figure(res.GatewayCPUUSPerPOST), res.GatewayCores, res.GatewayRSSMB, figure(res.PGCPUUSPerPOST))
	fmt.Fprintf(out, "  worker: %d drained in %.2fs: %.0f payments/s; door/worker %.2f\n",
		res.WorkerPayments, res.WorkerSeconds, res.WorkerPaymentsPerSec, res.DoorOverWorker)
	fmt.Fprintf(out, "  CPU per payment drained: worker %s, its PostgreSQL %s, provider-sim %s, the idle gateway %s\n",
		figure(res.WorkerCPUUSPerPayment), figure(res.WorkerPGCPUUSPerPayment), figure(res.SimCPUUSPerPayment), figure(res.GatewayCPUUSPerPaymentDraining))
	fmt.Fprintf(out, "  post-to-charged: %d accepted, %d completed in %.2fs: %.0f charged/s, POST to charged p50 %.1f ms, p99 %.1f ms\n",
		res.P2CAccepted, res.P2CCompleted, res.P2CSeconds, res.ChargedPerSec, res.POSTToChargedP50MS, res.POSTToChargedP99MS)
	dbl := fmt.Sprint(res.DoubleCharges)
	if res.DoubleCharges < 0 {
		dbl = "not checked (the simulator is inside the worker)"
	}
	fmt.Fprintf(out, "  double charges %s, lost %d\n", dbl, res.Lost)
	if d.dcfg.JSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(d.dcfg.Out, string(b))
	}
}
