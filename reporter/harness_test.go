package reporter

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// e2e is one end-to-end setup: an embedded Kafka broker, the partner API
// sandbox on loopback, and the plays published to <prefix>.reports.
type e2e struct {
	t     testing.TB
	kafka *testenv.Kafka
	sb    *testenv.Sandbox
	group string

	mu        sync.Mutex
	delivered map[string]bool // report ids expected in the sandbox ledger, exactly once
	rejected  map[string]bool // report ids expected to be answered 400
	skipped   map[string]bool // below-minimum plays: never posted
	// kgoOpts are added to the reporter's Kafka client options.
	kgoOpts []kgo.Opt
}

func newE2E(t testing.TB, partitions int, opts ...func(*sandbox.Config)) *e2e {
	return newE2EOn(t, testenv.StartKafka(t, partitions), opts...)
}

// newE2EApache is newE2E on Apache Kafka (one node shared by the package's
// tests, topics of the test's own: testenv.SharedApacheKafka): the suites
// that carry the crash and exactly-once promises run there.
func newE2EApache(t testing.TB, partitions int, opts ...func(*sandbox.Config)) *e2e {
	return newE2EOn(t, testenv.SharedApacheKafka(t, partitions), opts...)
}

func newE2EOn(t testing.TB, k *testenv.Kafka, opts ...func(*sandbox.Config)) *e2e {
	return &e2e{
		t: t, kafka: k, sb: testenv.StartSandbox(t, opts...),
		group:     "reporter-test",
		delivered: map[string]bool{}, rejected: map[string]bool{}, skipped: map[string]bool{},
	}
}

// play builds the track play of event e, position 0. The report's userid is
// the report id, so that ledger entries map back to reports.
func play(event string, invalid, belowMin bool) schemas.TrackPlay {
	id := schemas.ReportID(event, 0)
	tp := schemas.TrackPlay{
		V: schemas.TrackPlayVersion, ReportID: id, EventID: event, MixID: 1, OverlapMS: 65_000,
		BelowMinimum: belowMin, DerivedAt: time.Now().UnixMilli(),
		Report: schemas.PlayReport{
			TrackID: 1001, PlayedAt: 1_700_000_000_000, PlayLength: 65, SourceStream: "mix",
			SourceDetail: "Test mix", OS: "android 14", Device: "phone", Country: "DE", Vendor: 7, UserID: id,
		},
	}
	if invalid {
		tp.Report.Country = "" // 400: include the required fields: country
	}
	return tp
}

// publish produces n plays named prefix-0 … prefix-(n-1); every
// rejectEvery-th is invalid and every belowEvery-th is below the minimum
// (0: none).
func (e *e2e) publish(prefix string, n, rejectEvery, belowEvery int) []*kgo.Record {
	e.t.Helper()
	var recs []*kgo.Record
	e.mu.Lock()
	for i := range n {
		inv := rejectEvery > 0 && i%rejectEvery == rejectEvery-1
		below := !inv && belowEvery > 0 && i%belowEvery == belowEvery-1
		tp := play(fmt.Sprintf("%s-%d", prefix, i), inv, below)
		switch {
		case inv:
			e.rejected[tp.ReportID] = true
		case below:
			e.skipped[tp.ReportID] = true
		default:
			e.delivered[tp.ReportID] = true
		}
		v, err := json.Marshal(tp)
		if err != nil {
			e.t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: e.kafka.Config.Topics().Reports, Key: []byte(tp.ReportID), Value: v})
	}
	e.mu.Unlock()
	e.produce(recs)
	return recs
}

func (e *e2e) produce(recs []*kgo.Record) {
	e.t.Helper()
	cl := e.kafka.Client(e.t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

// client returns a partner API client on the sandbox.
func (e *e2e) client(ua string) *partnerapi.Client {
	e.t.Helper()
	c, err := partnerapi.New(partnerapi.Config{
		BaseURL:     e.sb.URL,
		Credentials: partnerapi.Credentials{ClientID: e.sb.ClientID, ClientSignature: e.sb.ClientSignature},
		UserAgent:   ua, MaxConns: 64, RequestTimeout: 5 * time.Second,
		Logger: testLogger(e.t),
	})
	if err != nil {
		e.t.Fatalf("partnerapi.New: %v", err)
	}
	e.t.Cleanup(c.Close)
	return c
}

func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	switch os.Getenv("PLAYPIPE_TEST_LOG") {
	case "":
	case "stderr": // unbuffered, for runs that hang
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	default:
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p[:len(p)-1])); return len(p), nil }

// testGroupOpts make group membership changes fast in tests.
var testGroupOpts = []kgo.Opt{
	kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(300 * time.Millisecond),
	kgo.RebalanceTimeout(6 * time.Second),
}

func (e *e2e) config() Config {
	return Config{
		Kafka: e.kafka.Config, Group: e.group, Concurrency: 16,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 300 * time.Millisecond,
		ProbeInterval: 50 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
		Logger: testLogger(e.t),
	}
}

// start runs a reporter until the returned stop is called; stop returns Run's error.
func (e *e2e) start(cfg Config, api API) (stop func() error) {
	e.t.Helper()
	stop, _ = e.startRun(cfg, api)
	return stop
}

// startRun is start, and also returns a channel closed when Run returns
// (on its own, or after stop).
func (e *e2e) startRun(cfg Config, api API) (stop func() error, ended <-chan struct{}) {
	e.t.Helper()
	r, err := New(cfg, api)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	r.kgoOpts = append(append([]kgo.Opt(nil), testGroupOpts...), e.kgoOpts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = r.Run(ctx)
	}()
	var once sync.Once
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				e.t.Fatal("reporter did not stop within 30s")
			}
		})
		return runErr
	}
	e.t.Cleanup(func() { _ = stop() })
	return stop, done
}

// expectDelivered adds ids to the reports expected in the sandbox ledger
// exactly once (parked reports, once their fault is lifted).
func (e *e2e) expectDelivered(ids map[string]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range ids {
		e.delivered[id] = true
	}
}

// waitLedger waits until every expected report is in the sandbox ledger
// (accepted) and every expected rejection was answered.
func (e *e2e) waitLedger(timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l := e.sb.Ledger()
		missing := e.missing(l)
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("after %v: %d reports still missing from the ledger (e.g. %v); accepted %d, standby %d, rejected %d",
				timeout, len(missing), missing[:min(3, len(missing))], l.AcceptedCount, l.StandbyCount, l.RejectedCount)
		}
		time.Sleep(50 * time.Millisecond) // polls the sandbox's ledger (another component's progress)
	}
}

func (e *e2e) missing(l sandbox.LedgerSnapshot) []string {
	seen := map[string]bool{}
	for _, a := range l.Accepted {
		if a.Report.UserID != nil {
			seen[*a.Report.UserID] = true
		}
	}
	for _, r := range l.Rejected {
		var rep schemas.PlayReport
		if json.Unmarshal([]byte(r.Raw), &rep) == nil {
			seen[rep.UserID] = true
		}
	}
	var out []string
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range e.delivered {
		if !seen[id] {
			out = append(out, id)
		}
	}
	for id := range e.rejected {
		if !seen[id] {
			out = append(out, id)
		}
	}
	return out
}

// ledgerCounts returns how many times each report id was accepted live.
func (e *e2e) ledgerCounts() map[string]int {
	counts := map[string]int{}
	for _, a := range e.sb.Ledger().Accepted {
		id := "<no userid>"
		if a.Report.UserID != nil {
			id = *a.Report.UserID
		}
		counts[id]++
	}
	return counts
}

// checkExactlyOnce asserts that the ledger of accepted reports equals the
// expected set: none missing, none unexpected, none twice. It returns the
// number of reports accepted more than once when allowDup, failing otherwise.
func (e *e2e) checkExactlyOnce(allowDup bool) (dups int) {
	e.t.Helper()
	counts := e.ledgerCounts()
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range e.delivered {
		switch n := counts[id]; {
		case n == 0:
			e.t.Errorf("report %s missing from the ledger", id)
		case n > 1:
			dups += n - 1
			if !allowDup {
				e.t.Errorf("report %s accepted %d times", id, n)
			}
		}
	}
	for id, n := range counts {
		if !e.delivered[id] {
			e.t.Errorf("unexpected report %s in the ledger (%d times)", id, n)
		}
	}
	return dups
}

// committed returns the group's committed offsets and the end offsets of
// the reports topic, per partition.
func (e *e2e) committed() (committed, end map[int32]int64) {
	e.t.Helper()
	return e.committedWith(kadm.NewClient(e.kafka.Client(e.t)))
}

// committedWith is committed through adm (one client for many polls).
func (e *e2e) committedWith(adm *kadm.Client) (committed, end map[int32]int64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topic := e.kafka.Config.Topics().Reports
	offs, err := adm.FetchOffsets(ctx, e.group)
	if err != nil {
		e.t.Fatalf("fetch offsets: %v", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		e.t.Fatalf("end offsets: %v", err)
	}
	committed, end = map[int32]int64{}, map[int32]int64{}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			committed[o.Partition] = o.At
		}
	})
	ends.Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	return committed, end
}

// checkAllCommitted asserts that every partition is committed to its end.
func (e *e2e) checkAllCommitted() {
	e.t.Helper()
	committed, end := e.committed()
	for p, o := range end {
		if o > 0 && committed[p] != o {
			e.t.Errorf("partition %d committed at %d, end offset %d", p, committed[p], o)
		}
	}
}

// waitRestartDone waits, after a restart, until every expected report is
// in the ledger and then every partition committed to its end. The ledger
// complete does not say the restarted process holds every partition: one
// whose reports were all final before the restart is fetched and committed
// only once assigned (CI once sent SIGTERM before that).
func (e *e2e) waitRestartDone(ledger, commits time.Duration) {
	e.t.Helper()
	e.waitLedger(ledger)
	e.waitAllCommitted(commits)
}

// waitAllCommitted waits until every partition is committed to its end
// (the running reporter has finished every record published so far).
func (e *e2e) waitAllCommitted(timeout time.Duration) {
	e.t.Helper()
	adm := kadm.NewClient(e.kafka.Client(e.t))
	waitFor(e.t, timeout, func() bool {
		committed, end := e.committedWith(adm)
		for p, o := range end {
			if o > 0 && committed[p] != o {
				return false
			}
		}
		return true
	})
}

// deliveries reads every Delivery record published so far.
func (e *e2e) deliveries() []schemas.Delivery {
	e.t.Helper()
	var out []schemas.Delivery
	for _, r := range e.kafka.ReadAll(e.t, e.kafka.Config.Topics().Deliveries) {
		if kafkax.HasHeader(r, schemas.HeaderLease) {
			continue
		}
		var d schemas.Delivery
		if err := json.Unmarshal(r.Value, &d); err != nil {
			e.t.Fatalf("delivery record: %v", err)
		}
		if string(r.Key) != d.ReportID {
			e.t.Errorf("delivery key %q != report id %q", r.Key, d.ReportID)
		}
		out = append(out, d)
	}
	return out
}

// checkDeliveries asserts that each expected report has exactly one final
// Delivery record with the right outcome (when exact), and returns the
// records by outcome.
func (e *e2e) checkDeliveries(exact bool) map[string][]schemas.Delivery {
	e.t.Helper()
	byOutcome := map[string][]schemas.Delivery{}
	final := map[string][]string{}
	for _, d := range e.deliveries() {
		byOutcome[d.Outcome] = append(byOutcome[d.Outcome], d)
		if d.Outcome == schemas.OutcomeDelivered || d.Outcome == schemas.OutcomeRejected {
			final[d.ReportID] = append(final[d.ReportID], d.Outcome)
		}
		if d.Attempt < 1 || d.V != schemas.DeliveryVersion || d.At == 0 {
			e.t.Errorf("malformed delivery %+v", d)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range e.delivered {
		if len(final[id]) == 0 || final[id][0] != schemas.OutcomeDelivered || (exact && len(final[id]) != 1) {
			e.t.Errorf("report %s: final deliveries %v, want [delivered]", id, final[id])
		}
	}
	for id := range e.rejected {
		if len(final[id]) == 0 || final[id][0] != schemas.OutcomeRejected || (exact && len(final[id]) != 1) {
			e.t.Errorf("report %s: final deliveries %v, want [rejected]", id, final[id])
		}
	}
	for id := range e.skipped {
		if len(final[id]) != 0 {
			e.t.Errorf("below-minimum report %s has deliveries %v", id, final[id])
		}
	}
	return byOutcome
}

// The sandbox must be reachable under the default product User-Agent.
const testUA = "playpipe-reporter-test/1.0 (partner integration)"

var _ = kafkax.DefaultTopicPrefix
