package telemetry

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Providers are the OpenTelemetry providers a role instruments itself with,
// handed to a library through its Config (partnerapi.Config's
// TracerProvider, MeterProvider and Propagator fields, for instance) rather
// than read from the otel globals. A library treats a nil field as "use the
// otel global", which Setup also installs for code not handed providers yet.
type Providers struct {
	Meter      metric.MeterProvider
	Tracer     trace.TracerProvider
	Propagator propagation.TextMapPropagator
}

// processProviders returns the providers Setup built: the process-wide
// meter provider (nil before the first Setup), the tracer provider that
// follows every Setup, and the W3C trace context + baggage propagator.
func processProviders() Providers {
	metricsMu.Lock()
	defer metricsMu.Unlock()
	p := Providers{Tracer: tracing, Propagator: propagator}
	if meterProvider != nil {
		p.Meter = meterProvider
	}
	return p
}
