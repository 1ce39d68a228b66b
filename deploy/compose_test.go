package deploy_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// The variables docker-compose.yml requires (${VAR:?…}) get these values in
// the test, so a secret whose value is not one of them came from a literal
// or a ${VAR:-default} in the file.
var composeEnv = map[string]string{
	"PLAYPIPE_CLICKHOUSE_PASSWORD": "from-the-environment-1",
	"PLAYPIPE_INGEST_API_KEYS":     "from-the-environment-2",
}

// secretEnvRE matches the names of environment variables that hold secrets.
var secretEnvRE = regexp.MustCompile(`PASSWORD|SIGNATURE|SECRET|TOKEN|API_KEYS?$`)

// defaultRefRE matches ${VAR:-default} and ${VAR-default}.
var defaultRefRE = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*):?-([^}]*)\}`)

// imageHealthcheck is where deploy/Dockerfile installs deploy/healthcheck.
const imageHealthcheck = "/usr/local/bin/healthcheck"

func repoFile(t testing.TB, rel string) []byte {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// loadCompose loads a compose file the way `docker compose` does (schema
// validation, interpolation, merge keys, consistency checks), with every
// profile enabled.
func loadCompose(data []byte) (*types.Project, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	env := types.Mapping{}
	for k, v := range composeEnv {
		env[k] = v
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, "docker-compose.yml"), Content: data}},
		Environment: env,
	}, func(o *loader.Options) {
		o.Profiles = []string{"*"}
		o.ResolvePaths = true
	})
}

// composeProblems returns what is wrong with the project, one sentence each.
func composeProblems(t testing.TB, raw string, p *types.Project) []string {
	t.Helper()
	dockerfile := string(repoFile(t, "deploy/Dockerfile"))
	sandboxDefaults := documentedSandboxDefaults(t)
	var probs []string
	add := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	// Kafka identities: one owner each (a shared transactional id fences
	// the other instance; a shared static member id steals its partitions).
	owner := map[string]string{}

	// A default in the file (${VAR:-value}) is a literal too.
	for _, m := range defaultRefRE.FindAllStringSubmatch(raw, -1) {
		if secretEnvRE.MatchString(m[1]) && !sandboxDefaults[m[2]] {
			add("secret %s has a default in the file (${%s:-…}): require it with ${%s:?…}", m[1], m[1], m[1])
		}
	}

	for _, name := range p.ServiceNames() {
		svc := p.Services[name]
		// Secrets, in every service: from the environment, or a documented
		// sandbox default.
		for _, k := range keys(svc.Environment) {
			v := svc.Environment[k]
			if !secretEnvRE.MatchString(k) || v == nil || *v == "" {
				continue
			}
			if !fromEnvironment(*v) && !sandboxDefaults[*v] {
				add("service %s: secret %s is a literal in the file (use ${%s:?…} or a documented sandbox default)", name, k, k)
			}
		}
		// Bind mounts point at files of the repository.
		for _, vol := range svc.Volumes {
			if vol.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(vol.Source); err != nil {
				add("service %s: bind mount %s: %v", name, vol.Source, err)
			}
		}
		// depends_on: every service named in an address of the environment
		// is waited for, healthy when it has a health check.
		for _, k := range keys(svc.Environment) {
			v := svc.Environment[k]
			if v == nil {
				continue
			}
			for _, host := range hostsIn(*v) {
				dep, isService := p.Services[host]
				if !isService || host == name {
					continue
				}
				d, ok := svc.DependsOn[host]
				switch {
				case !ok:
					add("service %s: %s=%s names service %s, missing from depends_on", name, k, *v, host)
				case dep.HealthCheck != nil && !dep.HealthCheck.Disable && d.Condition != types.ServiceConditionHealthy:
					add("service %s: depends_on %s has condition %q; %s has a health check: use service_healthy", name, host, d.Condition, host)
				}
			}
		}
		if svc.Build == nil || filepath.ToSlash(svc.Build.Dockerfile) != "deploy/Dockerfile" && !strings.HasSuffix(filepath.ToSlash(svc.Build.Dockerfile), "/deploy/Dockerfile") {
			continue
		}
		// A playpipe role: the command names it.
		if len(svc.Command) == 0 {
			add("service %s: builds playpipe but has no command (the role)", name)
			continue
		}
		r := roleOf(t, svc.Command[0])
		for _, k := range keys(svc.Environment) {
			if !r.Accepts(k) {
				add("service %s: environment %s is not read by `playpipe %s` (not in its --help)", name, k, r.Name)
			}
		}
		env := func(k string) string {
			if v := svc.Environment[k]; v != nil {
				return *v
			}
			return ""
		}
		oneShot := svc.Restart == "no" || len(svc.Profiles) > 0
		for _, idEnv := range []string{"PLAYPIPE_INSTANCE_ID", "PLAYPIPE_TRANSACTIONAL_ID"} {
			id := env(idEnv)
			if id == "" {
				continue
			}
			if other, dup := owner[idEnv+"="+id]; dup {
				add("service %s: %s=%s is also service %s's", name, idEnv, id, other)
			}
			owner[idEnv+"="+id] = name
		}
		// The default transactional id derives from the hostname, which is
		// the container id in compose: a recreated container would not fence
		// its predecessor. Set one.
		if r.Accepts("PLAYPIPE_TRANSACTIONAL_ID") && env("PLAYPIPE_TRANSACTIONAL_ID") == "" {
			add("service %s: `playpipe %s` needs a stable PLAYPIPE_TRANSACTIONAL_ID (the default derives from the container's hostname)", name, r.Name)
		}
		// Every external part the role can use is configured: a role never
		// silently falls back to an embedded one in a deployment.
		for _, need := range []struct {
			uses bool
			env  string
		}{{r.Kafka(), "PLAYPIPE_BROKERS"}, {r.ClickHouse(), "PLAYPIPE_CLICKHOUSE_ADDR"}, {r.API(), "PLAYPIPE_API_URL"}} {
			if need.uses && env(need.env) == "" {
				add("service %s: `playpipe %s` reads %s but the service does not set it", name, r.Name, need.env)
			}
		}
		// Listen addresses and published ports.
		listen := map[string]string{} // port -> address
		for e, def := range r.ListenEnv {
			addr := env(e)
			if addr == "" {
				addr = def
			}
			if port := portOf(addr); port != "" {
				listen[port] = addr
			}
		}
		for _, pc := range svc.Ports {
			target := fmt.Sprint(pc.Target)
			addr, ok := listen[target]
			switch {
			case !ok:
				add("service %s: publishes container port %s, where `playpipe %s` does not listen (its listen addresses: %v)", name, target, r.Name, listen)
			case isLoopback(addr):
				add("service %s: publishes container port %s but the role listens on loopback %s", name, target, addr)
			}
		}
		// Health check: the admin listener's real paths.
		if r.AdminEnv == "" || oneShot {
			continue
		}
		admin := env(r.AdminEnv)
		if admin == "" {
			admin = r.AdminDefault
		}
		hc := svc.HealthCheck
		if hc == nil || hc.Disable || len(hc.Test) < 3 || hc.Test[0] != "CMD" {
			add("service %s: no health check of the form [CMD, %s, URL]", name, imageHealthcheck)
			continue
		}
		if hc.Test[1] != imageHealthcheck || !strings.Contains(dockerfile, imageHealthcheck) {
			add("service %s: health check runs %s, which deploy/Dockerfile does not install (%s)", name, hc.Test[1], imageHealthcheck)
		}
		for _, raw := range hc.Test[2:] {
			u, err := url.Parse(raw)
			if err != nil || u.Scheme != "http" {
				add("service %s: health check URL %q is not http", name, raw)
				continue
			}
			if h := u.Hostname(); h != "127.0.0.1" && h != "localhost" {
				add("service %s: health check %s must ask the container itself (127.0.0.1)", name, raw)
			}
			if u.Port() != portOf(admin) {
				add("service %s: health check %s is not on the admin port %s (%s=%s)", name, raw, portOf(admin), r.AdminEnv, admin)
			}
			if !slices.Contains(r.AdminPaths, u.Path) {
				add("service %s: health check path %s is not one the admin listener serves %v", name, u.Path, r.AdminPaths)
			}
		}
	}
	if cyc := dependencyCycle(p); cyc != nil {
		add("depends_on cycle: %s", strings.Join(cyc, " -> "))
	}
	return probs
}

func fromEnvironment(v string) bool {
	for _, e := range composeEnv {
		if v == e {
			return true
		}
	}
	return false
}

// documentedSandboxDefaults are the sandbox's credentials as its --help
// documents them: the only secret-looking literals compose may carry.
func documentedSandboxDefaults(t testing.TB) map[string]bool {
	out := map[string]bool{}
	help := roleOf(t, "sandbox").Help
	for _, flag := range []string{"client-signature"} {
		re := regexp.MustCompile(`-` + flag + ` string\n\s+.*\(default "([^"]+)"\)`)
		m := re.FindStringSubmatch(help)
		if m == nil {
			t.Fatalf("sandbox --help: no default for --%s", flag)
		}
		out[m[1]] = true
	}
	return out
}

// hostsIn returns the host names in an address-like value: a URL, host:port,
// or a comma-separated list of them.
func hostsIn(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if strings.Contains(item, "://") {
			if u, err := url.Parse(item); err == nil && u.Hostname() != "" {
				out = append(out, u.Hostname())
			}
			continue
		}
		if h, _, err := net.SplitHostPort(item); err == nil && h != "" {
			out = append(out, h)
		}
	}
	return out
}

func isLoopback(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func dependencyCycle(p *types.Project) []string {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack, cycle []string
	var visit func(string) bool
	visit = func(n string) bool {
		color[n] = grey
		stack = append(stack, n)
		for _, d := range keys(p.Services[n].DependsOn) {
			switch color[d] {
			case grey:
				i := slices.Index(stack, d)
				cycle = append(append([]string(nil), stack[i:]...), d)
				return true
			case white:
				if visit(d) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return false
	}
	for _, n := range p.ServiceNames() {
		if color[n] == white && visit(n) {
			return cycle
		}
	}
	return nil
}

func TestComposeFile(t *testing.T) {
	p, err := loadCompose(repoFile(t, "docker-compose.yml"))
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	for _, s := range []string{"kafka", "clickhouse", "sandbox", "ingest", "consume", "report", "sink", "audit", "grafana"} {
		if _, ok := p.Services[s]; !ok {
			t.Errorf("service %s missing (services: %v)", s, p.ServiceNames())
		}
	}
	for _, prob := range composeProblems(t, string(repoFile(t, "docker-compose.yml")), p) {
		t.Error(prob)
	}
	// The order compose starts them in: the broker and the ledger before
	// the roles, the sandbox before the roles that call it.
	order := startOrder(p)
	for _, pair := range [][2]string{{"kafka", "ingest"}, {"kafka", "consume"}, {"kafka", "report"}, {"kafka", "sink"}, {"sandbox", "consume"}, {"sandbox", "report"}, {"clickhouse", "sink"}, {"clickhouse", "grafana"}} {
		if slices.Index(order, pair[0]) > slices.Index(order, pair[1]) {
			t.Errorf("start order %v: %s after %s", order, pair[0], pair[1])
		}
	}
	// The images the docker suite (e2e/docker) uses are compose's.
	for svc, img := range map[string]string{"kafka": "apache/kafka:", "clickhouse": "clickhouse/clickhouse-server:"} {
		if !strings.HasPrefix(p.Services[svc].Image, img) {
			t.Errorf("service %s image %q, want %s…", svc, p.Services[svc].Image, img)
		}
	}
}

// startOrder is a topological order of the services (dependencies first).
func startOrder(p *types.Project) []string {
	var out []string
	seen := map[string]bool{}
	var visit func(string)
	visit = func(n string) {
		if seen[n] {
			return
		}
		seen[n] = true
		for _, d := range keys(p.Services[n].DependsOn) {
			visit(d)
		}
		out = append(out, n)
	}
	for _, n := range p.ServiceNames() {
		visit(n)
	}
	return out
}

// TestComposeCheckCatchesMistakes shows that the checks above fail on the
// mistakes they exist for: each case edits the real file in memory.
func TestComposeCheckCatchesMistakes(t *testing.T) {
	orig := string(repoFile(t, "docker-compose.yml"))
	for _, tc := range []struct {
		name, old, new string
		want           string // in a problem, or in the load error
	}{
		{"misspelt variable of one role", "PLAYPIPE_TRANSACTIONAL_ID: playpipe-enrich", "PLAYPIPE_TRANSACTION_ID: playpipe-enrich",
			"service consume: environment PLAYPIPE_TRANSACTION_ID is not read by `playpipe consume`"},
		{"shared instance id", "PLAYPIPE_INSTANCE_ID: report-0", "PLAYPIPE_INSTANCE_ID: consume-0",
			"PLAYPIPE_INSTANCE_ID=consume-0 is also service consume's"},
		{"no transactional id", "      PLAYPIPE_TRANSACTIONAL_ID: playpipe-enrich-consume-0\n", "",
			"service consume: `playpipe consume` needs a stable PLAYPIPE_TRANSACTIONAL_ID"},
		{"misspelt shared variable", "  PLAYPIPE_BROKERS: kafka:9092", "  PLAYPIPE_BROKER: kafka:9092",
			"environment PLAYPIPE_BROKER is not read by `playpipe sink`"},
		{"variable of another role", "OTEL_SERVICE_NAME: playpipe-report\n", "OTEL_SERVICE_NAME: playpipe-report\n      PLAYPIPE_CLICKHOUSE_ADDR: clickhouse:9000\n",
			"service report: environment PLAYPIPE_CLICKHOUSE_ADDR is not read by `playpipe report`"},
		{"misspelt OTEL variable", "OTEL_SERVICE_NAME: playpipe-sink", "OTEL_SERVICE_NAM: playpipe-sink",
			"environment OTEL_SERVICE_NAM is not read"},
		{"wrong health path", `"http://127.0.0.1:9460/readyz"]`, `"http://127.0.0.1:9460/ready"]`,
			"health check path /ready is not one the admin listener serves"},
		{"health check on the wrong port", `"http://127.0.0.1:9460/readyz"]`, `"http://127.0.0.1:9470/readyz"]`,
			"is not on the admin port 9460"},
		{"admin port moved, published port not", "PLAYPIPE_ADMIN_ADDR: 0.0.0.0:9460", "PLAYPIPE_ADMIN_ADDR: 0.0.0.0:9470",
			"publishes container port 9460, where `playpipe ingest` does not listen"},
		{"missing depends_on", "      clickhouse: {condition: service_healthy}\n      otel-collector: {condition: service_started}\n    ports: [\"9464:9460\"]",
			"      otel-collector: {condition: service_started}\n    ports: [\"9464:9460\"]",
			"service sink: PLAYPIPE_CLICKHOUSE_ADDR=clickhouse:9000 names service clickhouse, missing from depends_on"},
		{"depends_on without health", "sandbox: {condition: service_healthy}", "sandbox: {condition: service_started}",
			`depends_on sandbox has condition "service_started"`},
		{"secret literal", "${PLAYPIPE_API_CLIENT_SIGNATURE:-SANDBOX-ONLY-signature-not-a-real-secret}", "0123456789012345678901234567890123456789",
			"secret PLAYPIPE_API_CLIENT_SIGNATURE is a literal"},
		{"secret default", "${PLAYPIPE_CLICKHOUSE_PASSWORD:?set PLAYPIPE_CLICKHOUSE_PASSWORD}", "${PLAYPIPE_CLICKHOUSE_PASSWORD:-playpipe}",
			"secret PLAYPIPE_CLICKHOUSE_PASSWORD has a default in the file"},
		{"misspelt compose key", "    healthcheck: *healthcheck\n    depends_on:\n      kafka: {condition: service_healthy}\n      otel-collector",
			"    healthcheck: *healthcheck\n    depend_on:\n      kafka: {condition: service_healthy}\n      otel-collector",
			"depend_on"},
		{"missing bind source", "./deploy/grafana/dashboards:", "./deploy/grafana/dashbaords:",
			"bind mount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(orig, tc.old) {
				t.Fatalf("docker-compose.yml no longer contains %q: update the case", tc.old)
			}
			broken := strings.Replace(orig, tc.old, tc.new, 1)
			p, err := loadCompose([]byte(broken))
			if err != nil {
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("load error %q does not mention %q", err, tc.want)
				}
				return
			}
			probs := composeProblems(t, broken, p)
			for _, pr := range probs {
				if strings.Contains(pr, tc.want) {
					return
				}
			}
			t.Errorf("no problem mentions %q; got %q", tc.want, probs)
		})
	}
}

// TestDockerfile: the image stays minimal (distroless static, no shell) and
// runs as a non-root user, and it installs what compose's health checks run.
func TestDockerfile(t *testing.T) {
	df := string(repoFile(t, "deploy/Dockerfile"))
	stages := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(df, -1)
	if len(stages) == 0 {
		t.Fatal("deploy/Dockerfile: no FROM")
	}
	final := stages[len(stages)-1][1]
	if !strings.HasPrefix(final, "gcr.io/distroless/static") || !strings.HasSuffix(final, ":nonroot") {
		t.Errorf("final stage %s: want gcr.io/distroless/static…:nonroot", final)
	}
	users := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(df, -1)
	if len(users) == 0 {
		t.Fatal("deploy/Dockerfile: no USER")
	}
	if u := users[len(users)-1][1]; strings.HasPrefix(u, "0") || strings.HasPrefix(u, "root") {
		t.Errorf("USER %s: must not be root", u)
	}
	for _, want := range []string{"CGO_ENABLED=0", "./cmd/playpipe", "./deploy/healthcheck", imageHealthcheck, `ENTRYPOINT ["/usr/local/bin/playpipe"]`} {
		if !strings.Contains(df, want) {
			t.Errorf("deploy/Dockerfile does not contain %q", want)
		}
	}
}
