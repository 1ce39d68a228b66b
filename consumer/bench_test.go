package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// benchRecords are valid events over the fake mixes, as fetched records.
func benchRecords(n int) ([]*kgo.Record, int) {
	mixes := refMixes(fakeMixes())
	var recs []*kgo.Record
	var bytes int
	for _, e := range genEvents(9, n*2, mixes, 999_999) {
		if e.wantReason != "" {
			continue
		}
		recs = append(recs, &kgo.Record{Topic: "plays.events", Key: e.key, Value: e.value, Timestamp: testArrival(e.value)})
		bytes += len(e.value)
		if len(recs) == n {
			break
		}
	}
	return recs, bytes / len(recs)
}

// BenchmarkEnrich measures the enrich step itself with a warm mix cache:
// parse and validate the event, look up the listing, split, encode every
// TrackPlay and build the output records; Kafka is not involved.
// It runs with tracing off (no exporter configured: the default) and on
// (every span sampled and handed to an exporter), to show what tracing costs.
func BenchmarkEnrich(b *testing.B) {
	b.Run("tracing=off", func(b *testing.B) { benchEnrich(b, nil) })
	b.Run("tracing=on", func(b *testing.B) {
		prov, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{SpanExporter: tracetest.NewNoopExporter()})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = shutdown(context.Background()) }()
		benchEnrich(b, prov.Tracer)
	})
}

// benchEnrich runs the benchmark with tp's tracer (nil: the no-op one, as
// an Enricher whose Config.TracerProvider is nil).
func benchEnrich(b *testing.B, tp trace.TracerProvider) {
	recs, avg := benchRecords(1000)
	cache, _ := NewMixCache(newFakeSource(fakeMixes()...), CacheConfig{})
	p := newProcessor(cache, kafkax.TopicsFor(""), schemas.ValidateOptions{}, SplitOptions{}, 8)
	p.tracer = telemetry.OrNoopTracerProvider(tp).Tracer(instrumentationName)
	ctx := context.Background()
	if _, err := p.process(ctx, ctx, recs, time.Now().UnixMilli(), noHold{}); err != nil { // warm the cache
		b.Fatal(err)
	}
	p.endTxn(false)
	b.ReportAllocs()
	b.ResetTimer()
	events, plays := 0, 0
	for b.Loop() {
		out, err := p.process(ctx, ctx, recs, 1_700_000_000_000, noHold{})
		if err != nil {
			b.Fatal(err)
		}
		events += len(recs)
		plays += len(out)
		p.endTxn(true)
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(plays)/float64(events), "plays/event")
	b.ReportMetric(float64(avg), "event-bytes")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkParseEvent isolates schemas.ParseEvent, the largest cost.
func BenchmarkParseEvent(b *testing.B) {
	recs, _ := benchRecords(1000)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for _, r := range recs {
			if _, vs := schemas.ParseEvent(r.Value, schemas.ValidateOptions{}); vs != nil {
				b.Fatal(vs)
			}
		}
		n += len(recs)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkAppendTrackPlay compares the hand-written appender with encoding/json.
func BenchmarkAppendTrackPlay(b *testing.B) {
	l := PrepareListing(testMix(), partnerapi.Meta{})
	ev := testEvent(170_000, 300_000)
	ev.Cached, ev.EndReason = ptr(true), ptr(int64(1))
	plays, _ := Split(nil, &ev, l, SplitOptions{})
	b.Run("appender", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for b.Loop() {
			buf = schemas.AppendTrackPlay(buf[:0], &plays[1])
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&plays[1]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEnrichKafka is a load run through the embedded broker: n events
// are published first (not timed), then one enricher consumes them in
// transactions and the time until everything is committed is measured.
// Run it with -benchtime 1x: each iteration is a whole run.
func BenchmarkEnrichKafka(b *testing.B) {
	const n = 100_000
	recs, _ := benchRecords(2000)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		k := testenv.StartKafka(b, 3)
		cl := k.Client(b, kgo.DefaultProduceTopic(k.Config.Topics().Events), kgo.ProducerLinger(5*time.Millisecond))
		batch := make([]*kgo.Record, 0, n)
		for j := 0; j < n; j++ {
			r := recs[j%len(recs)]
			// Distinct event ids so every play has its own report id.
			v := bytes.Replace(r.Value, []byte(`"event_id":"ev-`), []byte(`"event_id":"`+strconv.Itoa(j)+`-`), 1)
			batch = append(batch, &kgo.Record{Key: r.Key, Value: v, Timestamp: r.Timestamp})
		}
		if err := cl.ProduceSync(context.Background(), batch...).FirstErr(); err != nil {
			b.Fatal(err)
		}
		src := newFakeSource(fakeMixes()...)
		e, err := New(Config{Kafka: k.Config, Source: src, TransactionalID: "bench", Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { errc <- e.Run(ctx) }()
		for e.Stats().Events < n {
			time.Sleep(5 * time.Millisecond)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		st := e.Stats()
		b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
		b.ReportMetric(float64(st.Plays)/elapsed.Seconds(), "plays/s")
		b.ReportMetric(float64(st.Commits), "txns")
		b.ReportMetric(0, "ns/op")
		k.Close()
	}
}

// noHold is a holder that holds nothing (the processor alone).
type noHold struct{}

func (noHold) hold(it *item) bool { return false }
func (noHold) waited(int64) bool  { return false }
