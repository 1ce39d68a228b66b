package reporter

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// TestRecoveryWithoutProgressLabelsDoubt: a committed offset whose
// metadata holds no readable progress (another writer's, or corrupt) says
// nothing of the reports past it: the previous owner may have posted any
// of them. Recovery falls back to the committed offset, loudly (a warning
// naming the partition and why), and every report it posts again from
// there is labelled in doubt, so that the audit counts a copy the partner
// may already have. Before, they were posted as if never sent.
func TestRecoveryWithoutProgressLabelsDoubt(t *testing.T) {
	for _, c := range []struct{ name, meta string }{
		{"unreadable", progressPrefix + "!!"},
		{"another writer's", "consumer-1-abc"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newE2E(t, 1)
			recs := e.publish("fb", 10, 0, 0)
			const committed = 3
			adm := kadm.NewClient(e.kafka.Client(t))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			topic := e.kafka.Config.Topics().Reports
			var offs kadm.Offsets
			offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: committed, LeaderEpoch: -1, Metadata: c.meta})
			if resp, err := adm.CommitOffsets(ctx, e.group, offs); err != nil || resp.Error() != nil {
				t.Fatalf("commit: %v %v", err, resp.Error())
			}
			e.mu.Lock()
			for _, r := range recs[:committed] {
				delete(e.delivered, string(r.Key)) // below the commit: never posted
			}
			e.mu.Unlock()

			var warned atomic.Int64
			cfg := e.config()
			cfg.Logger = slog.New(&countingHandler{Handler: testLogger(t).Handler(), prefix: "no readable progress", n: &warned})
			reader := sdkmetric.NewManualReader()
			cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			stop := e.start(cfg, e.client("playpipe-test/1.0"))
			e.waitLedger(30 * time.Second)
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			var n int
			for _, d := range e.deliveries() {
				if d.Outcome != schemas.OutcomeDelivered {
					continue
				}
				n++
				if !d.InDoubt {
					t.Errorf("report %s re-posted past a commit without readable progress, not labelled in doubt", d.ReportID)
				}
			}
			if n != len(recs)-committed {
				t.Errorf("%d reports delivered, want %d", n, len(recs)-committed)
			}
			if warned.Load() == 0 {
				t.Errorf("no warning that the partition was recovered without readable progress")
			}
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(ctx, &rm); err != nil {
				t.Fatal(err)
			}
			var fallbacks int64
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "playpipe.reporter.recovery_fallbacks" {
						for _, dp := range sum.DataPoints {
							fallbacks += dp.Value
						}
					}
				}
			}
			if fallbacks != 1 {
				t.Errorf("playpipe.reporter.recovery_fallbacks = %d, want 1", fallbacks)
			}
		})
	}
}

// postCounter passes posts to api and counts those of one report id.
type postCounter struct {
	API
	id    string
	posts atomic.Int64
}

func (c *postCounter) ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error) {
	if bytes.Contains(body, []byte(c.id)) {
		c.posts.Add(1)
	}
	return c.API.ReportPlayJSON(ctx, body)
}

// TestRecoverySlowLogPartitionIsNotTheEnd: a recovery reads two deliveries
// partitions; one is held by the broker for 4 s (its leader does not
// answer fetches: kfake strips it from every fetch) while the other keeps
// growing (other instances write to it). The held partition's tail holds
// the final answer of a report past the committed progress: the recovery
// must wait for it (or fail loudly), never take the quiet spell for the end
// of the log and post that final report again. Before, the read gave up
// after 2 s without a record in range and the report was posted again.
func TestRecoverySlowLogPartitionIsNotTheEnd(t *testing.T) {
	e := newE2E(t, 2)
	recs := e.publish("slow", 20, 0, 0)
	var x *kgo.Record // the first report of partition 1: final before the restart
	for _, r := range recs {
		if r.Partition == 1 && (x == nil || r.Offset < x.Offset) {
			x = r
		}
	}
	if x == nil || x.Offset != 0 {
		t.Fatalf("no report at offset 0 of partition 1: %v", x)
	}
	e.mu.Lock()
	delete(e.delivered, string(x.Key))
	e.mu.Unlock()

	topics := e.kafka.Config.Topics()
	cl := e.kafka.Client(t)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The previous owner: progress committed at offset 0 of both
	// partitions, then a record in each deliveries partition — partition 1
	// holds x's final answer.
	var offs kadm.Offsets
	for p := range int32(2) {
		offs.Add(kadm.Offset{Topic: topics.Reports, Partition: p, At: 0, LeaderEpoch: -1,
			Metadata: encodeProgress(&progress{Base: 0, LogPartition: p})})
	}
	if resp, err := adm.CommitOffsets(ctx, e.group, offs); err != nil || resp.Error() != nil {
		t.Fatalf("commit: %v %v", err, resp.Error())
	}
	del, err := json.Marshal(schemas.Delivery{V: schemas.DeliveryVersion, ReportID: string(x.Key), Outcome: schemas.OutcomeDelivered, Attempt: 1, HTTPStatus: 200})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: topics.Deliveries, Partition: 0, Value: []byte("another report partition's record")},
		&kgo.Record{Topic: topics.Deliveries, Partition: 1, Key: x.Key, Value: del,
			Headers: []kgo.RecordHeader{{Key: schemas.HeaderSource, Value: []byte("1:0:f")}}},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// Other instances keep writing to deliveries partition 0.
	stopWriter := make(chan struct{})
	var writer sync.WaitGroup
	writer.Go(func() {
		for {
			select {
			case <-stopWriter:
				return
			case <-time.After(100 * time.Millisecond):
			}
			cl.Produce(ctx, &kgo.Record{Topic: topics.Deliveries, Partition: 0, Value: []byte("other")}, nil)
		}
	})
	defer func() { close(stopWriter); writer.Wait() }()

	// Deliveries partition 1 is held for 4 s from its first fetch.
	tds, err := adm.ListTopics(ctx, topics.Deliveries)
	if err != nil {
		t.Fatal(err)
	}
	delivID := tds[topics.Deliveries].ID
	kc := e.kafka.Cluster()
	var heldUntil time.Time // the control function's (kfake runs them one at a time)
	var held atomic.Int64
	kc.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		req := kr.(*kmsg.FetchRequest)
		for i := range req.Topics {
			rt := &req.Topics[i]
			if rt.Topic != topics.Deliveries && rt.TopicID != delivID {
				continue
			}
			if heldUntil.IsZero() {
				heldUntil = time.Now().Add(4 * time.Second)
			}
			if time.Now().Before(heldUntil) {
				rt.Partitions = slices.DeleteFunc(rt.Partitions, func(p kmsg.FetchRequestTopicPartition) bool {
					if p.Partition == 1 {
						held.Add(1)
						return true
					}
					return false
				})
			}
		}
		return nil, nil, false
	})

	api := &postCounter{API: e.client("playpipe-test/1.0"), id: string(x.Key)}
	stop := e.start(e.config(), api)
	e.waitLedger(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if held.Load() == 0 {
		t.Fatal("no fetch of deliveries partition 1 was held: the test did not slow the recovery's read")
	}
	if n := api.posts.Load(); n != 0 {
		t.Fatalf("report %s, final in the log tail of the held partition, posted %d times after the restart", x.Key, n)
	}
}
