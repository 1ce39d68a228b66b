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
