package producertest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// Spans records every span of TracerProvider.
var Spans = tracetest.NewSpanRecorder()

// PromRegistry holds every metric of MeterProvider, as a role's /metrics
// would.
var PromRegistry = prometheus.NewRegistry()

// TracerProvider (recording into Spans) and MeterProvider (a Prometheus
// exporter writing to PromRegistry, as telemetry.Setup does) are the
// providers the tests hand to what they build (NewPublisher does); set by
// RunWithTelemetry. No otel global is set.
var (
	TracerProvider *sdktrace.TracerProvider
	MeterProvider  *sdkmetric.MeterProvider
)

// RunWithTelemetry is a TestMain body: it builds TracerProvider and
// MeterProvider before any test, runs the tests and exits with their code.
func RunWithTelemetry(m *testing.M) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(Spans))
	exp, err := promexporter.New(promexporter.WithRegisterer(PromRegistry))
	if err != nil {
		fmt.Fprintln(os.Stderr, "prometheus exporter:", err)
		os.Exit(1)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	TracerProvider, MeterProvider = tp, mp
	code := m.Run()
	_ = tp.Shutdown(context.Background())
	_ = mp.Shutdown(context.Background())
	os.Exit(code)
}

// StartedAtMS is the started_at of ValidEvent: 2023-11-14T22:13:20Z.
const StartedAtMS = 1700000000000

// Now is the tests' clock: two days after StartedAtMS, so that ValidEvent
// (and events up to 30 days older or a day newer) are plausible. NewPublisher
// and the gateway tests inject it; an event checked against the real time
// would be refused implausible_time.
func Now() time.Time { return time.UnixMilli(StartedAtMS + 2*24*3600*1000) }

// ValidEvent is a valid player event with event_id id.
func ValidEvent(id string) []byte {
	return []byte(fmt.Sprintf(`{"event_id":%q,"mix_id":42,"started_at":1700000000000,"offset_ms":1000,"duration_ms":60000,"user_id":"u-1","country":"DE","os":"iOS 17","device":"phone","vendor":3,"app":"x"}`, id))
}

// NewPublisher starts a Publisher on k (cfg's connection and topic prefix
// are k's; its nil providers TracerProvider and MeterProvider) that the
// test closes when it ends.
func NewPublisher(t testing.TB, k *testenv.Kafka, cfg producer.Config) *producer.Publisher {
	t.Helper()
	if cfg.TracerProvider == nil && TracerProvider != nil {
		cfg.TracerProvider = TracerProvider
	}
	if cfg.MeterProvider == nil && MeterProvider != nil {
		cfg.MeterProvider = MeterProvider
	}
	if cfg.Now == nil {
		cfg.Now = Now
	}
	cfg.Brokers, cfg.SASL, cfg.TLS, cfg.TopicPrefix = k.Config.Brokers, k.Config.SASL(), k.Config.TLSSettings(), k.Config.TopicPrefix
	p, err := producer.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// HeaderValue is the value of r's header key, "" without one.
func HeaderValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// ReadTopic reads topic from the start (read_committed) until it holds at
// least want records or 20 s pass, then keeps reading for a quiet period so
// that records beyond want are seen too (exact-count checks can fail).
func ReadTopic(t testing.TB, k *testenv.Kafka, topic string, want int) []*kgo.Record {
	t.Helper()
	cl := k.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	var out []*kgo.Record
	poll := func(d time.Duration) int {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		n := 0
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r); n++ })
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		poll(time.Second)
	}
	for poll(400*time.Millisecond) > 0 {
	}
	return out
}

// FailProduce answers every produce request for topic with
// TOPIC_AUTHORIZATION_FAILED (not retriable) from now on. Produce v13+ names
// topics by id, so the id is looked up first.
func FailProduce(t testing.TB, k *testenv.Kafka, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	td, err := kadm.NewClient(k.Client(t)).ListTopics(ctx, topic)
	if err != nil || td[topic].Err != nil {
		t.Fatalf("look up topic %s: %v %v", topic, err, td[topic].Err)
	}
	id := [16]byte(td[topic].ID)
	c := k.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		hit := false
		for _, t := range pr.Topics {
			hit = hit || t.Topic == topic || t.TopicID == id
		}
		if !hit {
			return nil, nil, false
		}
		return failedProduce(pr), nil, true
	})
}

// failedProduce answers every partition of pr with TOPIC_AUTHORIZATION_FAILED.
func failedProduce(pr *kmsg.ProduceRequest) *kmsg.ProduceResponse {
	resp := pr.ResponseKind().(*kmsg.ProduceResponse)
	for _, t := range pr.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, part := range t.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = part.Partition
			rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}
