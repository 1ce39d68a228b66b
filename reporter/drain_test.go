package reporter

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// TestSlowLaneDrainsParkedLot: a lot of parked reports all due (the
// partner is back) drains at the slow lane's parallel pace: every report
// delivered once, and the rate logged. N is 2 000 by default
// (PLAYPIPE_DRAIN_N=10000 for the figure in docs/reporter.md); the lot is
// built directly: the reports in <prefix>.reports below the group's
// committed offset, an entry each in <prefix>.parked, due now.
func TestSlowLaneDrainsParkedLot(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("PLAYPIPE_DRAIN_N")); err == nil && v > 0 {
		n = v
	}
	e := newE2E(t, 1)
	e.group = "reporter-drain"
	topics := e.kafka.Config.Topics()
	var recs []*kgo.Record
	tps := make([]schemas.TrackPlay, n)
	for i := range n {
		tps[i] = play(fmt.Sprintf("lot-%d", i), false, false)
		v, err := json.Marshal(tps[i])
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: topics.Reports, Partition: 0, Key: []byte(tps[i].ReportID), Value: v})
		e.delivered[tps[i].ReportID] = true
	}
	cl := e.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// Settled: the group's commit is past them (parked, as the parked
	// Delivery records would have settled them).
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: topics.Reports, Partition: 0, At: recs[n-1].Offset + 1, LeaderEpoch: -1})
	if _, err := kadm.NewClient(cl).CommitOffsets(ctx, e.group, offs); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	entries := make([]*kgo.Record, n)
	for i, r := range recs {
		body, _ := json.Marshal(tps[i].Report)
		v, _ := json.Marshal(schemas.Parked{V: schemas.ParkedVersion, ReportID: tps[i].ReportID, EventID: tps[i].EventID,
			Source: schemas.Source{Topic: topics.Reports, Partition: 0, Offset: r.Offset}, Report: body, Attempts: 3,
			Due: now.UnixMilli(), Status: 500, Reason: delivery.ReasonHTTP500, ParkedAt: now.UnixMilli()})
		entries[i] = &kgo.Record{Topic: topics.Parked, Partition: 0, Key: []byte(tps[i].ReportID), Value: v}
	}
	if err := cl.ProduceSync(ctx, entries...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cfg := e.config()
	cfg.ParkRetries = []time.Duration{time.Hour}
	start := time.Now()
	stop := e.start(cfg, e.client(testUA))
	e.waitLedger(5 * time.Minute)
	took := time.Since(start)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	t.Logf("%d parked reports drained in %v (%.0f a second; start and recovery included, embedded Kafka, shared machine)", n, took.Round(time.Millisecond), float64(n)/took.Seconds())
}
