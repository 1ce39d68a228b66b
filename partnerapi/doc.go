// Package partnerapi is the client of the music catalog's partner API
// (docs/partnerapi.md, "The partner API"): sessions, catalog discovery, mixes and play
// reports. Its sub-package sandbox is a faithful emulator of the same API.
//
// What the Client promises:
//
//   - It is safe for concurrent use. All callers share one session token
//     (read lock-free) and one connection pool (its own *http.Transport
//     keeps MaxConns idle connections per host).
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
//   - One HTTP stack: every call, play reports included, goes through
//     net/http — HTTP/2 over TLS where the server offers it (in-flight
//     posts share few connections), HTTP/1.1 otherwise — on the client's own
//     transport: TLS sessions resume, idle connections close after
//     IdleConnTimeout (30 s, before common edge keep-alive timeouts),
//     answer headers and bodies are bounded, gzip answers are decoded.
//   - Only the API's own answers count as answers (answer.go): a 200 with
//     {"error":false,…}, or the API's error envelope. A non-2xx that is not
//     the envelope (an edge's or proxy's page) is KindTransient and
//     Foreign, never a final rejection, and is surfaced (metric
//     playpipe.partnerapi.foreign_answers, a rate-limited warning).
//   - A failed play report post says whether the report may have reached
//     the partner all the same (Error.Doubt): its request may have left
//     (httptrace saw it written) and no complete, well-formed answer of
//     the API came back.
//   - The client signature and tokens never appear in logs, errors or
//     traces: Credentials redact themselves in every format, and text that
//     the server echoes is scrubbed of both.
//   - Close stops background renewals and waits for them.
package partnerapi
