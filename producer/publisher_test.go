package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/internal/testenv"
	"github.com/playpipe/playpipe/schemas"
)

func validEvent(id string) []byte {
	return []byte(fmt.Sprintf(`{"event_id":%q,"mix_id":42,"started_at":1700000000000,"offset_ms":1000,"duration_ms":60000,"user_id":"u-1","country":"DE","os":"iOS 17","device":"phone","vendor":3,"app":"x"}`, id))
}

func newTestPublisher(t *testing.T, k *testenv.Kafka, cfg PublisherConfig) *Publisher {
	t.Helper()
	cfg.Kafka = k.Config
	p, err := NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func TestPublisherPublishesValidRefusesInvalid(t *testing.T) {
	k := testenv.StartKafka(t, 3)
	p := newTestPublisher(t, k, PublisherConfig{})
	topics := k.Config.Topics()

	events := [][]byte{
		validEvent("ev-1"),
		[]byte(`{"event_id":"ev-bad","mix_id":42,"started_at":1700000000000,"offset_ms":0,"duration_ms":0,"user_id":"u","country":"DEU","os":"o","device":"d","vendor":1}`),
		validEvent("ev-2"),
		[]byte(`not json`),
		validEvent("ev-3"),
	}
	parent, parentSpan := otel.Tracer("test").Start(context.Background(), "fleet batch")
	results, err := p.Publish(parent, events)
	parentSpan.End()
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	wantStatus := []Status{StatusAccepted, StatusRefused, StatusAccepted, StatusRefused, StatusAccepted}
	wantID := []string{"ev-1", "ev-bad", "ev-2", "", "ev-3"}
	for i, r := range results {
		if r.Index != i || r.Status != wantStatus[i] || r.EventID != wantID[i] {
			t.Errorf("result %d: %+v, want status %s id %q", i, r, wantStatus[i], wantID[i])
		}
	}
	if !errors.Is(results[1].Err, ErrInvalidEvent) || len(results[1].Violations) != 2 ||
		results[1].Violations[0].Reason != schemas.ReasonBadDuration || results[1].Violations[1].Reason != schemas.ReasonBadCountry {
		t.Errorf("refused event: err %v violations %v", results[1].Err, results[1].Violations)
	}
	if !errors.Is(results[3].Err, ErrInvalidEvent) || results[3].Violations[0].Reason != schemas.ReasonMalformedJSON {
		t.Errorf("malformed event: %+v", results[3])
	}

	recs := readTopic(t, k, topics.Events, 3)
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
	if n := len(readTopic(t, k, topics.Rejected, 0)); n != 0 {
		t.Errorf("rejected topic holds %d records without WithRejections", n)
	}
}

func hasEndedSpan(id trace.SpanID) bool {
	for _, s := range spans.Ended() {
		if s.SpanContext().SpanID() == id && s.SpanKind() == trace.SpanKindProducer && strings.HasPrefix(s.Name(), "send ") {
			return true
		}
	}
	return false
}

func TestPublisherWithRejectionsAndHeaders(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	p := newTestPublisher(t, k, PublisherConfig{})
	topics := k.Config.Topics()
	bad := []byte(`{"event_id":"ev-x","mix_id":1}`)
	results, err := p.Publish(context.Background(), [][]byte{validEvent("ev-ok"), bad},
		WithHeaders(kgo.RecordHeader{Key: "fleet", Value: []byte("acme")}), WithRejections(topics.Rejected, "test"))
	if err != nil || results[0].Status != StatusAccepted || results[1].Status != StatusRefused || results[1].RejectionErr != nil {
		t.Fatalf("Publish: %v %+v", err, results)
	}
	rej := readTopic(t, k, topics.Rejected, 1)
	if len(rej) != 1 {
		t.Fatalf("rejected topic holds %d records, want 1", len(rej))
	}
	var r schemas.Rejection
	if err := json.Unmarshal(rej[0].Value, &r); err != nil {
		t.Fatal(err)
	}
	if r.V != schemas.RejectionVersion || r.EventID != "ev-x" || r.Raw != string(bad) || r.Source.Topic != "test" || r.Source.Offset != -1 ||
		r.Reason != schemas.ReasonMissingField || len(r.Violations) != len(results[1].Violations) || string(rej[0].Key) != "ev-x" {
		t.Errorf("rejection %+v", r)
	}
	ev := readTopic(t, k, topics.Events, 1)
	if len(ev) != 1 || headerValue(ev[0], "fleet") != "acme" || headerValue(ev[0], "traceparent") == "" {
		t.Fatalf("events: %d records, headers %v", len(ev), ev)
	}
}

func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestPublisherProduceFailure makes the broker refuse produce requests for
// the events topic: Publish must report the valid events as failed, never as
// accepted, and the events topic must stay empty.
func TestPublisherProduceFailure(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	topics := k.Config.Topics()
	failProduce(t, k, topics.Events)
	p := newTestPublisher(t, k, PublisherConfig{DeliveryTimeout: 2 * time.Second})
	results, err := p.Publish(context.Background(), [][]byte{validEvent("a"), []byte(`{}`), validEvent("b")})
	if !errors.Is(err, ErrNotPublished) {
		t.Fatalf("err = %v, want ErrNotPublished", err)
	}
	for _, i := range []int{0, 2} {
		if results[i].Status != StatusFailed || !errors.Is(results[i].Err, ErrNotPublished) {
			t.Errorf("result %d: %+v", i, results[i])
		}
	}
	if results[1].Status != StatusRefused {
		t.Errorf("invalid event: %+v", results[1])
	}
	if !errors.Is(results[0].Err, kerr.TopicAuthorizationFailed) {
		t.Errorf("cause not kept: %v", results[0].Err)
	}
}

// failProduce answers every produce request for topic with
// TOPIC_AUTHORIZATION_FAILED (not retriable) from now on. Produce v13+ names
// topics by id, so the id is looked up first.
func failProduce(t *testing.T, k *testenv.Kafka, topic string) {
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
		return resp, nil, true
	})
}

func TestPublisherClose(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	p := newTestPublisher(t, k, PublisherConfig{})
	if _, err := p.Publish(context.Background(), [][]byte{validEvent("a")}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	res, err := p.Publish(context.Background(), [][]byte{validEvent("b")})
	if !errors.Is(err, ErrClosed) || res[0].Status != StatusFailed {
		t.Fatalf("Publish after Close: %v %+v", err, res)
	}
}

func TestPublisherConfigValidation(t *testing.T) {
	for name, cfg := range map[string]PublisherConfig{
		"Kafka.Brokers":      {},
		"MaxBufferedRecords": {MaxBufferedRecords: -1},
		"--kafka-sasl":       {Kafka: kafkaCfg("SCRAM-MD5")},
	} {
		if name != "Kafka.Brokers" && cfg.Kafka.Brokers == nil {
			cfg.Kafka.Brokers = []string{"127.0.0.1:1"}
			cfg.Kafka.Partitions = 1
		}
		_, err := NewPublisher(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want one naming %s", name, err, name)
		}
	}
}

func kafkaCfg(sasl string) kafkax.Config {
	return kafkax.Config{Brokers: []string{"127.0.0.1:1"}, Partitions: 1, SASLMechanism: sasl, SASLUser: "u"}
}
