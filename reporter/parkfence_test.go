package reporter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// TestParkFence: a reporter that lost a partition without being told (its
// successor claimed the partition's fence) cannot write the partition's
// parked state any more: its write fails as fenced and never becomes
// visible, while the successor's writes, 32 at once, all land. On the
// embedded broker and, when present, on Apache Kafka.
func TestParkFence(t *testing.T) { onBothBrokers(t, testParkFence) }

// onBothBrokers runs test on the embedded broker and, unless -short, on
// Apache Kafka, each with <prefix>.parked made.
func onBothBrokers(t *testing.T, test func(*testing.T, context.Context, func() *run)) {
	t.Run("kfake", func(t *testing.T) { fenceRuns(t, newE2E(t, 2), test) })
	t.Run("apache", func(t *testing.T) {
		if testing.Short() {
			t.Skip("Apache Kafka")
		}
		fenceRuns(t, newE2EApache(t, 2), test)
	})
}

// fenceRuns makes <prefix>.parked on e's broker and runs test with a
// context and a maker of runs (each a reporter process's, unconnected but
// for its admin client), ended when the test ends.
func fenceRuns(t *testing.T, e *e2e, test func(*testing.T, context.Context, func() *run)) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adm := kadm.NewClient(e.kafka.Client(t))
	if _, err := kafkax.EnsureParked(ctx, adm, e.kafka.Config); err != nil {
		t.Fatal(err)
	}
	newRun := func() *run {
		t.Helper()
		cfg := e.config().withDefaults()
		r := &Reporter{cfg: cfg, log: cfg.Logger}
		rn := r.newRun(context.Background(), func() {})
		rn.adm = adm
		t.Cleanup(func() {
			rn.endRun()
			rn.bg.Wait()
			rn.closeFences()
		})
		return rn
	}
	test(t, ctx, newRun)
}

func testParkFence(t *testing.T, ctx context.Context, newRun func() *run) {
	entry := func(rn *run, id string) *kgo.Record {
		return rn.parkRecord(0, id, &schemas.Parked{ReportID: id, Source: schemas.Source{Topic: rn.topics.Reports, Partition: 1}})
	}
	old, next := newRun(), newRun()
	if err := old.claimFences(ctx, []int32{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.parkWrite(1, entry(old, "r-1")); err != nil {
		t.Fatalf("the owner's write: %v", err)
	}
	if err := next.claimFences(ctx, []int32{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := next.parkWrite(1, next.parkRecord(0, "r-1", nil)); err != nil {
		t.Fatalf("the successor's tombstone: %v", err)
	}
	// The first write of the old owner meets INVALID_PRODUCER_EPOCH (its
	// producer's epoch is old), the next PRODUCER_FENCED: from then on the
	// fence is dead in the old run, and its slow retries end (ended).
	var err error
	for i := range 3 {
		_, err = old.parkWrite(1, entry(old, "r-1"))
		t.Logf("the old owner's write %d after the successor's claim: %v", i+1, err)
		if err == nil {
			t.Fatalf("the old owner's write %d after the successor's claim succeeded", i+1)
		}
	}
	if !errors.Is(err, errFenced) || !ended(err) {
		t.Errorf("the old owner's third write: %v, want fenced", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 32)
	for i := range errs {
		wg.Go(func() { _, errs[i] = next.parkWrite(1, entry(next, fmt.Sprintf("s-%d", i))) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("the successor's write %d of 32 at once: %v", i, err)
		}
	}

	// What a reader sees: r-1 removed; the old owner's write nowhere.
	var r1 []bool
	seen := map[string]bool{}
	if _, err := next.readParked(ctx, map[int32]int64{0: 0}, func(r *kgo.Record) {
		seen[string(r.Key)] = true
		if string(r.Key) == "r-1" {
			r1 = append(r1, len(r.Value) > 0)
		}
	}); err != nil {
		t.Fatalf("read the parked topic: %v", err)
	}
	if len(r1) != 2 || !r1[0] || r1[1] {
		t.Errorf("records of r-1 read (true: an entry): %v, want [true false] (the old owner's entry, the successor's removal)", r1)
	}
	if len(seen) != 33 {
		t.Errorf("%d report ids read, want 33", len(seen))
	}
}

// TestParkFenceFirstEntry: the main lane's first write of a parked report's
// entry is fenced too. An owner that lost the partition without being told
// (its successor claimed the fence, then delivered the report and removed
// its entry) and parks the report on waking writes nothing: the park ends
// as the partition's loss, the reporter goes on, and a reader of the
// parked topic finds the successor's removal last. Without the fence the
// late entry brought a delivered report back (TestParkedOwnerPausedPastSession).
func TestParkFenceFirstEntry(t *testing.T) { onBothBrokers(t, testParkFenceFirstEntry) }

func testParkFenceFirstEntry(t *testing.T, ctx context.Context, newRun func() *run) {
	old, next := newRun(), newRun()
	if err := old.claimFences(ctx, []int32{1}); err != nil {
		t.Fatal(err)
	}
	if err := next.claimFences(ctx, []int32{1}); err != nil {
		t.Fatal(err)
	}
	pp := next.parkedPart(1)
	const id = "r-late"
	if _, err := next.parkWrite(1, next.parkRecord(pp, id, &schemas.Parked{ReportID: id, Source: schemas.Source{Topic: next.topics.Reports, Partition: 1, Offset: 7}})); err != nil {
		t.Fatalf("the successor's entry: %v", err)
	}
	if _, err := next.parkWrite(1, next.parkRecord(pp, id, nil)); err != nil {
		t.Fatalf("the successor's removal: %v", err)
	}

	// The old owner wakes and parks the same report through its main lane.
	j := &job{id: id, rec: &kgo.Record{Topic: old.topics.Reports, Partition: 1, Offset: 7}}
	entry := &schemas.Parked{V: schemas.ParkedVersion, ReportID: id, Source: schemas.Source{Topic: old.topics.Reports, Partition: 1, Offset: 7}, Attempts: 3}
	rec := &kgo.Record{Topic: old.topics.Deliveries, Partition: 1, Value: []byte(`{}`)}
	recorded := make(chan struct{})
	old.setAside(j, entry, rec, func() { close(recorded) })
	select {
	case <-recorded:
	case <-ctx.Done():
		t.Fatal("the old owner's park never ended")
	}
	old.bg.Wait()
	if got := old.parking.Load(); got != 0 {
		t.Errorf("parks under way after the old owner's park ended: %d", got)
	}
	old.fatalMu.Lock()
	fatal := old.fatal
	old.fatalMu.Unlock()
	if fatal != nil {
		t.Errorf("the old owner stopped on the fence's refusal: %v", fatal)
	}
	var states []bool
	if _, err := next.readParked(ctx, map[int32]int64{pp: 0}, func(r *kgo.Record) {
		if string(r.Key) == id {
			states = append(states, len(r.Value) > 0)
		}
	}); err != nil {
		t.Fatalf("read the parked topic: %v", err)
	}
	if len(states) != 2 || !states[0] || states[1] {
		t.Errorf("records of %s read (true: an entry): %v, want [true false] (the successor's entry and removal; the old owner's entry nowhere)", id, states)
	}
}
