//go:build docker

package docker_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// moduleRoot is the repository's root: two folders above e2e/docker/go.mod
// (the Docker suite is a module of its own, nested in playpipe's).
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("not inside the playpipe e2e/docker module")
	}
	return filepath.Dir(filepath.Dir(filepath.Dir(gomod)))
}

// buildPlaypipe builds cmd/playpipe into the test's temp dir.
func buildPlaypipe(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "playpipe")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/playpipe")
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/playpipe: %v\n%s", err, out)
	}
	return bin
}

// roleProc is one role running as its own process, as in a deployment.
type roleProc struct {
	t         *testing.T
	name      string
	bin       string
	env       []string
	args      []string
	adminAddr string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives the exit of an unexpected stop
	done   chan struct{}
}

// startRole starts `playpipe <name> args…` with env added to the test's
// environment, and waits until its /readyz answers 200. The process is
// stopped (SIGTERM) when the test ends.
func startRole(ctx context.Context, t *testing.T, bin, name string, env []string, args ...string) *roleProc {
	t.Helper()
	r := &roleProc{t: t, name: name, bin: bin, env: env, args: args,
		adminAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), exited: make(chan error, 1)}
	r.start(ctx)
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *roleProc) start(ctx context.Context) {
	t := r.t
	t.Helper()
	cmd := exec.Command(r.bin, append([]string{r.name, "--admin-addr", r.adminAddr}, r.args...)...)
	cmd.Env = append(os.Environ(), r.env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", r.name, err)
	}
	done := make(chan struct{})
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	go func() { // the role's log lines, into the test log
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if os.Getenv("PLAYPIPE_TEST_LOG") != "" {
				t.Logf("%s: %s", r.name, sc.Text())
			}
		}
	}()
	go func() { // the owner of the process: reports an exit nobody asked for
		err := cmd.Wait()
		_ = pw.Close()
		r.mu.Lock()
		expected := r.cmd != cmd
		r.mu.Unlock()
		if !expected {
			select {
			case r.exited <- fmt.Errorf("role %s exited: %v", r.name, err):
			default:
			}
		}
		close(done)
	}()
	r.waitReady(ctx)
}

func (r *roleProc) waitReady(ctx context.Context) {
	t := r.t
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	url := "http://" + r.adminAddr + "/readyz"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("role %s ready (admin %s)", r.name, r.adminAddr)
				return
			}
		}
		select {
		case err := <-r.exited:
			t.Fatalf("%v (before it was ready)", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("role %s not ready after 2 min: last answer %v", r.name, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the orderly exit (SIGKILL after 45 s).
func (r *roleProc) stop() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(45 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// anyExited returns the first unexpected exit among the roles, if any.
func anyExited(roles ...*roleProc) error {
	var errs []error
	for _, r := range roles {
		select {
		case err := <-r.exited:
			errs = append(errs, err)
		default:
		}
	}
	return errors.Join(errs...)
}
