package telemetry

import (
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Providers are the OpenTelemetry providers a role instruments itself with,
// handed to a library through its Config (the MeterProvider, TracerProvider
// and, where trace context crosses HTTP, Propagator fields of
// consumer.Config, reporter.Config, analytics.SinkConfig, partnerapi.Config,
// producer.Config, …) rather than read from the otel globals, which nothing
// in playpipe sets or reads. Setup builds them (Role.Providers for a
// command). A library treats a nil field as a no-op provider: nothing is
// recorded, and it never depends on a global.
type Providers struct {
	Meter      metric.MeterProvider
	Tracer     trace.TracerProvider
	Propagator propagation.TextMapPropagator
}

// OrNoopMeterProvider returns mp, or a no-op meter provider when mp is nil:
// what a library does with a nil MeterProvider field.
func OrNoopMeterProvider(mp metric.MeterProvider) metric.MeterProvider {
	if mp == nil {
		return metricnoop.NewMeterProvider()
	}
	return mp
}

// OrNoopTracerProvider returns tp, or a no-op tracer provider when tp is
// nil: what a library does with a nil TracerProvider field. The no-op
// tracer starts no span but passes the context's span context on, so an
// incoming trace still reaches the records and requests a role sends.
func OrNoopTracerProvider(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return noop.NewTracerProvider()
	}
	return tp
}

// OrW3CPropagator returns p, or playpipe's propagator (W3C trace context plus baggage) when p is
// nil: trace context is carried even when telemetry was not set up.
func OrW3CPropagator(p propagation.TextMapPropagator) propagation.TextMapPropagator {
	if p == nil {
		return propagator
	}
	return p
}

// WithDefaults returns p with its nil fields replaced as a library does
// (OrNoopMeterProvider, OrNoopTracerProvider, OrW3CPropagator).
func (p Providers) WithDefaults() Providers {
	return Providers{Meter: OrNoopMeterProvider(p.Meter), Tracer: OrNoopTracerProvider(p.Tracer), Propagator: OrW3CPropagator(p.Propagator)}
}
