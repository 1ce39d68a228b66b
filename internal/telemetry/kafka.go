package telemetry

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/propagation"
)

// propagator is W3C trace context plus baggage: the one propagator of
// playpipe, in Kafka headers and HTTP headers alike. It is a package value,
// never the otel global. Setup hands it out as Providers.Propagator;
// Inject and Extract use it for Kafka records, whose header format is part
// of the topics' contract (docs/operating.md).
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Inject writes the trace context of ctx (traceparent, tracestate) into r's
// headers, through kotel's record carrier (an existing header is replaced).
func Inject(ctx context.Context, r *kgo.Record) { propagator.Inject(ctx, kotel.NewRecordCarrier(r)) }

// Extract returns ctx carrying the remote trace context found in r's headers;
// a record without one yields ctx unchanged (the next span starts a new trace).
func Extract(ctx context.Context, r *kgo.Record) context.Context {
	return propagator.Extract(ctx, kotel.NewRecordCarrier(r))
}
