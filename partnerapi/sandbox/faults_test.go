package sandbox_test

import (
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestFaultsFailNext(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()

	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{FailNext: 2, FailNextStatus: 500}, Mix: sandbox.GroupFaults{FailNext: 1, FailNextStatus: 503}})
	for range 2 {
		r := a.do("POST", "/partners/royalty-tracking", tok, validReport(sb))
		wantStatus(t, r, 500)
		if string(r.body) != `{"error":true,"message":"internal service error"}` {
			t.Fatalf("report 500 body %s", r.body)
		}
	}
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, validReport(sb)), 200)
	// Other groups are untouched; 503 in live carries the 500 envelope.
	wantStatus(t, a.do("GET", "/partners/catalog", tok, nil), 200)
	wantEnvelope(t, a.do("GET", "/partners/mix/30001", tok, nil), 503, "internal service error")
	wantStatus(t, a.do("GET", "/partners/mix/30001", tok, nil), 200)
	if f := sb.Faults(); f.Report.FailNext != 0 || f.Mix.FailNext != 0 {
		t.Fatalf("fail_next not counted down: %+v", f)
	}
	// Faults come after the token check: an unauthenticated call stays 401.
	sb.SetFaults(sandbox.Faults{Catalog: sandbox.GroupFaults{FailNext: 1}})
	wantUnauthorized(t, a.do("GET", "/partners/catalog", "", nil))
	wantEnvelope(t, a.do("GET", "/partners/catalog", tok, nil), 500, "internal service error")

	// 503 in standby: the standby envelope, with the header.
	sb.SetMode(sandbox.ModeStandby)
	sb.SetFaults(sandbox.Faults{Catalog: sandbox.GroupFaults{FailNext: 1, FailNextStatus: 503}, Report: sandbox.GroupFaults{FailNext: 1, FailNextStatus: 503}})
	for _, r := range []resp{a.do("GET", "/partners/page/101", tok, nil), a.do("POST", "/partners/royalty-tracking", tok, validReport(sb))} {
		wantStatus(t, r, 503)
		if string(r.body) != `{"error":true,"reason":"standby upstream error"}` || r.header.Get("X-Service-Served-By") != "standby" {
			t.Fatalf("standby 503: %s %v", r.body, r.header)
		}
	}
	sb.SetMode(sandbox.ModeLive)
	// A faulted 401 is the auth layer's plain text; session faults use the envelope.
	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{FailNext: 1, FailNextStatus: 401}, Session: sandbox.GroupFaults{FailNext: 1}})
	wantUnauthorized(t, a.do("GET", "/partners/mix/30001", tok, nil))
	wantEnvelope(t, a.do("POST", "/partners/session", "", a.creds()), 500, "internal service error")

	l := sb.Ledger()
	if l.AcceptedCount != 1 || l.Counters["report"][500] != 2 || l.Counters["report"][503] != 1 || l.Counters["mix"][503] != 1 {
		t.Fatalf("ledger after faults: accepted %d, counters %v", l.AcceptedCount, l.Counters)
	}
}

func TestFaultRatesAndLatency(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: 1}, Mix: sandbox.GroupFaults{Rate503: 1}})
	for range 5 {
		wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, validReport(sb)), 500)
		wantStatus(t, a.do("GET", "/partners/mix/30001", tok, nil), 503)
	}
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: 0.5}})
	codes := map[int]int{}
	for range 200 {
		codes[a.do("POST", "/partners/royalty-tracking", tok, validReport(sb)).status]++
	}
	if codes[200] < 50 || codes[500] < 50 || codes[200]+codes[500] != 200 {
		t.Fatalf("rate 0.5 gave %v", codes)
	}
	sb.SetFaults(sandbox.Faults{Catalog: sandbox.GroupFaults{Latency: 60 * time.Millisecond}})
	start := time.Now()
	wantStatus(t, a.do("GET", "/partners/catalog", tok, nil), 200)
	if d := time.Since(start); d < 60*time.Millisecond {
		t.Fatalf("latency fault not applied: %v", d)
	}
	// Clamping: SetFaults has no error, out-of-range values are clamped.
	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Rate500: 7, FailNextStatus: 418}})
	if f := sb.Faults(); f.Mix.Rate500 != 1 || f.Mix.FailNextStatus != 500 {
		t.Fatalf("clamped %+v", f.Mix)
	}
	if err := (sandbox.Faults{Mix: sandbox.GroupFaults{Rate500: 7}}).Validate(); err == nil {
		t.Fatal("Validate accepted rate 7")
	}
}

// TestFaultsForIDs: faults restricted to some mix ids fail those mixes only,
// also when set through the admin API.
func TestFaultsForIDs(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	mixes := sb.Catalog().Mixes
	bad, good := mixes[0].ID, mixes[1].ID
	r := a.doURL("PUT", sb.AdminURL+"/admin/faults", "", map[string]any{"mix": map[string]any{"rate_500": 1, "ids": []int64{bad}}})
	wantStatus(t, r, 200)
	for range 3 {
		wantEnvelope(t, a.do("GET", "/partners/mix/"+jsonNum(uint64(bad)), tok, nil), 500, "internal service error")
		wantStatus(t, a.do("GET", "/partners/mix/"+jsonNum(uint64(good)), tok, nil), 200)
	}
	if f := sb.Faults(); len(f.Mix.IDs) != 1 || f.Mix.IDs[0] != bad {
		t.Fatalf("faults %+v", f)
	}
	sb.SetFaults(sandbox.Faults{})
	wantStatus(t, a.do("GET", "/partners/mix/"+jsonNum(uint64(bad)), tok, nil), 200)
}
