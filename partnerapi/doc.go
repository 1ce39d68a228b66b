// Package partnerapi is the client of the music catalog's partner API
// (shared/partner-api-spec.md): sessions, catalog discovery, mixes and play
// reports. Its sub-package sandbox is a faithful emulator of the same API.
//
// What the Client promises:
//
//   - It is safe for concurrent use. All callers share one session token
//     (read lock-free) and one keep-alive connection pool (its own
//     *http.Transport keeps MaxConns idle connections per host).
//   - Sessions are taken lazily and renewed single flight: however many
//     goroutines find the token missing, expired or rejected (401) at once,
//     one session call is made. A token is renewed in the background
//     RenewBefore its expiry (8 h live, ~15 min when standby minted it, or
//     the JWT's exp when sooner) while callers keep using it.
//   - The token travels as the raw JWT in Authorization (never "Bearer "),
//     with a product User-Agent and no client-id header.
//   - Every answer says how it was served (Meta: live, standby,
//     live-bypass); every failure is an *Error whose Kind says what to do.
//   - GETs retry transient failures (500, 503, timeout, connection) with
//     exponential backoff and full jitter, bounded by MaxAttempts and the
//     context, honouring Retry-After; they take a new session once on 401.
//   - Play reports (ReportPlay, ReportPlayJSON) are exactly one POST: the
//     caller owns retries. Their bodies follow the spec's table byte for
//     byte (schemas.AppendReportJSON: the PlayReport wire type and its
//     encoder live in schemas, below this client), without reflection or logging per request.
//   - With the client's own transport (no Config.HTTPClient), no proxy for
//     the API, on Linux, play reports take a lean HTTP/1.1 path
//     (report_wire.go) instead of net/http: synchronous in the caller's
//     goroutine on the client's own keep-alive connections (at most
//     MaxConns), one write per request, the answer parsed in place; no
//     transport goroutines or channel hand-offs. It keeps everything the
//     net/http path promises: the same classifier (statusError: Kind,
//     Retry-After, x-service-served-by; 401 drops the token), the body sent
//     byte for byte, RequestTimeout and ctx cancellation (a cancelled post
//     returns at once with an error wrapping ctx.Err()), the trace context
//     of a sampled ctx, TLS (HTTP/1.1 by ALPN) for https base URLs, and an
//     idle connection the server closed is never posted on (a
//     non-blocking peek before reuse). Chosen by measurement against
//     net/http and fasthttp's HostClient (README, Performance): per report
//     it costs about half the CPU of net/http and less than fasthttp, which
//     has no context cancellation. Sessions and GETs stay on net/http.
//   - The client signature and tokens never appear in logs, errors or
//     traces: Credentials redact themselves in every format, and text that
//     the server echoes is scrubbed of both.
//   - Close stops background renewals and waits for them.
package partnerapi
