package sandbox_test

import (
	"testing"

	"github.com/playpipe/playpipe/internal/testenv"
)

func TestSmokeSessionMixReport(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	m := sb.Catalog().Mixes[0]
	r := a.do("GET", "/partners/mix/30001", tok, nil)
	wantStatus(t, r, 200)
	t.Logf("%.300s", r.body)
	rep := map[string]any{"trackid": m.Tracks[0].ID, "playedat": 1700000000000, "playlength": 30, "sourcestream": "mix", "sourcedetail": m.Title, "os": "iOS 17", "device": "phone", "country": "US", "vendor": 1, "userid": "u1", "isrc": m.Tracks[0].ISRC}
	r = a.do("POST", "/partners/royalty-tracking", tok, rep)
	wantStatus(t, r, 200)
	t.Logf("%s", r.body)
	l := sb.Ledger()
	if len(l.Accepted) != 1 || len(l.Accepted[0].Flags) != 0 {
		t.Fatalf("%+v", l)
	}
}
