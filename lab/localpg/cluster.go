//go:build unix

package localpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
)

// Cluster is a private PostgreSQL cluster started from the machine's
// binaries: its own data directory, a loopback port, trust authentication
// for the postgres superuser. The chaos harness crashes and restarts one;
// demo and bench start one when no server answers.
type Cluster struct {
	bin  string
	dir  string // data directory
	port int
	log  string
	args []string
	cred *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// ClusterConfig says where a Cluster lives.
type ClusterConfig struct {
	Bin      string   // directory of initdb, postgres and pg_ctl; "" finds it (FindBin)
	Dir      string   // the data directory, created; its parent must exist
	Log      string   // the server's log file; "" puts it beside Dir
	Settings []string // extra server settings, name=value, each passed as -c
}

// FindBin returns the directory of the machine's PostgreSQL server
// binaries: pg_config --bindir when that has initdb, else the newest of
// the Debian paths /usr/lib/postgresql/*/bin.
func FindBin() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if hasServer(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if hasServer(d) {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres) found via pg_config --bindir or in /usr/lib/postgresql/*/bin")
}

func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres", "pg_ctl"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// version is the major version in /usr/lib/postgresql/NN/bin, 0 if none.
func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// InitCluster runs initdb in cfg.Dir and picks a free loopback port; Start
// starts the server.
func InitCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.Bin == "" {
		b, err := FindBin()
		if err != nil {
			return nil, err
		}
		cfg.Bin = b
	}
	if cfg.Log == "" {
		cfg.Log = filepath.Join(filepath.Dir(cfg.Dir), "postgres.log")
	}
	cred, err := postgresUser()
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		// Postgres, running as its own user, must own its data directory
		// and reach it through ours.
		if err := os.Chown(cfg.Dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
		if err := os.Chmod(filepath.Dir(cfg.Dir), 0o755); err != nil {
			return nil, err
		}
	}
	c := &Cluster{bin: cfg.Bin, dir: cfg.Dir, port: port, log: cfg.Log, cred: cred}
	if err := c.runOnce(ctx, "initdb", "-D", cfg.Dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return nil, err
	}
	c.args = []string{"-D", cfg.Dir, "-p", strconv.Itoa(port), "-k", cfg.Dir, "-c", "listen_addresses=127.0.0.1"}
	for _, s := range cfg.Settings {
		c.args = append(c.args, "-c", s)
	}
	return c, nil
}

// URL is the URL of database (the default when "") as user.
func (c *Cluster) URL(user, database string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", user, c.port, database)
}

// Dir is the data directory.
func (c *Cluster) Dir() string { return c.dir }

// Start starts the server and waits until it accepts connections. The
// server dies with this process (on Linux even when it is killed).
func (c *Cluster) Start(ctx context.Context) error {
	logf, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "---- %s: start postgres\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), c.args...)
	cmd.Env = pgEnv
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr(c.cred)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	go func() { _ = cmd.Wait(); close(done) }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		pool, err := pg.Connect(cctx, c.URL("postgres", "postgres"))
		cancel()
		if err == nil {
			pool.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("postgres exited while starting (see %s):\n%s", c.log, c.logTail())
		case <-ctx.Done():
			c.Kill()
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.Kill()
			return fmt.Errorf("postgres did not accept connections within 60s (see %s)", c.log)
		}
	}
}

// StopImmediate is pg_ctl stop -m immediate: the postmaster and every
// backend quit at once, with no checkpoint; the next Start replays WAL.
func (c *Cluster) StopImmediate(ctx context.Context) error {
	if err := c.runOnce(ctx, "pg_ctl stop -m immediate", "stop", "-D", c.dir, "-m", "immediate", "-w", "-t", "30"); err != nil {
		c.Kill()
		return err
	}
	return c.wait(30 * time.Second)
}

// Stop shuts the server down (fast mode: sessions are ended, then a
// checkpoint), and kills it if it has not exited within 10 s.
func (c *Cluster) Stop() {
	c.mu.Lock()
	cmd := c.cmd
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	if c.wait(10*time.Second) != nil {
		c.Kill()
	}
}

// Kill sends SIGKILL to the server's process group and waits for its exit.
func (c *Cluster) Kill() {
	c.mu.Lock()
	cmd := c.cmd
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = c.wait(10 * time.Second)
}

func (c *Cluster) wait(d time.Duration) error {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("postgres did not exit within %v", d)
	}
}

func (c *Cluster) logTail() string {
	b, _ := os.ReadFile(c.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// pgEnv is the server's whole environment: nothing of ours leaks in.
var pgEnv = []string{"PATH=/usr/bin:/bin", "LANG=C", "LC_ALL=C"}

// runOnce runs one of the cluster's tools to completion, output in the log.
func (c *Cluster) runOnce(ctx context.Context, name string, args ...string) error {
	logf, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	tool := strings.Fields(name)[0]
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, tool), args...)
	cmd.Env = pgEnv
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr(c.cred)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w (see %s)", name, err, c.log)
	}
	return nil
}

// Throwaway starts a private cluster in a new temporary directory, tuned
// for speed over durability, and returns it with a func that stops it and
// removes the directory.
func Throwaway(ctx context.Context) (*Cluster, func(), error) {
	bin, err := FindBin()
	if err != nil {
		return nil, nil, err
	}
	tmp, err := os.MkdirTemp("", "paydedup-pg-")
	if err != nil {
		return nil, nil, err
	}
	remove := func() { _ = os.RemoveAll(tmp) }
	c, err := InitCluster(ctx, ClusterConfig{Bin: bin, Dir: filepath.Join(tmp, "data"), Settings: FastSettings})
	if err != nil {
		remove()
		return nil, nil, err
	}
	if err := c.Start(ctx); err != nil {
		remove()
		return nil, nil, err
	}
	return c, func() { c.Stop(); remove() }, nil
}

// FastSettings trade durability for speed where it is safe to: a process
// crash (an immediate stop) loses nothing the kernel has, and fsync matters
// only for a machine crash, which no lab tool survives or tests. Commits
// stay synchronous: an immediate stop must not lose a committed outcome.
var FastSettings = []string{"fsync=off", "full_page_writes=off",
	"max_connections=200", "shared_buffers=64MB", "log_min_messages=warning"}

// PostgresUser returns the credentials to run Postgres's own tools with
// (initdb, postgres, pg_autoctl): the postgres OS user when we run as root,
// else nil (run as ourselves).
func PostgresUser() (*syscall.Credential, error) { return postgresUser() }

// postgresUser returns the credentials to run Postgres with: the postgres
// OS user when we run as root (initdb and postgres refuse root), else nil
// (run as ourselves).
func postgresUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, a private PostgreSQL cluster needs the postgres OS user: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
