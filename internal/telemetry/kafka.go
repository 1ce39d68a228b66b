package telemetry

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// propagator is W3C trace context plus baggage, whatever the global one is.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Inject writes the trace context of ctx (traceparent, tracestate) into r's
// headers, through kotel's record carrier (an existing header is replaced).
func Inject(ctx context.Context, r *kgo.Record) { propagator.Inject(ctx, kotel.NewRecordCarrier(r)) }

// Extract returns ctx carrying the remote trace context found in r's headers;
// a record without one yields ctx unchanged (the next span starts a new trace).
func Extract(ctx context.Context, r *kgo.Record) context.Context {
	return propagator.Extract(ctx, kotel.NewRecordCarrier(r))
}

// init makes the W3C propagator the global one at import, for code that
// still reads otel.GetTextMapPropagator (producer/simulate.go) in processes
// and tests that never call Setup. TODO(issue 14): remove once every
// library takes telemetry.Providers.Propagator.
func init() { otel.SetTextMapPropagator(propagator) }
