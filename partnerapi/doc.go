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
//   - The client signature and tokens never appear in logs, errors or
//     traces: Credentials redact themselves in every format, and text that
//     the server echoes is scrubbed of both.
//   - Close stops background renewals and waits for them.
package partnerapi
