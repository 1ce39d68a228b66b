package reporter

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/schemas"
)

const instrumentation = "github.com/playpipe/playpipe/reporter"

// metrics are the reporter's instruments on the global meter provider, with
// the attribute sets of the hot path built once.
type metrics struct {
	deliveries     metric.Int64Counter
	retries        metric.Int64Counter
	latency        metric.Float64Histogram
	standbyActive  metric.Int64UpDownCounter
	standbyEpisode metric.Int64Counter
	skipped        metric.Int64Counter

	outcome map[string]metric.MeasurementOption
	reason  map[string]metric.MeasurementOption
}

func newMetrics() (*metrics, error) {
	m := otel.Meter(instrumentation)
	var err error
	x := &metrics{outcome: map[string]metric.MeasurementOption{}, reason: map[string]metric.MeasurementOption{}}
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

func (m *metrics) skip(ctx context.Context, reason string) {
	m.skipped.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
}

var tracer trace.Tracer = otel.Tracer(instrumentation)
