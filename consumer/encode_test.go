package consumer

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

var trickyStrings = []string{
	"", "plain", "GBAYE0601498", " us-s1z-99-00001\u00a0", `quote " and \ backslash`,
	"<script>&amp;</script>", "tab\tnewline\nreturn\rbell\a nul\x00 bs\b ff\f us\x1f del\x7f",
	"é ü ß 漢字 🎵", "line sep \u2028 para sep \u2029", "bad utf8 \xff\xfe end", "truncated \xe2\x82",
	"\xed\xa0\x80 surrogate", "\ufffd replacement", "\u0085 nel",
}

func TestAppendTrackPlayMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() string { return trickyStrings[rng.IntN(len(trickyStrings))] }
	for i := 0; i < 2000; i++ {
		p := schemas.TrackPlay{
			V: 1, ReportID: schemas.ReportID(pick(), i), EventID: pick(), MixID: rng.Int64() - rng.Int64(),
			Position: rng.IntN(100), OverlapMS: rng.Int64N(1 << 40), BelowMinimum: rng.IntN(2) == 0,
			NoUserID: rng.IntN(2) == 0, StandbyListing: rng.IntN(2) == 0, DerivedAt: rng.Int64(),
			Report: partnerapi.PlayReport{
				TrackID: rng.Int64() - rng.Int64(), PlayedAt: 1_700_000_000_000 + rng.Int64N(1e9), PlayLength: rng.Int64N(10000),
				SourceStream: pick(), SourceDetail: pick(), OS: pick(), Device: pick(), Country: pick(),
				Vendor: rng.Int64N(1000) - 10, UserID: pick(), ISRC: pick(),
			},
		}
		if rng.IntN(2) == 0 {
			p.Report.EndReason = ptr(rng.Int64N(3) - 1)
		}
		if rng.IntN(2) == 0 {
			p.Report.CachedPlay = ptr(rng.IntN(2) == 0)
		}
		if rng.IntN(2) == 0 {
			p.Report.JumpForward = ptr(rng.IntN(2) == 0)
		}
		want, err := json.Marshal(&p)
		if err != nil {
			t.Fatal(err)
		}
		got := AppendTrackPlay(nil, &p)
		if !bytes.Equal(got, want) {
			t.Fatalf("mismatch for %+v\n got: %s\nwant: %s", p, got, want)
		}
		wantR, _ := json.Marshal(&p.Report)
		if gotR := partnerapi.AppendReportJSON(nil, &p.Report); !bytes.Equal(gotR, wantR) {
			t.Fatalf("report mismatch\n got: %s\nwant: %s", gotR, wantR)
		}
	}
}

func TestISRCRoundTripsByteForByte(t *testing.T) {
	// Whatever a listing served (it was JSON, so valid UTF-8), decoding our
	// encoding gives the same bytes back.
	for _, s := range trickyStrings {
		if !utf8Valid(s) {
			continue
		}
		p := schemas.TrackPlay{Report: partnerapi.PlayReport{ISRC: s}}
		var back schemas.TrackPlay
		if err := json.Unmarshal(AppendTrackPlay(nil, &p), &back); err != nil {
			t.Fatal(err)
		}
		if back.Report.ISRC != s {
			t.Fatalf("isrc %q came back as %q", s, back.Report.ISRC)
		}
	}
}

func utf8Valid(s string) bool { return bytes.Equal([]byte(s), []byte(string([]rune(s)))) }

func TestAppendTrackPlayNoAllocs(t *testing.T) {
	p := schemas.TrackPlay{V: 1, ReportID: schemas.ReportID("e", 1), EventID: "e", Report: partnerapi.PlayReport{ISRC: "X", EndReason: ptr(int64(1))}}
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() { buf = AppendTrackPlay(buf[:0], &p) }); n != 0 {
		t.Fatalf("AppendTrackPlay allocates %v times per call", n)
	}
}

func TestAppendReportIDMatchesSchemas(t *testing.T) {
	long := string(bytes.Repeat([]byte("x"), 300))
	for _, id := range append(trickyStrings, long, "e", "ev-1-000001") {
		for _, pos := range []int{0, 1, 9, 10, 123, 1 << 20} {
			if got, want := string(appendReportID(nil, id, pos)), schemas.ReportID(id, pos); got != want {
				t.Fatalf("%q/%d: %s != %s", id, pos, got, want)
			}
		}
	}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = appendReportID(buf[:0], "ev-1-000001", 3) }); n != 0 {
		t.Fatalf("appendReportID allocates %v times", n)
	}
}

func TestAppendTrackPlayWithByteID(t *testing.T) {
	p := schemas.TrackPlay{V: 1, ReportID: schemas.ReportID("e", 2), EventID: "e", Report: partnerapi.PlayReport{ISRC: "X"}}
	want := AppendTrackPlay(nil, &p)
	id := []byte(p.ReportID)
	p.ReportID = ""
	if got := appendTrackPlay(nil, &p, id); !bytes.Equal(got, want) {
		t.Fatalf("got %s want %s", got, want)
	}
}
