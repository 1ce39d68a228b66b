package testenv

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// Logger returns a logger that writes to the test's log (shown on failure or
// with -v) at level warn, or at the level named by PLAYPIPE_TEST_LOG (debug,
// info, warn, error). Records logged after the test ended are dropped instead
// of panicking.
func Logger(t testing.TB) *slog.Logger {
	t.Helper()
	level := slog.LevelWarn
	if v := os.Getenv("PLAYPIPE_TEST_LOG"); v != "" {
		_ = level.UnmarshalText([]byte(v))
	}
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}
