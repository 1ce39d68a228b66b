package sandbox_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestTrackFault: every report of the faulted track is answered the fault's
// status and kept as injected, never accepted; the other tracks are served;
// lifting the fault (PATCH, null) restores 200 and keeps the other faults.
func TestTrackFault(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	base := validReport(sb)
	bad := base["trackid"].(int64)
	var good int64
	for _, tr := range sb.Catalog().Mixes[1].Tracks {
		if tr.ID != bad {
			good = tr.ID
			break
		}
	}
	r := a.doURL("PUT", sb.AdminURL+"/admin/faults", "", map[string]any{"report": map[string]any{"track_ids": []int64{bad}, "body_over": 60000}})
	wantStatus(t, r, 200)
	for i := range 4 {
		r := a.do("POST", "/partners/royalty-tracking", tok, with(base, "playedat", int64(1_763_000_000_000+i)))
		wantStatus(t, r, 500)
		if string(r.body) != `{"error":true,"message":"internal service error"}` {
			t.Fatalf("track fault body %s", r.body)
		}
		wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, with(base, "trackid", good, "playedat", int64(1_763_000_000_000+i))), 200)
	}
	l := sb.Ledger()
	if l.AcceptedCount != 4 || l.InjectedCount != 4 || l.InjectedByStatus[500] != 4 || len(l.Injected) != 4 {
		t.Fatalf("ledger: accepted %d, injected %d %v (%d entries)", l.AcceptedCount, l.InjectedCount, l.InjectedByStatus, len(l.Injected))
	}
	for _, e := range l.Accepted {
		if e.Report.TrackID == bad {
			t.Fatalf("a report of the faulted track %d was accepted: %s", bad, e.Raw)
		}
	}
	for _, e := range l.Injected {
		var rep struct{ TrackID int64 }
		if err := json.Unmarshal([]byte(e.Raw), &rep); err != nil || rep.TrackID != bad || e.Status != 500 || e.Fault != sandbox.FaultTrack {
			t.Fatalf("injected entry %+v", e)
		}
	}
	if c := sb.Counts(); c.Injected != 4 || c.Accepted != 4 {
		t.Fatalf("counts %+v", c)
	}

	// Lift the track fault only: body_over stays.
	r = a.doURL("PATCH", sb.AdminURL+"/admin/faults", "", `{"report":{"track_ids":null}}`, "Content-Type", "application/json")
	wantStatus(t, r, 200)
	if f := sb.Faults(); len(f.Report.TrackIDs) != 0 || f.Report.BodyOver != 60000 {
		t.Fatalf("after the patch: %+v", f.Report)
	}
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, with(base, "playedat", int64(1_763_000_000_100))), 200)

	// Another status for a set of tracks: 400 in the validation envelope.
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{TrackIDs: []int64{good, bad}, TrackStatus: 400}})
	r = a.do("POST", "/partners/royalty-tracking", tok, with(base, "playedat", int64(1_763_000_000_200)))
	wantStatus(t, r, 400)
	if string(r.body) != `{"error":true,"message":"include the required fields: trackid"}` {
		t.Fatalf("track fault 400 body %s", r.body)
	}
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, with(base, "trackid", good)), 400)
	sb.SetFaults(sandbox.Faults{})
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, with(base, "playedat", int64(1_763_000_000_300))), 200)
}

// TestBodyOverFault: reports longer than body_over bytes get its status;
// shorter ones are served.
func TestBodyOverFault(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	small, err := json.Marshal(validReport(sb))
	if err != nil {
		t.Fatal(err)
	}
	big, err := json.Marshal(with(validReport(sb), "padding", strings.Repeat("x", 200)))
	if err != nil {
		t.Fatal(err)
	}
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{BodyOver: int64(len(small))}})
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, small), 200)
	r := a.do("POST", "/partners/royalty-tracking", tok, big)
	wantStatus(t, r, 413)
	if string(r.body) != `{"error":true,"message":"request entity too large"}` {
		t.Fatalf("body_over 413 body %s", r.body)
	}
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{BodyOver: int64(len(small)), BodyOverStatus: 503, RetryAfter: 1500 * time.Millisecond}})
	r = a.do("POST", "/partners/royalty-tracking", tok, big)
	wantStatus(t, r, 503)
	if got := r.header.Get("Retry-After"); got != "2" {
		t.Fatalf("Retry-After %q, want 2 (1.5 s rounded up)", got)
	}
	l := sb.Ledger()
	if l.AcceptedCount != 1 || l.InjectedCount != 2 || l.InjectedByStatus[413] != 1 || l.InjectedByStatus[503] != 1 {
		t.Fatalf("ledger: accepted %d, injected %d %v", l.AcceptedCount, l.InjectedCount, l.InjectedByStatus)
	}
	if l.Injected[0].Fault != sandbox.FaultBodyOver || l.Injected[0].Raw != string(big) {
		t.Fatalf("injected entry %+v", l.Injected[0])
	}
}

// TestRateFaultShares: over N posts in lean mode with latency, the share
// answered 500 is within a binomial bound; the same seed gives the same
// answers in the same order; every injected answer is in the ledger and no
// injected report is accepted.
func TestRateFaultShares(t *testing.T) {
	sb := testenv.StartSandbox(t, func(c *sandbox.Config) { c.Lean = true })
	a := newAPI(t, sb)
	tok := a.session()
	const n, p = 1000, 0.1
	run := func() []int {
		sb.Reset()
		sb.SetFaults(sandbox.Faults{Seed: 7, Report: sandbox.GroupFaults{Rate500: p, Latency: time.Millisecond}})
		codes := make([]int, n)
		for i := range n {
			codes[i] = a.do("POST", "/partners/royalty-tracking", tok, with(validReport(sb), "playedat", int64(1_763_000_000_000+i))).status
		}
		return codes
	}
	first := run()
	got := map[int]int{}
	for _, c := range first {
		got[c]++
	}
	// 5 standard deviations of Binomial(n, p).
	bound := 5 * math.Sqrt(n*p*(1-p))
	if math.Abs(float64(got[500])-n*p) > bound || got[200]+got[500] != n {
		t.Fatalf("rate %v over %d posts: %v (bound ±%.0f)", p, n, got, bound)
	}
	l := sb.Ledger()
	if l.InjectedCount != int64(got[500]) || l.InjectedByStatus[500] != int64(got[500]) || l.AcceptedCount != int64(got[200]) || l.Counters["report"][500] != int64(got[500]) {
		t.Fatalf("ledger: accepted %d, injected %d %v, counters %v; answers %v", l.AcceptedCount, l.InjectedCount, l.InjectedByStatus, l.Counters["report"], got)
	}
	for _, e := range l.Injected {
		if e.Fault != sandbox.FaultRate || e.Status != 500 {
			t.Fatalf("injected entry %+v", e)
		}
	}
	second := run()
	for i := range first {
		if first[i] != second[i] {
			t.Fatalf("seed 7: post %d answered %d, then %d on the replay", i, first[i], second[i])
		}
	}
}

// TestRate429And503: one draw splits the rates; 429 and 503 carry
// Retry-After when set, not otherwise.
func TestRate429And503(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate429: 0.5, Rate503: 0.5, RetryAfter: 3 * time.Second}})
	got := map[int]int{}
	for range 40 {
		r := a.do("POST", "/partners/royalty-tracking", tok, validReport(sb))
		got[r.status]++
		if r.header.Get("Retry-After") != "3" {
			t.Fatalf("%d without Retry-After: %v", r.status, r.header)
		}
		if r.status == 429 && string(r.body) != `{"error":true,"message":"too many requests"}` {
			t.Fatalf("429 body %s", r.body)
		}
	}
	if got[429] == 0 || got[503] == 0 || got[429]+got[503] != 40 {
		t.Fatalf("rates 0.5/0.5: %v", got)
	}
	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Rate429: 1}})
	r := a.do("GET", "/partners/mix/30001", tok, nil)
	wantEnvelope(t, r, 429, "too many requests")
	if r.header.Get("Retry-After") != "" {
		t.Fatalf("Retry-After without retry_after: %v", r.header)
	}
}

// TestFaultsValidateNew: the new fields are checked and named.
func TestFaultsValidateNew(t *testing.T) {
	for name, f := range map[string]sandbox.Faults{
		"mix: track_ids":          {Mix: sandbox.GroupFaults{TrackIDs: []int64{1}}},
		"report.track_status":     {Report: sandbox.GroupFaults{TrackIDs: []int64{1}, TrackStatus: 418}},
		"report.body_over_status": {Report: sandbox.GroupFaults{BodyOver: 10, BodyOverStatus: 200}},
		"report: rate_500":        {Report: sandbox.GroupFaults{Rate500: 0.6, Rate503: 0.6}},
		"report.rate_429":         {Report: sandbox.GroupFaults{Rate429: -1}},
		"report.retry_after":      {Report: sandbox.GroupFaults{RetryAfter: -time.Second}},
		"report.body_over":        {Report: sandbox.GroupFaults{BodyOver: -1}},
	} {
		err := f.Validate()
		if err == nil || !strings.Contains(err.Error(), strings.Split(name, " ")[0]) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	if err := (sandbox.Faults{Report: sandbox.GroupFaults{TrackIDs: []int64{1}, TrackStatus: 429, Rate500: 0.5, Rate429: 0.5}}).Validate(); err != nil {
		t.Errorf("valid faults refused: %v", err)
	}
	var f sandbox.Faults
	if err := json.Unmarshal([]byte(`{"report":{"rate500":1}}`), &f); err == nil {
		t.Error("a misspelt fault field was accepted")
	}
	if _, err := sandbox.New(sandbox.Config{Faults: sandbox.Faults{Mix: sandbox.GroupFaults{BodyOver: 5}}}); err == nil {
		t.Error("New accepted invalid starting faults")
	}
}

// TestStartingFaults: Config.Faults apply from the start and come back on
// Reset; DELETE /admin/faults lifts them.
func TestStartingFaults(t *testing.T) {
	start := sandbox.Faults{Report: sandbox.GroupFaults{TrackIDs: []int64{400001}}}
	sb := testenv.StartSandbox(t, func(c *sandbox.Config) { c.Faults = start })
	a := newAPI(t, sb)
	tok := a.session()
	rep := with(validReport(sb), "trackid", int64(400001))
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, rep), 500)
	wantStatus(t, a.doURL("DELETE", sb.AdminURL+"/admin/faults", "", nil), 200)
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, rep), 200)
	sb.Reset()
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, rep), 500)
}
