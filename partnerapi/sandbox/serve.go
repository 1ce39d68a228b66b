package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Loopback is a sandbox serving its API on a free 127.0.0.1 port: the
// built-in partner API of playpipe's roles and demo when no API URL is
// configured. Close stops it; the Server stays readable (ledger, catalog).
type Loopback struct {
	*Server
	// URL is the API base address, e.g. "http://127.0.0.1:41234".
	URL string

	hs   *http.Server
	done chan struct{}
}

// ServeLoopback builds a Server from opts and serves its API (not the admin
// API) on a free loopback port until Close.
func ServeLoopback(opts Config) (*Loopback, error) {
	srv, err := New(opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sandbox: listen: %w", err)
	}
	l := &Loopback{Server: srv, URL: "http://" + ln.Addr().String(), done: make(chan struct{}),
		hs: &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(l.done)
		if err := l.hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			srv.log.Error("sandbox: serve", "err", err)
		}
	}()
	return l, nil
}

// Close shuts the listener down, waiting up to five seconds for requests in
// flight. Safe to call twice.
func (l *Loopback) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.hs.Shutdown(ctx); err != nil {
		_ = l.hs.Close()
	}
	<-l.done
}
