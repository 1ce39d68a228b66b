package producer_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// notForFleets are the module path prefixes of dependencies that only
// playpipe's tests and deploy checks use: they live in the nested modules
// deploy/, deploy/healthcheck and e2e/docker, so a fleet never resolves them.
var notForFleets = []string{
	"k8s.io/",
	"sigs.k8s.io/",                     // kustomize, structured-merge-diff, yaml
	"github.com/compose-spec/",         // compose-go
	"github.com/testcontainers/",       // testcontainers-go
	"github.com/docker/",               // the Docker client
	"github.com/moby/",                 // the Docker client's parts
	"github.com/chdb-io/",              // chdb-go
	"github.com/containerd/",           // testcontainers' parts
	"github.com/opencontainers/",       // the Docker client's parts
	"github.com/google/gnostic-models", // k8s.io/api's OpenAPI models
}

// TestFleetModuleGraph builds a program that imports only producer, in a
// module of its own that requires playpipe through a replace directive to
// this checkout (as a fleet's repository would require a release), and
// lists its module graph with `go list -m all`: it must hold none of the
// modules of notForFleets.
func TestFleetModuleGraph(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gomod := goCmd(ctx, t, ".", "env", "GOMOD")
	root := filepath.Dir(strings.TrimSpace(gomod))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/fleet\n\ngo 1.26\n\nrequire github.com/playpipe/playpipe v0.0.0\n\n" +
			"replace github.com/playpipe/playpipe => " + root + "\n",
		// playpipe's sums cover every module the fleet can need, so the
		// test runs offline once playpipe's modules are in the cache.
		"go.sum": string(sum),
		"main.go": `package main

import (
	"fmt"

	"github.com/playpipe/playpipe/producer"
)

func main() { fmt.Println(producer.Config{}.Brokers) }
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd(ctx, t, dir, "mod", "tidy")
	goCmd(ctx, t, dir, "build", "-o", os.DevNull, ".")
	mods := strings.Fields(goCmd(ctx, t, dir, "list", "-m", "-f", "{{.Path}}", "all"))
	var bad []string
	for _, m := range mods {
		for _, p := range notForFleets {
			if strings.HasPrefix(m, p) {
				bad = append(bad, m)
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("a program importing only producer resolves %d modules that only playpipe's tests and deploy checks need: %s", len(bad), strings.Join(bad, ", "))
	}
	t.Logf("a fleet importing producer resolves %d modules", len(mods))
}

// goCmd runs the go command in dir (module mode, no workspace) and returns
// its standard output.
func goCmd(ctx context.Context, t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}
