package reporter

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/reporter/delivery"
)

// watchMetadata polls the group's committed offsets every 20 ms until the
// returned stop is called, which returns the longest commit metadata seen
// on the reports topic.
func (e *e2e) watchMetadata() (stop func() int) {
	adm := kadm.NewClient(e.kafka.Client(e.t))
	topic := e.kafka.Config.Topics().Reports
	var longest atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if offs, err := adm.FetchOffsets(ctx, e.group); err == nil {
				offs.Each(func(o kadm.OffsetResponse) {
					if o.Topic == topic && int64(len(o.Metadata)) > longest.Load() {
						longest.Store(int64(len(o.Metadata)))
					}
				})
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond): // the watch's polling period (of Kafka, another process)
			}
		}
	})
	return func() int {
		cancel()
		wg.Wait()
		return int(longest.Load())
	}
}

// TestProgressWindowHolds: with a metadata bound of 256 bytes (a window of
// 785 offsets), one partition, 64 in flight and a 503 storm that leaves
// reports in backoff behind the commit point, the reporter leases only
// within the window: every commit's progress fits the bound (a broker
// would refuse a larger one), and every report is delivered exactly once.
func TestProgressWindowHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("a timed storm")
	}
	const n = 5000
	e := newE2E(t, 1)
	e.group = "reporter-window"
	e.publish("window", n, 0, 7)
	watch := e.watchMetadata()
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate503: 0.3}})
	cfg := e.config()
	cfg.Concurrency, cfg.MaxConcurrency, cfg.MetadataMaxBytes = 64, 256, 256
	// The storm's backoffs (20–300 ms) hold the commit point: they run on
	// the reporter's clock, driven 4 × faster than the real one.
	clk := newFakeClock()
	t.Cleanup(clk.Drive(4 * time.Millisecond)) // after the reporter's stop (cleanups run last first)
	cfg.Clock = clk
	if w := progressWindow(256); w != 785 {
		t.Fatalf("window of 256 bytes: %d offsets, want 785", w)
	}
	tooLarge := &countingHandler{Handler: cfg.Logger.Handler(), prefix: "partition progress larger", n: &atomic.Int64{}}
	cfg.Logger = slog.New(tooLarge)
	stop := e.start(cfg, e.client(testUA))
	waitFor(t, 60*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= n/2 })
	e.sb.SetFaults(sandbox.Faults{})
	e.waitLedger(2 * time.Minute)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	longest := watch()
	e.checkExactlyOnce(false)
	e.checkAllCommitted()
	e.checkDeliveries(false)
	t.Logf("longest commit metadata %d bytes (bound 256)", longest)
	if longest > 256 {
		t.Errorf("a commit carried %d bytes of metadata, over the bound 256", longest)
	}
	if k := tooLarge.n.Load(); k > 0 {
		t.Errorf("%d commits held back because the progress outgrew the bound: the window must keep it within", k)
	}
	if longest == 0 {
		t.Error("no commit metadata seen: the watch saw nothing")
	}
}

// countingHandler counts the records whose message starts with prefix.
type countingHandler struct {
	slog.Handler
	prefix string
	n      *atomic.Int64
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &countingHandler{Handler: h.Handler.WithAttrs(as), prefix: h.prefix, n: h.n}
}

func (h *countingHandler) WithGroup(g string) slog.Handler {
	return &countingHandler{Handler: h.Handler.WithGroup(g), prefix: h.prefix, n: h.n}
}

// TestHangingReportPastWindowParked: one report hangs (each post held
// until it times out) at its partition's commit point while the others
// flow. A partition leases at most the progress window past its commit
// point (785 offsets at a 256-byte metadata bound), which is far below
// MaxPending: the pressure rule parks the hanging report once the window
// is leased, and the other 3 000 reports are delivered, long before the
// retry budget (20 failures over 10 minutes) would have parked it. Before,
// the partition stopped at the window until then.
func TestHangingReportPastWindowParked(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 1)
	e.group = "reporter-window-hang"
	bad := e.publishTrack("hang", 1, 777)
	e.publish("good", 3000, 0, 0)
	partner := &hangPartner{badPartner: e.newBadPartner(bad)}
	partner.hang.Store(int64(500 * time.Millisecond))
	cfg := e.config()
	cfg.MetadataMaxBytes = 256
	cfg.ParkAfterAttempts, cfg.ParkAfter = 20, 10*time.Minute
	stop := e.start(cfg, partner)
	e.waitLedger(60 * time.Second)
	parked := e.parkedRecords()
	for id := range bad {
		d, ok := parked[id]
		if !ok {
			t.Fatalf("the hanging report %s is not parked", id)
		}
		if d.Attempt >= cfg.ParkAfterAttempts || d.Reason != delivery.ReasonTimeout {
			t.Errorf("parked record of the hanging report: attempt %d reason %q, want the pressure rule's (under %d attempts), timeout", d.Attempt, d.Reason, cfg.ParkAfterAttempts)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
