package partnerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/playpipe/playpipe/schemas"
)

// What is an answer of the API, and what is not. The partner API sits behind
// an edge (TLS, HTTP/2, keep-alive limits, large headers, its own error
// pages: docs/design.md, "The partner is behind an edge"). An answer is the
// API's own when its body is the API's JSON: `{"error":false,…}` on a 200,
// the error envelope `{"error":true,"message"|"reason":…}` otherwise (or the
// plain-text 401 of its authentication layer). Anything else came from
// something in between, which may or may not have passed the request on.

// isReportOK reports whether body is the API's answer to an accepted play
// report: a JSON object whose "error" is false.
func isReportOK(body []byte) bool {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return false
	}
	var b struct {
		Error *bool `json:"error"`
	}
	return json.Unmarshal(body, &b) == nil && b.Error != nil && !*b.Error
}

// isAPIEnvelope reports whether a non-2xx answer's body is the API's own: a
// JSON object with "error": true and a string "message" or "reason"
// (spec, Errors), or the plain-text "Unauthorized" of a 401.
func isAPIEnvelope(status int, body []byte) bool {
	body = bytes.TrimSpace(body)
	if status == http.StatusUnauthorized && bytes.EqualFold(body, []byte("Unauthorized")) {
		return true
	}
	if len(body) == 0 || body[0] != '{' {
		return false
	}
	var env struct {
		Error   *bool   `json:"error"`
		Message *string `json:"message"`
		Reason  *string `json:"reason"`
	}
	if json.Unmarshal(body, &env) != nil || env.Error == nil || !*env.Error {
		return false
	}
	return env.Message != nil || env.Reason != nil
}

// transportDoubt names the cause of doubt of a post whose request was
// written and whose answer failed in transport. replied says whether any
// byte of an answer arrived (httptrace's GotFirstResponseByte): without one
// the connection was lost (reset, closed, an HTTP/2 connection torn down);
// with one the answer was not complete and well-formed (a malformed status
// line or header, a header beyond the bound, a cut or oversized body, a
// protocol error on the stream). Decided by the trace and error types, never
// by error text.
func transportDoubt(replied bool, err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return schemas.DoubtTimeout
	case errors.Is(err, errBodyTooLarge):
		return schemas.DoubtMalformedAnswer
	case !replied:
		return schemas.DoubtConnectionLost
	}
	return schemas.DoubtMalformedAnswer
}

// foreignAnswer surfaces an answer that is not the API's own: the
// playpipe.partnerapi.foreign_answers metric (by status), and a warning
// with the status and the body's first bytes (scrubbed, printable), at most
// one per foreignLogEvery so that a storm of edge pages cannot flood the log.
func (c *Client) foreignAnswer(op call, status int, h http.Header, body []byte, auth []string) {
	c.foreign.Add(context.Background(), 1, metric.WithAttributes(
		attribute.Int("http.response.status_code", status), attribute.String("partnerapi.op", op.ep.String())))
	n := c.foreignN.Add(1)
	now := time.Now().UnixNano()
	last := c.foreignLogAt.Load()
	if now-last < int64(foreignLogEvery) || !c.foreignLogAt.CompareAndSwap(last, now) {
		return
	}
	c.foreignN.Add(-n)
	// Scrubbed whole, then cut: a secret the cut would split is found whole.
	first := bound(c.scrub(printable(string(body[:min(len(body), scrubSpan)])), auth), 120)
	var ct string
	if h != nil {
		ct = h.Get("Content-Type")
	}
	c.log.Warn("partner API: an answer that is not the API's own (an edge's or proxy's page?): retried, never taken as a rejection",
		"op", op.name, "status", status, "content_type", bound(printable(ct), 100), "first_bytes", first,
		"answers_since_last_log", n)
}

// foreignLogEvery is the least time between two foreign-answer warnings.
const foreignLogEvery = 10 * time.Second
