//go:build linux

// Child processes of the built playpipe binary, for the end-to-end suites
// (e2e, e2e/edge): built once, started with their output in a log file per
// name, signalled and stopped by PID, killed on cleanup, their logs dumped
// when the test failed.

package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BuildPlaypipe builds cmd/playpipe once into dir and returns its path.
func BuildPlaypipe(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "playpipe")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/playpipe/playpipe/cmd/playpipe")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build playpipe: %v\n%s", err, out)
	}
	return bin
}

// ChildEnv is the test's environment without PLAYPIPE_*, OTEL_* and
// SSL_CERT_* settings (so that a developer's shell cannot redirect the
// children or change the CAs they trust), plus extra.
func ChildEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PLAYPIPE_") || strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "SSL_CERT_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// Procs owns the child processes of one test: it starts them, signals them
// by PID, and on cleanup SIGKILLs whatever still runs and waits for it. On
// failure it dumps the tail of every process log.
type Procs struct {
	t   testing.TB
	Bin string
	Dir string
	Env []string

	mu  sync.Mutex
	all []*Proc
}

// Proc is one child process (one run of one instance; a restart is a new
// Proc with the same name and log file).
type Proc struct {
	Name, Log string
	Cmd       *exec.Cmd
	done      chan struct{} // closed when the process has exited
	Err       error         // Wait's error, set before done closes
	Exited    time.Time     // when Wait returned, set before done closes
}

func NewProcs(t testing.TB, bin, dir string, env []string) *Procs {
	ps := &Procs{t: t, Bin: bin, Dir: dir, Env: env}
	t.Cleanup(ps.cleanup)
	return ps
}

// start runs the binary with args; stdout and stderr go to <dir>/<name>.log
// (appended, so a restarted instance continues the same file).
// LogPath is the log of the processes started as name (appended to
// across restarts): readable while a supervisor restarts the process.
func (ps *Procs) LogPath(name string) string { return filepath.Join(ps.Dir, name+".log") }

func (ps *Procs) Start(name string, args ...string) *Proc {
	ps.t.Helper()
	logPath := ps.LogPath(name)
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		ps.t.Fatalf("log file of %s: %v", name, err)
	}
	fmt.Fprintf(f, "=== %s: playpipe %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := exec.Command(ps.Bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, ps.Env
	// Should the test binary itself die, the children die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		ps.t.Fatalf("start %s: %v", name, err)
	}
	p := &Proc{Name: name, Log: logPath, Cmd: cmd, done: make(chan struct{})}
	go func() { // owned by ps: cleanup kills the process, which ends this wait
		p.Err = cmd.Wait()
		p.Exited = time.Now()
		f.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.all = append(ps.all, p)
	ps.mu.Unlock()
	return p
}

// Signal sends sig to the process by its PID.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Errorf("%s (pid %d): send %v: %v", p.Name, p.Cmd.Process.Pid, sig, err)
	}
}

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Wait waits up to d for the process to exit and returns its exit code (-1
// if killed by a signal); on timeout it fails the test.
func (p *Proc) Wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Errorf("%s (pid %d) did not exit within %s", p.Name, p.Cmd.Process.Pid, d)
		return -2
	}
	var ee *exec.ExitError
	switch {
	case p.Err == nil:
		return 0
	case errors.As(p.Err, &ee):
		return ee.ExitCode()
	default:
		t.Errorf("%s: wait: %v", p.Name, p.Err)
		return -2
	}
}

// Stop sends SIGTERM and expects exit status 0 within d.
func (p *Proc) Stop(t testing.TB, d time.Duration) {
	t.Helper()
	p.Signal(t, syscall.SIGTERM)
	if code := p.Wait(t, d); code != 0 {
		t.Errorf("%s (pid %d) exited %d after SIGTERM, want 0 (log %s)", p.Name, p.Cmd.Process.Pid, code, p.Log)
	}
}

func (ps *Procs) cleanup() {
	ps.mu.Lock()
	all := append([]*Proc(nil), ps.all...)
	ps.mu.Unlock()
	for _, p := range all {
		if p.Running() {
			_ = p.Cmd.Process.Kill() // by PID
		}
	}
	for _, p := range all {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			ps.t.Logf("%s (pid %d) still running after SIGKILL", p.Name, p.Cmd.Process.Pid)
		}
	}
	if ps.t.Failed() {
		ps.DumpLogs(80)
	}
}

// DumpLogs writes the last n lines of every process log to the test log.
func (ps *Procs) DumpLogs(n int) {
	seen := map[string]bool{}
	ps.mu.Lock()
	all := append([]*Proc(nil), ps.all...)
	ps.mu.Unlock()
	for _, p := range all {
		if seen[p.Log] {
			continue
		}
		seen[p.Log] = true
		data, err := os.ReadFile(p.Log)
		if err != nil {
			ps.t.Logf("log of %s: %v", p.Name, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > n {
			lines = append([]string{fmt.Sprintf("… %d lines before", len(lines)-n)}, lines[len(lines)-n:]...)
		}
		ps.t.Logf("----- %s (%s) -----\n%s", p.Name, p.Log, strings.Join(lines, "\n"))
	}
}

// GrepLog returns the lines of a process log that contain every one of subs.
func GrepLog(path string, subs ...string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
scan:
	for sc.Scan() {
		for _, s := range subs {
			if !bytes.Contains(sc.Bytes(), []byte(s)) {
				continue scan
			}
		}
		out = append(out, sc.Text())
	}
	return out
}

// WaitReady polls http://addr/readyz until it answers 200, the process
// exits, or d passes.
func WaitReady(t testing.TB, p *Proc, addr string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if !p.Running() {
			t.Fatalf("%s exited before it was ready: %v (log %s)", p.Name, p.Err, p.Log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready on %s within %s (last: %v)", p.Name, addr, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ScrapeSum fetches http://addr/metrics and sums the samples whose line
// starts with name and contains every one of labels (e.g. `outcome="delivered"`).
func ScrapeSum(addr, name string, labels ...string) (float64, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
sample:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue sample
			}
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}
