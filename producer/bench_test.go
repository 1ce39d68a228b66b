package producer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/testkit/producertest"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// Benchmarks report events/s through the real parts (kfake on loopback, real
// HTTP). Keep runs short: go test -run '^$' -bench . -benchtime 20x ./producer/...

func benchBatch(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = producertest.ValidEvent(fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// BenchmarkPublisher publishes batches of 1000 valid events and waits for
// Kafka's acknowledgement of each batch.
func BenchmarkPublisher(b *testing.B) {
	for _, bc := range []struct {
		name        string
		concurrency int
		tp          trace.TracerProvider
	}{
		{"batch=1000/callers=1/tracing=off", 1, noop.NewTracerProvider()},
		{"batch=1000/callers=4/tracing=off", 4, noop.NewTracerProvider()},
		{"batch=1000/callers=1/tracing=sampled", 1, sdktrace.NewTracerProvider()},
	} {
		concurrency := bc.concurrency
		b.Run(bc.name, func(b *testing.B) {
			k := testenv.StartKafka(b, 6)
			p := producertest.NewPublisher(b, k, producer.Config{TracerProvider: bc.tp})
			batches := make([][][]byte, concurrency)
			for i := range batches {
				batches[i] = benchBatch(fmt.Sprintf("c%d", i), 1000)
			}
			b.ResetTimer()
			start := time.Now()
			next := make(chan struct{})
			done := make(chan error, concurrency)
			for c := 0; c < concurrency; c++ {
				go func(batch [][]byte) {
					for range next {
						if _, err := p.Publish(context.Background(), batch); err != nil {
							done <- err
							return
						}
					}
					done <- nil
				}(batches[c])
			}
			for i := 0; i < b.N; i++ {
				next <- struct{}{}
			}
			close(next)
			for c := 0; c < concurrency; c++ {
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*1000)/time.Since(start).Seconds(), "events/s")
		})
	}
}
