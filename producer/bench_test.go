package producer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/internal/testenv"
)

// Benchmarks report events/s through the real parts (kfake on loopback, real
// HTTP). Keep runs short: go test -run '^$' -bench . -benchtime 20x ./producer/

func benchBatch(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = validEvent(fmt.Sprintf("%s-%d", prefix, i))
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
			p, err := NewPublisher(context.Background(), PublisherConfig{Kafka: k.Config, TracerProvider: bc.tp})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
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

// BenchmarkGateway posts NDJSON batches of 1000 events (5% invalid, so the
// rejected topic is written too) over loopback HTTP, each answered 202.
func BenchmarkGateway(b *testing.B) {
	k := testenv.StartKafka(b, 6)
	p, err := NewPublisher(context.Background(), PublisherConfig{Kafka: k.Config, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	key, _ := ParseFleetKey("bench:" + HashKey(acmeKey))
	gw, err := NewGateway(GatewayConfig{Publisher: p, Keys: []FleetKey{key}, RatePerKey: 1e9, MaxEvents: 1000,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	defer srv.Close()
	// Keep a connection per client alive (the default transport keeps 2 idle
	// per host, so 8 parallel clients would mostly dial anew).
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	var body bytes.Buffer
	for i := 0; i < 1000; i++ {
		if i%20 == 0 {
			body.WriteString(`{"event_id":"bad","country":"XYZ"}`)
		} else {
			body.Write(validEvent(fmt.Sprintf("g-%d", i)))
		}
		body.WriteByte('\n')
	}
	for _, concurrency := range []int{1, 4} {
		b.Run(fmt.Sprintf("batch=1000/clients=%d", concurrency), func(b *testing.B) {
			start := time.Now()
			b.SetParallelism(concurrency)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/events", bytes.NewReader(body.Bytes()))
					req.Header.Set("Content-Type", "application/x-ndjson")
					req.Header.Set("Authorization", "Bearer "+acmeKey)
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusAccepted {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*1000)/time.Since(start).Seconds(), "events/s")
		})
	}
}

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
			stats, err := Simulate(context.Background(), SimConfig{Kafka: k.Config, Mixes: testMixes, Events: b.N * bc.batch, BadShare: 0.05,
				BatchSize: bc.batch, BatchTimeout: bc.bt, TracerProvider: noop.NewTracerProvider()})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(stats.Sent)/time.Since(start).Seconds(), "events/s")
		})
	}
}
