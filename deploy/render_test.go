package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	kustomizeDir  = "kustomize"
	overlaysDir   = "kustomize/overlays"
	componentsDir = "kustomize/components"
)

// rendering is one `kustomize build`, every object strict-decoded.
type rendering struct {
	name string

	deployments     []*appsv1.Deployment
	jobs            []*batchv1.Job
	cronJobs        []*batchv1.CronJob
	configMaps      map[string]*corev1.ConfigMap
	secrets         []*corev1.Secret
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	services        []*corev1.Service
	scaledObjects   []*scaledObject
	podMonitors     []*podMonitor
	prometheusRules []*prometheusRule
}

// decoders lists every kind the tree may produce, with its apiVersion. A
// kind missing here fails the test: add a strict decoder before shipping it.
var decoders = map[string]struct {
	apiVersion string
	add        func(r *rendering, data []byte) error
}{
	"ConfigMap": {"v1", func(r *rendering, data []byte) error {
		var cm corev1.ConfigMap
		if err := strictJSON(data, &cm); err != nil {
			return err
		}
		r.configMaps[cm.Name] = &cm
		return nil
	}},
	"Secret":         {"v1", decodeInto(func(r *rendering, s *corev1.Secret) { r.secrets = append(r.secrets, s) })},
	"ServiceAccount": {"v1", decodeInto(func(*rendering, *corev1.ServiceAccount) {})},
	"Service":        {"v1", decodeInto(func(r *rendering, s *corev1.Service) { r.services = append(r.services, s) })},
	"Deployment":     {"apps/v1", decodeInto(func(r *rendering, d *appsv1.Deployment) { r.deployments = append(r.deployments, d) })},
	"Job":            {"batch/v1", decodeInto(func(r *rendering, j *batchv1.Job) { r.jobs = append(r.jobs, j) })},
	"CronJob":        {"batch/v1", decodeInto(func(r *rendering, j *batchv1.CronJob) { r.cronJobs = append(r.cronJobs, j) })},
	"PodDisruptionBudget": {"policy/v1", decodeInto(func(r *rendering, p *policyv1.PodDisruptionBudget) {
		r.pdbs = append(r.pdbs, p)
	})},
	"HorizontalPodAutoscaler": {"autoscaling/v2", decodeInto(func(r *rendering, h *autoscalingv2.HorizontalPodAutoscaler) {
		r.hpas = append(r.hpas, h)
	})},
	"ScaledObject": {"keda.sh/v1alpha1", decodeInto(func(r *rendering, s *scaledObject) {
		r.scaledObjects = append(r.scaledObjects, s)
	})},
	"PodMonitor": {"monitoring.coreos.com/v1", decodeInto(func(r *rendering, p *podMonitor) {
		r.podMonitors = append(r.podMonitors, p)
	})},
	"PrometheusRule": {"monitoring.coreos.com/v1", decodeInto(func(r *rendering, p *prometheusRule) {
		r.prometheusRules = append(r.prometheusRules, p)
	})},
}

func decodeInto[T any](add func(*rendering, *T)) func(*rendering, []byte) error {
	return func(r *rendering, data []byte) error {
		v := new(T)
		if err := strictJSON(data, v); err != nil {
			return err
		}
		add(r, v)
		return nil
	}
}

// strictJSON decodes one JSON value, refusing fields the type does not have:
// a misspelt or misplaced field in a manifest is a field Kubernetes drops.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

// strictYAML is strictJSON for YAML input.
func strictYAML(data []byte, v any) error {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	return strictJSON(j, v)
}

// render builds the kustomization in dir (relative to this package).
func render(t *testing.T, name, dir string) *rendering {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("%s: kustomize build: %v", name, err)
	}
	r := &rendering{name: name, configMaps: map[string]*corev1.ConfigMap{}}
	for _, res := range rm.Resources() {
		kind, apiVersion := res.GetKind(), res.GetApiVersion()
		id := fmt.Sprintf("%s %s/%s", kind, res.GetNamespace(), res.GetName())
		d, ok := decoders[kind]
		if !ok {
			t.Errorf("%s: %s: no strict decoder for kind %s (add one to deploy/render_test.go)", name, id, kind)
			continue
		}
		if apiVersion != d.apiVersion {
			t.Errorf("%s: %s: apiVersion %q, want %q", name, id, apiVersion, d.apiVersion)
			continue
		}
		data, err := res.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %s: %v", name, id, err)
		}
		if err := d.add(r, data); err != nil {
			t.Errorf("%s: %s: strict decode: %v", name, id, err)
		}
	}
	return r
}

// dirs lists the subdirectories of dir that hold a kustomization.
func dirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "kustomization.yaml")); e.IsDir() && err == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// withComponents copies the kustomize tree (and the rules and dashboard it refers to)
// to a temporary directory, adds components to one overlay's kustomization
// there, as a user adding them to that overlay would, and returns the
// overlay's copy. Components belong in the overlay itself: layered on top of
// a rendered overlay they would miss its images, namespace and generators.
func withComponents(t *testing.T, overlay string, components ...string) string {
	t.Helper()
	tmp := t.TempDir()
	for _, dir := range []string{kustomizeDir, "prometheus", "grafana"} {
		if err := os.CopyFS(filepath.Join(tmp, dir), os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(tmp, overlaysDir, overlay)
	file := filepath.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var k map[string]any
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	list, _ := k["components"].([]any)
	for _, c := range components {
		list = append(list, "../../components/"+c)
	}
	k["components"] = list
	if data, err = yaml.Marshal(k); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// KEDA's ScaledObject (keda.sh/v1alpha1), as much of it as this tree may
// use; an unknown field fails the strict decode.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              scaledObjectSpec `json:"spec"`
}

type scaledObjectSpec struct {
	ScaleTargetRef struct {
		APIVersion             string `json:"apiVersion,omitempty"`
		Kind                   string `json:"kind,omitempty"`
		Name                   string `json:"name"`
		EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
	} `json:"scaleTargetRef"`
	PollingInterval       *int32 `json:"pollingInterval,omitempty"`
	InitialCooldownPeriod *int32 `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod        *int32 `json:"cooldownPeriod,omitempty"`
	IdleReplicaCount      *int32 `json:"idleReplicaCount,omitempty"`
	MinReplicaCount       *int32 `json:"minReplicaCount,omitempty"`
	MaxReplicaCount       *int32 `json:"maxReplicaCount,omitempty"`
	Fallback              *struct {
		FailureThreshold int32 `json:"failureThreshold"`
		Replicas         int32 `json:"replicas"`
	} `json:"fallback,omitempty"`
	Advanced *struct {
		RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount,omitempty"`
		HorizontalPodAutoscalerConfig *struct {
			Name     string                                         `json:"name,omitempty"`
			Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
		} `json:"horizontalPodAutoscalerConfig,omitempty"`
	} `json:"advanced,omitempty"`
	Triggers []struct {
		Type              string            `json:"type"`
		Name              string            `json:"name,omitempty"`
		Metadata          map[string]string `json:"metadata"`
		MetricType        string            `json:"metricType,omitempty"`
		UseCachedMetrics  bool              `json:"useCachedMetrics,omitempty"`
		AuthenticationRef *struct {
			Name string `json:"name"`
			Kind string `json:"kind,omitempty"`
		} `json:"authenticationRef,omitempty"`
	} `json:"triggers"`
}

// The Prometheus Operator's PodMonitor (monitoring.coreos.com/v1), the part
// this tree uses.
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		PodMetricsEndpoints []struct {
			Port          string `json:"port,omitempty"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// The Prometheus Operator's PrometheusRule; its spec is a Prometheus rule
// file.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ruleFile `json:"spec"`
}

type ruleFile struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert         string            `json:"alert,omitempty"`
	Record        string            `json:"record,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}
