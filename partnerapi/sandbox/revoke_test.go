package sandbox_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestRevokeTokens: every token minted before a revocation — live, with
// user, admin-minted and standby-minted — answers 401 afterwards on data
// endpoints and reports; a new session works; a second revocation kills the
// tokens of the first's aftermath too.
func TestRevokeTokens(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)

	live, user := a.session(), a.userSession()
	minted := sb.MintToken(time.Hour, false)
	for _, tok := range []string{live, user, minted} {
		wantStatus(t, a.do("GET", "/partners/catalog", tok, nil), 200)
	}
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", live, validReport(sb)), 200)

	// Revoked in standby: the standby token of the running episode dies too.
	sb.SetMode(sandbox.ModeStandby)
	standby := a.session()
	wantStatus(t, a.do("GET", "/partners/catalog", standby, nil), 200)
	if n := sb.RevokeTokens(); n != 1 || sb.Revocations() != 1 {
		t.Fatalf("RevokeTokens = %d, Revocations = %d; want 1", n, sb.Revocations())
	}
	wantUnauthorized(t, a.do("GET", "/partners/catalog", standby, nil))
	wantUnauthorized(t, a.do("POST", "/partners/royalty-tracking", standby, validReport(sb)))
	wantStatus(t, a.do("GET", "/partners/catalog", a.session(), nil), 200) // a new standby session works
	sb.SetMode(sandbox.ModeLive)

	for name, tok := range map[string]string{"live": live, "with-user": user, "admin-minted": minted} {
		wantUnauthorized(t, a.do("GET", "/partners/catalog", tok, nil))
		wantUnauthorized(t, a.do("POST", "/partners/royalty-tracking", tok, validReport(sb)))
		if t.Failed() {
			t.Fatalf("%s token still accepted after the revocation", name)
		}
	}
	if got := sb.Ledger().Counters["report"][401]; got != 4 {
		t.Errorf("report 401s counted %d, want 4", got)
	}

	// New sessions (and admin-minted tokens) work after the revocation.
	fresh := a.session()
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", fresh, validReport(sb)), 200)
	freshUser := a.userSession()
	wantStatus(t, a.do("GET", "/partners/catalog/restricted", freshUser, nil), 200)
	wantStatus(t, a.do("GET", "/partners/catalog", sb.MintToken(0, false), nil), 200)
	if c := sb.Counts(); c.Accepted != 2 {
		t.Errorf("accepted %d reports, want 2 (one before, one after the revocation)", c.Accepted)
	}

	// Reset does not bring revoked tokens back.
	sb.Reset()
	wantUnauthorized(t, a.do("GET", "/partners/catalog", live, nil))
	wantStatus(t, a.do("GET", "/partners/catalog", fresh, nil), 200)

	// Through the admin API: the answer counts revocations, and the tokens
	// of the previous aftermath die too.
	r := a.doURL("POST", sb.AdminURL+"/admin/revoke-tokens", "", nil)
	wantStatus(t, r, 200)
	var out struct{ Revocations uint64 }
	if err := json.Unmarshal(r.body, &out); err != nil || out.Revocations != 2 {
		t.Fatalf("admin revoke-tokens answer %s (%v), want revocations 2", r.body, err)
	}
	wantUnauthorized(t, a.do("GET", "/partners/catalog", fresh, nil))
	wantUnauthorized(t, a.do("GET", "/partners/catalog/restricted", freshUser, nil))
	wantStatus(t, a.do("GET", "/partners/catalog", a.session(), nil), 200)
	wantStatus(t, a.doURL("GET", sb.AdminURL+"/admin/revoke-tokens", "", nil), 405)
}
