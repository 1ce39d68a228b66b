package producer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/producertest"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestPublisherPublishesValidRefusesInvalid(t *testing.T) {
	k := testenv.StartKafka(t, 3)
	p := producertest.NewPublisher(t, k, producer.Config{})
	topics := k.Config.Topics()

	events := [][]byte{
		producertest.ValidEvent("ev-1"),
		[]byte(`{"event_id":"ev-bad","mix_id":42,"started_at":1700000000000,"offset_ms":0,"duration_ms":0,"user_id":"u","country":"DEU","os":"o","device":"d","vendor":1}`),
		producertest.ValidEvent("ev-2"),
		[]byte(`not json`),
		producertest.ValidEvent("ev-3"),
	}
	parent, parentSpan := producertest.TracerProvider.Tracer("test").Start(context.Background(), "fleet batch")
	results, err := p.Publish(parent, events)
	parentSpan.End()
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	wantStatus := []producer.Status{producer.StatusAccepted, producer.StatusRefused, producer.StatusAccepted, producer.StatusRefused, producer.StatusAccepted}
	wantID := []string{"ev-1", "ev-bad", "ev-2", "", "ev-3"}
	for i, r := range results {
		if r.Index != i || r.Status != wantStatus[i] || r.EventID != wantID[i] {
			t.Errorf("result %d: %+v, want status %s id %q", i, r, wantStatus[i], wantID[i])
		}
	}
	if !errors.Is(results[1].Err, producer.ErrInvalidEvent) || len(results[1].Violations) != 2 ||
		results[1].Violations[0].Reason != schemas.ReasonBadDuration || results[1].Violations[1].Reason != schemas.ReasonBadCountry {
		t.Errorf("refused event: err %v violations %v", results[1].Err, results[1].Violations)
	}
	if !errors.Is(results[3].Err, producer.ErrInvalidEvent) || results[3].Violations[0].Reason != schemas.ReasonMalformedJSON {
		t.Errorf("malformed event: %+v", results[3])
	}

	recs := producertest.ReadTopic(t, k, topics.Events, 3)
	if len(recs) != 3 {
		t.Fatalf("events topic holds %d records, want the 3 valid ones", len(recs))
	}
	got := map[string]*kgo.Record{}
	for _, r := range recs {
		got[string(r.Key)] = r
	}
	for i, id := range []string{"ev-1", "ev-2", "ev-3"} {
		r := got[id]
		if r == nil {
			t.Fatalf("no record keyed %s", id)
		}
		if string(r.Value) != string(events[i*2]) {
			t.Errorf("value of %s is not the raw event verbatim: %s", id, r.Value)
		}
		res := results[i*2]
		if r.Partition != res.Partition || r.Offset != res.Offset {
			t.Errorf("%s at %d/%d, result says %d/%d", id, r.Partition, r.Offset, res.Partition, res.Offset)
		}
		// The record carries the trace of the caller, with a span of its own.
		sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), r))
		if !sc.IsValid() || sc.TraceID() != parentSpan.SpanContext().TraceID() {
			t.Errorf("%s: traceparent %v, want trace %s", id, sc, parentSpan.SpanContext().TraceID())
		}
		if !hasEndedSpan(sc.SpanID()) {
			t.Errorf("%s: traceparent span %s is not a recorded producer span", id, sc.SpanID())
		}
	}
	if n := len(producertest.ReadTopic(t, k, topics.Rejected, 0)); n != 0 {
		t.Errorf("rejected topic holds %d records for refused events", n)
	}
}

func hasEndedSpan(id trace.SpanID) bool {
	for _, s := range producertest.Spans.Ended() {
		if s.SpanContext().SpanID() == id && s.SpanKind() == trace.SpanKindProducer && strings.HasPrefix(s.Name(), "send ") {
			return true
		}
	}
	return false
}

// TestPublisherHeadersAndWriteRecords: WithHeaders adds headers after the
// trace context; a refused event is not sent anywhere by Publish; and
// WriteRecords writes records beside the events verbatim, and fails with
// ErrClosed after Close.
func TestPublisherHeadersAndWriteRecords(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	p := producertest.NewPublisher(t, k, producer.Config{})
	topics := k.Config.Topics()
	bad := []byte(`{"event_id":"ev-x","mix_id":1}`)
	results, err := p.Publish(context.Background(), [][]byte{producertest.ValidEvent("ev-ok"), bad},
		producer.WithHeaders(kgo.RecordHeader{Key: "fleet", Value: []byte("acme")}))
	if err != nil || results[0].Status != producer.StatusAccepted || results[1].Status != producer.StatusRefused ||
		results[1].EventID != "ev-x" || results[1].Violations[0].Reason != schemas.ReasonMissingField {
		t.Fatalf("Publish: %v %+v", err, results)
	}
	ev := producertest.ReadTopic(t, k, topics.Events, 1)
	if len(ev) != 1 || producertest.HeaderValue(ev[0], "fleet") != "acme" || producertest.HeaderValue(ev[0], "traceparent") == "" {
		t.Fatalf("events: %d records, headers %v", len(ev), ev)
	}
	rec := &kgo.Record{Topic: topics.Rejected, Key: []byte("ev-x"), Value: []byte(`{"v":1}`)}
	if errs := p.WriteRecords(context.Background(), []*kgo.Record{rec}); errs[0] != nil {
		t.Fatalf("WriteRecords: %v", errs[0])
	}
	rej := producertest.ReadTopic(t, k, topics.Rejected, 1)
	if len(rej) != 1 || string(rej[0].Key) != "ev-x" || string(rej[0].Value) != `{"v":1}` {
		t.Fatalf("rejected topic: %v", rej)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if errs := p.WriteRecords(context.Background(), []*kgo.Record{rec}); !errors.Is(errs[0], producer.ErrClosed) {
		t.Fatalf("WriteRecords after Close: %v", errs[0])
	}
}

// TestPublisherProduceFailure makes the broker refuse produce requests for
// the events topic: Publish must report the valid events as failed, never as
// accepted, and the events topic must stay empty.
func TestPublisherProduceFailure(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	topics := k.Config.Topics()
	producertest.FailProduce(t, k, topics.Events)
	p := producertest.NewPublisher(t, k, producer.Config{DeliveryTimeout: 2 * time.Second})
	results, err := p.Publish(context.Background(), [][]byte{producertest.ValidEvent("a"), []byte(`{}`), producertest.ValidEvent("b")})
	if !errors.Is(err, producer.ErrNotPublished) {
		t.Fatalf("err = %v, want producer.ErrNotPublished", err)
	}
	for _, i := range []int{0, 2} {
		if results[i].Status != producer.StatusFailed || !errors.Is(results[i].Err, producer.ErrNotPublished) {
			t.Errorf("result %d: %+v", i, results[i])
		}
	}
	if results[1].Status != producer.StatusRefused {
		t.Errorf("invalid event: %+v", results[1])
	}
	if !errors.Is(results[0].Err, kerr.TopicAuthorizationFailed) {
		t.Errorf("cause not kept: %v", results[0].Err)
	}
}

func TestPublisherClose(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	p := producertest.NewPublisher(t, k, producer.Config{})
	if _, err := p.Publish(context.Background(), [][]byte{producertest.ValidEvent("a")}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	res, err := p.Publish(context.Background(), [][]byte{producertest.ValidEvent("b")})
	if !errors.Is(err, producer.ErrClosed) || res[0].Status != producer.StatusFailed {
		t.Fatalf("Publish after Close: %v %+v", err, res)
	}
}

func TestPublisherConfigValidation(t *testing.T) {
	for name, cfg := range map[string]producer.Config{
		"Config.Brokers":     {},
		"MaxBufferedRecords": {MaxBufferedRecords: -1},
		"SASL.Mechanism":     {SASL: producer.SASL{Mechanism: "SCRAM-MD5", User: "u"}},
		"SASL.User":          {SASL: producer.SASL{Mechanism: "plain"}},
		"TLS.CAFile":         {TLS: producer.TLS{Enabled: true, CAFile: "/nonexistent/ca.pem"}},
		"host:port":          {Brokers: []string{"localhost"}},
	} {
		if name != "Config.Brokers" && cfg.Brokers == nil {
			cfg.Brokers = []string{"127.0.0.1:1"}
		}
		_, err := producer.NewPublisher(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want one naming %s", name, err, name)
		}
	}
}

// TestPublishAnswersByItsDeadlineWhenKafkaHangs holds every produce request
// unanswered (a frozen broker): Publish must return by its DeliveryTimeout
// (plus scheduling slack) with the event unknown — not failed, since the
// request was sent — and the record must land once the broker answers.
func TestPublishAnswersByItsDeadlineWhenKafkaHangs(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	p := producertest.NewPublisher(t, k, producer.Config{DeliveryTimeout: time.Second})
	if _, err := p.Publish(context.Background(), [][]byte{producertest.ValidEvent("warm")}); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	release := make(chan struct{})
	c := k.Cluster()
	var once sync.Once
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() { c.SleepControl(func() { <-release }) })
		return nil, nil, false
	})
	start := time.Now()
	results, err := p.Publish(context.Background(), [][]byte{producertest.ValidEvent("hung")})
	took := time.Since(start)
	close(release)
	if took > 1500*time.Millisecond {
		t.Errorf("Publish took %s with a 1s DeliveryTimeout", took)
	}
	if !errors.Is(err, producer.ErrUnacknowledged) || errors.Is(err, producer.ErrNotPublished) {
		t.Errorf("error %v, want ErrUnacknowledged (and not ErrNotPublished: it may be on the topic)", err)
	}
	if len(results) != 1 || results[0].Status != producer.StatusUnknown || results[0].EventID != "hung" {
		t.Fatalf("results %+v, want one unknown", results)
	}
	recs := producertest.ReadTopic(t, k, k.Config.Topics().Events, 2)
	if len(recs) != 2 || string(recs[1].Key) != "hung" {
		t.Fatalf("after the broker answered: %d records on the topic, want warm and hung", len(recs))
	}
}
