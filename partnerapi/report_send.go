package partnerapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/schemas"
)

// injectTrace puts the W3C trace context of ctx (traceparent, tracestate)
// into h when ctx carries a sampled span, so the partner API (and the
// sandbox's ledger) can join the trace. Nothing is added otherwise.
func (c *Client) injectTrace(ctx context.Context, h http.Header) {
	if trace.SpanContextFromContext(ctx).IsSampled() {
		c.cfg.Propagator.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// opReport is the play report post.
var opReport = call{name: "POST " + PathRoyaltyTracking, ep: EndpointReport}

// ReportPlay encodes r exactly as the spec's Play report table says (see
// schemas.AppendReportJSON) and posts it once: see ReportPlayJSON.
func (c *Client) ReportPlay(ctx context.Context, r schemas.PlayReport) (ReportResult, error) {
	return c.ReportPlayJSON(ctx, schemas.AppendReportJSON(make([]byte, 0, 320), &r))
}

// ReportPlayJSON posts a pre-encoded play report body as is, in exactly one
// POST /partners/royalty-tracking through net/http (HTTP/2 over TLS where
// the server offers it, HTTP/1.1 otherwise), after taking a session if none
// is held: the caller owns retries and sees every attempt — the transport
// sends the report again only where the server says it did not process it
// (getBody).
// The attempt is bounded by RequestTimeout (from the request to the last
// byte of the answer) and ctx.
//
//   - 200 with the API's body ({"error":false,…}): a ReportResult;
//     Meta.ServedBy == ServedStandby means standby took the report without
//     validating or forwarding it (not an error).
//   - 401: the held token is dropped (the next call renews it, single
//     flight) after the answer is scrubbed of it, and an *Error of
//     KindUnauthorized is returned.
//   - anything else: an *Error of the matching Kind (a 4xx in the API's
//     envelope KindRejected with the message and Fields; 403
//     KindEdgeBlocked; 500/503/timeout/connection and every answer that is
//     not the API's own KindTransient with RetryAfter). Error.Doubt says
//     when the report may have reached the partner all the same: the
//     request may have left (net/http's httptrace saw its headers written)
//     and no complete, well-formed answer of the API came back.
//
// body must not be modified until the call returns.
func (c *Client) ReportPlayJSON(ctx context.Context, body []byte) (ReportResult, error) {
	if c.closed.Load() {
		return ReportResult{}, ErrClosed
	}
	tok, err := c.main.token(ctx)
	if err != nil {
		return ReportResult{}, err
	}
	// The HTTP client span exists only when the caller's trace is sampled:
	// with tracing off the hot path stays free of span work.
	var span trace.Span
	if trace.SpanContextFromContext(ctx).IsSampled() {
		ctx, span = c.tracer.Start(ctx, opReport.name, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("http.request.method", http.MethodPost),
				attribute.String("url.path", PathRoyaltyTracking), attribute.String("url.full", c.reportURL)))
		defer span.End()
	}
	start := time.Now()
	bp := readPool.Get().(*[]byte)
	defer readPool.Put(bp)
	a := c.postReport(ctx, tok, body, (*bp)[:0])
	if cap(a.body) <= 64<<10 {
		*bp = a.body[:0]
	}
	res, err := c.reportOutcome(tok, a)
	if span != nil {
		reportSpanEnd(span, Meta{Status: a.status, ServedBy: res.Meta.ServedBy}, err)
	}
	if err != nil {
		return ReportResult{}, err
	}
	res.Latency = time.Since(start)
	return res, nil
}

// reportAnswer is what one play report POST came back with.
type reportAnswer struct {
	status  int // 0: no answer
	header  http.Header
	body    []byte
	sent    bool // the request's headers were written: it may have left
	replied bool // the first byte of an answer arrived
	// resendRefused: the transport would have posted the report again
	// after the whole request was written (getBody refused).
	resendRefused bool
	err           error // transport or body-read error
	ctxErr        error // the caller's ctx error, when it ended
	timeout       bool  // the attempt's own RequestTimeout ran out
}

// postTrace records whether a request may have left the process: net/http
// calls WroteHeaders once the request's headers are written to the
// connection (HTTP/1.1: into its buffer, flushed with the body; HTTP/2:
// the HEADERS frame). Before that the server cannot have seen a request.
// wrote: WroteRequest came without an error — the whole request (headers
// and body: HTTP/1.1 flushed to the connection, HTTP/2 with END_STREAM)
// was written at least once. refused: the transport asked to post it
// again after that, and was refused (getBody).
//
// unsafe is the client's count of HTTP/2 errors after which a re-send may
// be a second copy (Client.h2Unsafe), nil when the transport is the
// caller's (Config.HTTPClient) and its errors cannot be seen; unsafe0 its
// value when the post began.
type postTrace struct {
	sent, replied, wrote, refused atomic.Bool
	unsafe                        *atomic.Uint64
	unsafe0                       uint64
	ct                            httptrace.ClientTrace
}

// errResendRefused is what getBody answers the transport that would post a
// report again after the whole request was written.
var errResendRefused = errors.New("the connection or stream failed after the whole report was written: not re-sent by the transport (the partner may have taken it)")

// getBody is the post's Request.GetBody: net/http rewinds a body with it
// to send the request again on another try of its own, and the caller
// would see only the last try's answer. It allows every re-send that
// cannot reach the partner twice, and refuses the rest:
//   - while no try has written the whole request (pt.wrote): HTTP/1.1
//     re-sends a POST (no Idempotency-Key: not replayable) only when
//     nothing was written to a reused keep-alive connection the server had
//     closed (nothingWrittenError) or no connection was taken; HTTP/2 after
//     a connection found unusable before the stream started. Kept, so a
//     stale connection costs no failed post.
//   - after the whole request was written, HTTP/2 re-sends on a stream the
//     server says it did not process — beyond a GOAWAY's last stream
//     (RFC 9113 §6.8: nginx's keepalive_requests, an edge's graceful
//     reload) or reset REFUSED_STREAM (§8.7) — and after a PROTOCOL_ERROR
//     reset from the peer (http2canRetryError, golang/go#47635), which can
//     come after the server read the whole report. The first two are
//     allowed; the third would put a second copy at the partner behind the
//     caller's back. Which one it is, net/http does not tell GetBody, but
//     it counts the error (countH2Error) before it fails the stream: a
//     re-send is refused when any unsafe HTTP/2 error was counted since the
//     post began (on this stream or, conservatively, another), and always
//     when the transport is the caller's (unsafe is nil). Refused, the post
//     fails in doubt (pt.refused) for the caller to retry, labelled.
func (pt *postTrace) getBody(body []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		if pt.wrote.Load() && (pt.unsafe == nil || pt.unsafe.Load() != pt.unsafe0) {
			pt.refused.Store(true)
			return nil, errResendRefused
		}
		return io.NopCloser(bytes.NewReader(body)), nil
	}
}

// postReport sends one report through net/http and reads the answer into
// dst, bounded by maxSmallBody (after gzip decoding, which net/http does
// transparently). It never returns an error of its own: everything is in
// the reportAnswer, for reportOutcome to classify.
func (c *Client) postReport(parent context.Context, tok *token, body, dst []byte) reportAnswer {
	pt := &postTrace{}
	if c.transport != nil {
		pt.unsafe = &c.h2Unsafe
		pt.unsafe0 = c.h2Unsafe.Load()
	}
	pt.ct.WroteHeaders = func() { pt.sent.Store(true) }
	pt.ct.GotFirstResponseByte = func() { pt.replied.Store(true) }
	pt.ct.WroteRequest = func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			pt.wrote.Store(true)
		}
	}
	ctx := httptrace.WithClientTrace(parent, &pt.ct)
	var cancel context.CancelFunc
	if c.cfg.RequestTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	req := c.reportReq.WithContext(ctx)
	req.Header = http.Header{"User-Agent": c.uaHeader, "Authorization": tok.hdr, "Content-Type": jsonHeader, "Accept": jsonHeader}
	c.injectTrace(parent, req.Header)
	// io.NopCloser(*bytes.Reader) is a body net/http knows to be in memory:
	// headers and body leave in one write. GetBody lets the transport send
	// it again only where the partner cannot get it twice (getBody):
	// net/http's HTTP/2 transport would re-send it after a PROTOCOL_ERROR
	// reset that came after the server read it all, and the caller would
	// see only the second copy's answer.
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = pt.getBody(body)

	var resp *http.Response
	var err error
	if c.transport != nil {
		// The own transport straight: no redirect machinery (a 3xx is not an
		// answer of the API, and following it would post the report again).
		resp, err = c.transport.RoundTrip(req)
	} else {
		resp, err = c.hc.Do(req)
	}
	a := reportAnswer{}
	if err == nil {
		a.status, a.header = resp.StatusCode, resp.Header
		if resp.StatusCode >= 200 {
			a.body, err = readInto(dst, resp.Body, maxSmallBody)
		}
		// A 101 (the only 1xx net/http returns) hands over the raw
		// connection, which no deadline bounds: never read, never the API's.
		resp.Body.Close()
	}
	a.sent, a.replied, a.resendRefused, a.err = pt.sent.Load(), pt.replied.Load(), pt.refused.Load(), err
	if err != nil {
		a.ctxErr = parent.Err()
		a.timeout = a.ctxErr == nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
	}
	return a
}

// reportOutcome classifies one answer of a play report POST: the one place
// that says what it means, with the reason next to each case.
func (c *Client) reportOutcome(tok *token, a reportAnswer) (ReportResult, error) {
	meta := Meta{Status: a.status, ServedBy: ServedLive}
	if a.header != nil {
		meta.ServedBy = servedBy(a.header)
	}
	if a.err != nil {
		e := &Error{Kind: KindTransient, Endpoint: opReport.ep, Op: opReport.name, Status: a.status, ServedBy: meta.ServedBy, Err: a.err}
		if a.status != 0 {
			e.Reason = "reading the answer"
		}
		switch {
		case a.ctxErr != nil:
			// The caller cancelled (shutdown, revocation) or its deadline
			// passed: the error wraps ctx's, so the caller can tell.
			if !errors.Is(a.err, a.ctxErr) {
				e.Err = fmt.Errorf("%w: %w", a.ctxErr, a.err)
			}
			if a.sent {
				e.Doubt = schemas.DoubtCancelled
				if errors.Is(a.ctxErr, context.DeadlineExceeded) {
					e.Doubt = schemas.DoubtTimeout
				}
			}
		case a.timeout:
			// RequestTimeout ran out: a timeout error for the caller.
			if !errors.Is(a.err, context.DeadlineExceeded) {
				e.Err = fmt.Errorf("%w: %w", context.DeadlineExceeded, a.err)
			}
			if a.sent {
				e.Doubt = schemas.DoubtTimeout
			}
		case a.resendRefused:
			// The connection or stream failed after the whole report was
			// written (an HTTP/2 reset from the peer): it may have been taken.
			e.Doubt = schemas.DoubtConnectionLost
		case a.sent:
			e.Doubt = transportDoubt(a.replied, a.err)
		}
		return ReportResult{Meta: meta}, e
	}
	var k answerClass
	if last := c.lastOK.Load(); a.status == http.StatusOK && last != nil && *last == string(a.body) {
		k.ok = true // the same body as the last success: no decoding on the hot path
	} else if k = classifyReportAnswer(a.status, a.body); k.ok && len(a.body) <= 256 {
		b := string(a.body)
		c.lastOK.Store(&b)
	}
	switch {
	case k.ok:
		return ReportResult{Meta: meta, Message: c.reportMessage(a.body)}, nil
	}
	// Scrubbed with the request's own token before a 401 drops it: an
	// edge's page may echo the Authorization header, and a dropped token
	// is no longer among the held ones that scrub looks for.
	e := c.statusError(opReport, meta, a.header, a.body, tok.hdr)
	if a.status == http.StatusUnauthorized {
		c.main.drop(tok)
	}
	if a.status < 300 {
		// A 2xx that is not the API's answer ({"error":false,…}) — cut,
		// garbled, or not the API's — or a 101: the report may have been
		// taken.
		if !e.Foreign {
			c.foreignAnswer(opReport, a.status, a.header, a.body, tok.hdr)
		}
		e.Kind, e.Reason, e.Doubt, e.Foreign = KindTransient, "malformed answer: "+e.Reason, schemas.DoubtMalformedAnswer, true
	} else if e.Foreign {
		e.Doubt = schemas.DoubtEdgeAnswer
	}
	return ReportResult{Meta: meta}, e
}

// answerClass is what the bytes of an answer are, whatever the transport.
type answerClass struct {
	ok       bool // a 200 with the API's success body
	envelope bool // a non-2xx in the API's own envelope
}

// classifyReportAnswer says whether a complete answer to a play report is
// the API's own: a 200 whose body is a JSON object with "error": false
// (spec: `{ error: false, message }`; standby answers the same), or a
// non-2xx in the API's envelope (isAPIEnvelope). FuzzClassifyAnswer holds
// it (and statusError) to never panic and to agree on Kind.
func classifyReportAnswer(status int, body []byte) answerClass {
	if status == http.StatusOK {
		return answerClass{ok: isReportOK(body)}
	}
	return answerClass{envelope: isAPIEnvelope(status, body)}
}

// reportSpanEnd sets the HTTP client span's attributes and status.
func reportSpanEnd(span trace.Span, meta Meta, err error) {
	if meta.Status == 0 {
		span.SetStatus(codes.Error, "no answer")
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", meta.Status))
	if meta.ServedBy != ServedLive {
		span.SetAttributes(attribute.String("partnerapi.served_by", string(meta.ServedBy)))
	}
	if meta.Status >= 400 {
		span.SetStatus(codes.Error, http.StatusText(meta.Status))
	} else if err != nil {
		span.SetStatus(codes.Error, "not the API's answer")
	}
}

var readPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// readInto appends r to dst until EOF, failing beyond limit bytes.
func readInto(dst []byte, r io.Reader, limit int) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			if len(dst) > limit {
				return dst, errBodyTooLarge
			}
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if len(dst) > limit {
			return dst, errBodyTooLarge
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}
