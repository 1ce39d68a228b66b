package sandbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// Concurrent clients over keep-alive connections: every report is recorded
// once, in Seq order, and duplicates are counted exactly across shards.
func TestLedgerConcurrentDuplicates(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	base := validReport(sb)
	const workers, perWorker, distinct = 8, 50, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wa := newAPI(t, sb)
			for i := range perWorker {
				r := wa.do("POST", "/partners/royalty-tracking", tok, with(base, "userid", fmt.Sprintf("u%d", (w*perWorker+i)%distinct)))
				if r.status != 200 {
					t.Errorf("status %d", r.status)
					return
				}
			}
		}()
	}
	wg.Wait()
	l := sb.Ledger()
	total := workers * perWorker
	if len(l.Accepted) != total || l.Duplicates != int64(total-distinct) {
		t.Fatalf("%d entries (want %d), %d duplicates (want %d)", len(l.Accepted), total, l.Duplicates, total-distinct)
	}
	firsts := map[string]bool{}
	for i, e := range l.Accepted {
		if i > 0 && e.Seq <= l.Accepted[i-1].Seq {
			t.Fatal("entries not in Seq order")
		}
		if !e.Duplicate {
			if firsts[*e.Report.UserID] {
				t.Fatalf("two non-duplicate entries for %s", *e.Report.UserID)
			}
			firsts[*e.Report.UserID] = true
		} else if !firsts[*e.Report.UserID] {
			t.Fatalf("duplicate of %s before its first", *e.Report.UserID)
		}
	}
	if since := sb.LedgerSince(l.Accepted[total-11].Seq); len(since.Accepted) != 10 {
		t.Fatalf("LedgerSince: %d entries", len(since.Accepted))
	}
}

func TestLedgerLimitDropsEntriesKeepsCounts(t *testing.T) {
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.MaxLedgerEntries = 3 })
	a := newAPI(t, sb)
	tok := a.session()
	for i := range 5 {
		wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, with(validReport(sb), "playedat", 1_763_000_000_000+i%2)), 200)
	}
	l := sb.Ledger()
	if c := sb.Counts(); c != (sandbox.LedgerCounts{Accepted: 5, Dropped: 2, Duplicates: 3}) {
		t.Fatalf("counts %+v", c)
	}
	if len(l.Accepted) != 3 || l.AcceptedCount != 5 || l.Dropped != 2 || l.Duplicates != 3 {
		t.Fatalf("kept %d, count %d, dropped %d, duplicates %d", len(l.Accepted), l.AcceptedCount, l.Dropped, l.Duplicates)
	}
}

func TestRegisterMetrics(t *testing.T) {
	sb := testenv.StartSandbox(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	reg, err := sb.RegisterMetrics(mp.Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	a := newAPI(t, sb)
	tok := a.session()
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, validReport(sb)), 200)
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, validReport(sb)), 200)
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, "{}"), 400)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					ep, _ := dp.Attributes.Value(attribute.Key("endpoint"))
					st, _ := dp.Attributes.Value(attribute.Key("status"))
					kind, _ := dp.Attributes.Value(attribute.Key("kind"))
					got[fmt.Sprintf("%s %s/%d/%s", m.Name, ep.AsString(), st.AsInt64(), kind.AsString())] = dp.Value
				}
			}
		}
	}
	for k, want := range map[string]int64{
		"playpipe.sandbox.responses report/200/": 2, "playpipe.sandbox.responses report/400/": 1,
		"playpipe.sandbox.reports /0/accepted": 2, "playpipe.sandbox.reports /0/duplicate": 1, "playpipe.sandbox.reports /0/rejected": 1,
	} {
		if got[k] != want {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], want, got)
		}
	}
}
