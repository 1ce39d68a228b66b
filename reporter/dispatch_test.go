package reporter

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// bareRun is a run with no Kafka client and no workers: the state that
// leasing and dispatch work on, with n fresh reports of partition 0
// (offsets 0..n-1) queued.
func bareRun(t *testing.T, concurrency, n int) (*run, *partState) {
	t.Helper()
	met, err := newMetrics(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &Reporter{cfg: Config{Concurrency: concurrency, PartnerURL: "http://partner.test"}.withDefaults(), met: met}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rn := r.newRun(ctx, cancel)
	ps := &partState{key: tpKey{"p.reports", 0}, unsure: map[*job]struct{}{}, recovered: map[int64]recState{}}
	rn.parts[ps.key] = ps
	for i := range n {
		rn.fresh.push(&job{ps: ps, rec: &kgo.Record{Topic: "p.reports", Offset: int64(i)}, id: "report-" + strconv.Itoa(i)})
	}
	return rn, ps
}

// TestLeaseWaitsForRoom: a lease is taken only once there is room for a
// quarter of the lease room (leaseChunk), and its one marker names every offset it covers. A lease
// per freed slot made one marker record per 2–3 reports.
func TestLeaseWaitsForRoom(t *testing.T) {
	const conc = 8
	rn, ps := bareRun(t, conc, 100)
	rn.mu.Lock()
	defer rn.mu.Unlock()

	l, marks := rn.takeLease()
	if l == nil || len(l.jobs) != baseLeaseRoom(conc, conc) || len(marks) != 1 {
		t.Fatalf("first lease: %v jobs, %d markers; want %d jobs in 1 marker", l, len(marks), baseLeaseRoom(conc, conc))
	}
	var m schemas.Lease
	if err := json.Unmarshal(marks[0].rec.Value, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Offsets) != 1 || m.Offsets[0] != [2]int64{0, int64(baseLeaseRoom(conc, conc) - 1)} {
		t.Fatalf("marker offsets %v, want [[0 %d]]", m.Offsets, baseLeaseRoom(conc, conc)-1)
	}
	if l2, _ := rn.takeLease(); l2 != nil {
		t.Fatalf("a second lease with no room: %d jobs", len(l2.jobs))
	}

	// The marker is acknowledged; the workers take reports one by one.
	rn.mu.Unlock()
	rn.leaseAcked(l, ps, &kgo.Record{Partition: 0, Offset: 7}, nil)
	rn.mu.Lock()
	for i := 1; i < leaseChunk(conc, conc); i++ {
		rn.leased.pop()
		if l2, _ := rn.takeLease(); l2 != nil {
			t.Fatalf("lease taken with room for %d (< %d): %d jobs", i, leaseChunk(conc, conc), len(l2.jobs))
		}
	}
	rn.leased.pop()
	l2, marks2 := rn.takeLease()
	if l2 == nil || len(l2.jobs) != leaseChunk(conc, conc) || len(marks2) != 1 {
		t.Fatalf("lease with room for %d: %v, %d markers", leaseChunk(conc, conc), l2, len(marks2))
	}
}

// TestCapOnPostsAtStake: posts in flight and answers not acknowledged by
// Kafka together stay under 2 × Concurrency (what a crash can re-post), and
// every acknowledgement lets one held worker go, also when several come
// back to back (the acknowledgements of one produce request).
func TestCapOnPostsAtStake(t *testing.T) {
	const conc = 4
	rn, _ := bareRun(t, conc, 100)
	rn.mu.Lock()
	for range 40 {
		j := rn.take()
		j.leasedOnly = true
		rn.leased.push(j)
	}
	// One post in flight, answers of 2 × conc - 1 on their way to Kafka.
	rn.inflight, rn.unrecorded = 1, 2*conc-1
	if j := rn.next(); j != nil {
		t.Fatalf("next handed out report %s with %d posts at stake (cap %d)", j.id, rn.atStake(), 2*conc)
	}
	rn.mu.Unlock()

	// The other three workers wait for room, as worker does.
	got := waitingWorkers(t, rn, 3)
	waitIdle(t, rn, 3)

	// Three acknowledgements back to back, under one lock each.
	for range 3 {
		rn.recorded()
	}
	for i := range 3 {
		select {
		case j := <-got:
			if j == nil {
				t.Fatal("a worker got no report")
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 3 held workers went after 3 acknowledgements", i)
		}
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.atStake() != 2*conc {
		t.Fatalf("%d posts at stake after the three went, want %d", rn.atStake(), 2*conc)
	}
	if j := rn.next(); j != nil {
		t.Fatalf("next handed out report %s over the cap", j.id)
	}
}

// ctxAPI answers every report 200 and keeps the trace context of the last
// post's ctx.
type ctxAPI struct{ sc trace.SpanContext }

func (a *ctxAPI) ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error) {
	a.sc = trace.SpanContextFromContext(ctx)
	return partnerapi.ReportResult{Meta: partnerapi.Meta{Status: 200}, Message: "ok"}, nil
}

func (a *ctxAPI) Session(context.Context) (partnerapi.Meta, error) {
	return partnerapi.Meta{Status: 200}, nil
}

// TestTraceContextWithTracingOff: with no tracer provider no span is
// started, but the trace context of the report's record still reaches the
// partner API's request and the Delivery record (its trace_id and headers).
func TestTraceContextWithTracingOff(t *testing.T) {
	rn, _ := bareRun(t, 2, 1)
	if rn.met.tracing {
		t.Fatal("a nil TracerProvider is taken for tracing")
	}
	api := &ctxAPI{}
	rn.api = api
	const tid = "4bf92f3577b34da6a3ce929d0e0e4736"
	j := rn.fresh.pop()
	j.body = []byte(`{"track_id":1}`)
	j.rec.Headers = []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-" + tid + "-00f067aa0ba902b7-01")}}
	rec := rn.post(j)
	if got := api.sc.TraceID().String(); got != tid {
		t.Fatalf("the partner API's request carries trace %q, want %s", got, tid)
	}
	var d schemas.Delivery
	if err := json.Unmarshal(rec.Value, &d); err != nil {
		t.Fatal(err)
	}
	if d.TraceID != tid || d.Outcome != schemas.OutcomeDelivered {
		t.Fatalf("delivery record: trace %q outcome %q, want %s delivered", d.TraceID, d.Outcome, tid)
	}
	var tp string
	for _, h := range rec.Headers {
		if h.Key == "traceparent" {
			tp = string(h.Value)
		}
	}
	if !strings.Contains(tp, tid) {
		t.Fatalf("delivery record's traceparent %q does not carry trace %s", tp, tid)
	}
}

// TestWakeOnePerReport: idle workers are woken one per report they may
// post, not all at once: with 20 workers waiting and 3 reports leased, 3
// go and 17 stay asleep (a broadcast to every idle worker per lease was a
// stampede once the limit allowed a thousand).
func TestWakeOnePerReport(t *testing.T) {
	const workers = 20
	rn, _ := bareRun(t, 32, 3)
	got := waitingWorkers(t, rn, workers)
	waitIdle(t, rn, workers)
	rn.mu.Lock()
	for range 3 {
		j := rn.take()
		j.leasedOnly = true
		rn.leased.push(j)
	}
	rn.jobsReady()
	if rn.idle != workers-3 {
		t.Errorf("%d workers left idle after waking for 3 reports, want %d", rn.idle, workers-3)
	}
	rn.mu.Unlock()
	for range 3 {
		select {
		case j := <-got:
			if j == nil {
				t.Fatal("a woken worker found no report")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a woken worker did not take its report")
		}
	}
	select {
	case j := <-got:
		t.Fatalf("a fourth worker woke (report %v)", j)
	case <-time.After(50 * time.Millisecond): // a real wait: nothing may happen in it
	}
}

// waitingWorkers starts n goroutines that take a report as worker does:
// next, or wait on cond (counted idle) until a wake-up lets them try again.
// Each sends what it took on the channel returned; the test's cleanup makes
// those still waiting exit (they send nil).
func waitingWorkers(t *testing.T, rn *run, n int) <-chan *job {
	t.Helper()
	got := make(chan *job, n)
	for range n {
		go func() {
			rn.mu.Lock()
			j := rn.next()
			for ; j == nil && !rn.exiting; j = rn.next() {
				rn.idle++ // the waker counts it out (wakeWorkers)
				rn.cond.Wait()
			}
			rn.mu.Unlock()
			got <- j
		}()
	}
	t.Cleanup(func() {
		rn.mu.Lock()
		rn.exiting, rn.idle = true, 0
		rn.cond.Broadcast()
		rn.mu.Unlock()
	})
	return got
}

// waitIdle waits until n workers wait on cond (polling: the goroutines
// reach cond.Wait on their own, no timer involved).
func waitIdle(t *testing.T, rn *run, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, func() bool {
		rn.mu.Lock()
		defer rn.mu.Unlock()
		return rn.idle == n
	})
}

// TestTokenBackWakesIdleWorkers: a worker that found the retry budget
// empty goes idle; once a token is back, the coordinator's next look wakes
// it, also when the timer that woke it before has fired already (the
// worker looked an instant before the refill completed). Without that, a
// reporter with no post out stalled for good: no answer or acknowledgement
// was left to wake anyone.
func TestTokenBackWakesIdleWorkers(t *testing.T) {
	rn, _ := bareRun(t, 4, 1)
	clk := newFakeClock()
	rn.cfg.Clock, rn.cfg.Now = clk, clk.Now
	rn.thr = newThrottle(rn.cfg, clk.Now())
	rn.thr.tokens = 0.5
	rn.log = testLogger(t)
	got := waitingWorkers(t, rn, 1)
	waitShed := func(shed int64) {
		t.Helper()
		waitFor(t, 5*time.Second, func() bool {
			rn.mu.Lock()
			defer rn.mu.Unlock()
			return rn.idle == 1 && rn.thr.shed == shed
		})
	}
	waitIdle(t, rn, 1)

	// A report is leased: the worker wakes, finds no token, goes idle.
	rn.mu.Lock()
	j := rn.take()
	j.leasedOnly = true
	rn.leased.push(j)
	rn.jobsReady()
	rn.mu.Unlock()
	waitShed(1)

	// The coordinator looks: the token is back in 0.5 / floor seconds.
	rn.mu.Lock()
	at := rn.nextWake(clk.Now())
	rn.mu.Unlock()
	want := clk.Now().Add(time.Duration(0.5 / DefaultBudgetFloor * float64(time.Second)))
	if !at.Equal(want) {
		t.Fatalf("the coordinator looks again at %v, want %v (when the token is back)", at, want)
	}
	select {
	case <-got:
		t.Fatal("the worker posted with no token")
	default:
	}

	// That instant passes; the coordinator looks again (its timer fired
	// already, or another wake-up): the worker goes.
	clk.Advance(time.Second)
	rn.mu.Lock()
	if at := rn.nextWake(clk.Now()); !at.IsZero() {
		t.Errorf("with a token back the coordinator still waits for %v", at)
	}
	rn.mu.Unlock()
	select {
	case j := <-got:
		if j == nil {
			t.Fatal("the woken worker found no report")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the worker stayed idle with a token back and a report leased")
	}
}

// TestLeaseRoomCoversTheMarkersRoundTrip: when the partner answers faster
// than Kafka acknowledges a lease marker, the room grows by the posts the
// limit allows during one marker's round trip (at most maxLeaseExtra × the
// limit), so that the workers do not wait for leases; toward a slower
// partner, or before either round trip is known, it is baseLeaseRoom's.
func TestLeaseRoomCoversTheMarkersRoundTrip(t *testing.T) {
	const conc, limit = 8, 100
	for _, c := range []struct {
		name         string
		post, marker time.Duration
		want         int
	}{
		{"nothing measured yet", 0, 0, baseLeaseRoom(conc, limit)},
		{"posts slower than markers", 50 * time.Millisecond, 4 * time.Millisecond, baseLeaseRoom(conc, limit) + limit*4/50},
		{"markers 4 times a post", time.Millisecond, 4 * time.Millisecond, baseLeaseRoom(conc, limit) + 4*limit},
		{"capped", time.Millisecond, 20 * time.Millisecond, baseLeaseRoom(conc, limit) + maxLeaseExtra*limit},
		{"half", 2 * time.Millisecond, time.Millisecond, baseLeaseRoom(conc, limit) + limit/2},
	} {
		t.Run(c.name, func(t *testing.T) {
			rn, _ := bareRun(t, conc, 2000)
			rn.mu.Lock()
			defer rn.mu.Unlock()
			rn.thr.lim.limit = limit
			rn.thr.lim.recent = c.post
			rn.markerRTT = c.marker
			l, _ := rn.takeLease()
			if l == nil || len(l.jobs) != c.want {
				n := 0
				if l != nil {
					n = len(l.jobs)
				}
				t.Fatalf("lease of %d reports, want %d (post %v, marker %v)", n, c.want, c.post, c.marker)
			}
		})
	}
}

// TestMarkerRTTIsAMovingMean: the first lease sets the marker round trip,
// later ones move it by an eighth of their difference.
func TestMarkerRTTIsAMovingMean(t *testing.T) {
	rn, _ := bareRun(t, 8, 0)
	rn.noteMarkerRTT(8 * time.Millisecond)
	if rn.markerRTT != 8*time.Millisecond {
		t.Fatalf("first: %v", rn.markerRTT)
	}
	rn.noteMarkerRTT(16 * time.Millisecond)
	if rn.markerRTT != 9*time.Millisecond {
		t.Fatalf("second: %v, want 9ms", rn.markerRTT)
	}
}
