package sandbox_test

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// validReport is a correct report of the first track of the first mix.
func validReport(sb *testenv.Sandbox) map[string]any {
	m := sb.Catalog().Mixes[0]
	tr := m.Tracks[0]
	for _, x := range m.Tracks {
		if x.Quirk == sandbox.QuirkNone {
			tr = x
			break
		}
	}
	return map[string]any{
		"trackid": tr.ID, "playedat": int64(1_763_000_000_000), "playlength": 30, "sourcestream": "mix",
		"sourcedetail": m.Title, "os": "iOS 17.4", "device": "phone", "country": "US", "vendor": 7,
		"userid": "user-1", "isrc": tr.ISRC,
	}
}

func with(base map[string]any, kv ...any) map[string]any {
	m := maps.Clone(base)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == deleteKey {
			delete(m, kv[i].(string))
			continue
		}
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

type del struct{}

var deleteKey = del{}

func TestReportValidationTable(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	ok := validReport(sb)

	accepted := []struct {
		name string
		body any
	}{
		{"valid", ok},
		{"legacy playLength", with(ok, "playlength", deleteKey, "playLength", 30)},
		{"both casings, playlength counts", with(ok, "playLength", "junk")},
		{"unknown fields ignored", with(ok, "extra", map[string]any{"x": []int{1}}, "TRACKID", "nope", "report_id", "r-1")},
		{"optional fields", with(ok, "endreason", 0, "cachedplay", false, "jumpforward", true)},
		{"optional nulls", with(ok, "endreason", nil, "cachedplay", nil, "userid", nil, "isrc", nil)},
		{"no optional fields", with(ok, "userid", deleteKey, "isrc", deleteKey)},
		{"lowercase country", with(ok, "country", "us")},
		{"seconds playedat", with(ok, "playedat", 1_763_000_000)},
		{"zero playlength", with(ok, "playlength", 0)},
		{"negative endreason", with(ok, "endreason", -1)},
		{"escaped key", strings.Replace(mustJSON(t, ok), `"os"`, `"\u006fs"`, 1)},
	}
	for _, c := range accepted {
		t.Run("accepted/"+c.name, func(t *testing.T) {
			r := a.do("POST", "/partners/royalty-tracking", tok, c.body)
			wantStatus(t, r, 200)
			if string(r.body) != `{"error":false,"message":"success"}` {
				t.Fatalf("body %s", r.body)
			}
		})
	}

	rejected := []struct {
		name   string
		body   any
		fields string
	}{
		{"trackid missing", with(ok, "trackid", deleteKey), "trackid"},
		{"trackid string", with(ok, "trackid", "400001"), "trackid"},
		{"trackid 1.0", strings.Replace(mustJSON(t, ok), `"trackid":`, `"trackid":1.0,"x":`, 1), "trackid"},
		{"trackid exponent", strings.Replace(mustJSON(t, ok), `"trackid":`, `"trackid":4e5,"x":`, 1), "trackid"},
		{"trackid zero", with(ok, "trackid", 0), "trackid"},
		{"trackid overflow", strings.Replace(mustJSON(t, ok), `"trackid":`, `"trackid":99999999999999999999,"x":`, 1), "trackid"},
		{"playedat missing", with(ok, "playedat", deleteKey), "playedat"},
		{"playedat string", with(ok, "playedat", "1763000000000"), "playedat"},
		{"playedat float", with(ok, "playedat", 1.7630000000005e12), "playedat"},
		{"playlength missing", with(ok, "playlength", deleteKey), "playlength"},
		{"playlength null", with(ok, "playlength", nil), "playlength"},
		{"playlength negative", with(ok, "playlength", -3), "playlength"},
		{"playLength legacy string", with(ok, "playlength", deleteKey, "playLength", "30"), "playlength"},
		{"playlength bool", with(ok, "playlength", true), "playlength"},
		{"sourcestream missing", with(ok, "sourcestream", deleteKey), "sourcestream"},
		{"sourcestream number", with(ok, "sourcestream", 1), "sourcestream"},
		{"sourcedetail empty", with(ok, "sourcedetail", ""), "sourcedetail"},
		{"os missing", with(ok, "os", deleteKey), "os"},
		{"device object", with(ok, "device", map[string]any{}), "device"},
		{"country missing", with(ok, "country", deleteKey), "country"},
		{"country three letters", with(ok, "country", "USA"), "country"},
		{"country digit", with(ok, "country", "U1"), "country"},
		{"country non-ascii", with(ok, "country", "ÜS"), "country"},
		{"vendor missing", with(ok, "vendor", deleteKey), "vendor"},
		{"vendor string", with(ok, "vendor", "7"), "vendor"},
		{"userid number", with(ok, "userid", 12), "-userid"},
		{"isrc number", with(ok, "isrc", 12), "-isrc"},
		{"endreason string", with(ok, "endreason", "1"), "-endreason"},
		{"cachedplay 1", with(ok, "cachedplay", 1), "-cachedplay"},
		{"cachedplay yes", with(ok, "cachedplay", "yes"), "-cachedplay"},
		{"jumpforward string", with(ok, "jumpforward", "true"), "-jumpforward"},
		{"required and optional", with(ok, "country", deleteKey, "userid", 123, "cachedplay", "yes"), "country; wrongly typed optional fields: userid,cachedplay"},
		{"several, in table order", with(ok, "country", "usa", "trackid", "1", "playlength", deleteKey, "vendor", 1.5), "trackid,playlength,country,vendor"},
		{"empty object", map[string]any{}, "trackid,playedat,playlength,sourcestream,sourcedetail,os,device,country,vendor"},
		{"not json", "trackid=1", "trackid,playedat,playlength,sourcestream,sourcedetail,os,device,country,vendor"},
		{"array", "[1,2]", "trackid,playedat,playlength,sourcestream,sourcedetail,os,device,country,vendor"},
		{"empty body", "", "trackid,playedat,playlength,sourcestream,sourcedetail,os,device,country,vendor"},
		{"trailing garbage", mustJSON(t, ok) + "}", "trackid,playedat,playlength,sourcestream,sourcedetail,os,device,country,vendor"},
	}
	for _, c := range rejected {
		t.Run("rejected/"+c.name, func(t *testing.T) {
			r := a.do("POST", "/partners/royalty-tracking", tok, c.body)
			wantStatus(t, r, 400)
			msg := "include the required fields: " + c.fields
			if opt, ok := strings.CutPrefix(c.fields, "-"); ok {
				msg = "wrongly typed optional fields: " + opt // never called required
			}
			want, _ := json.Marshal(map[string]any{"error": true, "message": msg})
			var got map[string]any
			_ = json.Unmarshal(r.body, &got)
			if gb, _ := json.Marshal(got); string(gb) != string(want) {
				t.Fatalf("body %s, want %s", r.body, want)
			}
		})
	}
	l := sb.Ledger()
	if l.AcceptedCount != int64(len(accepted)) || l.RejectedCount != int64(len(rejected)) || len(l.Rejected) != len(rejected) {
		t.Fatalf("ledger: %d accepted (want %d), %d rejected (want %d)", l.AcceptedCount, len(accepted), l.RejectedCount, len(rejected))
	}
	if l.Counters["report"][200] != int64(len(accepted)) || l.Counters["report"][400] != int64(len(rejected)) {
		t.Fatalf("counters %v", l.Counters)
	}
	legacy := l.Accepted[1]
	if !legacy.Report.LegacyPlayLength || legacy.Report.PlayLength != 30 || !strings.Contains(legacy.Raw, `"playLength":30`) {
		t.Fatalf("legacy entry %+v", legacy)
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestQualityFlags(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	cat := sb.Catalog()
	ok := validReport(sb)
	track, _ := cat.Track(ok["trackid"].(int64))
	quirk := func(q sandbox.ISRCQuirk) sandbox.Track { return cat.TracksWithQuirk(q)[0] }
	lower, hyph, trail := quirk(sandbox.QuirkLowercase), quirk(sandbox.QuirkHyphenated), quirk(sandbox.QuirkTrailingSpace)
	shared := cat.TracksWithQuirk(sandbox.QuirkShared)

	cases := []struct {
		name string
		body map[string]any
		want []sandbox.Flag
	}{
		{"clean", ok, nil},
		{"playedat in seconds", with(ok, "playedat", 1_763_000_000), []sandbox.Flag{sandbox.FlagPlayedAtNot13Digits}},
		{"playedat 14 digits", with(ok, "playedat", 17_630_000_000_000), []sandbox.Flag{sandbox.FlagPlayedAtNot13Digits}},
		{"lowercase country", with(ok, "country", "gb"), []sandbox.Flag{sandbox.FlagCountryLowercase}},
		{"mixed-case country", with(ok, "country", "Gb"), []sandbox.Flag{sandbox.FlagCountryLowercase}},
		{"userid missing", with(ok, "userid", deleteKey), []sandbox.Flag{sandbox.FlagUserIDMissing}},
		{"userid empty", with(ok, "userid", ""), []sandbox.Flag{sandbox.FlagUserIDMissing}},
		{"isrc omitted is fine", with(ok, "isrc", deleteKey), nil},
		{"isrc uppercased", with(ok, "trackid", lower.ID, "isrc", strings.ToUpper(lower.ISRC), "playlength", 1), []sandbox.Flag{sandbox.FlagISRCMismatch}},
		{"isrc exact lowercase", with(ok, "trackid", lower.ID, "isrc", lower.ISRC, "playlength", 1), nil},
		{"isrc de-hyphenated", with(ok, "trackid", hyph.ID, "isrc", strings.ReplaceAll(hyph.ISRC, "-", ""), "playlength", 1), []sandbox.Flag{sandbox.FlagISRCMismatch}},
		{"isrc trimmed", with(ok, "trackid", trail.ID, "isrc", strings.TrimSpace(trail.ISRC), "playlength", 1), []sandbox.Flag{sandbox.FlagISRCMismatch}},
		{"isrc exact trailing space", with(ok, "trackid", trail.ID, "isrc", trail.ISRC, "playlength", 1), nil},
		{"shared isrc on either track", with(ok, "trackid", shared[1].ID, "isrc", shared[0].ISRC, "playlength", 1), nil},
		{"isrc of another track", with(ok, "isrc", hyph.ISRC), []sandbox.Flag{sandbox.FlagISRCMismatch}},
		{"unknown trackid", with(ok, "trackid", 123), []sandbox.Flag{sandbox.FlagTrackIDUnknown}},
		{"playlength = track length", with(ok, "playlength", track.LengthSec), nil},
		{"playlength > track length", with(ok, "playlength", track.LengthSec+1), []sandbox.Flag{sandbox.FlagPlayLengthExceedsTrack}},
		{"several", with(ok, "playedat", 1_763_000_000, "country", "us", "userid", deleteKey), []sandbox.Flag{sandbox.FlagPlayedAtNot13Digits, sandbox.FlagCountryLowercase, sandbox.FlagUserIDMissing}},
	}
	for _, c := range cases {
		wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, with(c.body, "sourcedetail", c.name)), 200)
	}
	l := sb.Ledger()
	if len(l.Accepted) != len(cases) {
		t.Fatalf("%d entries", len(l.Accepted))
	}
	for i, c := range cases {
		e := l.Accepted[i]
		if e.Report.SourceDetail != c.name {
			t.Fatalf("entry %d is %q, want %q (arrival order)", i, e.Report.SourceDetail, c.name)
		}
		if len(e.Flags) != len(c.want) {
			t.Errorf("%s: flags %v, want %v", c.name, e.Flags, c.want)
			continue
		}
		for j := range c.want {
			if e.Flags[j] != c.want[j] {
				t.Errorf("%s: flags %v, want %v", c.name, e.Flags, c.want)
			}
		}
		if e.Arrival.IsZero() || e.Raw == "" || e.Duplicate {
			t.Errorf("%s: entry %+v", c.name, e)
		}
	}
	if n := len(l.Flagged(sandbox.FlagISRCMismatch)); n != 4 {
		t.Fatalf("%d isrc mismatches, want 4", n)
	}
}

func TestDuplicates(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	ok := validReport(sb)
	legacy := with(ok, "playlength", deleteKey, "playLength", ok["playlength"])
	for _, b := range []any{
		ok,
		ok,                     // duplicate
		with(ok, "unknown", 1), // duplicate: unknown fields are stripped
		legacy,                 // duplicate: playLength is playlength
		with(ok, "playedat", int64(1_763_000_000_001)), // new
		with(ok, "cachedplay", false),                  // new: an optional field present differs from absent
		"  " + mustJSON(t, ok) + "\n",                  // duplicate: whitespace
	} {
		wantStatus(t, a.do("POST", "/partners/royalty-tracking", tok, b), 200)
	}
	l := sb.Ledger()
	var dups []bool
	for _, e := range l.Accepted {
		dups = append(dups, e.Duplicate)
	}
	want := []bool{false, true, true, true, false, false, true}
	if l.Duplicates != 4 || len(dups) != len(want) {
		t.Fatalf("duplicates %d (want 4), entries %v", l.Duplicates, dups)
	}
	for i := range want {
		if dups[i] != want[i] {
			t.Fatalf("duplicate marks %v, want %v", dups, want)
		}
	}
}
