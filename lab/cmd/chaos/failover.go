package main

// The failover mode (-pg-failover N): Postgres is a pg_auto_failover
// formation instead of one cluster, and the Postgres faults are N kills -9
// of the primary, each followed by the engine's promotion of the
// synchronous standby and the killed node's return as the new standby.
//
// The formation: a monitor, a primary and a secondary, each `pg_autoctl`
// with its own Postgres, as local processes on loopback ports, run as the
// postgres OS user when the harness is root (Postgres refuses root), from
// Debian's postgresql-NN-auto-failover, which the harness installs with apt
// when pg_autoctl is missing. With two data nodes pg_auto_failover accepts
// only number_sync_standbys = 0: the primary's synchronous_standby_names
// is 'ANY 1 (standby)' while the standby is healthy, so with
// synchronous_commit = on (set here, and pg_autoctl's default) a COMMIT
// returns only once the standby has flushed its WAL; when the standby is
// down the primary runs alone (wait_primary, synchronous_standby_names '')
// and the monitor promotes no node that has not caught up. Every kill here
// waits for the formation to be back to primary + synchronous secondary,
// and checks the primary's settings say so, before it kills again.
//
// Workers, the reconciler, migrate, audit and the harness itself connect
// with the multi-host URL postgres://127.0.0.1:P1,127.0.0.1:P2/paydedup
// ?target_session_attrs=read-write: pgx tries the hosts in order and keeps
// the first that is a primary.
//
// What the worker saw committed, and how the harness knows it without
// asking the worker (see commitWitness): the worker acks a message only
// after the transaction that completed its key committed, and calls the
// provider only after the transaction that claimed the key committed. The
// harness subscribes to the workers' ack subjects ($JS.ACK.<stream>.
// <consumer>.…, core NATS delivers each ack to every subscriber, the
// JetStream server and the harness alike) and notes when each +ACK went by
// and for which stream sequence, which its own PubAcks map to a key; the
// simulator's ledger notes every charge with its provider key and time. At
// the end, on whatever node is primary then: every acked key must be
// completed with completed_at (the completing transaction's start) before
// the ack was seen, and every charged key must have its row under that
// provider key with created_at (the claim's transaction start) before the
// charge. A commit lost in a failover cannot hide behind its redo: an
// acked message is never redelivered, so a lost completion stays pending
// until the reconciler completes it again, later than the ack; a lost claim
// is claimed again by the redelivery, later than the charge it allowed.
// Both checks hold in every mode; the failover mode is where they bite.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/stream"
)

// formationSettings are appended to each node's postgresql.conf (later
// lines win over pg_autoctl's include at its top): pg_autoctl sizes memory
// for the whole machine, which other processes share here. fsync stays off
// as in the harness's own cluster (a process kill loses nothing the kernel
// has); full_page_writes stays on, which pg_rewind needs to bring a killed
// primary back as a standby. A killed primary comes back by pg_rewind or,
// when that fails, pg_basebackup, whose spread checkpoint would take half
// a minute under the default checkpoint pacing.
var formationSettings = []string{
	"listen_addresses = '127.0.0.1'", "synchronous_commit = on", "fsync = off",
	"checkpoint_timeout = '30s'", "checkpoint_completion_target = 0.1",
	"max_connections = 200", "shared_buffers = '64MB'", "effective_cache_size = '512MB'",
	"work_mem = '4MB'", "maintenance_work_mem = '64MB'", "wal_keep_size = '512MB'",
	"log_min_messages = warning",
}

// monitorSettings make the monitor notice a dead primary in seconds rather
// than its production defaults' half a minute (health check every 5 s,
// unhealthy after 20 s, 30 s for the old primary to demote itself). Only
// the detection is faster: the promotion follows the same state machine.
var monitorSettings = map[string]string{
	"health_check_period": "1000", "health_check_timeout": "1000", "health_check_max_retries": "1",
	"health_check_retry_delay": "500", "node_considered_unhealthy_timeout": "3000",
	"primary_demote_timeout": "3000",
}

// formation is the run's pg_auto_failover formation.
type formation struct {
	autoctl, pgBin string
	dir, logs      string
	cred           *syscall.Credential
	async          bool // standbys out of the replication quorum (-pg-failover-async)
	env            []string
	monitorPort    int
	monitor        *proc
	nodes          []*pgNode

	mu    sync.Mutex
	kills []time.Time // when each primary was killed
}

// pgNode is one data node: its pg_autoctl keeper, which runs its Postgres.
type pgNode struct {
	name   string
	port   int
	pgdata string
	run    *proc
}

func (n *pgNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// URL is the multi-host URL of database as user: every data node, a
// read-write session wanted.
func (f *formation) URL(user, database string) string {
	hosts := make([]string, len(f.nodes))
	for i, n := range f.nodes {
		hosts[i] = n.addr()
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		user, strings.Join(hosts, ","), database)
}

func (f *formation) monitorURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable&connect_timeout=2", f.monitorPort)
}

// dbURL is the URL of database as user: the formation's in failover mode,
// else the run's own cluster's.
func (h *harness) dbURL(user, database string) string {
	if h.fo != nil {
		return h.fo.URL(user, database)
	}
	return h.pg.URL(user, database)
}

// findAutoctl returns pg_autoctl: beside the server binaries, else on PATH.
func findAutoctl(pgBin string) (string, bool) {
	if p := filepath.Join(pgBin, "pg_autoctl"); isExec(p) {
		return p, true
	}
	p, err := exec.LookPath("pg_autoctl")
	return p, err == nil
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// ensureAutoctl finds pg_autoctl, installing Debian's
// postgresql-NN-auto-failover for the server's major version when it is
// missing (with sudo when not root).
func (h *harness) ensureAutoctl(ctx context.Context, pgBin string) (string, error) {
	if p, ok := findAutoctl(pgBin); ok {
		return p, nil
	}
	major := filepath.Base(filepath.Dir(pgBin))
	if _, err := strconv.Atoi(major); err != nil {
		return "", fmt.Errorf("pg_autoctl not found, and %s is not a Debian /usr/lib/postgresql/NN/bin to pick the package for: install pg_auto_failover", pgBin)
	}
	pkg := "postgresql-" + major + "-auto-failover"
	argv := []string{"apt-get", "install", "-y", "--no-install-recommends", pkg}
	if os.Geteuid() != 0 {
		argv = append([]string{"sudo", "-n"}, argv...)
	}
	h.logf("pg_autoctl not found: %s", strings.Join(argv, " "))
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if err := runOnce(ctx, "apt-get install "+pkg, filepath.Join(h.logs, "apt.log"), env, argv[0], argv[1:]...); err != nil {
		return "", fmt.Errorf("install %s: %w", pkg, err)
	}
	if p, ok := findAutoctl(pgBin); ok {
		return p, nil
	}
	return "", fmt.Errorf("%s installed, still no pg_autoctl in %s or on PATH", pkg, pgBin)
}

// initFailover creates and starts the formation: the monitor, then the
// first node (it becomes the primary), then the second (pg_basebackup from
// the first; it becomes the synchronous secondary).
func (h *harness) initFailover(ctx context.Context) error {
	pgBin := h.cfg.pgBin
	if pgBin == "" {
		b, err := localpg.FindBin()
		if err != nil {
			return err
		}
		pgBin = b
	}
	autoctl, err := h.ensureAutoctl(ctx, pgBin)
	if err != nil {
		return err
	}
	cred, err := localpg.PostgresUser()
	if err != nil {
		return err
	}
	f := &formation{autoctl: autoctl, pgBin: pgBin, dir: filepath.Join(h.work, "pgaf"), logs: h.logs, cred: cred,
		async: h.cfg.pgFailoverAsync}
	// pg_autoctl keeps its state under the XDG directories: ours, per run.
	for _, d := range []string{"", "config", "share", "run"} {
		p := filepath.Join(f.dir, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if cred != nil {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return err
			}
		}
	}
	f.env = []string{"PATH=" + pgBin + ":/usr/bin:/bin", "LANG=C", "LC_ALL=C", "HOME=" + f.dir,
		"XDG_CONFIG_HOME=" + filepath.Join(f.dir, "config"), "XDG_DATA_HOME=" + filepath.Join(f.dir, "share"),
		"XDG_RUNTIME_DIR=" + filepath.Join(f.dir, "run")}
	h.fo = f
	for i := range 3 {
		port, err := localpg.FreePort()
		if err != nil {
			return err
		}
		if i == 0 {
			f.monitorPort = port
			continue
		}
		name := fmt.Sprintf("node%d", i)
		f.nodes = append(f.nodes, &pgNode{name: name, port: port, pgdata: filepath.Join(f.dir, name)})
	}
	pgctl := filepath.Join(pgBin, "pg_ctl")

	h.logf("Postgres: pg_auto_failover formation (%s): monitor on 127.0.0.1:%d", autoctl, f.monitorPort)
	mdata := filepath.Join(f.dir, "monitor")
	if err := f.once(ctx, "pg_autoctl create monitor", "create", "monitor", "--pgdata", mdata,
		"--pgport", strconv.Itoa(f.monitorPort), "--pgctl", pgctl, "--hostname", "127.0.0.1",
		"--auth", "trust", "--no-ssl"); err != nil {
		return err
	}
	if err := appendSettings(mdata, formationSettings); err != nil {
		return err
	}
	f.monitor = h.procs.add(f.proc("pg-monitor", mdata))
	if err := f.monitor.start(); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, "the pg_auto_failover monitor", func() bool {
		return f.tune(ctx) == nil
	}); err != nil {
		return err
	}
	for i, n := range f.nodes {
		h.logf("Postgres: pg_autoctl create postgres %s on %s", n.name, n.addr())
		if err := f.once(ctx, "pg_autoctl create postgres "+n.name, "create", "postgres", "--pgdata", n.pgdata,
			"--pgport", strconv.Itoa(n.port), "--pgctl", pgctl, "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
			"--name", n.name, "--auth", "trust", "--no-ssl", "--monitor", f.monitorURL(),
			"--replication-quorum", strconv.FormatBool(!f.async)); err != nil {
			return err
		}
		if err := appendSettings(n.pgdata, formationSettings); err != nil {
			return err
		}
		n.run = h.procs.add(f.proc("pg-"+n.name, n.pgdata))
		if err := n.run.start(); err != nil {
			return err
		}
		want := map[string]string{n.name: "single"}
		if i > 0 {
			want = map[string]string{f.nodes[0].name: "primary", n.name: "secondary"}
		}
		if err := f.waitStates(ctx, 3*time.Minute, want); err != nil {
			return err
		}
	}
	st, err := f.syncState(ctx, f.nodes[0])
	if err != nil {
		return err
	}
	h.logf("Postgres: formation up: %s primary, %s standby (%s)", f.nodes[0].name, f.nodes[1].name, st)
	return nil
}

// proc is the long-running `pg_autoctl run` of the node at pgdata.
func (f *formation) proc(name, pgdata string) *proc {
	return &proc{name: name, path: f.autoctl, args: []string{"run", "--pgdata", pgdata}, env: f.env,
		log: filepath.Join(f.logs, name+".log"), cred: f.cred}
}

// once runs one pg_autoctl command to completion, as the postgres user.
func (f *formation) once(ctx context.Context, name string, args ...string) error {
	p := &proc{name: name, path: f.autoctl, args: args, env: f.env, cred: f.cred,
		log: filepath.Join(f.logs, "pg_autoctl-create.log")}
	if err := p.start(); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		p.kill()
		return ctx.Err()
	case <-p.exited():
	}
	if err := p.exitErr(); err != nil {
		return fmt.Errorf("%s: %w (see %s)", name, err, p.log)
	}
	return nil
}

// appendSettings appends the harness's settings to a node's
// postgresql.conf, once (the second node's came from the first by
// pg_basebackup).
func appendSettings(pgdata string, settings []string) error {
	p := filepath.Join(pgdata, "postgresql.conf")
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	const mark = "# paydedup chaos harness"
	if bytes.Contains(b, []byte(mark)) {
		return nil
	}
	fh, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(fh, "\n%s\n%s\n", mark, strings.Join(settings, "\n"))
	return errors.Join(err, fh.Close())
}

// tune sets the monitor's health checks (see monitorSettings).
func (f *formation) tune(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pool, err := pg.Connect(cctx, f.monitorURL())
	if err != nil {
		return err
	}
	defer pool.Close()
	for k, v := range monitorSettings {
		if _, err := pool.Exec(cctx, fmt.Sprintf(`ALTER SYSTEM SET pgautofailover.%s = %s`, k, v)); err != nil {
			return err
		}
	}
	_, err = pool.Exec(cctx, `SELECT pg_reload_conf()`)
	return err
}

// nodeState is one node as the monitor sees it.
type nodeState struct{ reported, goal string }

// states reads every node's reported and assigned state from the monitor.
func (f *formation) states(ctx context.Context) (map[string]nodeState, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pool, err := pg.Connect(cctx, f.monitorURL())
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	rows, err := pool.Query(cctx, `SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]nodeState{}
	for rows.Next() {
		var name string
		var s nodeState
		if err := rows.Scan(&name, &s.reported, &s.goal); err != nil {
			return nil, err
		}
		out[name] = s
	}
	return out, rows.Err()
}

// waitStates waits until each named node both reports and is assigned its
// state.
func (f *formation) waitStates(ctx context.Context, d time.Duration, want map[string]string) error {
	var last map[string]nodeState
	err := waitFor(ctx, d, fmt.Sprintf("pg_auto_failover states %v", want), func() bool {
		s, err := f.states(ctx)
		if err != nil {
			return false
		}
		last = s
		for name, st := range want {
			if s[name].reported != st || s[name].goal != st {
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("%w (monitor says %v; logs in %s)", err, last, f.logs)
	}
	return nil
}

// syncState checks, on the primary n, what the no-loss guarantee stands
// on: synchronous_commit on, synchronous_standby_names naming a standby,
// and that standby streaming as a synchronous (quorum) one. It returns a
// description for the log.
func (f *formation) syncState(ctx context.Context, n *pgNode) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pool, err := pg.Connect(cctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", n.addr()))
	if err != nil {
		return "", err
	}
	defer pool.Close()
	var commit, names, state string
	if err := pool.QueryRow(cctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
			coalesce((SELECT string_agg(application_name || ' ' || state || ' ' || sync_state, ', ') FROM pg_stat_replication), '')`).
		Scan(&commit, &names, &state); err != nil {
		return "", err
	}
	desc := fmt.Sprintf("synchronous_commit=%s synchronous_standby_names=%q replication: %s", commit, names, state)
	if commit != "on" && commit != "remote_apply" {
		return desc, fmt.Errorf("primary %s: %s: a commit would not wait for the standby", n.name, desc)
	}
	if f.async {
		return desc + " (asynchronous by -pg-failover-async)", nil
	}
	if names == "" || !(strings.Contains(state, " sync") || strings.Contains(state, " quorum")) {
		return desc, fmt.Errorf("primary %s: %s: no synchronous standby", n.name, desc)
	}
	return desc, nil
}

// failoverPrimary is one Postgres fault of the failover mode: it kills -9
// the primary node (its pg_autoctl keeper and its Postgres, as when the
// machine is lost), waits for the monitor to promote the standby and for
// the new primary to take writes, then starts the killed node again and
// waits for it to rejoin as the synchronous standby, so that every kill
// finds a standby that has every commit.
func (h *harness) failoverPrimary(ctx context.Context) error {
	f := h.fo
	s, err := f.states(ctx)
	if err != nil {
		return fmt.Errorf("read the formation's state: %w", err)
	}
	var old, next *pgNode
	for _, n := range f.nodes {
		if s[n.name] == (nodeState{"primary", "primary"}) {
			old = n
		} else {
			next = n
		}
	}
	if old == nil || next == nil || s[next.name] != (nodeState{"secondary", "secondary"}) {
		return fmt.Errorf("formation not at primary + secondary (%v): no kill", s)
	}
	desc, err := f.syncState(ctx, old)
	if err != nil {
		return err
	}
	// The replication link stalls first: the standby's WAL receiver is
	// stopped for a second, as a slow network would hold it, so the kill
	// finds commits the standby has not received. A synchronous primary
	// holds them unacknowledged (their clients see the connection cut); an
	// asynchronous one has already acknowledged them, and they are lost.
	receiver := walReceiverPID(next.pgdata)
	if receiver > 0 {
		_ = syscall.Kill(receiver, syscall.SIGSTOP)
		time.Sleep(replicationStall)
	}
	h.logf("Postgres failover: kill -9 the primary %s (pg_autoctl and postgres) after a %v replication stall (WAL receiver pid %d); %s",
		old.name, replicationStall, receiver, desc)
	f.mu.Lock()
	f.kills = append(f.kills, time.Now())
	f.mu.Unlock()
	killed := time.Now()
	f.killNode(old)
	if receiver > 0 {
		_ = syscall.Kill(receiver, syscall.SIGCONT)
	}

	promoted := func() bool {
		s, err := f.states(ctx)
		if err != nil || (s[next.name].reported != "wait_primary" && s[next.name].reported != "primary") {
			return false
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		pool, err := pg.Connect(cctx, f.URL("postgres", "postgres"))
		if err != nil {
			return false
		}
		defer pool.Close()
		var port int
		return pool.QueryRow(cctx, `SELECT inet_server_port()`).Scan(&port) == nil && port == next.port
	}
	if err := waitFor(ctx, 2*time.Minute, "the standby's promotion", promoted); err != nil {
		return err
	}
	h.logf("Postgres failover: %s promoted and taking writes %.1fs after the kill", next.name, time.Since(killed).Seconds())
	if err := old.run.start(); err != nil {
		return err
	}
	if err := f.waitStates(ctx, 3*time.Minute, map[string]string{next.name: "primary", old.name: "secondary"}); err != nil {
		return err
	}
	h.pgFailovers.Add(1)
	h.logf("Postgres failover: %s back as the standby %.1fs after the kill", old.name, time.Since(killed).Seconds())
	return nil
}

// replicationStall is how long the replication link stalls before each
// primary kill.
const replicationStall = time.Second

// walReceiverPID finds the WAL receiver of the standby at pgdata: the
// child of its postmaster titled "postgres: walreceiver"; 0 if none.
func walReceiverPID(pgdata string) int {
	postmaster := postmasterPID(pgdata)
	if postmaster == 0 {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces, so read after ')'.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		fields := strings.Fields(string(rest))
		if len(fields) < 2 || fields[1] != strconv.Itoa(postmaster) {
			continue
		}
		if cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && bytes.Contains(cmd, []byte("walreceiver")) {
			return pid
		}
	}
	return 0
}

// killNode kills the node's keeper with its process group (its Postgres
// runs in it), and the postmaster by its pid file in case it ran apart.
func (f *formation) killNode(n *pgNode) {
	pid := postmasterPID(n.pgdata)
	n.run.kill()
	killPostmaster(pid, n.pgdata)
}

// killPostmaster kills pid if it still is the postmaster of pgdata: a
// stale pid file's number may belong to another process by now.
func killPostmaster(pid int, pgdata string) {
	if pid <= 0 {
		return
	}
	cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !bytes.Contains(cmd, []byte(pgdata)) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// postmasterPID reads the postmaster's pid from postmaster.pid, 0 if none.
func postmasterPID(pgdata string) int {
	b, err := os.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// stop kills every node and the monitor (the registry kills the keepers;
// this also reaches a postmaster a killed keeper left behind). Nil-safe.
func (f *formation) stop() {
	if f == nil {
		return
	}
	for _, n := range f.nodes {
		if n.run != nil {
			f.killNode(n)
		}
	}
	if f.monitor != nil {
		mdata := filepath.Join(f.dir, "monitor")
		pid := postmasterPID(mdata)
		f.monitor.kill()
		killPostmaster(pid, mdata)
	}
}

func (f *formation) killTimes() []time.Time {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.kills...)
}

// commitWitness records, from outside the workers, what they saw
// committed: each +ACK they sent (by stream sequence, when the harness saw
// it go by) and, through the harness's own PubAcks, which key each
// sequence carries.
type commitWitness struct {
	mu     sync.Mutex
	seqKey map[uint64]string    // stream sequence → merchant_id:idempotency_key
	acked  map[uint64]time.Time // stream sequence → first +ACK seen
	sub    *nats.Subscription
}

// published notes the key of a message the stream stored at seq.
func (w *commitWitness) published(seq uint64, p workload.Publish) {
	key := publishKey(p)
	if key == "" {
		return // malformed: never acked
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seqKey == nil {
		w.seqKey = map[uint64]string{}
	}
	w.seqKey[seq] = key
}

// publishKey is a publish's merchant_id:idempotency_key (the subject's last
// token and the header, else the body's key), "" when it has none.
func publishKey(p workload.Publish) string {
	merchant := p.Subject[strings.LastIndexByte(p.Subject, '.')+1:]
	key := p.Header[workload.HeaderKey]
	if key == "" {
		var body struct {
			Key string `json:"idempotency_key"`
		}
		if json.Unmarshal(p.Body, &body) != nil {
			return ""
		}
		key = body.Key
	}
	if key == "" {
		return ""
	}
	return merchant + ":" + key
}

// watch subscribes to the workers' acks on the payments consumer. An ack
// subject is $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.….
func (w *commitWitness) watch(nc *nats.Conn) error {
	w.mu.Lock()
	if w.acked == nil {
		w.acked = map[uint64]time.Time{}
	}
	w.mu.Unlock()
	sub, err := nc.Subscribe("$JS.ACK."+stream.DefaultStream+"."+stream.DefaultDurable+".>", func(m *nats.Msg) {
		if !bytes.HasPrefix(m.Data, []byte("+ACK")) {
			return // a nak, a term (dead-lettered) or work in progress
		}
		at := time.Now()
		tokens := strings.Split(m.Subject, ".")
		if len(tokens) < 9 {
			return
		}
		seq, err := strconv.ParseUint(tokens[5], 10, 64)
		if err != nil {
			return
		}
		w.mu.Lock()
		if _, seen := w.acked[seq]; !seen {
			w.acked[seq] = at
		}
		w.mu.Unlock()
	})
	if err != nil {
		return fmt.Errorf("subscribe to the workers' acks: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return err
	}
	w.sub = sub
	return nil
}

// keyRow is what the commit check reads of a key's row.
type keyRow struct {
	status, providerKey    string
	createdAt, completedAt time.Time
	completed              bool
}

// checkCommitted compares what the witness saw committed with the rows on
// the current primary (see the top of this file) and returns a finding for
// each commit the database no longer has as it was seen.
func (h *harness) checkCommitted(ctx context.Context) ([]string, error) {
	w := &h.witness
	if w.sub != nil {
		_ = w.sub.Unsubscribe()
	}
	pool, err := pg.Connect(ctx, h.dbURL("postgres", "paydedup"))
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT merchant_id || ':' || idempotency_key, status::text, provider_key, created_at, completed_at
		FROM idempotency_keys`)
	if err != nil {
		return nil, fmt.Errorf("read rows: %w", err)
	}
	db := map[string]keyRow{}
	for rows.Next() {
		var key string
		var r keyRow
		var completedAt *time.Time
		if err := rows.Scan(&key, &r.status, &r.providerKey, &r.createdAt, &completedAt); err != nil {
			rows.Close()
			return nil, err
		}
		if completedAt != nil {
			r.completedAt, r.completed = *completedAt, true
		}
		db[key] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	ledger, err := h.ledger(ctx)
	if err != nil {
		return nil, err
	}

	kills := h.fo.killTimes()
	nearKill := func(t time.Time) bool {
		for _, k := range kills {
			if !t.After(k) && k.Sub(t) < 2*time.Second {
				return true
			}
		}
		return false
	}
	var findings []string
	w.mu.Lock()
	acks, unmapped, acksNear := 0, 0, 0
	for seq, at := range w.acked {
		key, ok := w.seqKey[seq]
		if !ok {
			unmapped++ // a message the harness did not publish (dlq replay's)
			continue
		}
		acks++
		if nearKill(at) {
			acksNear++
		}
		r, ok := db[key]
		switch {
		case !ok:
			findings = append(findings, fmt.Sprintf("committed lost: %s acked (stream seq %d) at %s, no row on the primary", key, seq, at.Format(time.RFC3339Nano)))
		case r.status != "completed":
			findings = append(findings, fmt.Sprintf("committed lost: %s acked (stream seq %d) at %s, row %s on the primary", key, seq, at.Format(time.RFC3339Nano), r.status))
		case !r.completedAt.Before(at):
			findings = append(findings, fmt.Sprintf("committed lost: %s acked (stream seq %d) at %s, completed only at %s: the completion the worker saw was lost and redone",
				key, seq, at.Format(time.RFC3339Nano), r.completedAt.Format(time.RFC3339Nano)))
		}
	}
	w.mu.Unlock()
	charges, chargesNear := 0, 0
	for _, c := range ledger.Charges {
		key := c.MerchantID + ":" + c.IdempotencyKey
		charges++
		if nearKill(c.Created) {
			chargesNear++
		}
		r, ok := db[key]
		switch {
		case !ok:
			findings = append(findings, fmt.Sprintf("committed lost: %s charged at %s, no row on the primary", key, c.Created.Format(time.RFC3339Nano)))
		case r.providerKey != c.ProviderKey:
			findings = append(findings, fmt.Sprintf("committed lost: %s charged under %s, the row has %s", key, c.ProviderKey, r.providerKey))
		case !r.createdAt.Before(c.Created):
			findings = append(findings, fmt.Sprintf("committed lost: %s charged at %s, claimed only at %s: the claim the worker saw was lost and redone",
				key, c.Created.Format(time.RFC3339Nano), r.createdAt.Format(time.RFC3339Nano)))
		}
	}
	if h.fo != nil && int(h.pgFailovers.Load()) < h.cfg.pgFailover {
		findings = append(findings, fmt.Sprintf("asked for %d primary kills with failover, made %d (lengthen -duration)", h.cfg.pgFailover, h.pgFailovers.Load()))
	}
	if acks == 0 || charges == 0 {
		findings = append(findings, fmt.Sprintf("commit witness blind: %d acks and %d charges seen", acks, charges))
	}
	near := ""
	if h.fo != nil {
		near = fmt.Sprintf(" (%d acks and %d charges within 2 s before one of the %d primary kills)", acksNear, chargesNear, len(kills))
	}
	h.logf("commit check on the primary: %d acked messages and %d charges the workers saw committed%s, %d acks of messages not published by the harness; %d missing",
		acks, charges, near, unmapped, len(findings))
	return findings, nil
}

// ledger reads the simulator's ledger.
func (h *harness) ledger(ctx context.Context) (stripesim.Ledger, error) {
	var l stripesim.Ledger
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.simAddr+"/_sim/ledger", nil)
	if err != nil {
		return l, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return l, fmt.Errorf("read the provider's ledger: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return l, fmt.Errorf("decode the provider's ledger: %w", err)
	}
	return l, nil
}
