package testenv

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// Sandbox is a partner API sandbox serving one test: the API on URL, the
// admin API on AdminURL, both on free 127.0.0.1 ports.
type Sandbox struct {
	*sandbox.Server
	// URL is the API base address, e.g. "http://127.0.0.1:41234" (paths
	// start with /partners/).
	URL string
	// AdminURL is the admin API base address (paths start with /admin/).
	AdminURL string
	// The credentials the sandbox accepts (sandbox-only values).
	ClientID, ClientSignature, Email string
}

// StartSandbox starts a sandbox (options applied in order over the defaults:
// seed 1, default credentials) and stops its listeners when the test ends.
func StartSandbox(t testing.TB, opts ...func(*sandbox.Config)) *Sandbox {
	t.Helper()
	o := sandbox.Config{Seed: 1}
	for _, f := range opts {
		f(&o)
	}
	srv, err := sandbox.New(o)
	if err != nil {
		t.Fatalf("testenv: sandbox: %v", err)
	}
	sb := &Sandbox{Server: srv, ClientID: o.ClientID, ClientSignature: o.ClientSignature, Email: o.Email}
	if sb.ClientID == "" {
		sb.ClientID = sandbox.DefaultClientID
	}
	if sb.ClientSignature == "" {
		sb.ClientSignature = sandbox.DefaultClientSignature
	}
	if sb.Email == "" {
		sb.Email = sandbox.DefaultEmail
	}
	sb.URL = ServeHandler(t, srv.Handler())
	sb.AdminURL = ServeHandler(t, srv.AdminHandler())
	return sb
}

// ServeHandler serves h on a free 127.0.0.1 port until the test ends and
// returns its base URL ("http://127.0.0.1:port").
func ServeHandler(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: listen: %v", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("testenv: serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			_ = hs.Close()
		}
		<-done
	})
	return "http://" + ln.Addr().String()
}
