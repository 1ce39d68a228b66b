package gateway

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/testkit/producertest"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// BenchmarkGateway posts NDJSON batches of 1000 events (5% invalid, so the
// rejected topic is written too) over loopback HTTP, each answered 202.
func BenchmarkGateway(b *testing.B) {
	k := testenv.StartKafka(b, 6)
	p := producertest.NewPublisher(b, k, producer.Config{TracerProvider: noop.NewTracerProvider()})
	key, _ := ParseFleetKey("bench:" + HashKey(acmeKey))
	gw, err := New(Config{Publisher: p, Keys: []FleetKey{key}, RatePerKey: 1e9, MaxEvents: 1000,
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
			body.Write(producertest.ValidEvent(fmt.Sprintf("g-%d", i)))
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
