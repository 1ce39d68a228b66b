package kafkax

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestWireCountsTraffic: a client made from a Config with a Wire counts its
// produce requests, batches and records, its fetches and records read, and
// the metrics report the same counts.
func TestWireCountsTraffic(t *testing.T) {
	e, err := StartEmbedded("plays", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	reader := metric.NewManualReader()
	w, unreg, err := NewWire(metric.NewMeterProvider(metric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	defer unreg()
	cfg := Config{Brokers: e.Addrs(), TopicPrefix: "plays", Partitions: 2, ReplicationFactor: -1, Wire: w}
	opts, err := cfg.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic("plays.events"), kgo.ConsumeTopics("plays.events"), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const n = 10
	for i := range n {
		// One synchronous produce each, to both partitions: n requests of one batch each.
		if err := cl.ProduceSync(ctx, &kgo.Record{Partition: int32(i % 2), Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	read := 0
	for read < n {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		read += fs.NumRecords()
	}
	// franz-go calls OnProduceBatchWritten from a goroutine of its own
	// after the produce's answer (kgo's produceMetrics.hook): the last
	// batches' counts may come a moment after ProduceSync returned.
	c := w.Counts()
	for wait := time.Now().Add(5 * time.Second); (c.ProducedBatches < n || c.ProducedRecords < n) && time.Now().Before(wait); c = w.Counts() {
		time.Sleep(10 * time.Millisecond)
	}
	if c.Requests["Produce"] != n || c.ProducedBatches != n || c.ProducedRecords != n {
		t.Errorf("produce: %d requests, %d batches, %d records; want %d each", c.Requests["Produce"], c.ProducedBatches, c.ProducedRecords, n)
	}
	if c.Requests["Fetch"] < 1 || c.FetchedRecords != n || c.FetchedBatches < 2 {
		t.Errorf("fetch: %d requests, %d batches, %d records; want ≥ 1, ≥ 2, %d", c.Requests["Fetch"], c.FetchedBatches, c.FetchedRecords, n)
	}
	if c.Seconds["Produce"] <= 0 {
		t.Errorf("produce wait %v s, want > 0", c.Seconds["Produce"])
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range s.DataPoints {
					key := m.Name
					if api, ok := dp.Attributes.Value("api"); ok {
						key += "|" + api.AsString()
					}
					got[key] += dp.Value
				}
			}
		}
	}
	// Reported after the reads above: at least what was counted then.
	for key, want := range map[string]int64{MetricKafkaRequests + "|Produce": n, MetricKafkaProducedRecords: n, MetricKafkaProducedBatches: n, MetricKafkaFetchedRecords: n} {
		if got[key] < want {
			t.Errorf("%s = %d, want ≥ %d (all: %v)", key, got[key], want, got)
		}
	}
	if got[MetricKafkaRequests+"|Fetch"] < 1 {
		t.Errorf("no fetch requests reported: %v", got)
	}
}
