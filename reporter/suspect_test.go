package reporter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// TestSuspects: a track is suspect after suspectStalls stalls over at
// least suspectAfter with none of its posts answered in between, cleared by
// one answer, forgotten after suspectFor without a stall; posts stalling
// together (a hiccup) make no track suspect; reports without a trackid
// never are.
func TestSuspects(t *testing.T) {
	now := time.Unix(1000, 0)
	var s suspects
	s.stalled(9, now)
	s.stalled(9, now.Add(time.Millisecond))
	if s.is(9) {
		t.Fatal("suspect after two stalls within a millisecond")
	}
	if s.answered(9) {
		t.Fatal("answered says a track that was not suspect was")
	}
	s.stalled(7, now)
	if s.is(7) {
		t.Fatal("suspect after one stall")
	}
	s.stalled(7, now.Add(suspectAfter))
	if !s.is(7) || s.is(8) {
		t.Fatalf("after two stalls %v apart: 7 suspect %v (want true), 8 suspect %v (want false)", suspectAfter, s.is(7), s.is(8))
	}
	if !s.answered(7) || s.is(7) {
		t.Fatal("an answer of the track: not reported as clearing a suspect, or still suspect")
	}
	s.stalled(7, now.Add(2*time.Second))
	s.stalled(7, now.Add(3*time.Second))
	s.at = now.Add(3*time.Second + suspectFor)
	if s.is(7) {
		t.Fatalf("still suspect %v after its last stall", suspectFor)
	}
	s.stalled(0, now)
	s.stalled(0, now)
	if s.is(0) {
		t.Fatal("a report without a trackid is suspect")
	}
	// Bounded: the tracks past suspectMax are never suspect, the stale
	// ones are swept to make room.
	at := now.Add(time.Hour)
	for i := range int64(suspectMax + 10) {
		s.stalled(100+i, at)
		s.stalled(100+i, at)
	}
	if len(s.tracks) > suspectMax {
		t.Fatalf("%d tracks remembered, at most %d", len(s.tracks), suspectMax)
	}
	s.stalled(1, at.Add(suspectFor))
	s.stalled(1, at.Add(suspectFor+suspectAfter))
	if !s.is(1) || len(s.tracks) != 1 {
		t.Fatalf("after the stale ones were swept: track 1 suspect %v, %d tracks", s.is(1), len(s.tracks))
	}
}

func TestTrackKey(t *testing.T) {
	for body, want := range map[string]int64{
		`{"trackid":666,"playedat":1}`:                  666,
		`{"playedat":1, "trackid" : 42 }`:               42,
		`{"sourcedetail":"trackid","trackid":5}`:        5,
		`{"sourcedetail":"a\"trackid\":9","trackid":3}`: 3,
		`{"playedat":1}`:                                0,
		`{"trackid":"x"}`:                               0,
		`{"trackid":-4}`:                                0,
		`{"trackid":123456789012345678901234567890}`:    123456789012345678,
	} {
		if got := trackKey([]byte(body)); got != want {
			t.Errorf("trackKey(%s) = %d, want %d", body, got, want)
		}
	}
}

// TestSuspectTrackWaitsAside: the partner holds every report of one track
// past the client's timeout, a sixth of the reports, and the reporter has
// 8 slots in all (--concurrency = --max-concurrency 8). Without the
// suspect-track rule every fresh report of the track holds a slot for the
// whole timeout: 100 of them take ≥ 12 s of the 8 slots, and the other
// reports wait behind them. With it, once the track is suspect its fresh
// reports wait aside within one slot (suspectCap), and the other 500 are
// delivered within a few seconds, each once.
func TestSuspectTrackWaitsAside(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 2)
	e.group = "reporter-suspect"
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{TrackIDs: []int64{666}, TrackStatus: 500, Hold: 3 * time.Second}})
	for i := range 20 {
		e.publish(fmt.Sprintf("sg-%d", i), 25, 0, 0)
		e.publishTrack(fmt.Sprintf("sh-%d", i), 5, 666)
	}
	api, err := partnerapi.New(partnerapi.Config{
		BaseURL:     e.sb.URL,
		Credentials: partnerapi.Credentials{ClientID: e.sb.ClientID, ClientSignature: e.sb.ClientSignature},
		UserAgent:   testUA, MaxConns: 64, RequestTimeout: time.Second,
		Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close)
	cfg := e.config()
	cfg.Concurrency, cfg.MaxConcurrency = 8, 8
	start := time.Now()
	stop := e.start(cfg, api)
	e.waitLedger(60 * time.Second)
	took := time.Since(start)
	held := e.sb.Counts().Injected
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	t.Logf("the 500 other reports delivered in %v; %d posts of the hanging track held meanwhile", took.Round(10*time.Millisecond), held)
	if took > 8*time.Second {
		t.Errorf("the other reports took %v behind the hanging track's fresh reports, want < 8 s", took)
	}
}

// TestHangingTrackParksItsReports: once a report of a suspect track spent
// its whole retry budget, or its reports together spent one, the track's
// reports are parked at their next failure; a report of another track, or
// of the track once one of its posts was answered again, spends a budget
// of its own.
func TestHangingTrackParksItsReports(t *testing.T) {
	clk := newFakeClock()
	cfg := Config{ParkAfterAttempts: 3, ParkAfter: time.Minute, Clock: clk, Logger: testLogger(t)}.withDefaults()
	r := &Reporter{cfg: cfg, log: cfg.Logger}
	rn := r.newRun(context.Background(), func() {})
	sus := &rn.thr.lim.sus
	const hanging, other = 777, 42
	sus.stalled(hanging, clk.Now())
	sus.stalled(hanging, clk.Now().Add(2*time.Second))
	if !sus.is(hanging) {
		t.Fatal("a track with two stalls 2 s apart is not suspect")
	}
	// fails counts the failures of j until its budget is spent (others
	// answered in between, 30 s apart: the default timeout's pace).
	fails := func(j *job) int {
		for i := 1; i <= 100; i++ {
			clk.Advance(30 * time.Second)
			rn.successes += 10
			j.attempt++
			if rn.budgetSpent(j) {
				return i
			}
		}
		return 0
	}
	newJob := func(track int64) *job { return &job{id: "r", rec: &kgo.Record{}, ps: &partState{}, track: track} }
	if n := fails(newJob(hanging)); n != 3 {
		t.Fatalf("the first report of the hanging track spent its budget at failure %d, want 3 (its own budget)", n)
	}
	j := newJob(hanging)
	if n := fails(j); n != 1 || !j.trackHangs {
		t.Errorf("the next report of the hanging track: spent at failure %d (trackHangs %v), want 1", n, j.trackHangs)
	}
	if n := fails(newJob(other)); n != 3 {
		t.Errorf("a report of another track: spent at failure %d, want 3", n)
	}
	sus.answered(hanging)
	if n := fails(newJob(hanging)); n != 3 {
		t.Errorf("a report of the track answered again: spent at failure %d, want 3", n)
	}

	// Together: three reports of another suspect track fail once each, 30 s
	// apart: the track's budget (3 failures over a minute) is spent by the
	// third, which is parked at its first failure, and so is the next.
	const together = 888
	sus.stalled(together, clk.Now())
	sus.stalled(together, clk.Now().Add(2*time.Second))
	once := func(j *job) bool {
		clk.Advance(30 * time.Second)
		rn.successes += 10
		j.attempt++
		return rn.budgetSpent(j)
	}
	for i, want := range []bool{false, false, true, true} {
		j := newJob(together)
		if got := once(j); got != want || j.trackHangs != want {
			t.Errorf("report %d of a track failing together: spent at its first failure %v (trackHangs %v), want %v", i+1, got, j.trackHangs, want)
		}
	}
}
