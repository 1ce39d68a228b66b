package reporter

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

const instrumentation = "github.com/playpipe/playpipe/reporter"

// metrics are the reporter's instruments, from Config.MeterProvider and
// Config.TracerProvider, with the attribute sets of the hot path built once.
type metrics struct {
	meter  metric.Meter
	tracer trace.Tracer
	// tracing: tracer is not a no-op one (spans are worth starting).
	tracing bool

	deliveries     metric.Int64Counter
	retries        metric.Int64Counter
	latency        metric.Float64Histogram
	standbyActive  metric.Int64UpDownCounter
	standbyEpisode metric.Int64Counter
	skipped        metric.Int64Counter
	limitMoves     metric.Int64Counter
	parks          metric.Int64Counter
	unparks        metric.Int64Counter
	recoveries     metric.Int64Counter // recovery fallbacks (recover.go)

	moveReason map[string]metric.AddOption

	// outcome and reason hold each hot-path attribute set as a ready
	// option slice: passing a slice (opts...) allocates nothing, where a
	// single option passed variadically escapes into a new slice per call
	// (1.6 allocations per report in BenchmarkOverhead).
	outcome map[string][]metric.AddOption
	reason  map[string][]metric.AddOption
}

func newMetrics(mp metric.MeterProvider, tp trace.TracerProvider) (*metrics, error) {
	m := telemetry.OrNoopMeterProvider(mp).Meter(instrumentation)
	var err error
	x := &metrics{meter: m, tracer: telemetry.OrNoopTracerProvider(tp).Tracer(instrumentation),
		outcome: map[string][]metric.AddOption{}, reason: map[string][]metric.AddOption{}, moveReason: map[string]metric.AddOption{}}
	_, off := x.tracer.(noop.Tracer)
	x.tracing = !off
	if x.deliveries, err = m.Int64Counter("playpipe.deliveries", metric.WithDescription("answers of the partner API to play reports, by outcome")); err != nil {
		return nil, err
	}
	if x.retries, err = m.Int64Counter("playpipe.delivery.retries", metric.WithDescription("report posts to be retried, by reason")); err != nil {
		return nil, err
	}
	if x.latency, err = m.Float64Histogram("playpipe.delivery.latency", metric.WithUnit("s"), metric.WithDescription("latency of one report post")); err != nil {
		return nil, err
	}
	if x.standbyActive, err = m.Int64UpDownCounter("playpipe.standby.active", metric.WithDescription("1 while a standby episode holds the reporter")); err != nil {
		return nil, err
	}
	if x.standbyEpisode, err = m.Int64Counter("playpipe.standby.episodes", metric.WithDescription("standby episodes seen by the reporter")); err != nil {
		return nil, err
	}
	if x.skipped, err = m.Int64Counter("playpipe.reports.skipped", metric.WithDescription("reports final without a post, by reason (duplicate, below_minimum, invalid)")); err != nil {
		return nil, err
	}
	if x.limitMoves, err = m.Int64Counter("playpipe.reporter.limit_changes", metric.WithDescription("moves of the in-flight limit, by reason: grow (latency flat, backlog waiting), latency (latency rose), back_pressure (429, 503, 408, Retry-After), timeout (a post timed out), error_rate (500s, edge pages, lost connections, 400s: their rate rose with the posts in flight)")); err != nil {
		return nil, err
	}
	if x.parks, err = m.Int64Counter("playpipe.reporter.parks", metric.WithDescription("reports parked: their transient failures outlasted the retry budget (park.go)")); err != nil {
		return nil, err
	}
	if x.unparks, err = m.Int64Counter("playpipe.reporter.unparks", metric.WithDescription("parked reports that got a final answer on a slow retry, by outcome")); err != nil {
		return nil, err
	}
	if x.recoveries, err = m.Int64Counter("playpipe.reporter.recovery_fallbacks", metric.WithDescription("partitions recovered without readable progress in their commit: the reports past the committed offset posted again labelled in doubt")); err != nil {
		return nil, err
	}
	for _, r := range []string{moveGrow, moveLatency, moveBackPressure, moveTimeout, moveErrorRate} {
		x.moveReason[r] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r)))
	}
	for _, o := range []string{schemas.OutcomeDelivered, schemas.OutcomeRejected, schemas.OutcomeStandby, schemas.OutcomeRetry, schemas.OutcomeBlocked} {
		x.outcome[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o)))}
	}
	for _, r := range []string{delivery.ReasonHTTP500, delivery.ReasonHTTP503, delivery.ReasonTimeout, delivery.ReasonConnection, delivery.ReasonUnauthorized} {
		x.reason[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r)))}
	}
	return x, nil
}

func (m *metrics) record(ctx context.Context, d delivery.Decision, seconds float64) {
	if o, ok := m.outcome[d.Outcome]; ok {
		m.deliveries.Add(ctx, 1, o...)
	} else if d.Outcome != "" {
		m.deliveries.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", d.Outcome)))
	}
	if d.Action == delivery.ActRetry {
		if o, ok := m.reason[d.Reason]; ok {
			m.retries.Add(ctx, 1, o...)
		} else {
			m.retries.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", d.Reason)))
		}
	}
	if seconds > 0 {
		m.latency.Record(ctx, seconds)
	}
}

// recoveryFallback counts one partition recovered without readable progress.
func (m *metrics) recoveryFallback(ctx context.Context) { m.recoveries.Add(ctx, 1) }

// limitMoved counts one move of the in-flight limit.
func (m *metrics) limitMoved(reason string) {
	if o, ok := m.moveReason[reason]; ok {
		m.limitMoves.Add(context.Background(), 1, o)
	}
}

// gauges is the state the reporter's gauges show, read once per collection.
type gauges struct {
	limit, tokens     float64
	shed              int64
	inFlight, atStake int
	rttMin, rttRecent time.Duration
	oldestPending     time.Duration // age of the oldest report without a final outcome; 0 when none
	parked            int64         // parked reports held by this instance's slow lane
	failing           int           // reports that failed at least twice (stall.go)
	stalled           int           // posts out of the limit's count: hanging on their payload (limit.go)
	suspect, aside    int           // suspect tracks, and fresh reports of them waiting for a slot (suspect.go)
	// Where fetched reports wait before their post (lease.go, dispatch.go):
	// for a lease (fresh and retries due), for their lease marker's
	// acknowledgement, for a worker with room under the limit and the cap
	// on posts at stake; and the workers waiting for a report.
	queued, leasing, leased, idleWorkers int
}

// observeState registers the gauges of the throttle (throttle.go), the
// in-flight limit (limit.go) and what a crash would put at stake, read
// through state on each collection: playpipe.reporter.concurrency_limit,
// retry_budget, shed, posts_in_flight, at_stake, rtt_min, rtt_recent and
// oldest_pending_age, failing, stalled_posts, suspect_tracks,
// suspect_aside, and where reports wait before their post:
// reports_queued, reports_leasing, reports_leased, idle_workers.
func (m *metrics) observeState(state func() gauges) (func(), error) {
	mt := m.meter
	var errs []error
	f64 := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := mt.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	i64 := func(name, desc string) metric.Int64ObservableGauge {
		g, err := mt.Int64ObservableGauge(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	lim := f64("playpipe.reporter.concurrency_limit", "", "posts allowed in flight now (adaptive, between 1 and --max-concurrency; playpipe.reporter.limit_changes says why it moved)")
	bud := f64("playpipe.reporter.retry_budget", "", "failed posts the retry budget allows now (tokens)")
	inFlight := i64("playpipe.reporter.posts_in_flight", "posts on the wire now")
	atStake := i64("playpipe.reporter.at_stake", "posts whose answer is not in Kafka yet (on the wire or on their way to Kafka): what a crash would re-post, labelled in doubt")
	rttMin := f64("playpipe.reporter.rtt_min", "s", "the in-flight limit's baseline: the lowest mean round trip of a measuring interval within the last minute")
	rttRecent := f64("playpipe.reporter.rtt_recent", "s", "the mean round trip of the last measuring interval")
	oldest := f64("playpipe.reporter.oldest_pending_age", "s", "age of the oldest fetched report without a final outcome (0: none)")
	parked := i64("playpipe.reporter.parked", "parked reports of this instance's partitions waiting for a slow retry")
	failing := i64("playpipe.reporter.failing", "reports that failed at least twice and have no final outcome yet: each holds its partition's commit point until delivered or parked")
	stalled := i64("playpipe.reporter.stalled_posts", "posts out longer than a few round trips while the partner answers the others: hanging on their payload, not counted against the in-flight limit")
	suspect := i64("playpipe.reporter.suspect_tracks", "tracks whose posts stall while the partner answers the others: their fresh reports hold at most a small share of the posts in flight (suspectCap)")
	aside := i64("playpipe.reporter.suspect_aside", "fresh reports of suspect tracks waiting for one of their slots")
	queued := i64("playpipe.reporter.reports_queued", "fetched reports (and retries due) waiting for a lease")
	leasing := i64("playpipe.reporter.reports_leasing", "reports whose lease marker is on its way to Kafka")
	leased := i64("playpipe.reporter.reports_leased", "reports leased and waiting for a worker: held by the in-flight limit or the cap on posts at stake when workers are idle")
	idleW := i64("playpipe.reporter.idle_workers", "posting workers waiting for a leased report they may post")
	shed, err := mt.Int64ObservableCounter("playpipe.reporter.shed", metric.WithDescription("times posting was held because the retry budget was spent"))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	reg, err := mt.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		g := state()
		o.ObserveFloat64(lim, g.limit)
		o.ObserveFloat64(bud, g.tokens)
		o.ObserveInt64(shed, g.shed)
		o.ObserveInt64(inFlight, int64(g.inFlight))
		o.ObserveInt64(atStake, int64(g.atStake))
		o.ObserveFloat64(rttMin, g.rttMin.Seconds())
		o.ObserveFloat64(rttRecent, g.rttRecent.Seconds())
		o.ObserveFloat64(oldest, g.oldestPending.Seconds())
		o.ObserveInt64(parked, g.parked)
		o.ObserveInt64(failing, int64(g.failing))
		o.ObserveInt64(stalled, int64(g.stalled))
		o.ObserveInt64(suspect, int64(g.suspect))
		o.ObserveInt64(aside, int64(g.aside))
		o.ObserveInt64(queued, int64(g.queued))
		o.ObserveInt64(leasing, int64(g.leasing))
		o.ObserveInt64(leased, int64(g.leased))
		o.ObserveInt64(idleW, int64(g.idleWorkers))
		return nil
	}, lim, bud, shed, inFlight, atStake, rttMin, rttRecent, oldest, parked, failing, stalled, suspect, aside, queued, leasing, leased, idleW)
	if err != nil {
		return nil, err
	}
	return func() { _ = reg.Unregister() }, nil
}

func (m *metrics) skip(ctx context.Context, reason string) {
	m.skipped.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
}

// parkedReport counts one report parked.
func (m *metrics) parkedReport(ctx context.Context) { m.parks.Add(ctx, 1) }

// unparked counts one parked report final on a slow retry.
func (m *metrics) unparked(ctx context.Context, outcome string) {
	m.unparks.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}
