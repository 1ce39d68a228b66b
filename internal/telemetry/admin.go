package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultAdminAddrs are the default admin listen addresses per role
// (loopback, one port each so that roles can share a host).
var DefaultAdminAddrs = map[string]string{
	"ingest":  "127.0.0.1:9461",
	"consume": "127.0.0.1:9462",
	"report":  "127.0.0.1:9463",
	"sink":    "127.0.0.1:9464",
	"demo":    "127.0.0.1:9460",
}

// EnablePprof serves net/http/pprof under /debug/pprof/ on the admin
// listener (a role's --pprof): CPU, heap, goroutine and trace profiles of a
// running process. Off by default: profiles expose internals, and the
// admin address may listen beyond loopback.
func (s *AdminServer) EnablePprof() {
	s.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	s.mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// AdminEnabled reports whether an --admin-addr value asks for a server.
func AdminEnabled(addr string) bool { return addr != "" && addr != "off" }

// ReadyCheck reports nil when the part it checks is ready to serve.
type ReadyCheck func(ctx context.Context) error

type namedCheck struct {
	name string
	fn   ReadyCheck
}

// AdminServer is a role's admin HTTP server:
//
//	GET /metrics  Prometheus exposition of the process's metrics (MetricsHandler)
//	GET /healthz  200 "ok" while the process serves HTTP (liveness)
//	GET /readyz   200 when every registered check passes, else 503 with one
//	              line per check; 503 as soon as shutdown starts
//
// Create it with NewAdminServer, register checks, then Run. Methods are safe
// for concurrent use; checks may be added while it runs.
type AdminServer struct {
	addr    string
	log     *slog.Logger
	mux     *http.ServeMux
	timeout time.Duration

	mu     sync.Mutex
	checks []namedCheck
	ln     net.Listener

	draining atomic.Bool
}

// NewAdminServer returns a server for addr (host:port; ":0" picks a free
// port, see Listen). log may be nil.
func NewAdminServer(addr string, log *slog.Logger) *AdminServer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &AdminServer{addr: addr, log: log, mux: http.NewServeMux(), timeout: ReadyTimeout}
	s.mux.Handle("GET /metrics", MetricsHandler())
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /readyz", s.readyz)
	return s
}

// ReadyTimeout bounds every readiness check and so GET /readyz: the checks
// run concurrently and one without an answer by then counts as failed
// ("no answer within 800ms"), so /readyz answers within a second whatever a
// checked part does. Checks should answer from cached state (kafkax.Health)
// rather than wait on the part.
const ReadyTimeout = 800 * time.Millisecond

// AddReadyCheck registers a readiness check run on each GET /readyz, bounded
// by ReadyTimeout. Its error message is shown in the response: keep secrets
// out.
func (s *AdminServer) AddReadyCheck(name string, fn ReadyCheck) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks = append(s.checks, namedCheck{name, fn})
}

// Ready runs the checks concurrently and returns their joined errors (nil:
// ready) within the server's check timeout, whatever the checks do.
func (s *AdminServer) Ready(ctx context.Context) error {
	if s.draining.Load() {
		return errors.New("shutting down")
	}
	s.mu.Lock()
	checks := append([]namedCheck(nil), s.checks...)
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	errs := make(chan error, len(checks)) // buffered: a late check never blocks
	for _, c := range checks {
		go func() { // ends when fn returns; fn is handed cctx, bounded by the timeout
			if err := c.fn(cctx); err != nil {
				errs <- fmt.Errorf("%s: %w", c.name, err)
				return
			}
			errs <- nil
		}()
	}
	var out []error
	timer := time.NewTimer(s.timeout + 50*time.Millisecond)
	defer timer.Stop()
	for answered := 0; answered < len(checks); answered++ {
		select {
		case err := <-errs:
			out = append(out, err)
		case <-timer.C:
			out = append(out, fmt.Errorf("%d of %d checks gave no answer within %s", len(checks)-answered, len(checks), s.timeout))
			return errors.Join(out...)
		}
	}
	return errors.Join(out...)
}

func (s *AdminServer) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := s.Ready(r.Context()); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		lines := strings.Split(err.Error(), "\n")
		sort.Strings(lines)
		_, _ = fmt.Fprintf(w, "not ready\n%s\n", strings.Join(lines, "\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// Listen binds the address now (so a caller can read Addr before Run) and is
// called by Run when needed.
func (s *AdminServer) Listen() (net.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return s.ln.Addr(), nil
	}
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", s.addr)
	if err != nil {
		return nil, fmt.Errorf("admin server: %w", err) // err names the address
	}
	s.ln = ln
	return ln.Addr(), nil
}

// Addr returns the bound address ("" before Listen or Run).
func (s *AdminServer) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Run serves until ctx ends, then makes /readyz fail and shuts down, waiting
// up to 5 s for requests in flight. It returns nil after a clean shutdown.
func (s *AdminServer) Run(ctx context.Context) error {
	addr, err := s.Listen()
	if err != nil {
		return err
	}
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	s.log.Info("admin server listening", "addr", addr.String(), "endpoints", "/metrics /healthz /readyz")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("telemetry: admin server: %w", err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("telemetry: admin server shutdown: %w", err)
	}
	return nil
}
