//go:build linux

package e2e

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

// buildBinary builds cmd/playpipe once into dir and returns its path.
func buildBinary(t *testing.T, dir string) string {
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

// childEnv is the test's environment without PLAYPIPE_* and OTEL_*
// settings (so that a developer's shell cannot redirect the children),
// plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PLAYPIPE_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// procs owns the child processes of one test: it starts them, signals them
// by PID, and on cleanup SIGKILLs whatever still runs and waits for it. On
// failure it dumps the tail of every process log.
type procs struct {
	t   *testing.T
	bin string
	dir string
	env []string

	mu  sync.Mutex
	all []*proc
}

// proc is one child process (one run of one instance; a restart is a new
// proc with the same name and log file).
type proc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{} // closed when the process has exited
	err       error         // Wait's error, set before done closes
	exited    time.Time     // when Wait returned, set before done closes
}

func newProcs(t *testing.T, bin, dir string, env []string) *procs {
	ps := &procs{t: t, bin: bin, dir: dir, env: env}
	t.Cleanup(ps.cleanup)
	return ps
}

// start runs the binary with args; stdout and stderr go to <dir>/<name>.log
// (appended, so a restarted instance continues the same file).
// logPath is the log of the processes started as name (appended to
// across restarts): readable while a supervisor restarts the process.
func (ps *procs) logPath(name string) string { return filepath.Join(ps.dir, name+".log") }

func (ps *procs) start(name string, args ...string) *proc {
	ps.t.Helper()
	logPath := ps.logPath(name)
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		ps.t.Fatalf("log file of %s: %v", name, err)
	}
	fmt.Fprintf(f, "=== %s: playpipe %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := exec.Command(ps.bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, ps.env
	// Should the test binary itself die, the children die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		ps.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { // owned by ps: cleanup kills the process, which ends this wait
		p.err = cmd.Wait()
		p.exited = time.Now()
		f.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.all = append(ps.all, p)
	ps.mu.Unlock()
	return p
}

// signal sends sig to the process by its PID.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Errorf("%s (pid %d): send %v: %v", p.name, p.cmd.Process.Pid, sig, err)
	}
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// wait waits up to d for the process to exit and returns its exit code (-1
// if killed by a signal); on timeout it fails the test.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Errorf("%s (pid %d) did not exit within %s", p.name, p.cmd.Process.Pid, d)
		return -2
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	default:
		t.Errorf("%s: wait: %v", p.name, p.err)
		return -2
	}
}

// stop sends SIGTERM and expects exit status 0 within d.
func (p *proc) stop(t *testing.T, d time.Duration) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, d); code != 0 {
		t.Errorf("%s (pid %d) exited %d after SIGTERM, want 0 (log %s)", p.name, p.cmd.Process.Pid, code, p.log)
	}
}

func (ps *procs) cleanup() {
	ps.mu.Lock()
	all := append([]*proc(nil), ps.all...)
	ps.mu.Unlock()
	for _, p := range all {
		if p.running() {
			_ = p.cmd.Process.Kill() // by PID
		}
	}
	for _, p := range all {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			ps.t.Logf("%s (pid %d) still running after SIGKILL", p.name, p.cmd.Process.Pid)
		}
	}
	if ps.t.Failed() {
		ps.dumpLogs(80)
	}
}

// dumpLogs writes the last n lines of every process log to the test log.
func (ps *procs) dumpLogs(n int) {
	seen := map[string]bool{}
	ps.mu.Lock()
	all := append([]*proc(nil), ps.all...)
	ps.mu.Unlock()
	for _, p := range all {
		if seen[p.log] {
			continue
		}
		seen[p.log] = true
		data, err := os.ReadFile(p.log)
		if err != nil {
			ps.t.Logf("log of %s: %v", p.name, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > n {
			lines = append([]string{fmt.Sprintf("… %d lines before", len(lines)-n)}, lines[len(lines)-n:]...)
		}
		ps.t.Logf("----- %s (%s) -----\n%s", p.name, p.log, strings.Join(lines, "\n"))
	}
}

// grepLog returns the lines of a process log that contain every one of subs.
func grepLog(path string, subs ...string) []string {
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

// waitReady polls http://addr/readyz until it answers 200, the process
// exits, or d passes.
func waitReady(t *testing.T, p *proc, addr string, d time.Duration) {
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
		if !p.running() {
			t.Fatalf("%s exited before it was ready: %v (log %s)", p.name, p.err, p.log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready on %s within %s (last: %v)", p.name, addr, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrapeSum fetches http://addr/metrics and sums the samples whose line
// starts with name and contains every one of labels (e.g. `outcome="delivered"`).
func scrapeSum(addr, name string, labels ...string) (float64, error) {
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
