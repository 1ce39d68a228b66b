package simulator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// BenchmarkSimulate measures the kafka-go simulator (synchronous writes)
// with several write sizes and Writer.BatchTimeout settings.
func BenchmarkSimulate(b *testing.B) {
	for _, bc := range []struct {
		batch int
		bt    time.Duration
	}{{500, 2 * time.Millisecond}, {500, 50 * time.Millisecond}, {2000, 2 * time.Millisecond}} {
		b.Run(fmt.Sprintf("batch=%d/batch-timeout=%s", bc.batch, bc.bt), func(b *testing.B) {
			k := testenv.StartKafka(b, 6)
			start := time.Now()
			stats, err := Run(context.Background(), Config{Kafka: k.Config, Mixes: testMixes, Events: b.N * bc.batch, BadShare: 0.05,
				BatchSize: bc.batch, BatchTimeout: bc.bt, TracerProvider: noop.NewTracerProvider()})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(stats.Sent)/time.Since(start).Seconds(), "events/s")
		})
	}
}
