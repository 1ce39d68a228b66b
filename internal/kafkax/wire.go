package kafkax

import (
	"context"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Metrics of a role's Kafka traffic (Wire), scraped as
// playpipe_kafka_requests_total{api}, playpipe_kafka_request_seconds_total{api},
// playpipe_kafka_produced_batches_total, playpipe_kafka_produced_records_total,
// playpipe_kafka_fetched_batches_total and playpipe_kafka_fetched_records_total.
const (
	MetricKafkaRequests        = "playpipe.kafka.requests"
	MetricKafkaRequestSeconds  = "playpipe.kafka.request.seconds"
	MetricKafkaProducedBatches = "playpipe.kafka.produced.batches"
	MetricKafkaProducedRecords = "playpipe.kafka.produced.records"
	MetricKafkaFetchedBatches  = "playpipe.kafka.fetched.batches"
	MetricKafkaFetchedRecords  = "playpipe.kafka.fetched.records"
)

// Wire counts what a role's Kafka clients ask of the brokers, through
// franz-go's hooks (Config.Wire adds it to every client ClientOpts makes):
// requests per API key (Produce, Fetch, EndTxn, OffsetCommit, …) and the
// time each took from its write to the end of its answer (for a produce,
// the wait for its acknowledgement; for a fetch, its long poll included);
// record batches and records produced and fetched. They say where a role
// waits on the broker and what it costs the broker per play
// (docs/performance.md). The hooks add to atomic counters only; the
// metrics read them when scraped.
//
// A nil *Wire counts nothing. Safe for concurrent use.
type Wire struct {
	reqs  [kmsg.MaxKey + 1]atomic.Int64
	nanos [kmsg.MaxKey + 1]atomic.Int64

	prodBatches, prodRecords   atomic.Int64
	fetchBatches, fetchRecords atomic.Int64
}

var (
	_ kgo.HookBrokerE2E           = (*Wire)(nil)
	_ kgo.HookProduceBatchWritten = (*Wire)(nil)
	_ kgo.HookFetchBatchRead      = (*Wire)(nil)
)

// OnBrokerE2E implements kgo.HookBrokerE2E: one request written and its
// answer read (or failed).
func (w *Wire) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key < 0 || int(key) >= len(w.reqs) {
		return
	}
	w.reqs[key].Add(1)
	w.nanos[key].Add(int64(e2e.DurationE2E()))
}

// OnProduceBatchWritten implements kgo.HookProduceBatchWritten.
func (w *Wire) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.ProduceBatchMetrics) {
	w.prodBatches.Add(1)
	w.prodRecords.Add(int64(m.NumRecords))
}

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (w *Wire) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	w.fetchBatches.Add(1)
	w.fetchRecords.Add(int64(m.NumRecords))
}

// WireCounts are a Wire's totals so far.
type WireCounts struct {
	// Requests and Seconds are per API name (kmsg.NameForKey): requests
	// answered or failed, and their summed time from write to answer.
	Requests map[string]int64
	Seconds  map[string]float64
	// Record batches and records produced (written in produce requests)
	// and fetched (read from fetch answers, aborted ones included).
	ProducedBatches, ProducedRecords int64
	FetchedBatches, FetchedRecords   int64
}

// Counts returns the totals so far (zero for a nil Wire).
func (w *Wire) Counts() WireCounts {
	c := WireCounts{Requests: map[string]int64{}, Seconds: map[string]float64{}}
	if w == nil {
		return c
	}
	for k := range w.reqs {
		if n := w.reqs[k].Load(); n > 0 {
			name := kmsg.NameForKey(int16(k))
			c.Requests[name] = n
			c.Seconds[name] = float64(w.nanos[k].Load()) / 1e9
		}
	}
	c.ProducedBatches, c.ProducedRecords = w.prodBatches.Load(), w.prodRecords.Load()
	c.FetchedBatches, c.FetchedRecords = w.fetchBatches.Load(), w.fetchRecords.Load()
	return c
}

// NewWire returns a Wire whose counts mp's meter reports (nil: a no-op
// provider, counted but not reported); unregister ends the reporting.
func NewWire(mp metric.MeterProvider) (w *Wire, unregister func(), err error) {
	w = &Wire{}
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/playpipe/playpipe/internal/kafkax")
	reqs, err := m.Int64ObservableCounter(MetricKafkaRequests,
		metric.WithDescription("Kafka requests this role's clients made, by API (Produce, Fetch, EndTxn, OffsetCommit, …), answered or failed."))
	if err != nil {
		return w, func() {}, err
	}
	secs, err := m.Float64ObservableCounter(MetricKafkaRequestSeconds,
		metric.WithDescription("Summed time of this role's Kafka requests from write to answer, by API: for Produce the wait for the acknowledgement, for Fetch the long poll included."))
	if err != nil {
		return w, func() {}, err
	}
	var counters [4]metric.Int64ObservableCounter
	for i, d := range []struct{ name, desc string }{
		{MetricKafkaProducedBatches, "Record batches this role's clients wrote in produce requests."},
		{MetricKafkaProducedRecords, "Records this role's clients wrote in produce requests (retries counted again)."},
		{MetricKafkaFetchedBatches, "Record batches this role's clients read from fetch answers."},
		{MetricKafkaFetchedRecords, "Records this role's clients read from fetch answers (aborted and control records included)."},
	} {
		if counters[i], err = m.Int64ObservableCounter(d.name, metric.WithDescription(d.desc)); err != nil {
			return w, func() {}, err
		}
	}
	reg, err := m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		c := w.Counts()
		for name, n := range c.Requests {
			set := metric.WithAttributeSet(attribute.NewSet(attribute.String("api", name)))
			obs.ObserveInt64(reqs, n, set)
			obs.ObserveFloat64(secs, c.Seconds[name], set)
		}
		for i, v := range []int64{c.ProducedBatches, c.ProducedRecords, c.FetchedBatches, c.FetchedRecords} {
			obs.ObserveInt64(counters[i], v)
		}
		return nil
	}, reqs, secs, counters[0], counters[1], counters[2], counters[3])
	if err != nil {
		return w, func() {}, err
	}
	return w, func() { _ = reg.Unregister() }, nil
}

// Hooks returns the option that adds w's hooks to a client (none for a nil
// Wire): ClientOpts adds it; a client built on other settings (the ingest
// gateway's publisher) adds it itself.
func (w *Wire) Hooks() []kgo.Opt {
	if w == nil {
		return nil
	}
	return []kgo.Opt{kgo.WithHooks(w)}
}
