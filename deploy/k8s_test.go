package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// k8sObjects is the kustomize build of deploy/k8s, decoded strictly.
type k8sObjects struct {
	Namespaces   []corev1.Namespace
	ConfigMaps   map[string]corev1.ConfigMap
	Secrets      []corev1.Secret
	Services     []corev1.Service
	Deployments  []appsv1.Deployment
	StatefulSets []appsv1.StatefulSet
}

// workload is a Deployment or a StatefulSet, seen through what both have.
type workload struct {
	Kind, Name string
	Selector   map[string]string
	Template   corev1.PodTemplateSpec
}

func (o *k8sObjects) workloads() []workload {
	var out []workload
	for _, d := range o.Deployments {
		out = append(out, workload{"Deployment", d.Name, matchLabels(d.Spec.Selector.MatchLabels), d.Spec.Template})
	}
	for _, s := range o.StatefulSets {
		out = append(out, workload{"StatefulSet", s.Name, matchLabels(s.Spec.Selector.MatchLabels), s.Spec.Template})
	}
	return out
}

func matchLabels(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// buildK8s runs kustomize on dir of fsys (as `kubectl apply -k` would) and
// decodes every object into its k8s.io/api type, rejecting unknown fields
// and kinds.
func buildK8s(fsys filesys.FileSystem, dir string) (*k8sObjects, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}
	o := &k8sObjects{ConfigMaps: map[string]corev1.ConfigMap{}}
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		id := r.GetKind() + "/" + r.GetName()
		var decodeErr error
		switch r.GetKind() {
		case "Namespace":
			var v corev1.Namespace
			decodeErr = yaml.UnmarshalStrict(y, &v)
			o.Namespaces = append(o.Namespaces, v)
		case "ConfigMap":
			var v corev1.ConfigMap
			decodeErr = yaml.UnmarshalStrict(y, &v)
			o.ConfigMaps[v.Name] = v
		case "Secret":
			var v corev1.Secret
			decodeErr = yaml.UnmarshalStrict(y, &v)
			o.Secrets = append(o.Secrets, v)
		case "Service":
			var v corev1.Service
			decodeErr = yaml.UnmarshalStrict(y, &v)
			o.Services = append(o.Services, v)
		case "Deployment":
			var v appsv1.Deployment
			decodeErr = yaml.UnmarshalStrict(y, &v)
			o.Deployments = append(o.Deployments, v)
		case "StatefulSet":
			var v appsv1.StatefulSet
			decodeErr = yaml.UnmarshalStrict(y, &v)
			o.StatefulSets = append(o.StatefulSets, v)
		default:
			return nil, fmt.Errorf("%s: a kind this test does not know: add its type", id)
		}
		if decodeErr != nil {
			return nil, fmt.Errorf("%s: %w", id, decodeErr)
		}
	}
	return o, nil
}

// exampleSecret is deploy/k8s/secret.example.yaml, decoded strictly: the keys
// the workloads may reference.
func exampleSecret(t testing.TB, fsys filesys.FileSystem, dir string) corev1.Secret {
	t.Helper()
	b, err := fsys.ReadFile(filepath.Join(dir, "secret.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		t.Fatalf("secret.example.yaml: %v", err)
	}
	return s
}

// k8sProblems returns what is wrong with the built objects, one sentence each.
func k8sProblems(t testing.TB, o *k8sObjects, secret corev1.Secret) []string {
	t.Helper()
	var probs []string
	add := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }

	if len(o.Secrets) > 0 {
		add("the kustomization applies Secret %s: credentials must be created apart, never applied from the repository", o.Secrets[0].Name)
	}
	for name, cm := range o.ConfigMaps {
		for k := range cm.Data {
			if secretEnvRE.MatchString(k) {
				add("ConfigMap %s holds secret %s: put it in the Secret and reference it", name, k)
			}
		}
	}
	secretKeys := map[string]bool{}
	for k := range secret.StringData {
		secretKeys[k] = true
	}
	for k := range secret.Data {
		secretKeys[k] = true
	}

	wls := o.workloads()
	if len(wls) == 0 {
		add("no workloads in the build")
	}
	for _, w := range wls {
		id := w.Kind + "/" + w.Name
		tl := w.Template.Labels
		if len(w.Selector) == 0 {
			add("%s: empty selector", id)
		}
		for k, v := range w.Selector {
			if tl[k] != v {
				add("%s: selector %s=%s does not match the pod template's labels %v", id, k, v, tl)
			}
		}
		ps := w.Template.Spec
		if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
			add("%s: pod securityContext.runAsNonRoot is not true", id)
		}
		if len(ps.Containers) != 1 {
			add("%s: %d containers, want 1", id, len(ps.Containers))
			continue
		}
		c := ps.Containers[0]
		if len(c.Args) == 0 {
			add("%s: container has no args (the role)", id)
			continue
		}
		r := roleOf(t, c.Args[0])

		// The environment: every name must be one the role reads.
		env := map[string]string{} // name -> literal value ("" for references)
		for _, ef := range c.EnvFrom {
			switch {
			case ef.ConfigMapRef != nil:
				cm, ok := o.ConfigMaps[ef.ConfigMapRef.Name]
				if !ok {
					add("%s: envFrom ConfigMap %s is not in the build", id, ef.ConfigMapRef.Name)
				}
				for k, v := range cm.Data {
					env[ef.Prefix+k] = v
				}
			case ef.SecretRef != nil:
				for k := range secretKeys {
					env[ef.Prefix+k] = ""
				}
			}
		}
		refs := map[string]string{} // name -> fieldRef path
		for _, e := range c.Env {
			env[e.Name] = e.Value
			if e.ValueFrom != nil {
				if f := e.ValueFrom.FieldRef; f != nil {
					refs[e.Name] = f.FieldPath
				}
				if s := e.ValueFrom.SecretKeyRef; s != nil {
					if s.Name != secret.Name {
						add("%s: env %s references Secret %s; the credentials are in %s", id, e.Name, s.Name, secret.Name)
					}
					if !secretKeys[s.Key] {
						add("%s: env %s references key %s, which secret.example.yaml does not have", id, e.Name, s.Key)
					}
				}
			}
			if secretEnvRE.MatchString(e.Name) && e.Value != "" {
				add("%s: secret %s is inlined in the manifest: reference it with secretKeyRef", id, e.Name)
			}
		}
		for _, k := range keys(env) {
			if k == "POD_NAME" { // only expanded into other values, $(POD_NAME)
				continue
			}
			if !r.Accepts(k) {
				add("%s: environment %s is not read by `playpipe %s` (not in its --help)", id, k, r.Name)
			}
		}
		if refs["POD_NAME"] != "metadata.name" {
			add("%s: POD_NAME must come from fieldRef metadata.name", id)
		}
		podName := func(v string) bool {
			return strings.Contains(v, "$(POD_NAME)")
		}
		group := strings.Contains(r.Help, "\n  -group ")
		if r.Accepts("PLAYPIPE_INSTANCE_ID") && group {
			if v := env["PLAYPIPE_INSTANCE_ID"]; !podName(v) && refs["PLAYPIPE_INSTANCE_ID"] != "metadata.name" {
				add("%s: PLAYPIPE_INSTANCE_ID (static group membership) must be the pod name, got %q", id, v)
			}
			if w.Kind != "StatefulSet" {
				add("%s: `playpipe %s` is a group member with a static instance id: use a StatefulSet so the id survives restarts", id, r.Name)
			}
		}
		if r.Accepts("PLAYPIPE_TRANSACTIONAL_ID") {
			if v := env["PLAYPIPE_TRANSACTIONAL_ID"]; !podName(v) {
				add("%s: PLAYPIPE_TRANSACTIONAL_ID must be unique per pod ($(POD_NAME)), got %q", id, v)
			}
		}
		if r.Kafka() && env["PLAYPIPE_BROKERS"] == "" {
			add("%s: `playpipe %s` needs PLAYPIPE_BROKERS", id, r.Name)
		}
		if r.API() && env["PLAYPIPE_API_URL"] == "" {
			add("%s: `playpipe %s` needs PLAYPIPE_API_URL", id, r.Name)
		}
		if r.ClickHouse() && env["PLAYPIPE_CLICKHOUSE_ADDR"] == "" {
			add("%s: `playpipe %s` needs PLAYPIPE_CLICKHOUSE_ADDR", id, r.Name)
		}

		// Probes: /healthz and /readyz on the admin listener's port.
		admin := env[r.AdminEnv]
		if admin == "" {
			admin = r.AdminDefault
		}
		if isLoopback(admin) {
			add("%s: %s=%s is loopback: the kubelet's probes cannot reach it", id, r.AdminEnv, admin)
		}
		ports := map[string]int32{}
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
		probe := func(kind string, p *corev1.Probe, path string) {
			switch {
			case p == nil || p.HTTPGet == nil:
				add("%s: no %s httpGet probe", id, kind)
			case p.HTTPGet.Path != path:
				add("%s: %s probe path %s, want %s", id, kind, p.HTTPGet.Path, path)
			case fmt.Sprint(portNumber(p.HTTPGet.Port, ports)) != portOf(admin):
				add("%s: %s probe port %s is not the admin port %s (%s=%s)", id, kind, p.HTTPGet.Port.String(), portOf(admin), r.AdminEnv, admin)
			}
		}
		probe("liveness", c.LivenessProbe, "/healthz")
		probe("readiness", c.ReadinessProbe, "/readyz")
		if c.StartupProbe != nil {
			probe("startup", c.StartupProbe, "/healthz")
		}
		if p := w.Template.Annotations["prometheus.io/port"]; p != "" && p != portOf(admin) {
			add("%s: prometheus.io/port %s is not the admin port %s", id, p, portOf(admin))
		}

		// Resources.
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			add("%s: resources.requests must set cpu and memory", id)
		}
		if c.Resources.Limits.Memory().IsZero() {
			add("%s: resources.limits must set memory", id)
		}
	}

	// Services select pods and target ports that exist.
	for _, s := range o.Services {
		var target *workload
		for i, w := range wls {
			if len(s.Spec.Selector) > 0 && subset(s.Spec.Selector, w.Template.Labels) {
				target = &wls[i]
			}
		}
		if target == nil {
			add("Service/%s: selector %v matches no workload's pods", s.Name, s.Spec.Selector)
			continue
		}
		ports := map[string]int32{}
		for _, p := range target.Template.Spec.Containers[0].Ports {
			ports[p.Name] = p.ContainerPort
		}
		for _, p := range s.Spec.Ports {
			if portNumber(p.TargetPort, ports) == 0 {
				add("Service/%s: targetPort %s is not a port of %s", s.Name, p.TargetPort.String(), target.Name)
			}
		}
	}
	for _, st := range o.StatefulSets {
		found := false
		for _, s := range o.Services {
			found = found || (s.Name == st.Spec.ServiceName && s.Spec.ClusterIP == corev1.ClusterIPNone)
		}
		if !found {
			add("StatefulSet/%s: serviceName %q is not a headless Service of the build", st.Name, st.Spec.ServiceName)
		}
	}
	return probs
}

func portNumber(p intstr.IntOrString, named map[string]int32) int32 {
	if p.Type == intstr.String {
		return named[p.StrVal]
	}
	for _, v := range named {
		if v == p.IntVal {
			return v
		}
	}
	return 0
}

func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func k8sDir(t testing.TB) string {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "k8s")
}

func TestKubernetesManifests(t *testing.T) {
	fsys, dir := filesys.MakeFsOnDisk(), k8sDir(t)
	o, err := buildK8s(fsys, dir)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{"Deployment": len(o.Deployments), "StatefulSet": len(o.StatefulSets), "Service": len(o.Services), "ConfigMap": len(o.ConfigMaps)}
	if kinds["Deployment"]+kinds["StatefulSet"] != 4 || kinds["Service"] < 4 {
		t.Errorf("build has %v; want the four roles and a Service each", kinds)
	}
	for _, w := range o.workloads() {
		if w.Template.Labels["app.kubernetes.io/part-of"] != "playpipe" || w.Template.Spec.Containers[0].Image != "ghcr.io/playpipe/playpipe:latest" {
			t.Errorf("%s: kustomize labels/images not applied: labels %v image %s", w.Name, w.Template.Labels, w.Template.Spec.Containers[0].Image)
		}
	}
	for _, p := range k8sProblems(t, o, exampleSecret(t, fsys, dir)) {
		t.Error(p)
	}
}

// TestKubernetesCheckCatchesMistakes: each case edits one file of deploy/k8s
// in an in-memory copy, and the checks above must fail on it.
func TestKubernetesCheckCatchesMistakes(t *testing.T) {
	dir := k8sDir(t)
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/k8s: %v %v", files, err)
	}
	orig := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		orig[filepath.Base(f)] = string(b)
	}
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"misspelt env in a workload", "consume.yaml", "{name: PLAYPIPE_TRANSACTIONAL_ID,", "{name: PLAYPIPE_TRANSACTION_ID,",
			"StatefulSet/playpipe-consume: environment PLAYPIPE_TRANSACTION_ID is not read by `playpipe consume`"},
		{"misspelt key in a ConfigMap", "config.yaml", "  PLAYPIPE_BROKERS:", "  PLAYPIPE_BROKER:",
			"environment PLAYPIPE_BROKER is not read by `playpipe consume`"},
		{"variable of another role", "config.yaml", "  PLAYPIPE_TOPIC_PREFIX:", "  PLAYPIPE_CLICKHOUSE_DATABASE: x\n  PLAYPIPE_TOPIC_PREFIX:",
			"Deployment/playpipe-ingest: environment PLAYPIPE_CLICKHOUSE_DATABASE is not read by `playpipe ingest`"},
		{"unknown field", "report.yaml", "          readinessProbe:", "          readinesProbe:",
			`StatefulSet/playpipe-report: error unmarshaling JSON: while decoding JSON: json: unknown field "readinesProbe"`},
		{"wrong probe path", "sink.yaml", "httpGet: {path: /readyz, port: admin}", "httpGet: {path: /ready, port: admin}",
			"StatefulSet/playpipe-sink: readiness probe path /ready, want /readyz"},
		{"probe on another port", "sink.yaml", "httpGet: {path: /healthz, port: admin}\n            periodSeconds: 10", "httpGet: {path: /healthz, port: 8080}\n            periodSeconds: 10",
			"liveness probe port 8080 is not the admin port 9460"},
		{"selector does not match", "report.yaml", "    matchLabels: {app.kubernetes.io/name: playpipe-report}", "    matchLabels: {app.kubernetes.io/name: playpipe-reporter}",
			"selector app.kubernetes.io/name=playpipe-reporter does not match"},
		{"service selects nothing", "ingest.yaml", "  selector: {app.kubernetes.io/name: playpipe-ingest}", "  selector: {app.kubernetes.io/name: playpipe-ingestor}",
			"Service/playpipe-ingest: selector map[app.kubernetes.io/name:playpipe-ingestor] matches no workload's pods"},
		{"inlined secret", "sink.yaml", "            - name: PLAYPIPE_CLICKHOUSE_PASSWORD\n              valueFrom: {secretKeyRef: {name: playpipe-credentials, key: PLAYPIPE_CLICKHOUSE_PASSWORD}}",
			"            - {name: PLAYPIPE_CLICKHOUSE_PASSWORD, value: hunter2}", "secret PLAYPIPE_CLICKHOUSE_PASSWORD is inlined"},
		{"misspelt secret key", "report.yaml", "key: PLAYPIPE_API_CLIENT_SIGNATURE}", "key: PLAYPIPE_API_CLIENT_SIGNATUR}",
			"references key PLAYPIPE_API_CLIENT_SIGNATUR, which secret.example.yaml does not have"},
		{"no resources", "ingest.yaml", "            requests: {cpu: \"500m\", memory: 256Mi}\n", "",
			"Deployment/playpipe-ingest: resources.requests must set cpu and memory"},
		{"fixed instance id", "report.yaml", `{name: PLAYPIPE_INSTANCE_ID, value: "$(POD_NAME)"}`, `{name: PLAYPIPE_INSTANCE_ID, value: "report"}`,
			`PLAYPIPE_INSTANCE_ID (static group membership) must be the pod name, got "report"`},
		{"shared transactional id", "consume.yaml", `value: "playpipe-enrich-$(POD_NAME)"`, `value: "playpipe-enrich"`,
			"PLAYPIPE_TRANSACTIONAL_ID must be unique per pod"},
		{"group member as a Deployment", "sink.yaml",
			"kind: StatefulSet\nmetadata:\n  name: playpipe-sink\n  labels: {app.kubernetes.io/name: playpipe-sink, app.kubernetes.io/component: sink}\nspec:\n  serviceName: playpipe-sink\n  podManagementPolicy: Parallel\n",
			"kind: Deployment\nmetadata:\n  name: playpipe-sink\n  labels: {app.kubernetes.io/name: playpipe-sink, app.kubernetes.io/component: sink}\nspec:\n",
			"Deployment/playpipe-sink: `playpipe sink` is a group member"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := filesys.MakeFsInMemory()
			for name, content := range orig {
				if name == tc.file {
					if !strings.Contains(content, tc.old) {
						t.Fatalf("%s no longer contains %q: update the case", name, tc.old)
					}
					content = strings.Replace(content, tc.old, tc.new, 1)
				}
				if err := fsys.WriteFile(filepath.Join("/k8s", name), []byte(content)); err != nil {
					t.Fatal(err)
				}
			}
			o, err := buildK8s(fsys, "/k8s")
			if err != nil {
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("build error %q does not mention %q", err, tc.want)
				}
				return
			}
			probs := k8sProblems(t, o, exampleSecret(t, fsys, "/k8s"))
			for _, p := range probs {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Errorf("no problem mentions %q; got %q", tc.want, probs)
		})
	}
}
