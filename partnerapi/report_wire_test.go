//go:build linux

package partnerapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Tests of the lean report path (report_wire.go) against a raw TCP server
// that answers with scripted bytes: framings, interim answers, closed
// connections, hung servers.

// rawServer answers session requests with a token and every report with
// the next scripted answer (the last one repeats). It records the raw bytes
// of each report request.
type rawServer struct {
	ln       net.Listener
	answers  []string
	mu       sync.Mutex
	reports  []string
	next     int
	conns    atomic.Int32
	hang     chan struct{}   // when set, reports are not answered until closed
	close    atomic.Bool     // close the connection after each report's answer
	settled  atomic.Int32    // report answers written, each followed by its close decision (and the close)
	closedBy map[string]bool // the client addresses of the connections closed after an answer (mu)
}

func newRawServer(t *testing.T, answers ...string) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, answers: answers}
	t.Cleanup(func() { ln.Close() })
	go s.accept()
	return s
}

func (s *rawServer) url() string { return "http://" + s.ln.Addr().String() }

func (s *rawServer) accept() {
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.conns.Add(1)
		go s.serve(nc)
	}
}

func (s *rawServer) serve(nc net.Conn) {
	defer nc.Close()
	br := bufio.NewReader(nc)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		if strings.HasPrefix(req.URL.Path, PathSession) {
			fmt.Fprintf(nc, "HTTP/1.1 200 OK\r\nContent-Length: 51\r\n\r\n%s", `{"session":{"token":{"token":"tok1","error":null}}}`)
			continue
		}
		var raw strings.Builder
		_ = req.Write(&raw)
		s.mu.Lock()
		s.reports = append(s.reports, req.Header.Get("Traceparent")+"|"+string(body))
		a := s.answers[min(s.next, len(s.answers)-1)]
		s.next++
		hang := s.hang
		s.mu.Unlock()
		if hang != nil {
			<-hang
			return
		}
		if _, err := io.WriteString(nc, a); err != nil || s.close.Load() || strings.Contains(a, "Connection: close") || !strings.Contains(a, "\r\n\r\n") {
			nc.Close()
			s.mu.Lock()
			if s.closedBy == nil {
				s.closedBy = map[string]bool{}
			}
			s.closedBy[nc.RemoteAddr().String()] = true
			s.mu.Unlock()
			s.settled.Add(1)
			return
		}
		s.settled.Add(1)
	}
}

func rawClient(t *testing.T, url string, mod func(*Config)) *Client {
	t.Helper()
	cfg := Config{
		BaseURL:     url,
		Credentials: Credentials{ClientID: testID, ClientSignature: testSig},
		BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Logger: discardLogger(),
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.wire == nil && cfg.HTTPClient == nil {
		t.Fatal("the lean report path is off")
	}
	t.Cleanup(c.Close)
	return c
}

func TestWireAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
		status       int
		kind         Kind
		served       ServedBy
		message      string
		retryAfter   time.Duration
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 33\r\n\r\n{\"error\":false,\"message\":\"ok\"}  \n", 200, 0, ServedLive, "ok", 0},
		{"chunked standby", "HTTP/1.1 200 OK\r\nx-service-served-by: standby\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"mes\r\n18;x=1\r\nsage\":\"queued\",\"e\":1} \n\r\n0\r\nX-T: 1\r\n\r\n", 200, 0, ServedStandby, "queued", 0},
		{"interim then close-delimited", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-Service-Served-By: live-bypass\r\nConnection: close\r\n\r\n{\"message\":\"fine\"}", 200, 0, ServedLiveBypass, "fine", 0},
		{"503 retry-after", "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 2\r\n\r\n{}", 503, KindTransient, ServedLive, "", 2 * time.Second},
		{"400 fields", "HTTP/1.1 400 Bad Request\r\nContent-Length: 58\r\n\r\n{\"error\":true,\"message\":\"include the required fields: os\"}", 400, KindRejected, ServedLive, "", 0},
		{"403", "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", 403, KindEdgeBlocked, ServedLive, "", 0},
		{"garbage", "SMTP ready\r\n\r\n", 0, KindTransient, "", "", 0},
		{"truncated", "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nConnection: close\r\n\r\n{\"message\"", 200, KindTransient, ServedLive, "", 0},
		{"too large", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", maxSmallBody+1), 200, KindTransient, ServedLive, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRawServer(t, tc.answer)
			c := rawClient(t, s.url(), nil)
			res, err := c.ReportPlayJSON(context.Background(), []byte(`{"trackid":1}`))
			if tc.kind == 0 {
				if err != nil || res.Meta.Status != tc.status || res.Meta.ServedBy != tc.served || res.Message != tc.message {
					t.Fatalf("%+v, %v", res, err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Kind != tc.kind || e.Status != tc.status || e.RetryAfter != tc.retryAfter || e.Op != opReport {
				t.Fatalf("err %#v", err)
			}
			if tc.kind == KindRejected && (len(e.Fields) != 1 || e.Fields[0] != "os") {
				t.Fatalf("fields %q", e.Fields)
			}
		})
	}
}

// TestWireSameAsNetHTTP posts through the lean path and through a caller's
// net/http client to the same server: the same body bytes arrive, and the
// answers classify alike.
func TestWireSameAsNetHTTP(t *testing.T) {
	ans := "HTTP/1.1 401 Unauthorized\r\nContent-Length: 39\r\n\r\n{\"error\":true,\"message\":\"token expired\"}"
	s := newRawServer(t, ans)
	body := []byte(`{"trackid":4711,"sourcedetail":"Run \u003cfast\u003e"}`)
	var errs []*Error
	for _, foreign := range []bool{false, true} {
		c := rawClient(t, s.url(), func(cfg *Config) {
			if foreign {
				cfg.HTTPClient = &http.Client{}
			}
		})
		if foreign {
			c.wire = nil
		}
		_, err := c.ReportPlayJSON(context.Background(), body)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindUnauthorized || c.main.cur.Load() != nil {
			t.Fatalf("foreign=%v: %v (token kept: %v)", foreign, err, c.main.cur.Load() != nil)
		}
		errs = append(errs, e)
	}
	if errs[0].Error() != errs[1].Error() {
		t.Fatalf("lean %q, net/http %q", errs[0], errs[1])
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.reports {
		if r != "|"+string(body) {
			t.Fatalf("report arrived as %q", r)
		}
	}
}

// TestWireServerClosedIdleConnection: a keep-alive connection the server
// closed while idle is not used for the next post (no answerless post).
func TestWireServerClosedIdleConnection(t *testing.T) {
	s := newRawServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"message\":\"a\"}")
	c := rawClient(t, s.url(), nil)
	if _, err := c.ReportPlayJSON(context.Background(), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	s.close.Store(true) // from now on the server closes each connection after its answer
	// The first post's connection too, should the server read the flag
	// after the store: wait until it has decided.
	waitClosesSeen(t, s, c, 1)
	for i := range 3 {
		if _, err := c.ReportPlayJSON(context.Background(), []byte(`{}`)); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
		waitClosesSeen(t, s, c, int32(i)+2) // the close reaches the client
	}
	// The session's connection, the first post's, and a new one after each
	// close (the first post's may have served post 0 as well).
	if n := s.conns.Load(); n < 4 {
		t.Fatalf("%d connections, want a new one after each close", n)
	}
}

// waitClosesSeen waits until the server has settled answers answers
// (written each, then kept the connection or closed it) and the client sees
// every idle connection the server closed as closed.
func waitClosesSeen(t *testing.T, s *rawServer, c *Client, answers int32) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d answers settled, their closes seen by the client", answers), func() bool {
		if s.settled.Load() < answers {
			return false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		c.wire.mu.Lock()
		defer c.wire.mu.Unlock()
		for _, wc := range c.wire.idle {
			if s.closedBy[wc.nc.LocalAddr().String()] && wc.peek.alive() {
				return false
			}
		}
		return true
	})
}

// TestWireCancelAndTimeout: a hung server does not hold a post past its
// context's cancellation (a context.Canceled error, which the reporter
// abandons) or past RequestTimeout (a transient timeout).
func TestWireCancelAndTimeout(t *testing.T) {
	s := newRawServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
	hang := make(chan struct{})
	defer close(hang)
	c := rawClient(t, s.url(), func(cfg *Config) { cfg.RequestTimeout = 300 * time.Millisecond })
	if _, err := c.ReportPlayJSON(context.Background(), []byte(`{}`)); err != nil { // session and a warm connection
		t.Fatal(err)
	}
	s.mu.Lock()
	s.hang = hang
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.ReportPlayJSON(ctx, []byte(`{}`))
	if !errors.Is(err, context.Canceled) || KindOf(err) != KindTransient || time.Since(start) > 250*time.Millisecond {
		t.Fatalf("cancelled: %v after %v", err, time.Since(start))
	}
	start = time.Now()
	_, err = c.ReportPlayJSON(context.Background(), []byte(`{}`))
	var ne net.Error
	if KindOf(err) != KindTransient || !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) > 2*time.Second {
		t.Fatalf("timeout: %v after %v", err, time.Since(start))
	}
}

// TestWireTraceContext: a sampled context's traceparent is sent; none
// otherwise.
func TestWireTraceContext(t *testing.T) {
	s := newRawServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
	c := rawClient(t, s.url(), nil)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5}, TraceFlags: trace.FlagsSampled,
	})
	for _, ctx := range []context.Context{context.Background(), trace.ContextWithSpanContext(context.Background(), sc)} {
		if _, err := c.ReportPlayJSON(ctx, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reports[0] != "|{}" || !strings.HasPrefix(s.reports[1], "00-01020300000000000000000000000000-") {
		t.Fatalf("reports %q", s.reports)
	}
}

func TestWireOffWhenNotApplicable(t *testing.T) {
	for _, tc := range []struct {
		url, ua string
	}{
		{"http://127.0.0.1:1", "bad\nagent"},
		{"ftp://127.0.0.1:1", "playpipe/1"},
	} {
		if w := newWireClient(tc.url, tc.ua, 4, time.Second, nil); w != nil {
			t.Errorf("%q %q: lean path on", tc.url, tc.ua)
		}
	}
	proxy := func(*http.Request) (*url.URL, error) { return url.Parse("http://127.0.0.1:3128") }
	if w := newWireClient("http://example.com/partners/royalty-tracking", "playpipe/1", 4, time.Second, proxy); w != nil {
		t.Error("lean path on behind a proxy")
	}
	if w := newWireClient("https://example.com/partners/royalty-tracking", "playpipe/1", 4, time.Second, nil); w == nil || w.tlsConf == nil || w.addr != "example.com:443" {
		t.Errorf("https: %+v", w)
	}
}

// TestWireTLS: an https base URL posts reports over TLS (HTTP/1.1 by ALPN).
func TestWireTLS(t *testing.T) {
	var proto atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, PathSession) {
			fmt.Fprint(w, `{"session":{"token":{"token":"tok1","error":null}}}`)
			return
		}
		proto.Store(r.Proto)
		fmt.Fprint(w, `{"error":false,"message":"over tls"}`)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := rawClient(t, srv.URL, nil)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	c.transport.TLSClientConfig = &tls.Config{RootCAs: roots}
	c.wire.tlsConf.RootCAs = roots
	for range 2 {
		res, err := c.ReportPlayJSON(context.Background(), []byte(`{}`))
		if err != nil || res.Message != "over tls" || proto.Load() != "HTTP/1.1" {
			t.Fatalf("%+v %v (%v)", res, err, proto.Load())
		}
	}
}
