package partnerapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// The lean path of the play report POST (issue 11). net/http's Transport
// runs a read and a write goroutine per connection and hands every request
// and answer between them and the caller over channels; on the reporter's
// hot path that hand-off, not the bytes on the wire, was most of the cost
// of a report (profile of the `report` process: ~45 % in the transport's
// goroutines). wireClient speaks HTTP/1.1 on its own keep-alive connections
// synchronously in the caller's goroutine: one write of a pre-built request
// (headers and body in one buffer), the answer parsed from a buffered
// reader, no goroutine, no channel, no per-request allocation beyond the
// context hook. Only POST /partners/royalty-tracking takes it, and only with
// the client's own transport; sessions, GETs and a caller's HTTPClient stay
// on net/http. The answer goes through the one classifier (statusError).

// wireIdleTimeout closes keep-alive connections idle longer than this (the
// own transport's IdleConnTimeout).
const wireIdleTimeout = 90 * time.Second

// wireMaxHeaderLine bounds one header line of an answer (the buffered
// reader's size).
const wireMaxHeaderLine = 8 << 10

// errWireProtocol is wrapped in the error of an answer that is not HTTP/1.x.
var errWireProtocol = errors.New("malformed HTTP answer")

// aLongTimeAgo is a deadline in the past: it interrupts a blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// wireClient posts play reports over its own HTTP/1.1 connections.
type wireClient struct {
	addr    string      // host:port dialled
	tlsConf *tls.Config // nil for http://
	dialer  net.Dialer
	timeout time.Duration // bounds one attempt on the connection (RequestTimeout)
	head    []byte        // request line, Host, User-Agent, Content-Type; CRLF-terminated
	slots   chan struct{} // one per request in flight: at most MaxConns connections

	mu     sync.Mutex
	idle   []*wireConn // most recently used last
	closed bool
}

// wireConn is one keep-alive connection.
type wireConn struct {
	nc   net.Conn
	br   *bufio.Reader
	buf  []byte    // the request being written
	last time.Time // when it went idle
	peek *peeker   // the liveness check of the idle connection

	// The cancellation hook: a context.AfterFunc on the Done channel of
	// the contexts the connection serves, which interrupts the blocked
	// read or write. It stays registered while posts come with contexts of
	// the same Done channel (the reporter's: one per run), so that a post
	// does not register and unregister one.
	watched   <-chan struct{}
	stopWatch func() bool
}

// watch makes the end of ctx interrupt wc's I/O. It reports false when wc
// cannot be used: a hook of another context may be firing.
func (wc *wireConn) watch(ctx context.Context) bool {
	done := ctx.Done()
	if done == wc.watched {
		return true
	}
	if wc.stopWatch != nil && !wc.stopWatch() {
		return false
	}
	wc.watched, wc.stopWatch = done, nil
	if done != nil {
		nc := wc.nc
		wc.stopWatch = context.AfterFunc(ctx, func() { _ = nc.SetDeadline(aLongTimeAgo) })
	}
	return true
}

// close closes the connection and drops its hook.
func (wc *wireConn) close() {
	if wc.stopWatch != nil {
		wc.stopWatch()
	}
	wc.nc.Close()
}

// newWireClient returns the lean path for reportURL, or nil when it must not
// be used: proxy (the own transport's Proxy) names a proxy for it (net/http
// speaks to proxies), the URL is not plain http(s), or the User-Agent is not
// a valid header value.
func newWireClient(reportURL, userAgent string, maxConns int, timeout time.Duration, proxy func(*http.Request) (*url.URL, error)) *wireClient {
	if !wireSupported || !validHeaderValue(userAgent) {
		return nil
	}
	u, err := url.Parse(reportURL)
	if err != nil || u.User != nil || u.RawQuery != "" || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil
	}
	if proxy != nil {
		if p, err := proxy(&http.Request{URL: u}); err != nil || p != nil {
			return nil
		}
	}
	w := &wireClient{
		dialer:  net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
		timeout: timeout,
		slots:   make(chan struct{}, maxConns),
	}
	host, port := u.Hostname(), u.Port()
	if u.Scheme == "https" {
		w.tlsConf = &tls.Config{ServerName: host, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
		if port == "" {
			port = "443"
		}
	} else if port == "" {
		port = "80"
	}
	w.addr = net.JoinHostPort(host, port)
	w.head = fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\nContent-Type: application/json\r\n",
		u.EscapedPath(), u.Host, userAgent)
	return w
}

// validHeaderValue reports whether v can be sent as a header value as it is
// (no control characters but tab: net/http refuses the others too).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

// wireAnswer is an answer to one post: status 0 when none came.
type wireAnswer struct {
	status     int
	servedBy   ServedBy
	retryAfter string
	body       []byte
}

// post sends body with the token auth and the trace headers extra (nil
// when none), and reads the answer's body into dst (grown as needed, up to
// maxSmallBody). An error with a zero status means no answer came; with a
// status, the answer could not be read whole. ctx cancels the attempt.
func (w *wireClient) post(ctx context.Context, auth string, extra http.Header, body, dst []byte) (wireAnswer, error) {
	select {
	case w.slots <- struct{}{}:
	default:
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			return wireAnswer{}, ctx.Err()
		}
	}
	defer func() { <-w.slots }()
	wc, err := w.conn(ctx)
	if err != nil {
		return wireAnswer{}, err
	}
	deadline := time.Time{}
	if w.timeout > 0 {
		deadline = time.Now().Add(w.timeout)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	_ = wc.nc.SetDeadline(deadline)
	a, keep, err := w.roundTrip(wc, auth, extra, body, dst)
	if ctx.Err() != nil {
		// ctx ended: the hook may have spoiled the connection's deadline.
		// An answer read whole is still the answer; a failure is the
		// context's.
		keep = false
		if err != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
	}
	if keep && err == nil {
		w.put(wc)
	} else {
		wc.close()
	}
	return a, err
}

// roundTrip writes the request and reads the answer on wc.
func (w *wireClient) roundTrip(wc *wireConn, auth string, extra http.Header, body, dst []byte) (wireAnswer, bool, error) {
	b := append(wc.buf[:0], w.head...)
	b = append(b, "Authorization: "...)
	b = append(b, auth...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n"...)
	for k, vs := range extra {
		for _, v := range vs {
			if validHeaderValue(v) {
				b = append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
			}
		}
	}
	b = append(append(b, "\r\n"...), body...)
	wc.buf = b
	if _, err := wc.nc.Write(b); err != nil {
		return wireAnswer{}, false, err
	}
	return readAnswer(wc.br, dst)
}

// conn returns an idle connection that is still open, or dials one.
func (w *wireClient) conn(ctx context.Context) (*wireConn, error) {
	now := time.Now()
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return nil, ErrClosed
		}
		n := len(w.idle)
		if n == 0 {
			w.mu.Unlock()
			break
		}
		wc := w.idle[n-1]
		w.idle[n-1] = nil
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		// The server may have closed it while idle (net/http's read
		// goroutine notices that; here a non-blocking peek does): a post on
		// a closed connection would be a post without an answer.
		if now.Sub(wc.last) < wireIdleTimeout && wc.peek.alive() && wc.watch(ctx) {
			return wc, nil
		}
		wc.close()
	}
	var nc net.Conn
	var err error
	if w.tlsConf != nil {
		td := tls.Dialer{NetDialer: &w.dialer, Config: w.tlsConf}
		nc, err = td.DialContext(ctx, "tcp", w.addr)
	} else {
		nc, err = w.dialer.DialContext(ctx, "tcp", w.addr)
	}
	if err != nil {
		return nil, err
	}
	wc := &wireConn{nc: nc, br: bufio.NewReaderSize(nc, wireMaxHeaderLine), peek: newPeeker(nc)}
	if !wc.watch(ctx) {
		nc.Close()
		return nil, errors.New("partnerapi: connection hook") // unreachable: a new connection has no hook
	}
	return wc, nil
}

// put keeps wc for the next post.
func (w *wireClient) put(wc *wireConn) {
	wc.last = time.Now()
	w.mu.Lock()
	if w.closed || len(w.idle) >= cap(w.slots) {
		w.mu.Unlock()
		wc.close()
		return
	}
	w.idle = append(w.idle, wc)
	w.mu.Unlock()
}

// close closes the idle connections; those in use close when their post
// ends.
func (w *wireClient) close() {
	w.mu.Lock()
	w.closed = true
	idle := w.idle
	w.idle = nil
	w.mu.Unlock()
	for _, wc := range idle {
		wc.close()
	}
}

// readAnswer reads one HTTP/1.x answer from br: the status, the headers the
// classifier needs, and the body into dst (Content-Length, chunked, or up
// to the end of the connection). keep is whether the connection may carry
// the next request.
func readAnswer(br *bufio.Reader, dst []byte) (a wireAnswer, keep bool, err error) {
	for {
		line, err := readLine(br)
		if err != nil {
			return a, false, err
		}
		var minor byte
		a.status, minor, err = parseStatusLine(line)
		if err != nil {
			return a, false, err
		}
		keep = minor == '1'
		h, err := readHeaders(br, &a)
		if err != nil {
			return a, false, err
		}
		if h.close {
			keep = false
		}
		if a.status >= 100 && a.status < 200 && a.status != http.StatusSwitchingProtocols {
			a = wireAnswer{} // an interim answer (100 Continue, 103): the real one follows
			continue
		}
		switch {
		case a.status == http.StatusNoContent || a.status == http.StatusNotModified:
			a.body = dst[:0]
		case h.chunked:
			a.body, err = readChunked(br, dst[:0])
		case h.length >= 0:
			if h.length > maxSmallBody {
				return a, false, errBodyTooLarge
			}
			a.body, err = readN(br, dst[:0], int(h.length))
		default:
			keep = false
			a.body, err = readInto(dst[:0], br, maxSmallBody)
		}
		return a, keep && err == nil, err
	}
}

// readLine returns the next line without its CRLF; it is valid until the
// next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: header line longer than %d bytes", errWireProtocol, wireMaxHeaderLine)
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseStatusLine parses "HTTP/1.x NNN reason".
func parseStatusLine(line []byte) (status int, minor byte, err error) {
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return 0, 0, fmt.Errorf("%w: status line %q", errWireProtocol, bound(string(line), 64))
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0, 0, fmt.Errorf("%w: status line %q", errWireProtocol, bound(string(line), 64))
		}
		status = status*10 + int(c-'0')
	}
	return status, line[7], nil
}

// wireHeaders are the framing headers of an answer.
type wireHeaders struct {
	length  int64 // Content-Length, -1 when absent
	chunked bool
	close   bool // Connection: close
}

// readHeaders reads the header block up to its empty line, keeping the
// framing headers and, in a, X-Service-Served-By and Retry-After.
func readHeaders(br *bufio.Reader, a *wireAnswer) (wireHeaders, error) {
	h := wireHeaders{length: -1}
	for {
		line, err := readLine(br)
		if err != nil {
			return h, err
		}
		if len(line) == 0 {
			return h, nil
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 {
			return h, fmt.Errorf("%w: header line %q", errWireProtocol, bound(string(line), 64))
		}
		name, v := line[:i], bytes.TrimSpace(line[i+1:])
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n < 0 || (h.length >= 0 && n != h.length) {
				return h, fmt.Errorf("%w: Content-Length %q", errWireProtocol, bound(string(v), 32))
			}
			h.length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			if !bytes.EqualFold(v, []byte("chunked")) && !bytes.EqualFold(v, []byte("identity")) {
				return h, fmt.Errorf("%w: Transfer-Encoding %q", errWireProtocol, bound(string(v), 32))
			}
			h.chunked = bytes.EqualFold(v, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			if bytes.Contains(bytes.ToLower(v), []byte("close")) {
				h.close = true
			}
		case bytes.EqualFold(name, []byte(headerServed)):
			if a.servedBy == "" {
				a.servedBy = servedByValue(v)
			}
		case bytes.EqualFold(name, []byte("Retry-After")):
			if a.retryAfter == "" {
				a.retryAfter = string(v)
			}
		}
	}
}

// readN appends exactly n bytes of br to dst.
func readN(br *bufio.Reader, dst []byte, n int) ([]byte, error) {
	if cap(dst)-len(dst) < n {
		dst = append(make([]byte, 0, len(dst)+n), dst...)
	}
	start := len(dst)
	dst = dst[:start+n]
	for got := 0; got < n; {
		m, err := br.Read(dst[start+got:])
		got += m
		if err != nil && got < n {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return dst[:start+got], err
		}
	}
	return dst, nil
}

// readChunked appends a chunked body to dst, up to maxSmallBody bytes; the
// trailers are read and dropped.
func readChunked(br *bufio.Reader, dst []byte) ([]byte, error) {
	for {
		line, err := readLine(br)
		if err != nil {
			return dst, err
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 31)
		if err != nil {
			return dst, fmt.Errorf("%w: chunk size %q", errWireProtocol, bound(string(line), 32))
		}
		if n == 0 {
			for { // trailers, up to the empty line
				t, err := readLine(br)
				if err != nil || len(t) == 0 {
					return dst, err
				}
			}
		}
		if len(dst)+int(n) > maxSmallBody {
			return dst, errBodyTooLarge
		}
		if dst, err = readN(br, dst, int(n)); err != nil {
			return dst, err
		}
		if line, err = readLine(br); err != nil || len(line) != 0 {
			if err == nil {
				err = fmt.Errorf("%w: no CRLF after a chunk", errWireProtocol)
			}
			return dst, err
		}
	}
}

// servedByValue maps the value of an x-service-served-by header (servedBy
// reads it from net/http's answers, the lean path from its own).
func servedByValue[T string | []byte](v T) ServedBy {
	switch string(v) {
	case "":
		return ServedLive
	case "standby":
		return ServedStandby
	case "live-bypass":
		return ServedLiveBypass
	}
	return ServedBy(bound(string(v), 64))
}
