package sandbox_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestAdminAPI(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	admin := func(method, path string, body any) resp {
		t.Helper()
		return a.doURL(method, sb.AdminURL+path, "", body)
	}
	decode := func(r resp, v any) {
		t.Helper()
		if err := json.Unmarshal(r.body, v); err != nil {
			t.Fatalf("%s: %v", r.body, err)
		}
	}
	wantStatus(t, admin("GET", "/admin/health", nil), 200)

	// Mode.
	r := admin("PUT", "/admin/mode", map[string]string{"mode": "standby"})
	wantStatus(t, r, 200)
	if sb.Mode() != sandbox.ModeStandby {
		t.Fatal("mode not switched")
	}
	var mode struct{ Mode string }
	decode(admin("GET", "/admin/mode", nil), &mode)
	if mode.Mode != "standby" {
		t.Fatalf("mode %q", mode.Mode)
	}
	wantStatus(t, admin("PUT", "/admin/mode", map[string]string{"mode": "sideways"}), 400)
	wantStatus(t, admin("PUT", "/admin/mode", map[string]string{"mode": "live"}), 200)

	// Faults: validated with the field named; latency as a duration string.
	r = admin("PUT", "/admin/faults", map[string]any{"report": map[string]any{"rate_500": 2}})
	wantStatus(t, r, 400)
	if !strings.Contains(string(r.body), "report.rate_500") {
		t.Fatalf("fault error %s", r.body)
	}
	wantStatus(t, admin("PUT", "/admin/faults", map[string]any{"bogus": 1}), 400)
	r = admin("PUT", "/admin/faults", map[string]any{"report": map[string]any{"fail_next": 1, "fail_next_status": 503, "latency": "5ms"}})
	wantStatus(t, r, 200)
	var f sandbox.Faults
	decode(admin("GET", "/admin/faults", nil), &f)
	if f.Report.FailNext != 1 || f.Report.FailNextStatus != 503 || f.Report.Latency.Milliseconds() != 5 {
		t.Fatalf("faults %+v", f)
	}
	tok := a.session()
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, validReport(sb)), 503)
	wantStatus(t, admin("DELETE", "/admin/faults", nil), 200)
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, validReport(sb)), 200)
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, map[string]any{}), 400)

	// Ledger and counters.
	var l sandbox.LedgerSnapshot
	decode(admin("GET", "/admin/ledger", nil), &l)
	if len(l.Accepted) != 1 || l.AcceptedCount != 1 || len(l.Rejected) != 1 || l.Accepted[0].Report.TrackID == 0 || l.Counters["report"][503] != 1 {
		t.Fatalf("admin ledger %+v", l)
	}
	decode(admin("GET", "/admin/ledger?since="+jsonNum(l.Accepted[0].Seq), nil), &l)
	if len(l.Accepted) != 0 || len(l.Rejected) != 1 {
		t.Fatalf("since filter: %+v", l)
	}
	wantStatus(t, admin("GET", "/admin/ledger?since=x", nil), 400)
	var counters map[string]map[string]int64
	decode(admin("GET", "/admin/counters", nil), &counters)
	if counters["report"]["200"] != 1 || counters["report"]["400"] != 1 || counters["session"]["200"] != 1 {
		t.Fatalf("counters %v", counters)
	}

	// Catalog with full track listings.
	var cat struct {
		Mixes []struct {
			ID     int64
			Tracks []struct {
				ID        int64
				ISRC      string
				LengthSec int
			}
		}
	}
	decode(admin("GET", "/admin/catalog", nil), &cat)
	if len(cat.Mixes) != len(sb.Catalog().Mixes) || len(cat.Mixes[0].Tracks) < 8 {
		t.Fatalf("admin catalog: %d mixes", len(cat.Mixes))
	}

	// Minted tokens: an already expired one is refused.
	var tk struct{ Token string }
	decode(admin("POST", "/admin/token", map[string]any{"ttl": "1ns"}), &tk)
	wantUnauthorized(t, a.do("GET", "/partners/catalog", tk.Token, nil))
	decode(admin("POST", "/admin/token", map[string]any{"ttl": "1m", "with_user": true}), &tk)
	wantStatus(t, a.do("GET", "/partners/catalog/restricted", tk.Token, nil), 200)

	// Reset.
	sb.SetMode(sandbox.ModeStandby)
	wantStatus(t, admin("POST", "/admin/reset", nil), 200)
	if l := sb.Ledger(); l.AcceptedCount != 0 || len(l.Rejected) != 0 || len(l.Counters) != 0 || sb.Mode() != sandbox.ModeLive {
		t.Fatalf("after reset %+v, mode %v", l, sb.Mode())
	}
}

func jsonNum(n uint64) string { b, _ := json.Marshal(n); return string(b) }

func TestAdminLoopbackOnly(t *testing.T) {
	for _, allow := range []bool{false, true} {
		srv, err := sandbox.New(sandbox.Config{AdminAllowRemote: allow})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("GET", "/admin/mode", nil)
		req.RemoteAddr = "10.1.2.3:4567"
		req.Host = "localhost:9465"
		w := httptest.NewRecorder()
		srv.AdminHandler().ServeHTTP(w, req)
		want := http.StatusForbidden
		if allow {
			want = http.StatusOK
		}
		if w.Code != want {
			t.Fatalf("allow=%v: status %d, want %d", allow, w.Code, want)
		}
	}
}

func TestRoutingOddities(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	wantEnvelope(t, a.do("GET", "/partners/nothing", tok, nil), 404, "not found")
	r := a.do("GET", "/partners/session", "", nil)
	wantEnvelope(t, r, 405, "method not allowed")
	if r.header.Get("Allow") != "POST" {
		t.Fatalf("Allow %q", r.header.Get("Allow"))
	}
	big := `{"x":"` + strings.Repeat("a", 70<<10) + `"}`
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, big), 413)
}
