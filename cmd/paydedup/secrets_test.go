package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
)

// Marker secrets: none may ever appear in help output, errors or logs.
const (
	markDB     = "MARKERdbpw7f3a"
	markNATS   = "MARKERnatsurl9c1e"
	markNATS2  = "MARKERnatsurl2b44"
	markStripe = "sk_test_MARKERstripe5d2"
	markNatsPW = "MARKERnatspw0e8b"
	markDLQKey = "MARKERdlqkey-0123456789abcdef0123456789"
	// markDLQOld is a previous DLQ key (PAYDEDUP_DLQ_PREVIOUS_KEYS).
	markDLQOld = "MARKERdlqold-0123456789abcdef0123456789"
	// markDLQShort is a previous DLQ key too short to be valid.
	markDLQShort = "MARKERdlqshort"
)

var markers = []string{markDB, markNATS, markNATS2, markStripe, markNatsPW, markDLQKey, markDLQOld, markDLQShort}

func envFunc(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func assertNoSecret(t *testing.T, what, text string) {
	t.Helper()
	for _, m := range markers {
		if strings.Contains(text, m) {
			t.Errorf("%s leaks the secret %q:\n%s", what, m, text)
		}
	}
}

// freeAddr is a loopback port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
}

func secretEnv(t *testing.T) map[string]string {
	return map[string]string{
		"DATABASE_URL":      "postgres://paydedup:" + markDB + "@" + freeAddr(t) + "/paydedup?sslmode=disable",
		"NATS_URL":          "nats://u:" + markNATS + "@" + freeAddr(t) + ",nats://v:" + markNATS2 + "@" + freeAddr(t),
		"NATS_USER":         "u",
		"NATS_PASSWORD":     markNatsPW,
		"STRIPE_SECRET_KEY": markStripe,
		"PAYDEDUP_PROVIDER": "stripe",
		"PAYDEDUP_DLQ_KEY":  markDLQKey,
	}
}

// commandPaths lists every command of the tree, as argument prefixes.
func commandPaths(c *cobra.Command, prefix []string) [][]string {
	out := [][]string{prefix}
	for _, sub := range c.Commands() {
		if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
			continue
		}
		out = append(out, commandPaths(sub, append(append([]string(nil), prefix...), sub.Name()))...)
	}
	return out
}

func TestHelpNeverShowsSecrets(t *testing.T) {
	t.Parallel()
	env := secretEnv(t)
	paths := commandPaths(newRootCmd(&bytes.Buffer{}, &bytes.Buffer{}, envFunc(env)), nil)
	if len(paths) < 5 {
		t.Fatalf("only %d commands found: %v", len(paths), paths)
	}
	for _, p := range paths {
		t.Run(strings.Join(append([]string{"paydedup"}, p...), " "), func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			root := newRootCmd(&out, &errOut, envFunc(env))
			root.SetArgs(append(append([]string(nil), p...), "--help"))
			if err := root.ExecuteContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), "Usage:") {
				t.Fatalf("no usage printed:\n%s", out.String())
			}
			assertNoSecret(t, "--help", out.String()+errOut.String())
		})
	}
}

// run executes the command tree with args and env until it returns or the
// context ends, and returns everything it said.
func run(ctx context.Context, env map[string]string, args ...string) (string, error) {
	var out, errOut testenv.Buffer
	root := newRootCmd(&out, &errOut, envFunc(env))
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	text := out.String() + errOut.String()
	if err != nil {
		text += "\nerror: " + err.Error()
	}
	return text, err
}

func TestFailingStartNeverLogsSecrets(t *testing.T) {
	t.Parallel()
	dbURL, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// The local Postgres trusts loopback: a password in the URL is ignored
	// by the server but travels through all of our code.
	dbURL.User = url.UserPassword(dbURL.User.Username(), markDB)
	liveDB := dbURL.String()

	cases := []struct {
		name string
		env  func(map[string]string)
		args []string
	}{
		{"worker, database down", nil, []string{"worker"}},
		{"worker, NATS down", func(e map[string]string) { e["DATABASE_URL"] = liveDB }, []string{"worker"}},
		{"worker, bad configuration", func(e map[string]string) { e["PAYDEDUP_LEASE"] = "1s" }, []string{"worker"}},
		{"worker, unparseable database URL", func(e map[string]string) {
			e["DATABASE_URL"] = "postgres://u:" + markDB + "@127.0.0.1:notaport/db"
		}, []string{"worker"}},
		{"worker, flag URLs", nil, []string{"worker", "--database-url", "postgres://u:" + markDB + "@" + freeAddr(t) + "/db"}},
		{"worker, a previous DLQ key too short", func(e map[string]string) {
			e["PAYDEDUP_DLQ_PREVIOUS_KEYS"] = markDLQOld + "," + markDLQShort
		}, []string{"worker"}},
		{"dlq replay, a previous DLQ key too short", func(e map[string]string) {
			e["PAYDEDUP_DLQ_PREVIOUS_KEYS"] = markDLQShort + "," + markDLQOld
		}, []string{"dlq", "replay", "--all"}},
		{"migrate up, database down", nil, []string{"migrate", "up"}},
		{"migrate status, unparseable URL", func(e map[string]string) {
			e["DATABASE_URL"] = "postgres://u:" + markDB + "@[::1/db"
		}, []string{"migrate", "status"}},
		{"reconcile, database down", nil, []string{"reconcile", "--once"}},
		{"reconcile, provider down", func(e map[string]string) {
			e["DATABASE_URL"] = liveDB
			e["STRIPE_API_BASE"] = "http://" + freeAddr(t)
		}, []string{"reconcile", "--once"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := secretEnv(t)
			env["PAYDEDUP_LOG_LEVEL"] = "debug"
			if tc.env != nil {
				tc.env(env)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			text, err := run(ctx, env, tc.args...)
			if err == nil && tc.name != "reconcile, provider down" {
				t.Fatalf("the start did not fail:\n%s", text)
			}
			assertNoSecret(t, "output", text)
		})
	}
}

// TestRunningWorkerNeverLogsSecrets starts a real worker (Postgres, an
// authenticated NATS server, the simulator behind the Stripe adapter) at
// debug level and reads everything it logs.
func TestRunningWorkerNeverLogsSecrets(t *testing.T) {
	t.Parallel()
	dbURL, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	dbURL.User = url.UserPassword(dbURL.User.Username(), markDB)
	srv := startNATS(t, func(o *server.Options) { o.Username, o.Password = "u", markNatsPW })
	sim := httptest.NewServer(stripesim.New(stripesim.Config{Seed: 1}))
	t.Cleanup(sim.Close)

	env := map[string]string{
		"DATABASE_URL":       dbURL.String(),
		"NATS_URL":           srv.ClientURL(),
		"NATS_USER":          "u",
		"NATS_PASSWORD":      markNatsPW,
		"STRIPE_SECRET_KEY":  markStripe,
		"STRIPE_API_BASE":    sim.URL,
		"PAYDEDUP_LOG_LEVEL": "debug",
		"PAYDEDUP_DLQ_KEY":   markDLQKey,
	}
	env["PAYDEDUP_DLQ_PREVIOUS_KEYS"] = markDLQOld
	var out, errOut testenv.Buffer
	root := newRootCmd(&out, &errOut, envFunc(env))
	root.SetArgs([]string{"worker"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(errOut.String(), "worker started") {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("worker ended early: %v\n%s", err, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("worker did not start:\n%s", errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("worker: %v", err)
	}
	assertNoSecret(t, "worker logs", out.String()+errOut.String())
}

// startNATS runs an embedded server on a free port, configured by conf.
func startNATS(t *testing.T, conf func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: testenv.FreePort(t), JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	conf(opts)
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded NATS did not start")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// connectWith resolves natsFlags from env alone, as a command would, and
// connects.
func connectWith(env map[string]string) error {
	var errOut bytes.Buffer
	return connectWithErrOut(env, &errOut)
}

func connectWithErrOut(env map[string]string, errOut io.Writer) error {
	var out bytes.Buffer
	a := &app{out: &out, errOut: errOut, getenv: envFunc(env)}
	cmd := &cobra.Command{Use: "x"}
	var n natsFlags
	n.bind(cmd, a)
	if err := cmd.Flags().Parse(nil); err != nil {
		return err
	}
	if err := n.validate(); err != nil {
		return err
	}
	nc, err := n.connect("paydedup-test", nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	if !nc.IsConnected() {
		return fmt.Errorf("not connected: %v", nc.Status())
	}
	return nil
}

func TestNATSUserPassword(t *testing.T) {
	t.Parallel()
	srv := startNATS(t, func(o *server.Options) { o.Username, o.Password = "paydedup", markNatsPW })
	ok := map[string]string{"NATS_URL": srv.ClientURL(), "NATS_USER": "paydedup", "NATS_PASSWORD": markNatsPW}
	if err := connectWith(ok); err != nil {
		t.Fatalf("user/password from the environment: %v", err)
	}
	bad := map[string]string{"NATS_URL": srv.ClientURL(), "NATS_USER": "paydedup", "NATS_PASSWORD": "wrong-" + markNATS}
	err := connectWith(bad)
	if err == nil {
		t.Fatal("a wrong password connected")
	}
	assertNoSecret(t, "connect error", err.Error())
	// A password in the URL works too and is redacted from errors.
	inURL := map[string]string{"NATS_URL": "nats://paydedup:" + markNatsPW + "@" + strings.TrimPrefix(srv.ClientURL(), "nats://")}
	if err := connectWith(inURL); err != nil {
		t.Fatalf("user/password in NATS_URL: %v", err)
	}
	if err := connectWith(map[string]string{"NATS_PASSWORD": markNatsPW}); err == nil || !strings.Contains(err.Error(), "NATS_USER") {
		t.Fatalf("a password without a user must be refused, got %v", err)
	}
}

func TestNATSCredsFile(t *testing.T) {
	t.Parallel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	op, err := nkeys.CreateOperator()
	must(err)
	opPub, err := op.PublicKey()
	must(err)
	opJWT, err := jwt.NewOperatorClaims(opPub).Encode(op)
	must(err)
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	must(err)
	acc, err := nkeys.CreateAccount()
	must(err)
	accPub, err := acc.PublicKey()
	must(err)
	accJWT, err := jwt.NewAccountClaims(accPub).Encode(op)
	must(err)
	user, err := nkeys.CreateUser()
	must(err)
	userPub, err := user.PublicKey()
	must(err)
	uc := jwt.NewUserClaims(userPub)
	uc.IssuerAccount = accPub
	userJWT, err := uc.Encode(acc)
	must(err)
	seed, err := user.Seed()
	must(err)
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	must(err)
	credsPath := filepath.Join(t.TempDir(), "worker.creds")
	must(os.WriteFile(credsPath, creds, 0o600))

	resolver := &server.MemAccResolver{}
	must(resolver.Store(accPub, accJWT))
	srv := startNATS(t, func(o *server.Options) {
		o.JetStream = false
		o.TrustedOperators = []*jwt.OperatorClaims{opClaims}
		o.AccountResolver = resolver
	})
	if err := connectWith(map[string]string{"NATS_URL": srv.ClientURL(), "NATS_CREDS": credsPath}); err != nil {
		t.Fatalf("connect with NATS_CREDS: %v", err)
	}
	if err := connectWith(map[string]string{"NATS_URL": srv.ClientURL()}); err == nil {
		t.Fatal("connected without credentials to a server that requires them")
	}
	err = connectWith(map[string]string{"NATS_URL": srv.ClientURL(), "NATS_CREDS": filepath.Join(t.TempDir(), "missing.creds")})
	if err == nil || !strings.Contains(err.Error(), "NATS_CREDS") {
		t.Fatalf("a missing creds file must be named in the error, got %v", err)
	}
}

func TestNATSTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t)
	caPath := filepath.Join(dir, "ca.pem")
	writePEM(t, caPath, "CERTIFICATE", ca.der)
	srvCert := ca.issue(t, "server", dir, true)
	cliCert := ca.issue(t, "client", dir, false)

	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	serverTLS, err := tls.LoadX509KeyPair(srvCert.cert, srvCert.key)
	if err != nil {
		t.Fatal(err)
	}
	srv := startNATS(t, func(o *server.Options) {
		o.JetStream = false
		o.TLS, o.TLSVerify = true, true // mutual TLS: the client must show a certificate
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{serverTLS}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	})
	u := srv.ClientURL() // tls://…
	full := map[string]string{"NATS_URL": u, "NATS_CA": caPath, "NATS_CERT": cliCert.cert, "NATS_KEY": cliCert.key}
	if err := connectWith(full); err != nil {
		t.Fatalf("mutual TLS from the environment: %v", err)
	}
	if err := connectWith(map[string]string{"NATS_URL": u, "NATS_CA": caPath}); err == nil {
		t.Fatal("connected without the client certificate the server requires")
	}
	if err := connectWith(map[string]string{"NATS_URL": u, "NATS_CERT": cliCert.cert, "NATS_KEY": cliCert.key}); err == nil {
		t.Fatal("connected without the CA: the server certificate was not verified")
	}
	if err := connectWith(map[string]string{"NATS_URL": u, "NATS_CA": caPath, "NATS_CERT": cliCert.cert}); err == nil ||
		!strings.Contains(err.Error(), "NATS_KEY") {
		t.Fatalf("a certificate without its key must be refused, got %v", err)
	}
	// The old names still connect, and say what to set instead.
	old := map[string]string{"NATS_URL": u, "NATS_TLS_CA": caPath, "NATS_TLS_CERT": cliCert.cert, "NATS_TLS_KEY": cliCert.key}
	var warn bytes.Buffer
	if err := connectWithErrOut(old, &warn); err != nil {
		t.Fatalf("mutual TLS from the deprecated NATS_TLS_* variables: %v", err)
	}
	for _, want := range []string{"NATS_TLS_CA is deprecated: set NATS_CA", "NATS_TLS_CERT is deprecated: set NATS_CERT", "NATS_TLS_KEY is deprecated: set NATS_KEY"} {
		if !strings.Contains(warn.String(), want) {
			t.Errorf("no warning %q in %q", want, warn.String())
		}
	}
}

type testCA struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

type certFiles struct{ cert, key string }

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "paydedup test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, der: der, key: key}
}

func (ca *testCA) issue(t *testing.T, name, dir string, isServer bool) certFiles {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if isServer {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := certFiles{cert: filepath.Join(dir, name+".pem"), key: filepath.Join(dir, name+"-key.pem")}
	writePEM(t, f.cert, "CERTIFICATE", der)
	writePEM(t, f.key, "EC PRIVATE KEY", keyDER)
	return f
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                              "nats://127.0.0.1:4222",
		"nats://u:p@h:4222":                                  "nats://***@h:4222",
		"nats://token@h:4222":                                "nats://***@h:4222",
		"nats://a:p1@h1:4222,nats://b:p2@h2:4222":            "nats://***@h1:4222,nats://***@h2:4222",
		"nats://h1:4222,tls://u:p@ss@h2:4222":                "nats://h1:4222,tls://***@h2:4222",
		"u:p@h:4222":                                         "***@h:4222",
		"nats://h1:4222, nats://user:" + markNATS + "@h2:42": "nats://h1:4222, nats://***@h2:42",
	} {
		if got := redact.URLs(in); got != want {
			t.Errorf("redact.URLs(%q) = %q, want %q", in, got, want)
		}
	}
}

// NATS_NKEY signs the server's challenge with the seed in the file: the
// server admits that nkey, and nobody without it.
func TestNATSNkey(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	path := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startNATS(t, func(o *server.Options) {
		o.JetStream = false
		o.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	})
	if err := connectWith(map[string]string{"NATS_URL": srv.ClientURL(), "NATS_NKEY": path}); err != nil {
		t.Fatalf("connect with NATS_NKEY: %v", err)
	}
	if err := connectWith(map[string]string{"NATS_URL": srv.ClientURL()}); err == nil {
		t.Fatal("connected without the nkey the server requires")
	}
	if err := connectWith(map[string]string{"NATS_URL": srv.ClientURL(), "NATS_NKEY": path + ".missing"}); err == nil ||
		!strings.Contains(err.Error(), "NATS_NKEY") {
		t.Fatalf("a missing seed file must be named, got %v", err)
	}
}
