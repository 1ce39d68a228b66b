package sandbox_test

import (
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestStandbySwitch(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Now = clk.Now })
	a := newAPI(t, sb)
	live := a.session()
	cat := sb.Catalog()

	sb.SetMode(sandbox.ModeStandby)
	if sb.Mode() != sandbox.ModeStandby {
		t.Fatal("mode not set")
	}
	// Flat session without credential check (even with none at all).
	for _, body := range []any{a.creds(), map[string]string{"client_id": "wrong", "client_signature": "wrong"}, ""} {
		r := a.do("POST", "/partners/session", "", body)
		wantStatus(t, r, 200)
		if r.header.Get("X-Service-Served-By") != "standby" {
			t.Fatalf("session header %q", r.header.Get("X-Service-Served-By"))
		}
		if _, ok := r.json(t)["session"].(map[string]any)["token"].(string); !ok {
			t.Fatalf("standby session not flat: %s", r.body)
		}
	}
	stb := tokenOf(t, a.do("POST", "/partners/session", "", "").body)
	r0 := a.do("POST", "/partners/session/with-user", "", map[string]string{"email": sb.Email})
	wantStatus(t, r0, 200)
	if _, ok := r0.json(t)["session"].(map[string]any)["token"].(string); !ok || r0.header.Get("X-Service-Served-By") != "standby" {
		t.Fatalf("standby with-user session: %s", r0.body)
	}

	// Every response carries the header, errors included; live tokens still work.
	for _, tok := range []string{live, stb} {
		for _, path := range []string{"/partners/catalog", "/partners/catalog/restricted", "/partners/page/101", "/partners/list/2001", "/partners/genres/101", "/partners/mix/30001"} {
			r := a.do("GET", path, tok, nil)
			wantStatus(t, r, 200)
			if r.header.Get("X-Service-Served-By") != "standby" {
				t.Fatalf("%s: header %q", path, r.header.Get("X-Service-Served-By"))
			}
		}
	}
	r := a.do("GET", "/partners/mix/999999", stb, nil)
	wantEnvelope(t, r, 404, "Mix not found")
	if r.header.Get("X-Service-Served-By") != "standby" {
		t.Fatal("error answer without header")
	}
	r = a.do("GET", "/partners/catalog", "", nil)
	wantUnauthorized(t, r)
	if r.header.Get("X-Service-Served-By") != "standby" {
		t.Fatal("401 without header")
	}

	// List summaries in the standby shape.
	r = a.do("GET", "/partners/list/2001", stb, nil)
	var list struct {
		List struct {
			Mixes []map[string]any `json:"mixes"`
		} `json:"list"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil {
		t.Fatal(err)
	}
	for _, mx := range list.List.Mixes {
		keys := slices.Sorted(mapKeys(mx))
		if want := []string{"dj", "explicit", "id", "image_large", "image_thumbnail", "length", "max_bpm", "min_bpm", "title"}; !slices.Equal(keys, want) {
			t.Fatalf("standby list summary keys %v, want %v", keys, want)
		}
		if _, ok := mx["explicit"].(bool); !ok {
			t.Fatalf("standby explicit must be boolean: %v", mx["explicit"])
		}
	}
	// Genre items: only the guaranteed keys.
	r = a.do("GET", "/partners/genres/101", stb, nil)
	var rows struct {
		Rows struct {
			Items []map[string]any `json:"items"`
		} `json:"rows"`
	}
	_ = json.Unmarshal(r.body, &rows)
	if keys := slices.Sorted(mapKeys(rows.Rows.Items[0])); !slices.Equal(keys, []string{"bpm", "description", "id", "image", "ordering", "player_image", "thumbnail", "title"}) {
		t.Fatalf("standby genre keys %v", keys)
	}
	// Degraded mixes: every kind of degradation appears, tracks unchanged.
	var emptyDesc, equalBPM, mp3InHLS, sameRendition int
	for _, m := range cat.Mixes {
		r := a.do("GET", "/partners/mix/"+strconv.FormatInt(m.ID, 10), stb, nil)
		var v struct {
			Mix struct {
				Description string `json:"description"`
				MinBPM      int    `json:"min_bpm"`
				MaxBPM      int    `json:"max_bpm"`
				URL         string `json:"url"`
				Android     string `json:"android_hls_url"`
				IOS         string `json:"ios_hls_url"`
				HLS         string `json:"hls_url"`
				Tracks      []struct {
					ID   int64  `json:"id"`
					ISRC string `json:"isrc"`
				} `json:"tracks"`
			} `json:"mix"`
		}
		if err := json.Unmarshal(r.body, &v); err != nil {
			t.Fatal(err)
		}
		x := v.Mix
		d := m.DegradedForStandby()
		if x.Description != d.Description || x.MinBPM != d.MinBPM || x.MaxBPM != d.MaxBPM || x.Android != d.AndroidHLSURL || x.IOS != d.IOSHLSURL || len(x.Tracks) != len(m.Tracks) {
			t.Fatalf("mix %d standby %s", m.ID, r.body)
		}
		if x.Description == "" {
			emptyDesc++
		}
		if x.MinBPM == x.MaxBPM {
			equalBPM++
		}
		if x.Android == x.URL && x.IOS == x.URL && x.HLS == x.URL {
			mp3InHLS++
		} else if x.Android == x.IOS && x.HLS == x.Android {
			sameRendition++
		}
	}
	if emptyDesc == 0 || equalBPM == 0 || mp3InHLS == 0 || sameRendition == 0 {
		t.Fatalf("degradations: %d empty descriptions, %d equal bpm, %d mp3 in HLS, %d one rendition", emptyDesc, equalBPM, mp3InHLS, sameRendition)
	}

	// Play reports: 200 without validation, kept apart.
	for _, body := range []any{validReport(sb), "garbage", map[string]any{}} {
		r := a.do("POST", "/partners/royalty-tracking", stb, body)
		wantStatus(t, r, 200)
		if string(r.body) != `{"error":false,"message":"success"}` || r.header.Get("X-Service-Served-By") != "standby" {
			t.Fatalf("standby report answer %s", r.body)
		}
	}
	l := sb.Ledger()
	if l.AcceptedCount != 0 || len(l.Accepted) != 0 || l.StandbyCount != 3 || len(l.Standby) != 3 || l.Standby[1].Raw != "garbage" {
		t.Fatalf("ledger %+v", l)
	}

	// Back to live: standby tokens die, live ones live on; header gone; shapes back.
	sb.SetMode(sandbox.ModeLive)
	wantUnauthorized(t, a.do("GET", "/partners/mix/30001", stb, nil))
	wantUnauthorized(t, a.do("POST", "/partners/royalty-tracking", stb, validReport(sb)))
	r = a.do("GET", "/partners/list/2001", live, nil)
	wantStatus(t, r, 200)
	if r.header.Get("X-Service-Served-By") != "" {
		t.Fatal("live answer with header")
	}
	if err := json.Unmarshal(r.body, &list); err != nil || list.List.Mixes[0]["bpm"] == nil {
		t.Fatalf("live list shape %s", r.body)
	}
	// A new standby episode does not revive the old standby token.
	sb.SetMode(sandbox.ModeStandby)
	wantUnauthorized(t, a.do("GET", "/partners/mix/30001", stb, nil))
	stb2 := tokenOf(t, a.do("POST", "/partners/session", "", "").body)
	wantStatus(t, a.do("GET", "/partners/mix/30001", stb2, nil), 200)
	// Standby tokens live 15 minutes by default.
	clk.Add(15*time.Minute - time.Second)
	wantStatus(t, a.do("GET", "/partners/mix/30001", stb2, nil), 200)
	clk.Add(time.Second)
	wantUnauthorized(t, a.do("GET", "/partners/mix/30001", stb2, nil))
	// Live-bypass is normal service resumed too: standby tokens die.
	stb3 := tokenOf(t, a.do("POST", "/partners/session", "", "").body)
	sb.SetMode(sandbox.ModeLiveBypass)
	wantUnauthorized(t, a.do("GET", "/partners/mix/30001", stb3, nil))
}

func TestLiveBypass(t *testing.T) {
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Mode = sandbox.ModeLiveBypass })
	a := newAPI(t, sb)
	// Credentials are checked; live shapes; header on every answer.
	r := a.do("POST", "/partners/session", "", map[string]string{"client_id": "x", "client_signature": "y"})
	wantEnvelope(t, r, 400, "credentials invalid")
	if r.header.Get("X-Service-Served-By") != "live-bypass" {
		t.Fatalf("header %q", r.header.Get("X-Service-Served-By"))
	}
	r = a.do("POST", "/partners/session", "", a.creds())
	wantStatus(t, r, 200)
	tok := tokenOf(t, r.body)
	if _, flat := r.json(t)["session"].(map[string]any)["token"].(string); flat || r.header.Get("X-Service-Served-By") != "live-bypass" {
		t.Fatalf("live-bypass session %s", r.body)
	}
	r = a.do("POST", "/partners/royalty-tracking", tok, validReport(sb))
	wantStatus(t, r, 200)
	if r.header.Get("X-Service-Served-By") != "live-bypass" {
		t.Fatal("report answer without header")
	}
	wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, with(validReport(sb), "vendor", deleteKey)), 400)
	l := sb.Ledger()
	if len(l.Accepted) != 1 || l.Accepted[0].ServedBy != "live-bypass" || l.StandbyCount != 0 || l.RejectedCount != 1 {
		t.Fatalf("live-bypass ledger %+v", l)
	}
	// Tokens minted in live-bypass stay valid in live.
	sb.SetMode(sandbox.ModeLive)
	wantStatus(t, a.do("GET", "/partners/mix/30001", tok, nil), 200)
}
