package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// dockerfile is a Dockerfile's instructions, continuation lines joined.
type dockerfile struct {
	args   map[string]string // ARGs before the first FROM, with defaults
	stages [][]instruction   // one slice per FROM, the FROM first
}

type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY, USER, ...
	args string
}

func parseDockerfile(data string) dockerfile {
	df := dockerfile{args: map[string]string{}}
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	for _, l := range logical {
		cmd, args, _ := strings.Cut(l, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		switch {
		case in.cmd == "FROM":
			df.stages = append(df.stages, []instruction{in})
		case len(df.stages) == 0 && in.cmd == "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			df.args[k] = v
		case len(df.stages) > 0:
			df.stages[len(df.stages)-1] = append(df.stages[len(df.stages)-1], in)
		}
	}
	return df
}

// image returns a stage's base image, global ARGs expanded.
func (df dockerfile) image(stage int) string {
	fields := strings.Fields(df.stages[stage][0].args)
	for _, f := range fields {
		if !strings.HasPrefix(f, "--") {
			return os.Expand(f, func(k string) string { return df.args[k] })
		}
	}
	return ""
}

func (df dockerfile) find(stage int, cmd string) []string {
	var out []string
	for _, in := range df.stages[stage][1:] {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

func TestDockerfile(t *testing.T) {
	b := readBinary(t)
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := parseDockerfile(string(data))
	if len(df.stages) < 2 {
		t.Fatalf("want a multi-stage build, got %d stages", len(df.stages))
	}

	// The builder's Go is the one go.mod asks for.
	goMinor := strings.Join(strings.SplitN(b.goVersion, ".", 3)[:2], ".")
	if img := df.image(0); img != "golang:"+goMinor {
		t.Errorf("builder image %q, want golang:%s (go.mod says go %s)", img, goMinor, b.goVersion)
	}
	var build string
	for _, run := range df.find(0, "RUN") {
		if strings.Contains(run, "go build") {
			build = run
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-s -w`, "-X main.version=$VERSION", "./cmd/paydedup", "--mount=type=cache,target=/go/pkg/mod", "--mount=type=cache,target=/root/.cache/go-build"} {
		if !strings.Contains(build, want) {
			t.Errorf("the go build step lacks %q: %s", want, build)
		}
	}
	// paydedup version reads the build information: VCS stamping stays on
	// (the context has no .git, so it finds nothing and VERSION names the
	// build; a build from a clone gets its revision).
	if strings.Contains(build, "buildvcs=false") {
		t.Errorf("the go build step turns VCS stamping off (-buildvcs=false): paydedup version would say less: %s", build)
	}
	// The production binary leaves the lab out; the last build is the one
	// the final stage copies.
	if i := strings.LastIndex(build, "go build"); !strings.Contains(build[i:], "-tags nolab") || !strings.Contains(build[i:], "-o /out/paydedup ") {
		t.Errorf("the last go build must make /out/paydedup with -tags nolab: %s", build)
	}

	// The last stage is what `docker build` produces: the production image.
	last := len(df.stages) - 1
	if img := df.image(last); img != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("final image %q, want gcr.io/distroless/static-debian12:nonroot", img)
	}
	for _, want := range []struct{ cmd, args string }{
		{"USER", "65532:65532"},
		{"ENTRYPOINT", `["/paydedup"]`},
	} {
		if got := df.find(last, want.cmd); !slices.Contains(got, want.args) {
			t.Errorf("final stage: %s %v, want %s", want.cmd, got, want.args)
		}
	}
	// The admin listener is on by default, at the port the image exposes,
	// so probes and "paydedup healthcheck" need no setting.
	var adminAddr string
	for _, env := range df.find(last, "ENV") {
		if v, ok := strings.CutPrefix(env, "PAYDEDUP_ADMIN_ADDR="); ok {
			adminAddr = v
		}
	}
	_, adminPort, err := net.SplitHostPort(adminAddr)
	if err != nil || !slices.Contains(df.find(last, "EXPOSE"), adminPort) {
		t.Errorf("final stage: ENV PAYDEDUP_ADMIN_ADDR=%q must listen on the port it EXPOSEs (%v)", adminAddr, df.find(last, "EXPOSE"))
	}
	if copies := df.find(last, "COPY"); !slices.ContainsFunc(copies, func(c string) bool {
		return strings.HasPrefix(c, "--from=") && strings.HasSuffix(c, " /paydedup")
	}) {
		t.Errorf("final stage copies no binary to /paydedup: %v", copies)
	}
}

// TestDockerignore: the context keeps what go build needs.
func TestDockerignore(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(mainModule, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, l)
		}
	}
	ignored := func(p string) string {
		for _, pat := range patterns {
			pat = strings.TrimPrefix(strings.TrimSuffix(pat, "/"), "/")
			for q := p; q != "." && q != "/"; q = path.Dir(q) {
				if ok, _ := path.Match(pat, q); ok {
					return pat
				}
				if rest, ok := strings.CutPrefix(pat, "**/"); ok {
					if ok, _ := path.Match(rest, path.Base(q)); ok {
						return pat
					}
				}
			}
		}
		return ""
	}
	for _, p := range []string{"go.mod", "go.sum", "cmd/paydedup/main.go", "consumer/config.go", "migrations/migrations.go", "migrations/00001_idempotency_keys.sql", "ops/ops.go"} {
		if pat := ignored(p); pat != "" {
			t.Errorf(".dockerignore pattern %q drops %s, which the build needs", pat, p)
		}
	}
	for _, p := range []string{".git/HEAD", "consumer/e2e_test.go", "deploy/compose.yaml"} {
		if ignored(p) == "" {
			t.Errorf(".dockerignore keeps %s in the build context", p)
		}
	}
}

// The part of the compose specification this file uses; a misspelt key
// fails the strict decode instead of being ignored by Docker.
type composeFile struct {
	Name     string                    `json:"name"`
	Services map[string]composeService `json:"services"`
	Volumes  map[string]any            `json:"volumes"`
}

type composeService struct {
	Image       string            `json:"image"`
	Build       *composeBuild     `json:"build,omitempty"`
	Command     []string          `json:"command,omitempty"`
	Environment map[string]string `json:"environment,omitempty"`
	Ports       []string          `json:"ports,omitempty"`
	Volumes     []string          `json:"volumes,omitempty"`
	Healthcheck *struct {
		Test        []string `json:"test"`
		Interval    string   `json:"interval,omitempty"`
		Timeout     string   `json:"timeout,omitempty"`
		Retries     int      `json:"retries,omitempty"`
		StartPeriod string   `json:"start_period,omitempty"`
	} `json:"healthcheck,omitempty"`
	DependsOn map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on,omitempty"`
	Restart         string   `json:"restart,omitempty"`
	ReadOnly        bool     `json:"read_only,omitempty"`
	User            string   `json:"user,omitempty"`
	CapDrop         []string `json:"cap_drop,omitempty"`
	SecurityOpt     []string `json:"security_opt,omitempty"`
	StopGracePeriod string   `json:"stop_grace_period,omitempty"`
}

type composeBuild struct {
	Context    string            `json:"context"`
	Dockerfile string            `json:"dockerfile"`
	Target     string            `json:"target,omitempty"`
	Args       map[string]string `json:"args,omitempty"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	// Extension fields (x-...) are anchors' homes, not configuration.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(j, &top); err != nil {
		t.Fatal(err)
	}
	for k := range top {
		if strings.HasPrefix(k, "x-") {
			delete(top, k)
		}
	}
	j, _ = json.Marshal(top)
	var cf composeFile
	if err := strictJSON(j, &cf); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return cf
}

func TestCompose(t *testing.T) {
	b := readBinary(t)
	cf := loadCompose(t)
	svc := func(name string) composeService {
		t.Helper()
		s, ok := cf.Services[name]
		if !ok {
			t.Fatalf("compose.yaml has no service %q", name)
		}
		return s
	}

	pg := svc("postgres")
	if pg.Image != "postgres:15" {
		t.Errorf("postgres image %q, want postgres:15 (what CI runs)", pg.Image)
	}
	nats := svc("nats")
	if !strings.HasPrefix(nats.Image, "nats:2.9") {
		t.Errorf("nats image %q, want the 2.9 server (what CI runs)", nats.Image)
	}
	if args := strings.Join(nats.Command, " "); !strings.Contains(args, "-js") || !strings.Contains(args, "-m 8222") {
		t.Errorf("nats command %q needs -js and -m 8222", args)
	}

	sim := svc("sim")
	if len(sim.Command) == 0 || sim.Command[0] != "provider-sim" {
		t.Fatalf("sim command %q, want provider-sim ...", sim.Command)
	}
	i := slices.Index(sim.Command, "--addr")
	if i < 0 || i+1 >= len(sim.Command) {
		t.Fatalf("sim command %q has no --addr", sim.Command)
	}
	_, simPort, err := net.SplitHostPort(sim.Command[i+1])
	if err != nil || strings.HasPrefix(sim.Command[i+1], "127.") {
		t.Errorf("sim --addr %q must listen on all interfaces for the workers to reach it", sim.Command[i+1])
	}

	migrate := svc("migrate")
	if !slices.Equal(migrate.Command, []string{"migrate", "up"}) {
		t.Errorf("migrate command %q, want [migrate up]", migrate.Command)
	}
	if migrate.Restart != "no" {
		t.Errorf("migrate restart %q, want \"no\": it is one-shot", migrate.Restart)
	}

	for _, name := range []string{"postgres", "nats", "sim"} {
		if cf.Services[name].Healthcheck == nil {
			t.Errorf("service %s has no healthcheck: dependants cannot wait for it", name)
		}
	}

	var workers []string
	for name, s := range cf.Services {
		if len(s.Command) > 0 && s.Command[0] == "worker" {
			workers = append(workers, name)
		}
	}
	if len(workers) < 2 {
		t.Errorf("want two workers sharing the consumer, got %v", workers)
	}
	for _, name := range workers {
		w := cf.Services[name]
		env := w.Environment
		for k, want := range map[string]string{
			"PAYDEDUP_PROVIDER":   "stripe",
			"STRIPE_API_BASE":     "http://sim:" + simPort,
			"PAYDEDUP_ADMIN_ADDR": ":9090",
		} {
			if env[k] != want {
				t.Errorf("%s: %s=%q, want %q", name, k, env[k], want)
			}
		}
		if !strings.HasPrefix(env["STRIPE_SECRET_KEY"], "sk_test_") {
			t.Errorf("%s: STRIPE_SECRET_KEY must be a throwaway sk_test_ key", name)
		}
		for k := range env {
			if !b.readsEnv(k) {
				t.Errorf("%s sets %s, which paydedup does not read", name, k)
			}
		}
		if w.DependsOn["migrate"].Condition != "service_completed_successfully" {
			t.Errorf("%s: must depend on migrate completing successfully, got %+v", name, w.DependsOn)
		}
		for _, dep := range []string{"nats", "sim"} {
			if w.DependsOn[dep].Condition != "service_healthy" {
				t.Errorf("%s: must wait for %s to be healthy, got %+v", name, dep, w.DependsOn[dep])
			}
		}
		checkHealthcheck(t, name, w)
		drain := b.drainTimeout
		if v, ok := env["PAYDEDUP_DRAIN_TIMEOUT"]; ok {
			if drain, err = time.ParseDuration(v); err != nil {
				t.Fatalf("%s: PAYDEDUP_DRAIN_TIMEOUT=%q", name, v)
			}
		}
		grace, err := time.ParseDuration(w.StopGracePeriod)
		if err != nil || grace <= drain+drainMargin {
			t.Errorf("%s: stop_grace_period %q must exceed the drain %v + %v (Docker's default is 10s)", name, w.StopGracePeriod, drain, drainMargin)
		}
	}

	// Each process logs in as its own role (migrations 00002 and 00006),
	// with the password the one-shot "roles" service gives it; only
	// migrate runs as the owner.
	roles := svc("roles")
	passwords := strings.Join(roles.Command, " ")
	if roles.DependsOn["migrate"].Condition != "service_completed_successfully" || roles.Restart != "no" {
		t.Errorf("roles: must run once, after migrate completed: %+v restart %q", roles.DependsOn, roles.Restart)
	}
	for name, s := range cf.Services {
		if len(s.Command) == 0 {
			continue
		}
		want := map[string]string{"worker": "paydedup_worker", "reconcile": "paydedup_worker", "gateway": "paydedup_gateway"}[s.Command[0]]
		if want == "" {
			continue
		}
		u, err := url.Parse(s.Environment["DATABASE_URL"])
		if err != nil || u.User.Username() != want {
			t.Errorf("%s: DATABASE_URL must log in as %s, got %v", name, want, u.User)
			continue
		}
		pass, _ := u.User.Password()
		if !strings.Contains(passwords, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", want, pass)) {
			t.Errorf("%s: the roles service does not give %s the password of its DATABASE_URL", name, want)
		}
		if s.DependsOn["roles"].Condition != "service_completed_successfully" {
			t.Errorf("%s: must wait for the roles service, got %+v", name, s.DependsOn)
		}
		for k := range s.Environment {
			if !b.readsEnv(k) {
				t.Errorf("%s sets %s, which paydedup does not read", name, k)
			}
		}
	}
	if u, err := url.Parse(migrate.Environment["DATABASE_URL"]); err != nil || strings.HasPrefix(u.User.Username(), "paydedup_") {
		t.Errorf("migrate: DATABASE_URL must be the owner's, got %v", u.User)
	}

	checkHealthcheck(t, "gateway", svc("gateway"))

	// Every paydedup container is the image deploy/Dockerfile builds.
	for name, s := range cf.Services {
		if len(s.Command) == 0 || !slices.Contains([]string{"worker", "migrate", "provider-sim", "reconcile", "gateway"}, s.Command[0]) {
			continue
		}
		if s.Build == nil || s.Build.Dockerfile != "deploy/Dockerfile" || path.Clean(s.Build.Context) != ".." {
			t.Errorf("%s: must build deploy/Dockerfile with the repository as context, got %+v", name, s.Build)
		}
		// The shipped image (the last stage), except the lab-only simulator.
		wantTarget := ""
		if s.Command[0] == "provider-sim" {
			wantTarget = "lab"
		}
		if s.Build != nil && s.Build.Target != wantTarget {
			t.Errorf("%s: builds target %q, want %q (the production image for everything but the simulator)", name, s.Build.Target, wantTarget)
		}
		if !s.ReadOnly || s.User == "" || s.User == "0" || s.User == "root" {
			t.Errorf("%s: run read-only and non-root (read_only %v, user %q)", name, s.ReadOnly, s.User)
		}
	}
}

// checkHealthcheck: a paydedup service's healthcheck runs "paydedup
// healthcheck" (the image has no shell or wget), which probes /readyz.
func checkHealthcheck(t *testing.T, name string, s composeService) {
	t.Helper()
	if s.Healthcheck == nil || !slices.Equal(s.Healthcheck.Test, []string{"CMD", "/paydedup", "healthcheck"}) {
		t.Errorf("%s: healthcheck must be [CMD /paydedup healthcheck] (it probes /readyz on PAYDEDUP_ADMIN_ADDR), got %+v", name, s.Healthcheck)
	}
	if s.Environment["PAYDEDUP_ADMIN_ADDR"] == "" {
		t.Errorf("%s: PAYDEDUP_ADMIN_ADDR must be set for the healthcheck to find the listener", name)
	}
}

func TestParseDockerfile(t *testing.T) {
	df := parseDockerfile("ARG GO=1.26\n# c\nFROM --platform=$BUILDPLATFORM golang:${GO} AS b\nRUN a \\\n  b\nFROM scratch\nUSER 1\n")
	if got := fmt.Sprintf("%d %s %s %q %q", len(df.stages), df.image(0), df.image(1), df.find(0, "RUN"), df.find(1, "USER")); got != `2 golang:1.26 scratch ["a  b"] ["1"]` {
		t.Errorf("parseDockerfile: %s", got)
	}
}
