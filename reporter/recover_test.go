package reporter

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

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
			if resp, err := adm.CommitOffsets(ctx, e.group, offs); err == nil {
				err = resp.Error()
			} else {
				t.Fatalf("commit: %v", err)
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
