package reporter

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/internal/telemetry"
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

	outcome map[string]metric.MeasurementOption
	reason  map[string]metric.MeasurementOption
}

func newMetrics(mp metric.MeterProvider, tp trace.TracerProvider) (*metrics, error) {
	m := telemetry.OrNoopMeterProvider(mp).Meter(instrumentation)
	var err error
	x := &metrics{meter: m, tracer: telemetry.OrNoopTracerProvider(tp).Tracer(instrumentation),
		outcome: map[string]metric.MeasurementOption{}, reason: map[string]metric.MeasurementOption{}}
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
	for _, o := range []string{schemas.OutcomeDelivered, schemas.OutcomeRejected, schemas.OutcomeStandby, schemas.OutcomeRetry, schemas.OutcomeBlocked} {
		x.outcome[o] = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o)))
	}
	for _, r := range []string{ReasonHTTP500, ReasonHTTP503, ReasonTimeout, ReasonConnection, ReasonUnauthorized} {
		x.reason[r] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r)))
	}
	return x, nil
}

func (m *metrics) record(ctx context.Context, d Decision, seconds float64) {
	if o, ok := m.outcome[d.Outcome]; ok {
		m.deliveries.Add(ctx, 1, o)
	} else if d.Outcome != "" {
		m.deliveries.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", d.Outcome)))
	}
	if d.Action == ActRetry {
		if o, ok := m.reason[d.Reason]; ok {
			m.retries.Add(ctx, 1, o)
		} else {
			m.retries.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", d.Reason)))
		}
	}
	if seconds > 0 {
		m.latency.Record(ctx, seconds)
	}
}

// observeThrottle registers the throttle's gauges (throttle.go), read
// through state on each collection: playpipe.reporter.concurrency_limit,
// playpipe.reporter.retry_budget and playpipe.reporter.shed.
func (m *metrics) observeThrottle(state func() (limit, tokens float64, shed int64)) (func(), error) {
	mt := m.meter
	lim, err := mt.Float64ObservableGauge("playpipe.reporter.concurrency_limit", metric.WithDescription("posts allowed in flight now (adaptive, between 1 and --concurrency)"))
	if err != nil {
		return nil, err
	}
	bud, err := mt.Float64ObservableGauge("playpipe.reporter.retry_budget", metric.WithDescription("failed posts the retry budget allows now (tokens)"))
	if err != nil {
		return nil, err
	}
	shed, err := mt.Int64ObservableCounter("playpipe.reporter.shed", metric.WithDescription("times posting was held because the retry budget was spent"))
	if err != nil {
		return nil, err
	}
	reg, err := mt.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		l, t, s := state()
		o.ObserveFloat64(lim, l)
		o.ObserveFloat64(bud, t)
		o.ObserveInt64(shed, s)
		return nil
	}, lim, bud, shed)
	if err != nil {
		return nil, err
	}
	return func() { _ = reg.Unregister() }, nil
}

func (m *metrics) skip(ctx context.Context, reason string) {
	m.skipped.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
}
