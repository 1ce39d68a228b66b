package telemetry

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// recordCarrier is a propagation.TextMapCarrier over a record's headers.
type recordCarrier struct{ r *kgo.Record }

func (c recordCarrier) Get(key string) string {
	for _, h := range c.r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c recordCarrier) Set(key, value string) {
	for i, h := range c.r.Headers {
		if h.Key == key {
			c.r.Headers[i].Value = []byte(value)
			return
		}
	}
	c.r.Headers = append(c.r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c recordCarrier) Keys() []string {
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}

// propagator is W3C trace context plus baggage, whatever the global one is.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Inject writes the trace context of ctx (traceparent, tracestate) into r's headers.
func Inject(ctx context.Context, r *kgo.Record) { propagator.Inject(ctx, recordCarrier{r}) }

// Extract returns ctx carrying the remote trace context found in r's headers;
// a record without one yields ctx unchanged (the next span starts a new trace).
func Extract(ctx context.Context, r *kgo.Record) context.Context {
	return propagator.Extract(ctx, recordCarrier{r})
}

func init() { otel.SetTextMapPropagator(propagator) }
