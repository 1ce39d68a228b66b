package schemas

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestAppendReportJSONMatchesEncodingJSON(t *testing.T) {
	one, yes, no := int64(1), true, false
	for _, r := range []PlayReport{
		{},
		{TrackID: -5, PlayedAt: 1, PlayLength: 0, Vendor: -1},
		{TrackID: 1, PlayedAt: 1700000000000, PlayLength: 30, SourceStream: "mix", SourceDetail: "a\u2028b\u2029<>&\"\\\x00\x1f\x7f\b\f\n\r\t",
			OS: "ios", Device: "d", Country: "DE", Vendor: 2, UserID: "u", ISRC: "\xffbad utf8 \xe2\x82", EndReason: &one, CachedPlay: &yes, JumpForward: &no},
	} {
		want, _ := json.Marshal(r)
		if got := AppendReportJSON(nil, &r); string(got) != string(want) {
			t.Errorf("\n got %s\nwant %s", got, want)
		}
	}
}

func TestAppendReportJSONNoAllocs(t *testing.T) {
	r := PlayReport{TrackID: 1, PlayedAt: 1700000000000, PlayLength: 30, SourceStream: "mix", SourceDetail: "Mix", OS: "ios", Device: "d",
		Country: "DE", Vendor: 2, UserID: "user-1", ISRC: "us-abc-12-00001 "}
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(100, func() { buf = AppendReportJSON(buf[:0], &r) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// FuzzAppendReportJSON holds the hand-written encoder to encoding/json's
// output byte for byte, and checks that strings (the isrc) survive a round trip.
func FuzzAppendReportJSON(f *testing.F) {
	f.Add(int64(1), int64(1700000000000), "us-abc-12-00001 ", "Mix <1>", "DE", true)
	f.Add(int64(-1), int64(0), "\xff\u2028", "\x00", "", false)
	f.Fuzz(func(t *testing.T, id, at int64, isrc, detail, country string, set bool) {
		r := PlayReport{TrackID: id, PlayedAt: at, PlayLength: at % 1000, SourceStream: "mix", SourceDetail: detail, Country: country, ISRC: isrc, UserID: detail}
		if set {
			r.EndReason, r.CachedPlay = &id, &set
		}
		want, _ := json.Marshal(r)
		got := AppendReportJSON(nil, &r)
		if !bytes.Equal(got, want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
		var back PlayReport
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatal(err)
		}
		if utf8.ValidString(isrc) && back.ISRC != isrc {
			t.Fatalf("isrc %q came back %q", isrc, back.ISRC)
		}
	})
}
