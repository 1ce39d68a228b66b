package main

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string // removed by TestMain
)

// playpipeBinary builds the playpipe binary once per test run and returns
// its path; tests that need a separate process (kill -9, real signals) run it.
func playpipeBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "playpipe-bin-")
		if err != nil {
			binErr = err
			return
		}
		binDir = dir
		binPath = filepath.Join(dir, "playpipe")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			binErr = err
			binPath = string(out)
		}
	})
	if binErr != nil {
		t.Fatalf("go build: %v\n%s", binErr, binPath)
	}
	return binPath
}

// lineWatcher collects the lines a process writes and finds a pattern in them.
type lineWatcher struct {
	mu    sync.Mutex
	lines []string
}

func (w *lineWatcher) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		w.mu.Lock()
		w.lines = append(w.lines, sc.Text())
		w.mu.Unlock()
	}
}

func (w *lineWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// wait returns the submatches of the first line matching re, waiting up to d.
func (w *lineWatcher) wait(t *testing.T, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		w.mu.Lock()
		for _, l := range w.lines {
			if m := re.FindStringSubmatch(l); m != nil {
				w.mu.Unlock()
				return m
			}
		}
		w.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no line matching %s within %s; output:\n%s", re, d, w.String())
		}
	}
}

// proc is a playpipe process a test runs.
type proc struct {
	cmd    *exec.Cmd
	out    *lineWatcher
	exited chan struct{} // closed when the process ended; err is then set
	err    error
}

// startProc runs the built binary with args (env added to the test's) as a
// separate process; its stdout and stderr are collected in out. When the
// test ends it is stopped with SIGTERM (SIGKILL after 15 s) unless it ended.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(playpipeBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: &lineWatcher{}, exited: make(chan struct{})}
	go p.out.read(pr)
	go func() {
		p.err = cmd.Wait()
		pw.Close()
		close(p.exited)
	}()
	t.Cleanup(func() { p.stop(t, 15*time.Second) })
	return p
}

// stop sends SIGTERM and waits up to d for the process to end (then kills
// it); it returns the process's exit error. Safe to call twice.
func (p *proc) stop(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("%s did not stop within %s after SIGTERM; killed", p.cmd.Args[1], d)
		return p.err
	}
}

// kill9 kills the process with SIGKILL (by its pid) and waits for it.
func (p *proc) kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}
