package partnerapi

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
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

const opReport = "POST " + PathRoyaltyTracking

// ReportPlay encodes r exactly as the spec's Play report table says (see
// schemas.AppendReportJSON) and posts it once: see ReportPlayJSON.
func (c *Client) ReportPlay(ctx context.Context, r schemas.PlayReport) (ReportResult, error) {
	return c.ReportPlayJSON(ctx, schemas.AppendReportJSON(make([]byte, 0, 320), &r))
}

// ReportPlayJSON posts a pre-encoded play report body as is, in exactly one
// POST /partners/royalty-tracking (after taking a session if none is held):
// the caller owns retries and sees every attempt.
//
//   - 200: a ReportResult; Meta.ServedBy == ServedStandby means standby took
//     the report without validating or forwarding it (not an error).
//   - 401: the held token is dropped (the next call renews it, single
//     flight) and an *Error of KindUnauthorized is returned.
//   - anything else: an *Error of the matching Kind (400 KindRejected with
//     the message and Fields; 403 KindEdgeBlocked; 500/503/timeout/connection
//     KindTransient with RetryAfter).
//
// With the client's own transport the POST takes the lean HTTP/1.1 path
// (report_wire.go); with a caller's HTTPClient, behind a proxy, or off
// Linux it goes through net/http. Both answers meet the same classifier.
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
		ctx, span = c.tracer.Start(ctx, opReport, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("http.request.method", http.MethodPost),
				attribute.String("url.path", PathRoyaltyTracking), attribute.String("url.full", c.reportURL)))
		defer span.End()
	}
	start := time.Now()
	bp := readPool.Get().(*[]byte)
	defer readPool.Put(bp)
	var a wireAnswer
	if c.wire != nil && tok.rawOK {
		var extra http.Header
		if span != nil {
			extra = http.Header{}
			c.injectTrace(ctx, extra)
		}
		a, err = c.wire.post(ctx, tok.hdr[0], extra, body, (*bp)[:0])
	} else {
		a, err = c.postReportHTTP(ctx, tok, body, (*bp)[:0])
	}
	if cap(a.body) <= 64<<10 {
		*bp = a.body[:0]
	}
	latency := time.Since(start)
	meta := Meta{Status: a.status, ServedBy: a.servedBy}
	if meta.ServedBy == "" {
		meta.ServedBy = ServedLive
	}
	if span != nil {
		reportSpanEnd(span, meta, err)
	}
	if err != nil {
		if a.status == 0 {
			return ReportResult{}, &Error{Kind: KindTransient, Op: opReport, Err: err}
		}
		return ReportResult{}, &Error{Kind: KindTransient, Op: opReport, Status: meta.Status, ServedBy: meta.ServedBy, Reason: "reading the answer", Err: err}
	}
	if a.status == http.StatusOK {
		return ReportResult{Meta: meta, Message: c.reportMessage(a.body), Latency: latency}, nil
	}
	if a.status == http.StatusUnauthorized {
		c.main.drop(tok)
	}
	var h http.Header
	if a.retryAfter != "" {
		h = http.Header{"Retry-After": {a.retryAfter}}
	}
	return ReportResult{}, c.statusError(opReport, meta, h, a.body)
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
		span.SetStatus(codes.Error, "reading the answer")
	}
}

// postReportHTTP posts one report through net/http and reads the answer
// into dst, as wireClient.post does.
func (c *Client) postReportHTTP(ctx context.Context, tok *token, body, dst []byte) (wireAnswer, error) {
	resp, err := c.postReport(ctx, tok, body)
	if err != nil {
		return wireAnswer{}, err
	}
	a := wireAnswer{status: resp.StatusCode, servedBy: servedBy(resp.Header), retryAfter: resp.Header.Get("Retry-After")}
	a.body, err = readInto(dst, resp.Body, maxSmallBody)
	resp.Body.Close()
	return a, err
}

// postReport sends one report. With the client's own transport it goes
// straight to Transport.RoundTrip from a pre-parsed request template: no
// redirect or header-copy machinery, no per-request timer (the attempt is
// bounded by the dial timeout, ResponseHeaderTimeout = RequestTimeout, the
// size bound of the answer, and ctx). With a caller's HTTPClient it goes
// through HTTPClient.Do with RequestTimeout on the context.
func (c *Client) postReport(ctx context.Context, tok *token, body []byte) (*http.Response, error) {
	if c.transport == nil {
		if c.cfg.RequestTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
			// The answer is read after we return: cancel when it is closed.
			resp, err := c.postReportDo(ctx, tok, body)
			if err != nil {
				cancel()
				return nil, err
			}
			resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
			return resp, nil
		}
		return c.postReportDo(ctx, tok, body)
	}
	req := c.reportReq.WithContext(ctx)
	req.Header = http.Header{"User-Agent": c.uaHeader, "Authorization": tok.hdr, "Content-Type": jsonHeader}
	c.injectTrace(ctx, req.Header)
	// io.NopCloser(*bytes.Reader) is a body net/http knows to be in memory:
	// headers and body then leave in one write (with any other wrapper the
	// transport flushes the headers first: a second syscall per report).
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return c.transport.RoundTrip(req)
}

func (c *Client) postReportDo(ctx context.Context, tok *token, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.reportURL, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header["User-Agent"] = c.uaHeader
	req.Header["Authorization"] = tok.hdr
	req.Header["Content-Type"] = jsonHeader
	c.injectTrace(ctx, req.Header)
	return c.hc.Do(req)
}

// cancelBody cancels the attempt's context when the answer is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
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
