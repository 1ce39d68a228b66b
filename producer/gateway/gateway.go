package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/internal/confcheck"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/schemas"
)

const instrumentation = "github.com/playpipe/playpipe/producer/gateway"

// IngestSource is Source.Topic of the rejections the gateway publishes for
// events it refused before they reached Kafka (partition and offset are -1).
const IngestSource = "ingest"

// Event size limits of the gateway.
const (
	// DefaultMaxEventBytes is Config.MaxEventBytes' default: 64 KiB,
	// about 200 times an ordinary event.
	DefaultMaxEventBytes = 64 << 10
	// MaxEventBytesCeiling is the largest MaxEventBytes allowed: 960 KiB
	// leaves room for the key, the headers and the batch framing under
	// Kafka's default 1 MiB record limit (message.max.bytes 1 048 588,
	// franz-go's ProducerBatchMaxBytes 1 000 012), so an accepted event can
	// always be written.
	MaxEventBytesCeiling = 960 << 10
)

// Config configures the HTTP ingest gateway. Zero values take the
// defaults named in the comments; New validates it once.
type Config struct {
	// Publisher sends the events; required. The gateway does not close it.
	Publisher *producer.Publisher
	// RejectedTopic receives a schemas.Rejection for every refused event;
	// defaults to <prefix>.rejected, beside the Publisher's topics
	// (producer.Config.TopicPrefix).
	RejectedTopic string
	// Keys are the fleets' API keys (hashes); at least one is required.
	Keys []FleetKey
	// MaxBodyBytes bounds a request body; larger ones get 413 body_too_large
	// as a whole. Defaults to 4 MiB.
	MaxBodyBytes int64
	// MaxEventBytes bounds one event of a batch (its bytes as sent: an array
	// element or an NDJSON line); a larger event is refused with reason
	// too_large in its per-event answer, and its rejection record keeps only
	// a bounded prefix of it (see RejectionRawBound). Defaults to 64 KiB; at
	// most MaxEventBytesCeiling, so that every accepted event fits one Kafka
	// record.
	MaxEventBytes int64
	// MaxEvents bounds the events of one request; more get 413. Defaults to 5000.
	MaxEvents int
	// RatePerKey is the sustained events per second allowed per API key;
	// defaults to 20000. Burst is the events a key may send at once; defaults
	// to max(MaxEvents, RatePerKey) and must be ≥ MaxEvents (so that every
	// allowed batch can pass).
	RatePerKey float64
	Burst      int
	// MaxConcurrent bounds the POST /v1/events requests served at once (and
	// so the memory held by their bodies, up to MaxConcurrent × MaxBodyBytes);
	// beyond it a request gets 503 with Retry-After at once. Defaults to 64.
	// A request takes one of these slots only after its key is authenticated
	// and passed its own limits (MaxConcurrentPerKey, the rate limit).
	MaxConcurrent int
	// MaxConcurrentPerKey bounds the requests one API key has in flight;
	// beyond it the key's request gets 429 concurrency_limited at once. It
	// keeps one fleet from taking every slot of MaxConcurrent. Defaults to a
	// quarter of MaxConcurrent (at least 1); at most MaxConcurrent.
	MaxConcurrentPerKey int
	// MinBodyRate is the slowest a request body may arrive, in bytes per
	// second on average, once BodyGrace has passed; a slower body is cut
	// with 408 slow_body and its connection closed. Defaults to 1024.
	MinBodyRate int64
	// BodyGrace is how long a request body may take before MinBodyRate
	// applies (so small bodies on slow links pass). Defaults to 10 s.
	BodyGrace time.Duration
	// ReadTimeout bounds the time from the request's headers to the end of
	// its body; a body not complete by then is cut with 408 read_timeout.
	// Defaults to 60 s.
	ReadTimeout time.Duration
	// Now is the clock of a request's arrival: the events of a request are
	// checked against the plausible-time window (the Publisher's
	// Config.Validate.Window) around it, and its rejection records carry
	// it. Defaults to time.Now (tests inject a fixed one).
	Now func() time.Time
	// BrokerReady reports whether Kafka answers, for GET /readyz: it must
	// answer at once from a cached probe (the commands pass kafkax.Health's
	// Check), never wait on the broker. Nil: a ping bounded to
	// ReadyTimeout.
	BrokerReady func(ctx context.Context) error
	// Faults rate-limits the lines about Kafka not answering (one a minute
	// per kind, the repeats counted), which would otherwise come once per
	// request while the broker is down; the commands pass kafkax.Health's.
	// Nil: a process-wide one.
	Faults *kafkax.FaultLog
	// Logger defaults to slog.Default(). API keys are never logged.
	Logger *slog.Logger
	// MeterProvider makes playpipe.ingest.requests and the http.server.*
	// metrics; the command passes telemetry.Role.Providers.Meter. Nil: a
	// no-op provider (nothing is measured; no otel global is read).
	MeterProvider metric.MeterProvider
	// TracerProvider makes the server span of each request (which
	// continues the fleet's W3C trace context); the command passes
	// telemetry.Role.Providers.Tracer. Nil: a no-op provider, which still
	// carries the fleet's trace context on to the records.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	if c.RejectedTopic == "" && c.Publisher != nil {
		c.RejectedTopic = c.Publisher.TopicPrefix() + ".rejected"
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 4 << 20
	}
	if c.MaxEventBytes == 0 {
		c.MaxEventBytes = DefaultMaxEventBytes
	}
	if c.MaxEvents == 0 {
		c.MaxEvents = 5000
	}
	if c.RatePerKey == 0 {
		c.RatePerKey = 20000
	}
	if c.Burst == 0 {
		c.Burst = max(c.MaxEvents, int(math.Ceil(c.RatePerKey)))
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 64
	}
	if c.MaxConcurrentPerKey == 0 {
		c.MaxConcurrentPerKey = max(1, c.MaxConcurrent/4)
	}
	if c.MinBodyRate == 0 {
		c.MinBodyRate = 1024
	}
	if c.BodyGrace == 0 {
		c.BodyGrace = 10 * time.Second
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *Config) validate() error {
	if c.Publisher == nil {
		return errors.New("gateway: Config.Publisher is required")
	}
	return c.validateLimits()
}

// ValidateLimits checks the limits of c (sizes, rates, concurrency, body
// deadlines) with the defaults applied, leaving out the Publisher and the
// keys: a command calls it before it connects to anything, so that a bad
// flag is reported as such. New checks the same.
func (c Config) ValidateLimits() error {
	c.setDefaults()
	return c.validateLimits()
}

func (c *Config) validateLimits() error {
	if err := confcheck.First(
		confcheck.Rule(c.MaxBodyBytes < 1, "gateway: Config.MaxBodyBytes (--max-body)", "≥ 1", c.MaxBodyBytes),
		confcheck.Rule(c.MaxEventBytes < 1 || c.MaxEventBytes > MaxEventBytesCeiling, "gateway: Config.MaxEventBytes (--max-event-bytes)",
			fmt.Sprintf("1–%d bytes (an accepted event must fit one Kafka record)", MaxEventBytesCeiling), c.MaxEventBytes),
		confcheck.Rule(c.MaxEvents < 1, "gateway: Config.MaxEvents (--max-events)", "≥ 1", c.MaxEvents),
		confcheck.Rule(c.RatePerKey < 0 || math.IsNaN(c.RatePerKey) || math.IsInf(c.RatePerKey, 0), "gateway: Config.RatePerKey (--rate)", "> 0 events/s", c.RatePerKey),
		confcheck.Rule(c.MaxConcurrent < 1, "gateway: Config.MaxConcurrent (--max-concurrent)", "≥ 1", c.MaxConcurrent),
		confcheck.Rule(c.MaxConcurrentPerKey < 1 || c.MaxConcurrentPerKey > c.MaxConcurrent, "gateway: Config.MaxConcurrentPerKey (--max-concurrent-per-key)",
			fmt.Sprintf("1–%d (--max-concurrent)", c.MaxConcurrent), c.MaxConcurrentPerKey),
		confcheck.Rule(c.MinBodyRate < 1, "gateway: Config.MinBodyRate (--min-body-rate)", "≥ 1 byte/s", c.MinBodyRate),
		confcheck.Rule(c.BodyGrace < 0, "gateway: Config.BodyGrace (--body-grace)", "≥ 0", c.BodyGrace),
		confcheck.Rule(c.ReadTimeout < 0, "gateway: Config.ReadTimeout (--read-timeout)", "> 0", c.ReadTimeout),
	); err != nil {
		return err
	}
	if c.Burst < c.MaxEvents {
		return fmt.Errorf("gateway: Config.Burst (--burst) %d must be ≥ MaxEvents (--max-events) %d, or a full batch could never pass", c.Burst, c.MaxEvents)
	}
	return nil
}

// Gateway is the HTTP ingest gateway. Routes:
//
//	POST /v1/events  a JSON array or NDJSON batch of player events
//	GET  /healthz    200 while the process serves
//	GET  /readyz     200 when a Kafka broker answers and the gateway is not draining
type Gateway struct {
	cfg      Config
	keys     *keyring
	limiters []*rate.Limiter // one per configured key
	inflight []atomic.Int32  // requests in flight per configured key
	draining atomic.Bool
	handler  http.Handler
	slots    chan struct{} // one per request being served

	requests metric.Int64Counter
}

// New builds a gateway from a validated configuration.
func New(cfg Config) (*Gateway, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	kr, err := newKeyring(cfg.Keys)
	if err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, keys: kr, slots: make(chan struct{}, cfg.MaxConcurrent)}
	for range cfg.Keys {
		g.limiters = append(g.limiters, rate.NewLimiter(rate.Limit(cfg.RatePerKey), cfg.Burst))
	}
	g.inflight = make([]atomic.Int32, len(cfg.Keys))
	g.requests, _ = telemetry.OrNoopMeterProvider(cfg.MeterProvider).Meter(instrumentation).Int64Counter("playpipe.ingest.requests",
		metric.WithDescription("Requests to POST /v1/events, by HTTP status code."))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/events", g.postEvents)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", g.readyz)
	g.handler = telemetry.HTTPHandler(mux, "ingest", telemetry.Providers{Meter: cfg.MeterProvider, Tracer: cfg.TracerProvider})
	return g, nil
}

// ServeHTTP serves the gateway's routes.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.handler.ServeHTTP(w, r) }

// SetDraining makes /readyz answer 503 (call it when shutdown begins, so load
// balancers stop sending before the listener closes).
func (g *Gateway) SetDraining() { g.draining.Store(true) }

// ErrorResponse is the body of a request refused as a whole.
type ErrorResponse struct {
	Error string `json:"error"`
	// Code is machine-readable: unauthorized, rate_limited,
	// concurrency_limited, body_too_large, too_many_events, malformed_batch,
	// empty_batch, unsupported_media_type, unsupported_encoding, slow_body,
	// read_timeout, overloaded, kafka_unavailable, draining.
	Code string `json:"code"`
}

// IngestResponse is the body of an answer to POST /v1/events that got as far
// as publishing: 202 when every event is accepted or refused (with its
// rejection recorded), 503 when some are not on Kafka or not acknowledged
// within the delivery timeout (failed or unknown), and 413 when every
// event of the request is over the per-event size limit (each refused with
// reason too_large and recorded; retrying cannot help). In a batch that also
// holds events under the limit, an oversized event is one refused answer of
// a 202.
type IngestResponse struct {
	Accepted int `json:"accepted"`
	Refused  int `json:"refused"`
	Failed   int `json:"failed"`
	// Unknown counts the events of unknown fate: handed to Kafka but not
	// acknowledged within the delivery timeout (status unknown).
	Unknown int           `json:"unknown"`
	Events  []EventAnswer `json:"events"`
	Error   string        `json:"error,omitempty"`
	// Code is set on a 503: kafka_timeout when Kafka did not answer within
	// the delivery timeout (some events unknown), kafka_unavailable when it
	// failed records.
	Code string `json:"code,omitempty"`
	// RetryAfter is the Retry-After header of a 503, in seconds.
	RetryAfter int `json:"retry_after_s,omitempty"`
}

// EventAnswer is the answer for one event of a batch.
type EventAnswer struct {
	Index   int    `json:"index"`
	EventID string `json:"event_id,omitempty"`
	// Status: accepted (on the events topic), refused (broke a rule: do not
	// retry; Reasons says why), failed (not on Kafka: retry it) or unknown
	// (sent or queued, not acknowledged within the delivery timeout: it may
	// be on the topic; retry it, the pipeline recognises the copies by
	// event_id, see docs/producer.md).
	Status    producer.Status     `json:"status"`
	Partition *int32              `json:"partition,omitempty"`
	Offset    *int64              `json:"offset,omitempty"`
	Reasons   []schemas.Violation `json:"reasons,omitempty"`
	Error     string              `json:"error,omitempty"`
}

func (g *Gateway) postEvents(w http.ResponseWriter, r *http.Request) {
	status := g.serveEvents(w, r)
	g.requests.Add(r.Context(), 1, metric.WithAttributes(attribute.Int("code", status)))
}

// serveEvents answers POST /v1/events. The order of the checks is the
// isolation between fleets: everything a request can be refused for by its
// key alone (authentication, the key's concurrent requests, its rate limit)
// and by its headers is decided before it takes one of the MaxConcurrent
// slots shared by every key, and the body (the only slow part a client
// controls) is read under a minimum rate and a deadline.
func (g *Gateway) serveEvents(w http.ResponseWriter, r *http.Request) int {
	q := &request{w: w, r: r, start: time.Now(), arrival: g.cfg.Now()}
	ki := g.keys.match(presentedKey(r))
	if ki < 0 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="playpipe-ingest"`)
		g.cfg.Logger.Debug("ingest: request without a valid API key", "remote", r.RemoteAddr)
		return q.fail(http.StatusUnauthorized, "unauthorized", "a valid fleet API key is required (Authorization: Bearer <key> or X-API-Key)")
	}
	fleet := g.cfg.Keys[ki].Fleet
	trace.SpanFromContext(r.Context()).SetAttributes(attribute.String("playpipe.fleet", fleet))
	if !acquireUpTo(&g.inflight[ki], int32(g.cfg.MaxConcurrentPerKey)) {
		w.Header().Set("Retry-After", "1")
		g.cfg.Logger.Debug("ingest: too many requests in flight for one key; answering 429", "fleet", fleet, "max_concurrent_per_key", g.cfg.MaxConcurrentPerKey)
		return q.fail(http.StatusTooManyRequests, "concurrency_limited", fmt.Sprintf("this API key has %d requests in flight already (the limit per key); retry when one is answered", g.cfg.MaxConcurrentPerKey))
	}
	defer g.inflight[ki].Add(-1)
	lim := g.limiters[ki]
	if lim.Tokens() < 1 { // refuse before reading the body
		q.closeUnread()
		return g.tooMany(w, lim.Reserve())
	}
	ndjson, status := g.checkHeaders(q)
	if status != 0 {
		return status
	}
	select {
	case g.slots <- struct{}{}:
		defer func() { <-g.slots }()
	default:
		w.Header().Set("Retry-After", "1")
		g.cfg.Logger.Warn("ingest: too many requests in flight; answering 503", "fleet", fleet, "max_concurrent", g.cfg.MaxConcurrent)
		return q.fail(http.StatusServiceUnavailable, "overloaded", fmt.Sprintf("the gateway is serving %d requests already; retry shortly", g.cfg.MaxConcurrent))
	}
	events, status := g.readEvents(q, fleet, ndjson)
	if status != 0 {
		return status
	}
	now := time.Now()
	if res := lim.ReserveN(now, len(events)); res.DelayFrom(now) > 0 {
		return g.tooMany(w, res)
	}
	// Every wait on Kafka for this request ends by the delivery timeout,
	// whatever the broker does: the answer says per event what is known.
	pctx, cancel := context.WithTimeout(r.Context(), g.cfg.Publisher.DeliveryTimeout())
	defer cancel()
	resp, status := g.publish(pctx, fleet, events, q.arrival)
	if status == http.StatusServiceUnavailable {
		resp.RetryAfter = 1
		if resp.Unknown > 0 {
			resp.RetryAfter = RetryAfterUnknown
		}
		w.Header().Set("Retry-After", strconv.Itoa(resp.RetryAfter))
	}
	writeJSON(w, status, resp)
	return status
}

// request is one POST /v1/events being served.
type request struct {
	w        http.ResponseWriter
	r        *http.Request
	start    time.Time // for the body's rate and deadline
	arrival  time.Time // Config.Now at arrival: the events' plausible-time reference
	bodyRead bool
}

// closeUnread closes the connection of a request refused before its body is
// read, at once: otherwise the server would wait for up to 256 KiB of the
// unread body (at the client's pace) before reusing the connection.
func (q *request) closeUnread() {
	if !q.bodyRead && q.r.ContentLength != 0 {
		q.w.Header().Set("Connection", "close")
		_ = http.NewResponseController(q.w).SetReadDeadline(time.Unix(1, 0))
	}
}

// fail refuses the request as a whole and returns status.
func (q *request) fail(status int, code, msg string) int {
	q.closeUnread()
	writeJSON(q.w, status, ErrorResponse{Error: msg, Code: code})
	return status
}

// checkHeaders refuses a request whose headers already say it cannot be
// served (encoding, media type, declared length): status is then its
// answer's, else 0 and ndjson tells the body's format.
func (g *Gateway) checkHeaders(q *request) (ndjson bool, status int) {
	if ce := q.r.Header.Get("Content-Encoding"); ce != "" && ce != "identity" {
		return false, q.fail(http.StatusUnsupportedMediaType, "unsupported_encoding", "Content-Encoding "+strconv.Quote(ce)+" is not supported; send the body uncompressed")
	}
	ndjson, known := bodyKind(q.r.Header.Get("Content-Type"))
	if !known {
		return false, q.fail(http.StatusUnsupportedMediaType, "unsupported_media_type", "Content-Type must be application/json (an array) or application/x-ndjson (one event per line)")
	}
	if q.r.ContentLength > g.cfg.MaxBodyBytes {
		return false, q.fail(http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body of %d bytes exceeds the limit of %d bytes", q.r.ContentLength, g.cfg.MaxBodyBytes))
	}
	return ndjson, 0
}

// readEvents reads the body (bounded, under the minimum rate and the read
// timeout) and splits it into events; status is the answer's when the
// request is refused, else 0.
func (g *Gateway) readEvents(q *request, fleet string, ndjson bool) (events [][]byte, status int) {
	br := newBodyReader(q.w, q.r.Body, q.start, &g.cfg)
	body, err := io.ReadAll(http.MaxBytesReader(q.w, io.NopCloser(br), g.cfg.MaxBodyBytes))
	br.done(err == nil)
	q.bodyRead = err == nil
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, q.fail(http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body exceeds the limit of %d bytes", g.cfg.MaxBodyBytes))
		case errors.Is(err, errSlowBody):
			q.w.Header().Set("Connection", "close")
			g.cfg.Logger.Info("ingest: request body too slow; cut", "fleet", fleet, "bytes", br.n, "after", time.Since(q.start).Round(time.Millisecond), "min_body_rate", g.cfg.MinBodyRate)
			return nil, q.fail(http.StatusRequestTimeout, "slow_body", fmt.Sprintf("the body arrived slower than %d bytes/s after the first %s; send it faster", g.cfg.MinBodyRate, g.cfg.BodyGrace))
		case errors.Is(err, errReadTimeout):
			q.w.Header().Set("Connection", "close")
			g.cfg.Logger.Info("ingest: request body not complete within the read timeout; cut", "fleet", fleet, "bytes", br.n, "read_timeout", g.cfg.ReadTimeout)
			return nil, q.fail(http.StatusRequestTimeout, "read_timeout", fmt.Sprintf("the body was not complete within %s; send smaller batches", g.cfg.ReadTimeout))
		}
		return nil, q.fail(http.StatusBadRequest, "malformed_batch", "could not read the body")
	}
	events, err = splitBatch(body, ndjson, g.cfg.MaxEvents)
	switch {
	case errors.Is(err, errTooManyEvents):
		return nil, q.fail(http.StatusRequestEntityTooLarge, "too_many_events", fmt.Sprintf("more than %d events in one request; split the batch", g.cfg.MaxEvents))
	case err != nil:
		return nil, q.fail(http.StatusBadRequest, "malformed_batch", err.Error())
	case len(events) == 0:
		return nil, q.fail(http.StatusBadRequest, "empty_batch", "the batch holds no event")
	}
	return events, 0
}

// publish sends the events of one request, checked against the
// plausible-time window around its arrival, records the refused ones to the
// rejected topic (bounded records) and returns the answer and its status:
// 503 when some event or rejection record is not on Kafka (retry them), 413
// when every event of the request is over MaxEventBytes, else 202.
func (g *Gateway) publish(ctx context.Context, fleet string, events [][]byte, arrival time.Time) (IngestResponse, int) {
	now := arrival
	// Events over the size limit are not parsed: they are refused here.
	var refused []refusal
	fit := make([][]byte, 0, len(events))
	fitIndex := make([]int, 0, len(events))
	for i, ev := range events {
		if int64(len(ev)) > g.cfg.MaxEventBytes {
			refused = append(refused, refusal{index: i, raw: ev, eventID: producer.LenientEventID(ev), vs: []schemas.Violation{{
				Reason: ReasonTooLarge,
				Detail: fmt.Sprintf("the event is %d bytes; the limit is %d bytes per event", len(ev), g.cfg.MaxEventBytes)}}})
			continue
		}
		fit = append(fit, ev)
		fitIndex = append(fitIndex, i)
	}
	tooLarge := len(refused)

	var results []producer.Result
	var pubErr error
	if len(fit) > 0 {
		results, pubErr = g.cfg.Publisher.Publish(ctx, fit, producer.WithArrival(arrival),
			producer.WithHeaders(kgo.RecordHeader{Key: "fleet", Value: []byte(fleet)}))
	}
	resp := IngestResponse{Events: make([]EventAnswer, len(events))}
	for j := range results {
		res := &results[j]
		i := fitIndex[j]
		a := EventAnswer{Index: i, EventID: res.EventID, Status: res.Status}
		switch res.Status {
		case producer.StatusAccepted:
			resp.Accepted++
			p, o := res.Partition, res.Offset
			a.Partition, a.Offset = &p, &o
		case producer.StatusRefused:
			refused = append(refused, refusal{index: i, raw: events[i], eventID: res.EventID, vs: res.Violations})
		case producer.StatusUnknown:
			resp.Unknown++
			a.Error = errUnknownFate
		default:
			resp.Failed++
			a.Error = "not written to Kafka; retry this event"
		}
		resp.Events[i] = a
	}
	rejectionLost := 0
	for k, err := range g.recordRefusals(ctx, fleet, refused, now.UnixMilli()) {
		rf := refused[k]
		a := EventAnswer{Index: rf.index, EventID: rf.eventID, Status: producer.StatusRefused, Reasons: rf.vs}
		if err != nil {
			rejectionLost++
			a.Error = errRejectionLost.Error()
			if pubErr == nil {
				pubErr = err
			}
		}
		resp.Refused++
		resp.Events[rf.index] = a
	}
	log := g.cfg.Logger.With("fleet", fleet, "events", len(events), "accepted", resp.Accepted, "refused", resp.Refused, "failed", resp.Failed, "unknown", resp.Unknown)
	if tooLarge > 0 {
		log = log.With("too_large", tooLarge)
	}
	switch {
	case resp.Unknown > 0:
		resp.Code = "kafka_timeout"
		resp.Error = fmt.Sprintf("Kafka did not acknowledge %d events within the delivery timeout of %s: their fate is unknown (status unknown: they may be on Kafka); retry every event not accepted", resp.Unknown, g.cfg.Publisher.DeliveryTimeout())
		g.cfg.Faults.Say(log, slog.LevelWarn, kafkax.FaultProduceTimeout, "ingest", "ingest: Kafka did not answer within the delivery timeout (logged at most once a minute)", "err", pubErr, "rejections_lost", rejectionLost)
		return resp, http.StatusServiceUnavailable
	case resp.Failed > 0 || rejectionLost > 0:
		resp.Code = "kafka_unavailable"
		resp.Error = "Kafka did not acknowledge every record of the batch: retry the events not accepted"
		g.cfg.Faults.Say(log, slog.LevelWarn, kafkax.FaultProduce, "ingest", "ingest: batch not fully on Kafka (logged at most once a minute)", "err", pubErr, "rejections_lost", rejectionLost)
		return resp, http.StatusServiceUnavailable
	case tooLarge == len(events):
		resp.Error = fmt.Sprintf("every event of the request exceeds the limit of %d bytes per event; it was refused (reason %s), do not retry it", g.cfg.MaxEventBytes, ReasonTooLarge)
		log.Info("ingest: events over the size limit refused")
		return resp, http.StatusRequestEntityTooLarge
	case tooLarge > 0:
		resp.Error = fmt.Sprintf("%d events exceed the limit of %d bytes per event and were refused (reason %s)", tooLarge, g.cfg.MaxEventBytes, ReasonTooLarge)
	}
	log.Debug("ingest: batch published")
	return resp, http.StatusAccepted
}

func (g *Gateway) tooMany(w http.ResponseWriter, res *rate.Reservation) int {
	now := time.Now()
	delay := res.DelayFrom(now)
	res.CancelAt(now)
	secs := int(math.Ceil(delay.Seconds()))
	if secs < 1 {
		secs = 1
	}
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeJSON(w, http.StatusTooManyRequests, ErrorResponse{Code: "rate_limited",
		Error: fmt.Sprintf("rate limit of this API key exceeded (%g events/s, burst %d); retry after %d s", g.cfg.RatePerKey, g.cfg.Burst, secs)})
	return http.StatusTooManyRequests
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// acquireUpTo takes one of max slots of n, never letting n pass max (not
// even for an instant, as an add-then-undo would: the gauge of requests in
// flight per key reads true). It reports whether a slot was free.
func acquireUpTo(n *atomic.Int32, max int32) bool {
	for {
		cur := n.Load()
		if cur >= max {
			return false
		}
		if n.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}
