package partnerapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/playpipe/playpipe/internal/backoff"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http2"
)

const instrumentationName = "github.com/playpipe/playpipe/partnerapi"

// Paths of the nine endpoints (spec: Endpoints).
const (
	PathSession           = "/partners/session"
	PathSessionWithUser   = "/partners/session/with-user"
	PathCatalog           = "/partners/catalog"
	PathRestrictedCatalog = "/partners/catalog/restricted"
	PathPage              = "/partners/page/"
	PathList              = "/partners/list/"
	PathGenres            = "/partners/genres/"
	PathMix               = "/partners/mix/"
	PathRoyaltyTracking   = "/partners/royalty-tracking"
)

// Response body bounds: answers larger than these are not read (an error).
const (
	maxGetBody    = 8 << 20  // catalog, page, list, genre row, mix
	maxSmallBody  = 64 << 10 // session, play report, error envelopes
	maxReasonLen  = 512
	headerServed  = "X-Service-Served-By"
	headerCountry = "Edge-Ipcountry" // canonical form of EDGE-IPCountry
)

// ErrClosed is returned by calls made after Close.
var ErrClosed = errors.New("partnerapi: client closed")

// errBodyTooLarge is wrapped in the *Error of an answer larger than its bound.
var errBodyTooLarge = errors.New("response body exceeds its size bound")

var (
	jsonHeader = []string{"application/json"}
)

// Client is a client of the partner API. It is safe for concurrent use by any
// number of goroutines, which share one session token and one keep-alive
// connection pool. Close releases it.
type Client struct {
	cfg       Config
	base      string
	hc        *http.Client
	transport *http.Transport // own transport, nil when Config.HTTPClient was given
	uaHeader  []string
	log       *slog.Logger
	reportURL string
	reportReq *http.Request // template of the play report POST

	main *slot // POST /partners/session: every endpoint
	user *slot // POST /partners/session/with-user: the restricted catalog, when Email is set

	closed atomic.Bool
	root   context.Context // cancelled by Close: background session renewals
	cancel context.CancelFunc
	wg     sync.WaitGroup

	lastMessage atomic.Pointer[string] // interned success word of play reports
	lastOK      atomic.Pointer[string] // the last play report answer found to be the API's success body

	tracer trace.Tracer
	// policy is the wait before attempt n+1 after n failed attempts: full
	// jitter over the exponential step, or Retry-After when longer.
	policy   backoff.Policy
	sessions metric.Int64Counter
	// foreign counts answers that are not the API's own (foreignAnswer);
	// foreignN those since the last warning, foreignLogAt its time (ns).
	foreign      metric.Int64Counter
	foreignN     atomic.Int64
	foreignLogAt atomic.Int64
	// h2Errors counts the HTTP/2 errors the own transport reports
	// (countH2Error), by type; h2Unsafe those after which a re-send by the
	// transport could put a second copy at the partner (getBody).
	h2Errors metric.Int64Counter
	h2Unsafe atomic.Uint64
}

// New validates cfg once (errors name the field and flag) and returns a
// Client. It makes no request: the first call takes a session.
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:      cfg,
		base:     strings.TrimRight(cfg.BaseURL, "/"),
		uaHeader: []string{cfg.UserAgent},
		log:      cfg.Logger,
		tracer:   cfg.TracerProvider.Tracer(instrumentationName),
		policy:   backoff.Policy{Initial: cfg.BaseBackoff, Max: cfg.MaxBackoff, Jitter: backoff.Full},
	}
	c.reportURL = c.base + PathRoyaltyTracking
	if cfg.HTTPClient != nil {
		c.hc = cfg.HTTPClient
	} else {
		if c.transport, err = newTransport(cfg, c.countH2Error); err != nil {
			return nil, err
		}
		c.hc = &http.Client{Transport: c.transport}
	}
	req, err := http.NewRequest(http.MethodPost, c.reportURL, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: Config.BaseURL (--api-url): %w", ErrInvalidConfig, err)
	}
	req.Header = nil
	c.reportReq = req
	c.root, c.cancel = context.WithCancel(context.Background())
	c.main = &slot{c: c, path: PathSession, op: call{name: "POST " + PathSession, ep: EndpointSession}}
	c.user = &slot{c: c, path: PathSessionWithUser, op: call{name: "POST " + PathSessionWithUser, ep: EndpointSessionWithUser}, withUser: true}
	c.sessions, _ = cfg.MeterProvider.Meter(instrumentationName).Int64Counter("playpipe.partnerapi.sessions",
		metric.WithDescription("Partner API sessions created, by served_by and outcome"))
	c.foreign, _ = cfg.MeterProvider.Meter(instrumentationName).Int64Counter("playpipe.partnerapi.foreign_answers",
		metric.WithDescription("Answers that were not the API's own (an edge's or proxy's error page, a malformed 2xx), by status: retried, never a final rejection"))
	c.h2Errors, _ = cfg.MeterProvider.Meter(instrumentationName).Int64Counter("playpipe.partnerapi.http2_errors",
		metric.WithDescription("HTTP/2 errors of the partner API's connections (net/http's CountError types: recv_goaway_*, recv_rststream_*, read frame errors), by type"))
	if looksLikeLibraryAgent(cfg.UserAgent) {
		c.log.Warn("partner API User-Agent looks like a library default; the API's edge blocks those with 403/1010",
			"user_agent", cfg.UserAgent)
	}
	return c, nil
}

// maxResponseHeaderBytes bounds an answer's header: generous for an edge
// that adds large CSP, Set-Cookie or trace headers (a 9 000-byte line is
// tested), small enough that a runaway header cannot exhaust memory.
const maxResponseHeaderBytes = 256 << 10

// newTransport is the client's own transport, suited to an API behind an
// edge (docs/partnerapi.md, "Connections"):
//   - HTTP/2 over TLS where the edge offers it (x/net/http2, below), so
//     in-flight posts share few connections;
//     HTTP/1.1 otherwise, with as many idle connections kept per host as
//     are allowed (MaxConns), so concurrent callers never dial again after
//     warm-up;
//   - TLS sessions resume (a client session cache), so a reconnect after
//     the edge closed a connection skips the full handshake;
//   - idle connections close after IdleConnTimeout (30 s), before the
//     usual keep-alive timeouts of edges and load balancers (60–75 s), so a
//     post rarely meets a connection the edge is closing;
//   - answers: headers bounded (maxResponseHeaderBytes), bodies bounded by
//     the callers, gzip accepted and decoded by net/http;
//   - HTTP/2 errors go to countError (x/net's Transport.CountError), which
//     tells a play report's getBody whether the transport's re-send is safe.
func newTransport(cfg Config, countError func(errType string)) (*http.Transport, error) {
	t1 := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		TLSClientConfig: &tls.Config{
			RootCAs:            cfg.RootCAs,
			MinVersion:         tls.VersionTLS12,
			ClientSessionCache: tls.NewLRUClientSessionCache(max(64, cfg.MaxConns)),
		},
		MaxIdleConns:           cfg.MaxConns,
		MaxIdleConnsPerHost:    cfg.MaxConns,
		MaxConnsPerHost:        cfg.MaxConns,
		IdleConnTimeout:        cfg.IdleConnTimeout,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		ResponseHeaderTimeout:  cfg.RequestTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	// HTTP/2 through golang.org/x/net/http2 rather than the copy bundled in
	// net/http: Go 1.26's bundled client never calls HTTP2Config.CountError
	// (its streams read a field that config does not set), and getBody
	// needs the count. x/net's transport takes its settings from t1 (header
	// bound, response header timeout, idle timeout, compression) and, unlike
	// the bundled copy, does not re-send after a PROTOCOL_ERROR reset.
	//lint:ignore SA1019 ConfigureTransports is deprecated for http.Transport.Protocols, which has no client-side CountError before Go 1.27; x/net forwards CountError to net/http from 1.27 on.
	t2, err := http2.ConfigureTransports(t1)
	if err != nil {
		return nil, fmt.Errorf("partnerapi: HTTP/2 transport: %w", err)
	}
	//lint:ignore SA1019 see above: the only client-side CountError on Go 1.26.
	t2.CountError = countError
	return t1, nil
}

// The CountError types of a stream reset by the server: RST_STREAM with
// any code is h2ResetPrefix and the code; REFUSED_STREAM (h2RefusedStream)
// says the stream was not processed (RFC 9113 §8.7).
const (
	h2ResetPrefix   = "recv_rststream_"
	h2RefusedStream = h2ResetPrefix + "REFUSED_STREAM"
)

// countH2Error is the own transport's HTTP/2 CountError: the transport
// calls it on the connection's read loop before it fails the streams the
// error concerns, so a getBody that runs for one of them sees it counted.
// Unsafe (h2Unsafe) is a stream reset by the server with any code but
// REFUSED_STREAM: the only errors after which a transport re-sends a
// stream the server may have processed (net/http's bundled copy after a
// PROTOCOL_ERROR reset, golang/go#47635). A GOAWAY beyond the stream (a
// graceful one, as nginx sends after keepalive_requests, is not even an
// error) and the connection's end after it fail streams the server did not
// process, and are not unsafe.
func (c *Client) countH2Error(errType string) {
	c.h2Errors.Add(context.Background(), 1, metric.WithAttributes(attribute.String("type", errType)))
	if strings.HasPrefix(errType, h2ResetPrefix) && errType != h2RefusedStream {
		c.h2Unsafe.Add(1)
	}
}

func looksLikeLibraryAgent(ua string) bool {
	l := strings.ToLower(ua)
	for _, p := range []string{"go-http-client", "curl/", "wget/", "python-requests", "python-urllib", "aiohttp", "axios", "node-fetch", "okhttp", "java/", "libwww-perl", "httpie"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return strings.TrimSpace(l) == ""
}

// Close stops background session renewals, waits for them, and closes the
// idle connections of the client's own transport. Calls after Close return
// ErrClosed. Close may be called more than once.
func (c *Client) Close() {
	if c.closed.Swap(true) {
		return
	}
	c.cancel()
	c.wg.Wait()
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
}

// servedBy reads the x-service-served-by header.
func servedBy(h http.Header) ServedBy {
	v := h[headerServed]
	if len(v) == 0 {
		return ServedLive
	}
	return servedByValue(v[0])
}

// servedByValue maps the x-service-served-by value to a ServedBy: the
// spec's values, or the value itself (bounded) when unknown.
func servedByValue(v string) ServedBy {
	switch v {
	case "":
		return ServedLive
	case "standby":
		return ServedStandby
	case "live-bypass":
		return ServedLiveBypass
	}
	return ServedBy(bound(printable(v), 64))
}

// call is one call of the API: its name for people (Error.Op, span names)
// and its endpoint, which decisions read (Error.Endpoint).
type call struct {
	name string
	ep   Endpoint
}

// send makes one attempt of one request and reads the answer with a size
// bound. A non-2xx answer is returned as an *Error (with meta filled).
func (c *Client) send(ctx context.Context, op call, method, url string, auth []string, body []byte, country string, limit int64) (Meta, []byte, error) {
	if c.closed.Load() {
		return Meta{}, nil, ErrClosed
	}
	if c.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Meta{}, nil, &Error{Kind: KindRejected, Endpoint: op.ep, Op: op.name, Reason: "cannot build request", Err: err}
	}
	req.Header["User-Agent"] = c.uaHeader
	req.Header["Accept"] = jsonHeader
	if auth != nil {
		req.Header["Authorization"] = auth
	}
	if body != nil {
		req.Header["Content-Type"] = jsonHeader
	}
	if country != "" {
		req.Header[headerCountry] = []string{country}
	}
	c.injectTrace(ctx, req.Header)
	resp, err := c.hc.Do(req)
	if err != nil {
		return Meta{}, nil, &Error{Kind: KindTransient, Endpoint: op.ep, Op: op.name, Err: err}
	}
	meta := Meta{Status: resp.StatusCode, ServedBy: servedBy(resp.Header)}
	data, err := readBounded(resp.Body, limit)
	resp.Body.Close()
	if err != nil {
		return meta, nil, &Error{Kind: KindTransient, Endpoint: op.ep, Op: op.name, Status: meta.Status, ServedBy: meta.ServedBy, Reason: "reading the answer", Err: err}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return meta, data, nil
	}
	return meta, nil, c.statusError(op, meta, resp.Header, data, auth)
}

// readBounded reads r to EOF, failing when it holds more than limit bytes.
func readBounded(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, errBodyTooLarge
	}
	return data, nil
}

// statusError is the one place that maps an HTTP answer to a Kind; the
// reason for each case is written next to it. auth is the Authorization
// header the request carried (nil: none): the answer may echo it, held or
// not (a 401's token is dropped, another caller may have dropped it first).
func (c *Client) statusError(op call, meta Meta, h http.Header, body []byte, auth []string) *Error {
	e := &Error{Endpoint: op.ep, Op: op.name, Status: meta.Status, ServedBy: meta.ServedBy}
	s := meta.Status
	api := isAPIEnvelope(s, body)
	switch {
	case s == http.StatusUnauthorized:
		// Token missing, malformed, expired or standby-minted (or, on the
		// session endpoints, credentials missing from the body).
		e.Kind = KindUnauthorized
	case s == http.StatusForbidden:
		// The edge blocked our User-Agent (error 1010): configuration error.
		e.Kind = KindEdgeBlocked
	case s == http.StatusNotFound && (api || op.ep == EndpointReport):
		// Mix not found; on the report endpoint, a base URL that is not the
		// partner API (the reporter stops: a configuration error).
		e.Kind = KindNotFound
	case !api && (s < 200 || s >= 300):
		// Not the API's envelope: an edge's or proxy's page (its own 400,
		// 413, 502 …), a redirect. The API may never have seen the request,
		// so this is never a final rejection: retry with backoff, and say so.
		e.Kind, e.Foreign = KindTransient, true
		c.foreignAnswer(op, s, h, body, auth)
	case s == http.StatusRequestTimeout, s == http.StatusTooManyRequests, s >= 500:
		// 500 internal error, 503 standby upstream error, and the
		// overload statuses, in the API's envelope: retry with backoff.
		e.Kind = KindTransient
	case s >= 400:
		// 400 (or another client error) in the API's own envelope: missing
		// or invalid parameter, no content. Will not pass on a retry.
		e.Kind = KindRejected
	default:
		// 1xx/3xx that net/http did not resolve: not an answer we can use;
		// an intermediary may be misbehaving, so retrying is reasonable.
		e.Kind = KindTransient
	}
	e.Reason = errorReason(s, body, func(r string) string { return c.scrub(r, auth) })
	if e.Kind == KindRejected {
		e.Fields = parseFields(e.Reason)
	}
	if ra := h.Get("Retry-After"); ra != "" {
		e.RetryAfter = parseRetryAfter(ra, time.Now())
	}
	return e
}

// scrub removes the signature, the request's own token (auth, the
// Authorization header it carried; nil: none) and any held token from text
// that came from the server (an answer could echo a request), so that no
// secret reaches an error message. The request's token is scrubbed whether
// or not it is still held: a 401's token is dropped, and another caller's
// 401 may drop it while this answer is read.
func (c *Client) scrub(s string, auth []string) string {
	if s == "" {
		return s
	}
	if sig := c.cfg.Credentials.ClientSignature; len(sig) >= 4 && strings.Contains(s, sig) {
		s = strings.ReplaceAll(s, sig, redacted)
	}
	if len(auth) > 0 && auth[0] != "" && strings.Contains(s, auth[0]) {
		s = strings.ReplaceAll(s, auth[0], redacted)
	}
	for _, sl := range [...]*slot{c.main, c.user} {
		if t := sl.cur.Load(); t != nil && strings.Contains(s, t.hdr[0]) {
			s = strings.ReplaceAll(s, t.hdr[0], redacted)
		}
	}
	return s
}

// retryable reports whether e may be retried after waiting d: a transient
// error whose Retry-After is within MaxBackoff (a longer one is handed back
// to the caller rather than blocking it), and a wait that ends before ctx does.
func (c *Client) retryable(ctx context.Context, e *Error, d time.Duration) bool {
	if e.Kind != KindTransient || e.RetryAfter > c.cfg.MaxBackoff {
		return false
	}
	if ctx.Err() != nil {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return false
	}
	return true
}

// get runs a GET with the session of s: transient errors retried with
// backoff up to MaxAttempts, one new session and retry on 401.
func (c *Client) get(ctx context.Context, ep Endpoint, path string, s *slot, country string, decode func([]byte) error) (Meta, error) {
	op := call{name: "GET " + path, ep: ep}
	ctx, span := c.tracer.Start(ctx, op.name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", "GET"), attribute.String("url.path", path)))
	defer span.End()
	meta, err := c.getLoop(ctx, op, c.base+path, s, country, decode)
	span.SetAttributes(attribute.Int("http.response.status_code", meta.Status))
	if meta.ServedBy != ServedLive {
		span.SetAttributes(attribute.String("partnerapi.served_by", string(meta.ServedBy)))
	}
	if err != nil {
		span.SetAttributes(attribute.String("partnerapi.error_kind", KindOf(err).String()))
		span.SetStatus(codes.Error, err.Error())
	}
	return meta, err
}

func (c *Client) getLoop(ctx context.Context, op call, url string, s *slot, country string, decode func([]byte) error) (Meta, error) {
	reauthed := false
	for attempt := 1; ; {
		tok, err := s.token(ctx)
		if err != nil {
			return Meta{}, err
		}
		meta, body, err := c.send(ctx, op, http.MethodGet, url, tok.hdr, nil, country, maxGetBody)
		if err == nil {
			derr := decode(body)
			if derr == nil {
				return meta, nil
			}
			// A 200 whose body does not decode: truncated or garbled by an
			// intermediary, or a shape this client does not know. Retried as
			// transient (bounded by MaxAttempts).
			err = &Error{Kind: KindTransient, Endpoint: op.ep, Op: op.name, Status: meta.Status, ServedBy: meta.ServedBy, Reason: "malformed response body", Err: derr}
		}
		var e *Error
		if !errors.As(err, &e) {
			return meta, err
		}
		if e.Kind == KindUnauthorized {
			s.drop(tok)
			if !reauthed {
				reauthed = true
				continue
			}
			return meta, err
		}
		if attempt >= c.cfg.MaxAttempts {
			return meta, err
		}
		d := c.policy.Delay(attempt, e.RetryAfter)
		if !c.retryable(ctx, e, d) || !backoff.Sleep(ctx, d) {
			return meta, err
		}
		attempt++
	}
}

func bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
