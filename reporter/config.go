package reporter

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/kafkax"
)

// Defaults of the Config fields.
const (
	DefaultGroup       = "playpipe-reporter"
	DefaultConcurrency = 48
	// DefaultMaxConcurrency caps the adaptive in-flight limit (limit.go):
	// Little's law puts 1 024 in flight at 20 000 reports/s toward a partner
	// 50 ms away, or 6 800/s at 150 ms.
	DefaultMaxConcurrency = 1024
	// MaxInFlight is the largest Concurrency and MaxConcurrency accepted.
	MaxInFlight            = 4096
	DefaultMaxPending      = 16384
	DefaultProducers       = 2
	DefaultRecentWindow    = 100_000
	DefaultBackoffInitial  = 100 * time.Millisecond
	DefaultBackoffMax      = 10 * time.Second
	DefaultRetryAfterMax   = 2 * time.Minute
	DefaultProbeInterval   = 500 * time.Millisecond
	DefaultCommitInterval  = 100 * time.Millisecond
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultBudgetFloor and DefaultBudgetRatio shape the retry budget: failed
	// posts allowed per second whatever happens, and per successful post.
	DefaultBudgetFloor = 10.0
	DefaultBudgetRatio = 0.5
	// DefaultMetadataMaxBytes is Kafka's default offset.metadata.max.bytes.
	DefaultMetadataMaxBytes = 4096
	// DefaultParkAfterAttempts and DefaultParkAfter are a report's retry
	// budget (park.go): it is parked once both are spent, counting only
	// failures and time while other reports were answered.
	DefaultParkAfterAttempts = 20
	DefaultParkAfter         = 10 * time.Minute
	// DefaultWarnAfterAttempts is the failed attempts after which a report
	// is logged as stuck (once).
	DefaultWarnAfterAttempts = 10
)

// DefaultParkRetries is the slow schedule of a parked report: the delay
// before each slow retry, the last one repeated.
var DefaultParkRetries = []time.Duration{time.Minute, 5 * time.Minute, 30 * time.Minute, time.Hour}

// ErrInvalidConfig is wrapped by every error Validate (and so New) returns,
// and by the error Run returns when the partner API answered in a way no
// retry can fix (edge 403/1010, credentials rejected, endpoint not found):
// the reporter then stopped and committed nothing more.
var ErrInvalidConfig = errors.New("reporter: invalid configuration")

// Config configures a Reporter. Zero fields take the default stated in their
// comment; New validates once and names the offending flag in its error.
type Config struct {
	// Kafka is the connection and the topic prefix; the reporter consumes
	// <prefix>.reports and publishes to <prefix>.deliveries.
	Kafka kafkax.Config
	// Group is the consumer group. Defaults to DefaultGroup.
	Group string
	// Concurrency is the number of reports in flight (posts at once) the
	// reporter starts with; the adaptive limit (limit.go) grows it toward
	// MaxConcurrency while a backlog waits and the partner's latency stays
	// flat, shrinks it back toward Concurrency when latency rises, and below
	// it (down to 1) when the partner fails. Defaults to DefaultConcurrency.
	Concurrency int
	// MaxConcurrency caps the adaptive limit. Defaults to the larger of
	// DefaultMaxConcurrency and Concurrency; set it to Concurrency for a
	// fixed in-flight. The API client's transport should keep at least that
	// many idle keep-alive connections.
	MaxConcurrency int
	// Rate limits posts to this many reports per second (0: no limit), for
	// partners whose contract sets one. Burst defaults to Concurrency.
	Rate  float64
	Burst int
	// LiveBypassNotDelivered makes a 200 served by live-bypass count as a
	// standby answer (replayed later) instead of delivered. Default false:
	// live-bypass is delivered.
	LiveBypassNotDelivered bool
	// BackoffInitial and BackoffMax bound the exponential retry delay of
	// transient failures (defaults 100ms and 10s); RetryAfterMax caps how
	// long a server's Retry-After is honoured (default 2m).
	BackoffInitial time.Duration
	BackoffMax     time.Duration
	RetryAfterMax  time.Duration
	// ProbeInterval is the pause between live probes (new sessions) during a
	// standby episode. Defaults to DefaultProbeInterval.
	ProbeInterval time.Duration
	// CommitInterval is the least time between two commits of final offsets
	// while running (one commit is in flight at a time; revocation and
	// shutdown commit at once). Defaults to DefaultCommitInterval: the commit
	// point trails finality by about a commit round trip, which bounds what a
	// crash re-sends.
	CommitInterval time.Duration
	// ShutdownTimeout bounds how long a graceful shutdown waits for posts in
	// flight before abandoning them. Defaults to DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// MaxPending bounds the records held between a partition's commit point
	// and the newest fetched record, per partition: fetching pauses for that
	// partition alone at the bound (the others go on), and resumes once half
	// of it is free. Defaults to DefaultMaxPending.
	MaxPending int
	// Producers is how many Kafka clients write the Delivery records, lease
	// markers and parked entries (producers.go): each partition always
	// through the same one, so its records keep their order. Apache Kafka
	// handles one request of a connection at a time; several clients put
	// several produce requests before the broker at once. Defaults to
	// DefaultProducers.
	Producers int
	// ParkAfterAttempts and ParkAfter are the retry budget of one report
	// (park.go): a report whose transient failures (5xx, timeouts, an edge's
	// page; not 401, not standby) number at least ParkAfterAttempts and span
	// at least ParkAfter is parked — set aside in <prefix>.parked with a
	// parked Delivery record, its offset settled for the commit point, and
	// retried on the ParkRetries schedule. Only failures and time while the
	// partner answered other reports count: in an outage of the whole
	// partner nothing is parked (the reporter backs off as a whole).
	// Defaults DefaultParkAfterAttempts and DefaultParkAfter; a negative
	// ParkAfterAttempts never parks.
	ParkAfterAttempts int
	ParkAfter         time.Duration
	// ParkRetries is the slow schedule of parked reports: the delay before
	// each slow retry, the last one repeated. Defaults to DefaultParkRetries.
	ParkRetries []time.Duration
	// WarnAfterAttempts is how many failed attempts of one report make a
	// warning (once per report) naming it, its track, status and attempts.
	// Defaults to DefaultWarnAfterAttempts.
	WarnAfterAttempts int
	// RecentWindow is how many report ids with a final outcome are remembered
	// to skip duplicates (re-published events). Defaults to
	// DefaultRecentWindow (~60 bytes each); negative disables.
	RecentWindow int
	// BudgetFloor and BudgetRatio are the retry budget (throttle.go): a
	// failed post takes a token; tokens come back at BudgetFloor per second
	// plus BudgetRatio per successful post. In a full outage the partner
	// sees about BudgetFloor posts a second. Defaults DefaultBudgetFloor and
	// DefaultBudgetRatio.
	BudgetFloor float64
	BudgetRatio float64
	// MetadataMaxBytes is the brokers' offset.metadata.max.bytes: the
	// largest progress (commit metadata) the reporter writes. A partition's
	// progress takes at most 1.6 bits per offset between its commit point
	// and its newest report leased or final (progress.go), so it bounds that
	// window per partition, not the in-flight: 15 185 offsets at Kafka's
	// default 4 096 bytes (reports past it wait until the commit point
	// moves). Defaults to DefaultMetadataMaxBytes.
	MetadataMaxBytes int
	// Clock is the reporter's time and timers (clock.go); tests inject one
	// to advance time instead of sleeping. Defaults to the real clock.
	Clock Clock
	// Now reads the time. With Clock set it is Clock.Now; set alone, it is
	// the real clock's reading (its timers stay real). Defaults to time.Now.
	Now func() time.Time
	// PartnerURL is the base URL of the partner API the reporter posts to
	// (the client's BaseURL: --api-url, or the built-in sandbox's loopback
	// URL). Every delivery record carries it (schemas.Delivery.Partner), so
	// the ledger counts deliveries per partner target and never mistakes a
	// sandbox's answers for real deliveries. Empty: records carry none.
	PartnerURL string
	// Logger receives the reporter's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// MeterProvider makes the reporter's instruments (reporter/metrics.go);
	// the command passes telemetry.Role.Providers.Meter. Nil: a no-op
	// provider (nothing is measured; no otel global is read).
	MeterProvider metric.MeterProvider
	// TracerProvider makes the reporter's spans (a consumer span per post,
	// playpipe.report.deliver, standby.episode); the command passes
	// telemetry.Role.Providers.Tracer. Nil: a no-op provider, which still
	// carries a record's trace context on to the delivery record. The trace
	// context in Kafka headers is always W3C (telemetry.Inject, Extract).
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() Config {
	c.Group = cmp.Or(c.Group, DefaultGroup)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.MaxConcurrency = cmp.Or(c.MaxConcurrency, max(DefaultMaxConcurrency, c.Concurrency))
	if c.Clock == nil {
		now := c.Now
		if now == nil {
			now = time.Now
		}
		c.Clock = systemClock{now: now}
	}
	c.Now = c.Clock.Now
	c.Burst = cmp.Or(c.Burst, c.Concurrency)
	c.BackoffInitial = cmp.Or(c.BackoffInitial, DefaultBackoffInitial)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.RetryAfterMax = cmp.Or(c.RetryAfterMax, DefaultRetryAfterMax)
	c.ProbeInterval = cmp.Or(c.ProbeInterval, DefaultProbeInterval)
	c.CommitInterval = cmp.Or(c.CommitInterval, DefaultCommitInterval)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.MaxPending = cmp.Or(c.MaxPending, DefaultMaxPending)
	c.Producers = cmp.Or(c.Producers, DefaultProducers)
	c.RecentWindow = cmp.Or(c.RecentWindow, DefaultRecentWindow)
	c.MetadataMaxBytes = cmp.Or(c.MetadataMaxBytes, DefaultMetadataMaxBytes)
	c.ParkAfterAttempts = cmp.Or(c.ParkAfterAttempts, DefaultParkAfterAttempts)
	c.ParkAfter = cmp.Or(c.ParkAfter, DefaultParkAfter)
	if len(c.ParkRetries) == 0 {
		c.ParkRetries = DefaultParkRetries
	}
	c.WarnAfterAttempts = cmp.Or(c.WarnAfterAttempts, DefaultWarnAfterAttempts)
	c.BudgetFloor = cmp.Or(c.BudgetFloor, DefaultBudgetFloor)
	c.BudgetRatio = cmp.Or(c.BudgetRatio, DefaultBudgetRatio)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Validate checks the configuration (after defaults) once.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(flag, format string, args ...any) error {
		return fmt.Errorf("%w: --%s: %s", ErrInvalidConfig, flag, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Concurrency < 1 || c.Concurrency > MaxInFlight:
		return bad("concurrency", "must be 1–%d, got %d", MaxInFlight, c.Concurrency)
	case c.MaxConcurrency < c.Concurrency || c.MaxConcurrency > MaxInFlight:
		return bad("max-concurrency", "must be within --concurrency (%d) and %d, got %d", c.Concurrency, MaxInFlight, c.MaxConcurrency)
	case c.Rate < 0:
		return bad("rate", "must be ≥ 0 reports/s (0: unlimited), got %v", c.Rate)
	case c.Burst < 1:
		return bad("rate-burst", "must be ≥ 1, got %d", c.Burst)
	case c.BackoffInitial < 0:
		return bad("backoff-initial", "must be > 0, got %v", c.BackoffInitial)
	case c.BackoffMax < c.BackoffInitial:
		return bad("backoff-max", "must be ≥ --backoff-initial (%v), got %v", c.BackoffInitial, c.BackoffMax)
	case c.RetryAfterMax < 0:
		return bad("retry-after-max", "must be ≥ 0, got %v", c.RetryAfterMax)
	case c.ProbeInterval <= 0:
		return bad("standby-probe-interval", "must be > 0, got %v", c.ProbeInterval)
	case c.CommitInterval <= 0:
		return bad("commit-interval", "must be > 0, got %v", c.CommitInterval)
	case c.ShutdownTimeout <= 0:
		return bad("shutdown-timeout", "must be > 0, got %v", c.ShutdownTimeout)
	case c.MaxPending < c.Concurrency:
		return bad("max-pending", "must be ≥ --concurrency (%d), got %d", c.Concurrency, c.MaxPending)
	case c.Producers < 1 || c.Producers > 64:
		return bad("producers", "must be 1–64, got %d", c.Producers)
	case c.BudgetFloor < 0.1:
		return bad("retry-budget-floor", "must be ≥ 0.1 failed posts/s, got %v", c.BudgetFloor)
	case c.BudgetRatio < 0 || c.BudgetRatio > 10:
		return bad("retry-budget-ratio", "must be within 0–10 failed posts per successful post, got %v", c.BudgetRatio)
	case c.ParkAfter < 0:
		return bad("park-after", "must be ≥ 0, got %v", c.ParkAfter)
	case slices.ContainsFunc(c.ParkRetries, func(d time.Duration) bool { return d <= 0 }):
		return bad("park-retries", "every delay must be > 0, got %v", c.ParkRetries)
	case c.WarnAfterAttempts < 1:
		return bad("warn-after-attempts", "must be ≥ 1, got %d", c.WarnAfterAttempts)
	case c.MetadataMaxBytes < 256:
		return bad("offset-metadata-max-bytes", "must be ≥ 256, got %d", c.MetadataMaxBytes)
	case progressWindow(c.MetadataMaxBytes) < int64(2*c.Concurrency):
		return bad("offset-metadata-max-bytes", "%d bytes of commit metadata hold the progress of %d offsets a partition, fewer than twice --concurrency (%d): raise it with the brokers' offset.metadata.max.bytes, or lower --concurrency",
			c.MetadataMaxBytes, progressWindow(c.MetadataMaxBytes), c.Concurrency)
	}
	if err := c.Kafka.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}
