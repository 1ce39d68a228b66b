package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// role is what one `playpipe <cmd> --help` says about the command: the
// environment it reads and the addresses it listens on. Everything here is
// parsed from the built binary's help, so the checks follow the flag sets.
type role struct {
	Name string
	// Help is the whole help text.
	Help string
	// Env holds every PLAYPIPE_* name the help mentions ("(env NAME)",
	// "read from NAME", examples).
	Env map[string]bool
	// AdminEnv is the environment variable of --admin-addr, AdminDefault
	// its default; AdminPaths the paths the admin listener serves, as its
	// help lists them (/healthz, /readyz; the sandbox's /admin/health).
	AdminEnv, AdminDefault string
	AdminPaths             []string
	// ListenEnv maps the environment variable of every listen-address flag
	// (admin included) to the flag's default.
	ListenEnv map[string]string
}

// Kafka, ClickHouse and API tell which external parts the role talks to.
func (r *role) Kafka() bool      { return r.Env["PLAYPIPE_BROKERS"] }
func (r *role) ClickHouse() bool { return r.Env["PLAYPIPE_CLICKHOUSE_ADDR"] }
func (r *role) API() bool        { return r.Env["PLAYPIPE_API_URL"] }

// otelEnv is the OpenTelemetry SDK's general environment (the spec's
// "General SDK Configuration" and OTLP exporter variables) that every role
// reads through internal/telemetry. Kept as a list so that a misspelt OTEL_
// name fails too.
var otelEnv = map[string]bool{
	"OTEL_SERVICE_NAME": true, "OTEL_RESOURCE_ATTRIBUTES": true,
	"OTEL_TRACES_SAMPLER": true, "OTEL_TRACES_SAMPLER_ARG": true, "OTEL_PROPAGATORS": true,
	"OTEL_TRACES_EXPORTER": true, "OTEL_METRICS_EXPORTER": true, "OTEL_LOGS_EXPORTER": true,
	"OTEL_SDK_DISABLED": true, "OTEL_LOG_LEVEL": true, "OTEL_METRIC_EXPORT_INTERVAL": true,
	"OTEL_EXPORTER_OTLP_ENDPOINT": true, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": true,
	"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": true, "OTEL_EXPORTER_OTLP_PROTOCOL": true,
	"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": true, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": true,
	"OTEL_EXPORTER_OTLP_HEADERS": true, "OTEL_EXPORTER_OTLP_TIMEOUT": true,
	"OTEL_EXPORTER_OTLP_INSECURE": true, "OTEL_EXPORTER_OTLP_CERTIFICATE": true,
	"OTEL_EXPORTER_PROMETHEUS_HOST": true, "OTEL_EXPORTER_PROMETHEUS_PORT": true,
}

// Accepts reports whether the role reads the environment variable name.
func (r *role) Accepts(name string) bool {
	if strings.HasPrefix(name, "OTEL_") {
		return otelEnv[name]
	}
	return r.Env[name]
}

var (
	binOnce sync.Once
	binPath string
	binErr  error

	rolesMu sync.Mutex
	roles   = map[string]*role{}
)

// playpipeBinary builds cmd/playpipe once per test binary run.
func playpipeBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			binErr = err
			return
		}
		dir, err := os.MkdirTemp("", "playpipe-deploy-test-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "playpipe")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binPath, "./cmd/playpipe")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/playpipe: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// moduleRoot is the repository's root: the folder above deploy/go.mod (the
// deploy checks are a module of their own, nested in playpipe's).
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the playpipe deploy module")
	}
	return filepath.Dir(filepath.Dir(gomod)), nil
}

var (
	envNameRE   = regexp.MustCompile(`\bPLAYPIPE_[A-Z0-9_]*[A-Z0-9]\b`)
	flagLineRE  = regexp.MustCompile(`^\s+-([a-z0-9-]+)`)
	envInRE     = regexp.MustCompile(`\(env (PLAYPIPE_[A-Z0-9_]+)`)
	defaultRE   = regexp.MustCompile(`\(default "([^"]*)"\)\s*$`)
	adminPathRE = regexp.MustCompile(`(/healthz|/readyz|/admin/health)\b`)
)

// roleOf runs `playpipe <name> --help` (once) and parses it.
func roleOf(t testing.TB, name string) *role {
	t.Helper()
	rolesMu.Lock()
	defer rolesMu.Unlock()
	if r, ok := roles[name]; ok {
		return r
	}
	bin := playpipeBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, name, "--help")
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // --help may exit 0 or 2; the text decides
	help := out.String()
	if !strings.Contains(help, "Usage: playpipe "+name) {
		t.Fatalf("playpipe %s --help: not a usage text:\n%s", name, help)
	}
	r := parseHelp(name, help)
	roles[name] = r
	return r
}

// parseHelp reads a role's help text; see role.
func parseHelp(name, help string) *role {
	r := &role{Name: name, Help: help, Env: map[string]bool{}, ListenEnv: map[string]string{}}
	for _, n := range envNameRE.FindAllString(help, -1) {
		r.Env[n] = true
	}
	lines := strings.Split(help, "\n")
	for i := 0; i+1 < len(lines); i++ {
		m := flagLineRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		usage := lines[i+1]
		env := envInRE.FindStringSubmatch(usage)
		if env == nil || !strings.Contains(usage, "listen address") {
			continue
		}
		def := ""
		if d := defaultRE.FindStringSubmatch(usage); d != nil {
			def = d[1]
		}
		r.ListenEnv[env[1]] = def
		if m[1] == "admin-addr" {
			r.AdminEnv, r.AdminDefault = env[1], def
		}
	}
	seen := map[string]bool{}
	for _, p := range adminPathRE.FindAllString(help, -1) {
		if !seen[p] {
			seen[p] = true
			r.AdminPaths = append(r.AdminPaths, p)
		}
	}
	sort.Strings(r.AdminPaths)
	return r
}

// portOf returns the port of a listen address ("0.0.0.0:9460", ":9460").
func portOf(addr string) string {
	if _, p, err := net.SplitHostPort(addr); err == nil {
		return p
	}
	return ""
}

// TestRoleHelpParsed guards the parser: if the help format changes so that
// nothing is found, every deployment check would pass vacuously.
func TestRoleHelpParsed(t *testing.T) {
	c := roleOf(t, "consume")
	for _, n := range []string{"PLAYPIPE_BROKERS", "PLAYPIPE_API_URL", "PLAYPIPE_API_CLIENT_SIGNATURE", "PLAYPIPE_INSTANCE_ID", "PLAYPIPE_TRANSACTIONAL_ID", "PLAYPIPE_ADMIN_ADDR"} {
		if !c.Accepts(n) {
			t.Errorf("consume --help: %s not found (env names found: %v)", n, keys(c.Env))
		}
	}
	if c.Accepts("PLAYPIPE_BROKER") || c.Accepts("OTEL_SERVICE_NAM") {
		t.Error("misspelt names accepted")
	}
	if c.AdminEnv != "PLAYPIPE_ADMIN_ADDR" || portOf(c.AdminDefault) == "" {
		t.Errorf("consume admin: env %q default %q", c.AdminEnv, c.AdminDefault)
	}
	if strings.Join(c.AdminPaths, " ") != "/healthz /readyz" {
		t.Errorf("consume admin paths %v, want /healthz /readyz", c.AdminPaths)
	}
	s := roleOf(t, "sandbox")
	if s.AdminEnv != "PLAYPIPE_SANDBOX_ADMIN_ADDR" || s.Kafka() || s.API() {
		t.Errorf("sandbox: admin env %q, kafka %v, api %v", s.AdminEnv, s.Kafka(), s.API())
	}
	if !roleOf(t, "sink").ClickHouse() || roleOf(t, "ingest").ClickHouse() {
		t.Error("sink must read ClickHouse settings and ingest must not")
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestMain removes the binary playpipeBinary built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}
