package deploy

import (
	"bytes"
	"cmp"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// drainMargin is what the grace period must leave after the drain deadline:
// releasing and nakking unfinished work, then closing the pools and the
// admin listener.
const drainMargin = 5 * time.Second

// sensitiveEnv are the variables that carry credentials: they come from a
// Secret by reference, never as a value in a manifest or a ConfigMap.
var sensitiveEnv = []string{"DATABASE_URL", "STRIPE_SECRET_KEY", "NATS_PASSWORD", "PAYDEDUP_DLQ_KEY"}

// credentialPattern catches a credential pasted where configuration goes: a
// Stripe key, or a URL with user information (postgres://u:p@, nats://token@).
var credentialPattern = regexp.MustCompile(`\b[sr]k_(live|test)_|://[^/\s@]+@`)

// overlayWant is what each shipped overlay promises beyond the checks every
// rendering passes.
var overlayWant = map[string]struct {
	replicas     int32 // fixed replica count; 0 when KEDA owns it
	scaledObject bool
	pdb          bool
	pinnedImage  bool
}{
	"dev":  {replicas: 1},
	"prod": {scaledObject: true, pdb: true, pinnedImage: true},
}

func TestOverlays(t *testing.T) {
	b := readBinary(t)
	overlays := dirs(t, overlaysDir)
	for name := range overlayWant {
		if !slices.Contains(overlays, name) {
			t.Errorf("overlay %s is missing from %s", name, overlaysDir)
		}
	}
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, "overlays/"+o, filepath.Join(overlaysDir, o))
			checkRendering(t, b, r)
			want, ok := overlayWant[o]
			if !ok {
				return
			}
			w := worker(t, r)
			if want.replicas > 0 && (w.Spec.Replicas == nil || *w.Spec.Replicas != want.replicas) {
				t.Errorf("worker replicas = %v, want %d", ptrString(w.Spec.Replicas), want.replicas)
			}
			if want.scaledObject && len(r.scaledObjects) == 0 {
				t.Error("no KEDA ScaledObject")
			}
			if want.pdb && len(r.pdbs) == 0 {
				t.Error("no PodDisruptionBudget")
			}
			if want.pinnedImage {
				img := w.Spec.Template.Spec.Containers[0].Image
				if !pinned(img) {
					t.Errorf("image %q is not pinned to a release tag or digest", img)
				}
			}
		})
	}
}

// TestComponents renders every component on top of every overlay, and all of
// them together on prod, as a user's overlay would include them.
func TestComponents(t *testing.T) {
	b := readBinary(t)
	components := dirs(t, componentsDir)
	if len(components) == 0 {
		t.Fatal("no components")
	}
	for _, o := range dirs(t, overlaysDir) {
		for _, c := range components {
			t.Run(o+"+"+c, func(t *testing.T) {
				checkRendering(t, b, render(t, o+"+"+c, withComponents(t, o, c)))
			})
		}
	}
	t.Run("prod+all", func(t *testing.T) {
		r := render(t, "prod+all", withComponents(t, "prod", components...))
		checkRendering(t, b, r)
		if len(r.podMonitors) == 0 || len(r.prometheusRules) == 0 {
			t.Error("components/monitoring: no PodMonitor or PrometheusRule")
		}
		checkDashboardConfigMap(t, r)
		if reconcilers(r) == nil {
			t.Error("components/reconciler: no reconciler Deployment")
		}
		checkGateway(t, r)
		if len(r.cronJobs) == 0 {
			t.Error("components/audit: no audit CronJob")
		}
	})
}

// checkDashboardConfigMap: components/monitoring ships the dashboard,
// byte for byte, where Grafana's sidecar looks for it.
func checkDashboardConfigMap(t *testing.T, r *rendering) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join("grafana", "paydedup.json"))
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, cm := range r.configMaps {
		if cm.Labels["grafana_dashboard"] != "1" {
			continue
		}
		found = true
		if got := cm.Data["paydedup.json"]; got != string(want) {
			t.Errorf("ConfigMap %s: paydedup.json is not deploy/grafana/paydedup.json", cm.Name)
		}
		if cm.Name != "paydedup-dashboard" {
			t.Errorf("dashboard ConfigMap named %s: a hashed name leaves copies behind", cm.Name)
		}
	}
	if !found {
		t.Error("components/monitoring: no ConfigMap labelled grafana_dashboard=1")
	}
}

// checkGateway: components/gateway deploys the gateway as the workers are
// (probes, resources and security are checked for every Deployment), sized
// by an HPA that owns its replicas, with a PodDisruptionBudget and a Service.
func checkGateway(t *testing.T, r *rendering) {
	t.Helper()
	gws := commandDeployments(r, "gateway")
	if len(gws) != 1 {
		t.Fatalf("components/gateway: %d gateway Deployments, want 1", len(gws))
	}
	gw := gws[0]
	if gw.Spec.Replicas != nil {
		t.Errorf("Deployment %s sets replicas: the HPA owns them, and every apply would reset its choice", gw.Name)
	}
	var hpas []*autoscalingv2.HorizontalPodAutoscaler
	for _, h := range r.hpas {
		if h.Spec.ScaleTargetRef.Kind == "Deployment" && h.Spec.ScaleTargetRef.Name == gw.Name {
			hpas = append(hpas, h)
		}
	}
	if len(hpas) != 1 {
		t.Fatalf("%d HorizontalPodAutoscalers target %s, want 1", len(hpas), gw.Name)
	}
	h := hpas[0]
	if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
		t.Errorf("HPA %s: replicas %s to %d, want at least 2 (one may be disrupted)", h.Name, ptrString(h.Spec.MinReplicas), h.Spec.MaxReplicas)
	}
	c := gw.Spec.Template.Spec.Containers[0]
	for _, m := range h.Spec.Metrics {
		if m.Resource != nil && m.Resource.Target.Type == autoscalingv2.UtilizationMetricType {
			if _, ok := c.Resources.Requests[m.Resource.Name]; !ok {
				t.Errorf("HPA %s scales on %s utilization, which %s does not request", h.Name, m.Resource.Name, gw.Name)
			}
		}
	}
	if !slices.ContainsFunc(r.pdbs, func(p *policyv1.PodDisruptionBudget) bool { return selects(t, p.Spec.Selector, gw) }) {
		t.Errorf("no PodDisruptionBudget selects %s", gw.Name)
	}
	if !slices.ContainsFunc(r.services, func(s *corev1.Service) bool {
		return s.Spec.Selector["app.kubernetes.io/component"] == gw.Spec.Template.Labels["app.kubernetes.io/component"] &&
			slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return resolvePort(c, p.TargetPort) > 0 })
	}) {
		t.Errorf("no Service routes to %s's HTTP port", gw.Name)
	}
	if ref := secretRef(c, "STRIPE_SECRET_KEY"); ref != nil {
		t.Errorf("%s gets the provider key: it never charges", gw.Name)
	}
}

// checkMemoryLimit: every Deployment's containers have a memory limit and
// give it to the Go runtime as GOMEMLIMIT, from their own limit.
func checkMemoryLimit(t *testing.T, r *rendering) {
	t.Helper()
	for _, d := range r.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			id := d.Name + "/" + c.Name
			if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
				t.Errorf("%s: no memory limit", id)
			}
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" })
			if i < 0 {
				t.Errorf("%s: no GOMEMLIMIT: the GC would not know the container's limit", id)
				continue
			}
			e := c.Env[i]
			if e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
				e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" || e.ValueFrom.ResourceFieldRef.ContainerName != c.Name {
				t.Errorf("%s: GOMEMLIMIT must come from resourceFieldRef limits.memory of %s, got %+v", id, c.Name, e)
			} else if dv := e.ValueFrom.ResourceFieldRef.Divisor; !dv.IsZero() && dv.Value() != 1 {
				// Go reads a bare number as bytes: a divisor of 1Mi would make it 128 bytes.
				t.Errorf("%s: GOMEMLIMIT divisor %s, want bytes (none)", id, dv.String())
			}
		}
	}
}

// checkMigrateReapply: the migrate Job's pod template is immutable, so the
// next release's Job must replace it rather than be refused. Under Argo CD
// a PreSync hook deleted before each creation does; under plain kubectl the
// documented delete-then-apply, and the TTL, do. Without either, the next
// image would never migrate (and the workers, gated on the schema version,
// would never become ready).
func checkMigrateReapply(t *testing.T, j *batchv1.Job) {
	t.Helper()
	if got := j.Annotations["argocd.argoproj.io/hook"]; got != "PreSync" {
		t.Errorf("Job %s: argocd.argoproj.io/hook %q, want PreSync: it runs before the Deployments sync", j.Name, got)
	}
	if got := j.Annotations["argocd.argoproj.io/hook-delete-policy"]; !slices.Contains(strings.Split(got, ","), "BeforeHookCreation") {
		t.Errorf("Job %s: hook-delete-policy %q lacks BeforeHookCreation: the previous Job would block the new one", j.Name, got)
	}
	if ttl := j.Spec.TTLSecondsAfterFinished; ttl == nil || *ttl > 3600 {
		t.Errorf("Job %s: ttlSecondsAfterFinished %s, want at most an hour so a plain re-apply soon finds it gone", j.Name, ptrString(ttl))
	}
	doc, err := os.ReadFile(filepath.Join(kustomizeDir, "base", "migrate-job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "kubectl -n NAMESPACE delete job " + j.Name + " --ignore-not-found"; !strings.Contains(string(doc), want) {
		t.Errorf("base/migrate-job.yaml does not document the plain-kubectl re-apply (%s)", want)
	}
}

// checkRendering asserts what every rendering must hold.
func checkRendering(t *testing.T, b *binary, r *rendering) {
	t.Helper()
	w := worker(t, r)
	wc := w.Spec.Template.Spec.Containers[0]
	wenv := effectiveEnv(t, r, wc)

	t.Run("security", func(t *testing.T) { checkSecurity(t, r) })
	t.Run("secrets", func(t *testing.T) { checkSecrets(t, r) })
	t.Run("env names", func(t *testing.T) { checkEnvNames(t, b, r) })
	t.Run("one image", func(t *testing.T) { checkOneImage(t, r) })
	t.Run("memory limit", func(t *testing.T) { checkMemoryLimit(t, r) })
	t.Run("worker GC", func(t *testing.T) {
		// The worker's GC pace is the binary's own default (GOGC 400 when
		// unset, docs/configuration.md), under the GOMEMLIMIT of its own
		// limit: a GOGC here would override it.
		if got, ok := wenv["GOGC"]; ok {
			t.Errorf("worker: GOGC=%q set; the binary's default applies only when it is unset", got)
		}
	})

	t.Run("probes", func(t *testing.T) {
		for _, d := range append(append([]*appsv1.Deployment{w}, reconcilers(r)...), commandDeployments(r, "gateway")...) {
			c := d.Spec.Template.Spec.Containers[0]
			checkProbes(t, b, d.Name, c, effectiveEnv(t, r, c))
		}
	})

	t.Run("drain", func(t *testing.T) {
		raw, ok := wenv["PAYDEDUP_DRAIN_TIMEOUT"]
		if !ok {
			t.Fatalf("worker: PAYDEDUP_DRAIN_TIMEOUT is not set (the binary's default is %v): set it explicitly so the grace period can be checked against it", b.drainTimeout)
		}
		drain, err := time.ParseDuration(raw)
		if err != nil || drain <= 0 {
			t.Fatalf("worker: PAYDEDUP_DRAIN_TIMEOUT=%q is not a positive duration", raw)
		}
		g := w.Spec.Template.Spec.TerminationGracePeriodSeconds
		if g == nil {
			t.Fatal("worker: terminationGracePeriodSeconds is not set (Kubernetes' default is 30s)")
		}
		if grace := time.Duration(*g) * time.Second; grace <= drain+drainMargin {
			t.Errorf("worker: terminationGracePeriodSeconds %v must exceed PAYDEDUP_DRAIN_TIMEOUT %v + %v, or the kubelet kills the drain", grace, drain, drainMargin)
		}
		if lc := wc.Lifecycle; lc != nil && lc.PreStop != nil {
			t.Error("worker: a preStop hook delays SIGTERM and eats into the grace period; the binary drains on SIGTERM itself")
		}
	})

	t.Run("retention", func(t *testing.T) {
		// The payments stream has no max age: a paused worker must find
		// every command it has not settled. The worker refuses the
		// variable.
		if v, ok := wenv["PAYDEDUP_STREAM_MAX_AGE"]; ok {
			t.Errorf("PAYDEDUP_STREAM_MAX_AGE=%s is set: the worker refuses it; bound the stream with PAYDEDUP_STREAM_MAX_BYTES", v)
		}
		if keys := envDuration(t, wenv, "PAYDEDUP_KEY_RETENTION", b.keyRetention); keys < 24*time.Hour {
			t.Errorf("PAYDEDUP_KEY_RETENTION %v: keep keys at least a day, beyond the provider's own key window", keys)
		}
	})

	t.Run("reconciler", func(t *testing.T) {
		inWorker := true
		if v, ok := wenv["PAYDEDUP_RECONCILE"]; ok {
			var err error
			if inWorker, err = strconv.ParseBool(v); err != nil {
				t.Fatalf("PAYDEDUP_RECONCILE=%q is not a boolean", v)
			}
		}
		apart := len(reconcilers(r)) > 0
		switch {
		case apart && inWorker:
			t.Error("a reconciler Deployment runs and the workers still reconcile: set PAYDEDUP_RECONCILE=false")
		case !apart && !inWorker:
			t.Error("PAYDEDUP_RECONCILE=false but no reconciler Deployment: pending rows would never be resolved")
		}
		for _, d := range reconcilers(r) {
			c := d.Spec.Template.Spec.Containers[0]
			if !slices.Equal(c.Args, []string{"reconcile"}) {
				t.Errorf("%s: args %q, want [reconcile]", d.Name, c.Args)
			}
		}
	})

	t.Run("dlq key", func(t *testing.T) {
		// The worker refuses to start without the key dead letters are
		// authenticated with.
		if secretRef(wc, "PAYDEDUP_DLQ_KEY") == nil {
			t.Error("the worker must take PAYDEDUP_DLQ_KEY from a secretKeyRef")
		}
	})

	t.Run("migrate job", func(t *testing.T) {
		var found bool
		for _, j := range r.jobs {
			c := j.Spec.Template.Spec.Containers[0]
			if !slices.Equal(c.Args, []string{"migrate", "up"}) {
				continue
			}
			found = true
			owner, worker := secretRef(c, "DATABASE_URL"), secretRef(wc, "DATABASE_URL")
			if owner == nil || worker == nil {
				t.Fatal("migrate Job and worker must both take DATABASE_URL from a secretKeyRef")
			}
			if owner.Name == worker.Name && owner.Key == worker.Key {
				t.Errorf("migrate Job uses the worker's DATABASE_URL (%s/%s): it must run as the schema owner", owner.Name, owner.Key)
			}
			if p := j.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever && p != corev1.RestartPolicyOnFailure {
				t.Errorf("migrate Job restartPolicy %q", p)
			}
			checkMigrateReapply(t, j)
		}
		if !found {
			t.Error("no Job runs [migrate up]")
		}
	})

	t.Run("audit cronjob", func(t *testing.T) { checkAuditCronJobs(t, r) })

	t.Run("pdb", func(t *testing.T) {
		for _, p := range r.pdbs {
			if p.Spec.MaxUnavailable == nil || *p.Spec.MaxUnavailable != intstr.FromInt32(1) {
				t.Errorf("%s: maxUnavailable %v, want 1", p.Name, p.Spec.MaxUnavailable)
			}
			// Each budget selects exactly one Deployment's pods: two budgets
			// over one pod make the eviction API refuse every drain.
			var selected []string
			for _, d := range r.deployments {
				if selects(t, p.Spec.Selector, d) {
					selected = append(selected, d.Name)
				}
			}
			if len(selected) != 1 {
				t.Errorf("%s: selects the pods of %v, want exactly one Deployment", p.Name, selected)
			}
		}
		if !slices.ContainsFunc(r.pdbs, func(p *policyv1.PodDisruptionBudget) bool { return selects(t, p.Spec.Selector, w) }) {
			t.Error("no PodDisruptionBudget selects the worker pods")
		}
	})

	t.Run("database roles", func(t *testing.T) { checkDatabaseRoles(t, r) })

	t.Run("keda", func(t *testing.T) { checkScaledObjects(t, b, r, w, wenv) })

	t.Run("monitoring", func(t *testing.T) {
		for _, pm := range r.podMonitors {
			if !selects(t, &pm.Spec.Selector, w) {
				t.Errorf("PodMonitor %s does not select the worker pods", pm.Name)
			}
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				if !slices.ContainsFunc(wc.Ports, func(p corev1.ContainerPort) bool { return p.Name == ep.Port }) {
					t.Errorf("PodMonitor %s scrapes port %q, which the worker does not name", pm.Name, ep.Port)
				}
				if path := cmp.Or(ep.Path, "/metrics"); !b.literals["GET "+path] {
					t.Errorf("PodMonitor %s scrapes %s, which the binary does not serve", pm.Name, path)
				}
			}
		}
		for _, pr := range r.prometheusRules {
			checkRules(t, pr.Spec)
		}
	})
}

// worker returns the Deployment that runs `paydedup worker`.
func worker(t *testing.T, r *rendering) *appsv1.Deployment {
	t.Helper()
	var ws []*appsv1.Deployment
	for _, d := range r.deployments {
		if c := d.Spec.Template.Spec.Containers; len(c) > 0 && len(c[0].Args) > 0 && c[0].Args[0] == "worker" {
			ws = append(ws, d)
		}
	}
	if len(ws) != 1 {
		t.Fatalf("%s: %d Deployments run `paydedup worker`, want 1", r.name, len(ws))
	}
	return ws[0]
}

// reconcilers returns the Deployments that run `paydedup reconcile`.
func reconcilers(r *rendering) []*appsv1.Deployment { return commandDeployments(r, "reconcile") }

// commandDeployments returns the Deployments that run `paydedup command`.
func commandDeployments(r *rendering, command string) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, d := range r.deployments {
		if c := d.Spec.Template.Spec.Containers; len(c) > 0 && len(c[0].Args) > 0 && c[0].Args[0] == command {
			out = append(out, d)
		}
	}
	return out
}

// databaseRoles is, for each command, the Secret key its DATABASE_URL must
// come from and the database role the documented example of that key logs
// in as (migrations 00002 and 00006): each process gets only its
// statements, and only migrations run as the owner.
var databaseRoles = map[string]struct{ secret, key, role string }{
	"worker":    {"paydedup", "database-url", "paydedup_worker"},
	"reconcile": {"paydedup", "database-url", "paydedup_worker"},
	"gateway":   {"paydedup-gateway", "database-url", "paydedup_gateway"},
	"migrate":   {"paydedup", "database-url-owner", ""},
	// The audit only reads payments and idempotency_keys, which the
	// worker's role may.
	"audit": {"paydedup", "database-url", "paydedup_worker"},
}

// checkDatabaseRoles: every paydedup container takes DATABASE_URL from the
// Secret key of its own role, and base/kustomization.yaml documents each
// key with a URL of that role.
func checkDatabaseRoles(t *testing.T, r *rendering) {
	doc, err := os.ReadFile(filepath.Join(kustomizeDir, "base", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for owner, p := range podSpecs(r) {
		for _, c := range p.Containers {
			if len(c.Args) == 0 {
				continue
			}
			want, ok := databaseRoles[c.Args[0]]
			if !ok {
				t.Errorf("%s/%s runs %q: add it to databaseRoles with the role it connects as", owner, c.Name, c.Args[0])
				continue
			}
			ref := secretRef(c, "DATABASE_URL")
			if ref == nil || ref.Name != want.secret || ref.Key != want.key {
				t.Errorf("%s/%s (%s): DATABASE_URL from %v, want Secret %s key %s", owner, c.Name, c.Args[0], ref, want.secret, want.key)
			}
		}
	}
	for _, want := range databaseRoles {
		if want.role == "" {
			continue
		}
		// The example under the Secret's own heading.
		i := bytes.Index(doc, []byte(`Secret "`+want.secret+`"`))
		if i < 0 {
			t.Errorf("base/kustomization.yaml does not document Secret %q", want.secret)
			continue
		}
		example := regexp.MustCompile(`(?m)^#\s+` + regexp.QuoteMeta(want.key) + `\s[\s\S]*?postgres://([a-z_]+):`).FindSubmatch(doc[i:])
		if example == nil || string(example[1]) != want.role {
			t.Errorf("base/kustomization.yaml: the example of Secret %s key %s must log in as %s, got %q", want.secret, want.key, want.role, example)
		}
	}
}

// podSpecs returns every pod template of the rendering, by owner.
func podSpecs(r *rendering) map[string]*corev1.PodSpec {
	out := map[string]*corev1.PodSpec{}
	for _, d := range r.deployments {
		out["Deployment/"+d.Name] = &d.Spec.Template.Spec
	}
	for _, j := range r.jobs {
		out["Job/"+j.Name] = &j.Spec.Template.Spec
	}
	for _, j := range r.cronJobs {
		out["CronJob/"+j.Name] = &j.Spec.JobTemplate.Spec.Template.Spec
	}
	return out
}

func allContainers(p *corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(p.InitContainers), p.Containers...)
}

// effectiveEnv is the container's environment as the binary sees it, for
// the variables with a literal value (envFrom ConfigMaps, then env).
func effectiveEnv(t *testing.T, r *rendering, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			continue
		}
		cm, ok := r.configMaps[from.ConfigMapRef.Name]
		if !ok {
			if from.ConfigMapRef.Optional == nil || !*from.ConfigMapRef.Optional {
				t.Errorf("container %s: envFrom ConfigMap %q is not in the rendering", c.Name, from.ConfigMapRef.Name)
			}
			continue
		}
		for k, v := range cm.Data {
			env[from.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			if cm, ok := r.configMaps[ref.Name]; ok {
				env[e.Name] = cm.Data[ref.Key]
			} else {
				t.Errorf("container %s: %s refers to ConfigMap %q, not in the rendering", c.Name, e.Name, ref.Name)
			}
		default:
			delete(env, e.Name) // a Secret or field reference wins over envFrom
		}
	}
	return env
}

func envDuration(t *testing.T, env map[string]string, key string, def time.Duration) time.Duration {
	t.Helper()
	v, ok := env[key]
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q is not a duration", key, v)
	}
	return d
}

func envInt(t *testing.T, env map[string]string, key string, def int) int {
	t.Helper()
	v, ok := env[key]
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q is not an integer", key, v)
	}
	return n
}

func secretRef(c corev1.Container, name string) *corev1.SecretKeySelector {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}

// checkProbes: liveness on /livez and readiness on /readyz, both on the port
// the binary's admin listener binds (PAYDEDUP_ADMIN_ADDR).
func checkProbes(t *testing.T, b *binary, owner string, c corev1.Container, env map[string]string) {
	t.Helper()
	addr, ok := env["PAYDEDUP_ADMIN_ADDR"]
	if !ok || addr == "" {
		t.Errorf("%s: PAYDEDUP_ADMIN_ADDR is not set: the admin listener (and the probes' target) is off", owner)
		return
	}
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: PAYDEDUP_ADMIN_ADDR=%q: %v", owner, addr, err)
		return
	}
	adminPort, err := strconv.Atoi(portStr)
	if err != nil || adminPort == 0 {
		t.Errorf("%s: PAYDEDUP_ADMIN_ADDR=%q: the port must be fixed for probes", owner, addr)
		return
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "admin" && int(p.ContainerPort) == adminPort }) {
		t.Errorf("%s: no container port named admin on %d", owner, adminPort)
	}
	for _, p := range []struct {
		kind  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", c.LivenessProbe, "/livez"},
		{"readiness", c.ReadinessProbe, "/readyz"},
	} {
		if !b.literals["GET "+p.path] {
			t.Errorf("the binary no longer serves GET %s: update the probes and this test", p.path)
		}
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", owner, p.kind)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path {
			t.Errorf("%s: %s probe path %q, want %q", owner, p.kind, g.Path, p.path)
		}
		if port := resolvePort(c, g.Port); port != adminPort {
			t.Errorf("%s: %s probe port %s resolves to %d, want the admin port %d (PAYDEDUP_ADMIN_ADDR=%s)", owner, p.kind, g.Port.String(), port, adminPort, addr)
		}
	}
}

func resolvePort(c corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return -1
}

// checkSecurity: non-root, read-only root, no privilege escalation, every
// capability dropped, RuntimeDefault seccomp, no API token; and resources.
func checkSecurity(t *testing.T, r *rendering) {
	for owner, p := range podSpecs(r) {
		if p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
			t.Errorf("%s: automountServiceAccountToken must be false (paydedup never calls the API)", owner)
		}
		if p.HostNetwork || p.HostPID || p.HostIPC {
			t.Errorf("%s: shares a host namespace", owner)
		}
		psc := p.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
			t.Errorf("%s: pod securityContext.runAsNonRoot must be true", owner)
		}
		if psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 0 {
			t.Errorf("%s: runAsUser 0", owner)
		}
		podSeccomp := psc != nil && psc.SeccompProfile != nil && psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
		for _, c := range allContainers(p) {
			id := owner + "/" + c.Name
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", id)
				continue
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: readOnlyRootFilesystem must be true", id)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation must be false", id)
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s: privileged", id)
			}
			if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
				t.Errorf("%s: runAsUser 0", id)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: capabilities must drop ALL and add none", id)
			}
			if !podSeccomp && (sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
				t.Errorf("%s: seccompProfile must be RuntimeDefault", id)
			}
			req, lim := c.Resources.Requests, c.Resources.Limits
			if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
				t.Errorf("%s: needs cpu and memory requests and a memory limit", id)
			}
			for _, m := range c.VolumeMounts {
				if !m.ReadOnly && isSecretVolume(p, m.Name) {
					t.Errorf("%s: secret volume %s mounted read-write", id, m.Name)
				}
			}
		}
		for _, v := range p.Volumes {
			if v.Secret == nil || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o004 != 0 {
				continue
			}
			// Not world-readable: only the group can let uid 65532 read it.
			if psc == nil || psc.FSGroup == nil {
				t.Errorf("%s: secret volume %s (mode %#o) needs securityContext.fsGroup to be readable", owner, v.Name, *v.Secret.DefaultMode)
			}
		}
	}
}

func isSecretVolume(p *corev1.PodSpec, name string) bool {
	for _, v := range p.Volumes {
		if v.Name == name {
			return v.Secret != nil || v.Projected != nil
		}
	}
	return false
}

// checkSecrets: credentials only by reference, to documented Secret keys.
func checkSecrets(t *testing.T, r *rendering) {
	for _, s := range r.secrets {
		if len(s.Data) > 0 || len(s.StringData) > 0 {
			t.Errorf("Secret %s carries data: secrets are created out of band, never in this tree", s.Name)
		}
	}
	for name, cm := range r.configMaps {
		for k, v := range cm.Data {
			if slices.Contains(sensitiveEnv, k) {
				t.Errorf("ConfigMap %s sets %s: it must come from a Secret", name, k)
			}
			if credentialPattern.MatchString(v) {
				t.Errorf("ConfigMap %s: %s looks like it carries a credential", name, k)
			}
		}
	}
	doc, err := os.ReadFile(filepath.Join(kustomizeDir, "base", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	documented := func(secret, key string) bool {
		return strings.Contains(string(doc), `"`+secret+`"`) && strings.Contains(string(doc), " "+key+" ")
	}
	for owner, p := range podSpecs(r) {
		for _, c := range allContainers(p) {
			id := owner + "/" + c.Name
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					if slices.Contains(sensitiveEnv, e.Name) {
						t.Errorf("%s: %s has an inline value: use valueFrom.secretKeyRef", id, e.Name)
					}
					if credentialPattern.MatchString(e.Value) {
						t.Errorf("%s: %s looks like it carries a credential", id, e.Name)
					}
					continue
				}
				if slices.Contains(sensitiveEnv, e.Name) && e.ValueFrom.SecretKeyRef == nil {
					t.Errorf("%s: %s must come from a secretKeyRef", id, e.Name)
				}
				if ref := e.ValueFrom.SecretKeyRef; ref != nil {
					if !documented(ref.Name, ref.Key) {
						t.Errorf("%s: %s uses Secret %q key %q, not documented in base/kustomization.yaml", id, e.Name, ref.Name, ref.Key)
					}
					if ref.Optional != nil && *ref.Optional && e.Name == "DATABASE_URL" {
						t.Errorf("%s: DATABASE_URL must not be optional", id)
					}
				}
			}
		}
		for _, v := range p.Volumes {
			if v.Secret != nil {
				for _, key := range secretVolumeKeys(t, r, v) {
					if !documented(v.Secret.SecretName, key) {
						t.Errorf("%s: volume %s uses Secret %q key %q, not documented in base/kustomization.yaml", owner, v.Name, v.Secret.SecretName, key)
					}
				}
			}
		}
		// A credentials file named in the environment must be a mounted secret.
		for _, c := range p.Containers {
			path, ok := effectiveEnv(t, r, c)["NATS_CREDS"]
			if !ok {
				continue
			}
			if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
				return isSecretVolume(p, m.Name) && strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
			}) {
				t.Errorf("%s/%s: NATS_CREDS=%s is not under a mounted secret volume", owner, c.Name, path)
			}
		}
	}
}

// secretVolumeKeys returns the keys a secret volume projects: its items, or
// the file names its mounts' users expect.
func secretVolumeKeys(t *testing.T, r *rendering, v corev1.Volume) []string {
	t.Helper()
	var keys []string
	for _, it := range v.Secret.Items {
		keys = append(keys, it.Key)
	}
	if len(keys) > 0 {
		return keys
	}
	// Without items every key becomes a file: the ones the tree relies on are
	// those NATS_CREDS names.
	for _, d := range r.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, m := range c.VolumeMounts {
				if m.Name != v.Name {
					continue
				}
				if path, ok := effectiveEnv(t, r, c)["NATS_CREDS"]; ok && strings.HasPrefix(path, m.MountPath) {
					keys = append(keys, filepath.Base(path))
				}
			}
		}
	}
	return keys
}

// checkEnvNames: every paydedup variable the tree sets is one the binary
// reads, so a typo (PAYDEDUP_DRAIN_TIMOUT) does not silently keep a default.
func checkEnvNames(t *testing.T, b *binary, r *rendering) {
	for name, cm := range r.configMaps {
		for k := range cm.Data {
			if !b.readsEnv(k) {
				t.Errorf("ConfigMap %s sets %s, which paydedup does not read", name, k)
			}
		}
	}
	for owner, p := range podSpecs(r) {
		for _, c := range allContainers(p) {
			for _, e := range c.Env {
				if !b.readsEnv(e.Name) {
					t.Errorf("%s/%s sets %s, which paydedup does not read", owner, c.Name, e.Name)
				}
			}
		}
	}
}

// checkOneImage: the migrate Job and the Deployments run the same build, so
// the schema and the code that uses it move together.
func checkOneImage(t *testing.T, r *rendering) {
	images := map[string][]string{}
	for owner, p := range podSpecs(r) {
		for _, c := range allContainers(p) {
			images[c.Image] = append(images[c.Image], owner+"/"+c.Name)
		}
	}
	if len(images) != 1 {
		t.Errorf("want one image for every workload, got %v", images)
	}
	for img := range images {
		if img == "" || strings.HasSuffix(img, ":latest") {
			t.Errorf("image %q: name a tag or digest", img)
		}
	}
}

// pinned reports whether an image names a release: a digest, or a tag other
// than latest and dev.
func pinned(image string) bool {
	if strings.Contains(image, "@sha256:") {
		return true
	}
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return false
	}
	tag := image[i+1:]
	return tag != "" && tag != "latest" && tag != "dev"
}

// checkScaledObjects: KEDA watches the worker's own stream and durable
// consumer, never scales it to zero, owns its replica count, and adds no pod
// that MaxAckPending would leave idle.
func checkScaledObjects(t *testing.T, b *binary, r *rendering, w *appsv1.Deployment, wenv map[string]string) {
	for _, so := range r.scaledObjects {
		id := "ScaledObject " + so.Name
		ref := so.Spec.ScaleTargetRef
		if ref.Name != w.Name || (ref.Kind != "" && ref.Kind != "Deployment") {
			t.Errorf("%s: scales %s %q, want the worker Deployment %q", id, cmp.Or(ref.Kind, "Deployment"), ref.Name, w.Name)
		}
		if w.Spec.Replicas != nil {
			t.Errorf("%s: the worker Deployment sets replicas (%d): every apply would fight KEDA's HPA", id, *w.Spec.Replicas)
		}
		minR, maxR := so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount
		if minR == nil || *minR < 1 {
			t.Errorf("%s: minReplicaCount %s, want at least 1 (workers create the consumer and run the reconciler)", id, ptrString(minR))
		}
		if maxR == nil || (minR != nil && *maxR < *minR) {
			t.Errorf("%s: maxReplicaCount %s must be set and at least minReplicaCount", id, ptrString(maxR))
		} else {
			conc := envInt(t, wenv, "PAYDEDUP_CONCURRENCY", b.concurrency)
			pending := envInt(t, wenv, "PAYDEDUP_MAX_ACK_PENDING", b.maxAckPending)
			if int(*maxR)*conc > pending {
				t.Errorf("%s: maxReplicaCount %d × PAYDEDUP_CONCURRENCY %d > PAYDEDUP_MAX_ACK_PENDING %d: the consumer's MaxAckPending caps in-flight messages across all pods, so the extra pods would sit idle", id, *maxR, conc, pending)
			}
		}
		if len(so.Spec.Triggers) == 0 {
			t.Errorf("%s: no triggers", id)
		}
		for _, tr := range so.Spec.Triggers {
			if tr.Type != "nats-jetstream" {
				t.Errorf("%s: trigger type %q, want nats-jetstream", id, tr.Type)
				continue
			}
			md := tr.Metadata
			// The worker's own names: its environment if it sets them, else
			// stream/config.go's defaults.
			for key, want := range map[string]string{
				"stream":   cmp.Or(wenv["PAYDEDUP_STREAM"], b.stream),
				"consumer": cmp.Or(wenv["PAYDEDUP_DURABLE"], b.durable),
			} {
				if md[key] != want {
					t.Errorf("%s: %s %q, want the worker's %q", id, key, md[key], want)
				}
			}
			if md["account"] == "" {
				t.Errorf("%s: no account ($G without accounts)", id)
			}
			if _, _, err := net.SplitHostPort(md["natsServerMonitoringEndpoint"]); err != nil {
				t.Errorf("%s: natsServerMonitoringEndpoint %q must be host:port of the monitoring listener: %v", id, md["natsServerMonitoringEndpoint"], err)
			}
			if n, err := strconv.Atoi(md["lagThreshold"]); err != nil || n < 1 {
				t.Errorf("%s: lagThreshold %q must be a positive integer", id, md["lagThreshold"])
			}
			for k := range md {
				if !slices.Contains([]string{"natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold", "activationLagThreshold", "useHttps"}, k) {
					t.Errorf("%s: unknown nats-jetstream metadata %q", id, k)
				}
			}
		}
	}
}

func selects(t *testing.T, sel *metav1.LabelSelector, d *appsv1.Deployment) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("selector %v: %v", sel, err)
		return false
	}
	return !s.Empty() && s.Matches(labels.Set(d.Spec.Template.Labels))
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

func TestPinned(t *testing.T) {
	tests := []struct {
		image string
		want  bool
	}{
		{"ghcr.io/paydedup/paydedup:v0.1.0", true},
		{"ghcr.io/paydedup/paydedup@sha256:0123", true},
		{"registry:5000/paydedup", false},
		{"paydedup:dev", false},
		{"paydedup:latest", false},
		{"paydedup", false},
	}
	for _, tt := range tests {
		if got := pinned(tt.image); got != tt.want {
			t.Errorf("pinned(%q) = %v, want %v", tt.image, got, tt.want)
		}
	}
}

// checkAuditCronJobs: the audit CronJob runs `paydedup audit` once per
// schedule, one at a time, and lets its exit status speak: a failed run (drift)
// is not retried into a success and stays visible as a failed Job.
func checkAuditCronJobs(t *testing.T, r *rendering) {
	for _, cj := range r.cronJobs {
		id := "CronJob " + cj.Name
		c := cj.Spec.JobTemplate.Spec.Template.Spec.Containers
		if len(c) != 1 || len(c[0].Args) == 0 || c[0].Args[0] != "audit" {
			t.Errorf("%s: want one container running [audit ...]", id)
			continue
		}
		if slices.Contains(c[0].Args, "--every") {
			t.Errorf("%s: --every never exits; a CronJob runs one audit per schedule", id)
		}
		if _, err := cron.ParseStandard(cj.Spec.Schedule); err != nil {
			t.Errorf("%s: schedule %q: %v", id, cj.Spec.Schedule, err)
		}
		if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
			t.Errorf("%s: concurrencyPolicy %q, want Forbid (two audits at once only double the provider's list calls)", id, cj.Spec.ConcurrencyPolicy)
		}
		js := cj.Spec.JobTemplate.Spec
		if js.BackoffLimit == nil || *js.BackoffLimit != 0 {
			t.Errorf("%s: backoffLimit %s, want 0: a run that found drift must fail its Job, not be retried", id, ptrString(js.BackoffLimit))
		}
		if p := js.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever {
			t.Errorf("%s: restartPolicy %q, want Never", id, p)
		}
		if js.ActiveDeadlineSeconds == nil {
			t.Errorf("%s: no activeDeadlineSeconds: a hung audit would block every later run (Forbid)", id)
		}
	}
}
