package telemetry

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAdminPprof: /debug/pprof/ is served only when asked for (--pprof).
func TestAdminPprof(t *testing.T) {
	for _, on := range []bool{false, true} {
		s := NewAdminServer("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
		if on {
			s.EnablePprof()
		}
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
			rec := httptest.NewRecorder()
			s.mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
			if served := rec.Code == 200; served != on {
				t.Errorf("pprof %v: GET %s = %d", on, path, rec.Code)
			}
			if on && path == "/debug/pprof/goroutine?debug=1" && !strings.Contains(rec.Body.String(), "goroutine") {
				t.Errorf("goroutine profile: %.200s", rec.Body.String())
			}
		}
	}
}
