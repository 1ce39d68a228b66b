package telemetry

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// discardExporter drops spans: it measures the cost of recording, not of
// shipping.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkRecordTracing measures what one record costs the enrich hot path
// in tracing: Extract the upstream trace from the consumed record's headers,
// start and end a span, and Inject it into the produced record.
//
//	go test -run '^$' -bench RecordTracing -benchmem -count 6 ./internal/telemetry/
func BenchmarkRecordTracing(b *testing.B) {
	const upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, c := range []struct {
		name string
		o    *Config // nil: nothing configured
	}{
		{"off-no-header", nil},
		{"off", nil},
		{"on-sampled", &Config{SpanExporter: discardExporter{}}},
		{"on-ratio-0", &Config{SpanExporter: discardExporter{}, Sampler: sdktrace.TraceIDRatioBased(0)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for _, k := range []string{EnvTracesExporter, EnvMetricsExporter, EnvOTLPEndpoint, EnvOTLPTraces, EnvOTLPMetrics, "OTEL_TRACES_SAMPLER"} {
				b.Setenv(k, "")
			}
			o := Config{}
			if c.o != nil {
				o = *c.o
			}
			p, shutdown, err := Setup(context.Background(), o)
			if err != nil {
				b.Fatal(err)
			}
			defer shutdown(context.Background()) //nolint:errcheck
			in := &kgo.Record{Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte(upstream)}}}
			if c.name == "off-no-header" {
				in.Headers = []kgo.RecordHeader{{Key: "source", Value: []byte("fleet")}}
			}
			out := &kgo.Record{Headers: make([]kgo.RecordHeader, 0, 2)}
			bg := context.Background()
			tracer := testTracer(p)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ctx, span := tracer.Start(Extract(bg, in), "enrich")
				out.Headers = out.Headers[:0]
				Inject(ctx, out)
				span.End()
			}
		})
	}
}
