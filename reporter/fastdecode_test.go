package reporter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// slowTrackPlay is the reference: encoding/json, as the reporter decoded
// records before the fast path.
func slowTrackPlay(b []byte) (wireTrackPlay, error) {
	var tp wireTrackPlay
	err := json.Unmarshal(b, &tp)
	return tp, err
}

// checkSame fails t unless decodeTrackPlay gives exactly what encoding/json
// gives for b; it returns whether the fast path took b.
func checkSame(t testing.TB, b []byte) bool {
	t.Helper()
	want, wantErr := slowTrackPlay(b)
	var got wireTrackPlay
	gotErr := decodeTrackPlay(b, &got)
	var fast wireTrackPlay
	took := fastTrackPlay(b, &fast)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("record %q: error %v, encoding/json: %v", b, gotErr, wantErr)
	}
	if took && wantErr != nil {
		t.Fatalf("record %q: fast path took a record encoding/json refuses (%v)", b, wantErr)
	}
	if gotErr == nil && !sameTrackPlay(got, want) {
		t.Fatalf("record %q:\n got  %+v (report %q)\n want %+v (report %q)", b, got, got.Report, want, want.Report)
	}
	if took && !sameTrackPlay(fast, want) {
		t.Fatalf("record %q: fast path\n got  %+v (report %q)\n want %+v (report %q)", b, fast, fast.Report, want, want.Report)
	}
	if gotErr == nil {
		// The decoded report must not share the record's memory.
		c := bytes.Clone(b)
		var own wireTrackPlay
		_ = decodeTrackPlay(c, &own)
		clear(c)
		if !bytes.Equal(own.Report, want.Report) {
			t.Fatalf("record %q: decoded report shares the record's memory", b)
		}
	}
	return took
}

func sameTrackPlay(a, b wireTrackPlay) bool {
	return a.ReportID == b.ReportID && a.EventID == b.EventID && a.BelowMinimum == b.BelowMinimum &&
		bytes.Equal(a.Report, b.Report) && (a.Report == nil) == (b.Report == nil)
}

// trickyStrings are strings whose JSON encoding needs escapes (quotes,
// backslashes, control bytes, HTML characters, U+2028/2029), non-ASCII
// text, or nothing at all.
var trickyStrings = []string{
	"", "plain", "GB-A1B-23-00042", `US"QT\1"9900`, "FR\tZ03\n1700001", "<b>&amp;</b>", "caf\u00e9 \u2028\u2029",
	"\x00\x01\x1f", "Björk – Jóga", "日本語のミックス", "emoji 🎧", `\u0041`, "/slash/", "\x7f",
}

// variedPlays builds n track plays with every field varied, tricky strings
// in the ids and the report, and the optional fields on and off.
func variedPlays(n int) []schemas.TrackPlay {
	r := rand.New(rand.NewPCG(7, 11))
	pick := func() string { return trickyStrings[r.IntN(len(trickyStrings))] }
	out := make([]schemas.TrackPlay, n)
	for i := range out {
		event := fmt.Sprintf("ev-%d", i)
		if i%7 == 3 {
			event += pick()
		}
		id := schemas.ReportID(event, i%5)
		if i%11 == 5 {
			id = pick()
		}
		tp := schemas.TrackPlay{
			V: schemas.TrackPlayVersion, ReportID: id, EventID: event, MixID: r.Int64N(1 << 40), Position: i % 30,
			OverlapMS: r.Int64N(600_000), BelowMinimum: i%4 == 1, NoUserID: i%6 == 2, StandbyListing: i%9 == 4,
			DerivedAt: 1_700_000_000_000 + int64(i),
			Report: partnerapi.PlayReport{
				TrackID: r.Int64N(1 << 50), PlayedAt: 1_700_000_000_000 + int64(i), PlayLength: r.Int64N(900),
				SourceStream: "mix", SourceDetail: pick(), OS: "android 14", Device: pick(), Country: "DE",
				Vendor: 7, UserID: pick(), ISRC: pick(),
			},
		}
		if i%3 == 0 {
			er, c, j := int64(i%4), i%2 == 0, i%5 == 0
			tp.Report.EndReason, tp.Report.CachedPlay, tp.Report.JumpForward = &er, &c, &j
		}
		out[i] = tp
	}
	return out
}

// TestFastDecodeMatchesEncodingJSON holds the fast path to encoding/json on
// the records the consumer really writes (consumer.AppendTrackPlay), and on
// hand-made records that must fall back.
func TestFastDecodeMatchesEncodingJSON(t *testing.T) {
	fastCount := 0
	plays := variedPlays(2000)
	for i := range plays {
		b := consumer.AppendTrackPlay(nil, &plays[i])
		if checkSame(t, b) {
			fastCount++
		}
		// The report is posted as its exact bytes: the consumer's encoding
		// of the PlayReport.
		var got wireTrackPlay
		if err := decodeTrackPlay(b, &got); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(plays[i].Report)
		if !bytes.Equal(got.Report, want) {
			t.Fatalf("play %d: report %s, want %s", i, got.Report, want)
		}
		if got.ReportID != plays[i].ReportID || got.EventID != plays[i].EventID || got.BelowMinimum != plays[i].BelowMinimum {
			t.Fatalf("play %d: decoded %+v", i, got)
		}
	}
	// Ids with escapes or control bytes fall back; everything else must be
	// fast (the point of the fast path).
	if fastCount < len(plays)*3/4 {
		t.Fatalf("fast path took %d of %d consumer records", fastCount, len(plays))
	}

	good := `{"v":1,"report_id":"r1","event_id":"e1","below_minimum":false,"report":{"trackid":1,"isrc":"A\"B"}}`
	if !checkSame(t, []byte(good)) {
		t.Fatalf("fast path refused the plain record %s", good)
	}
	// Each of these must decode exactly as encoding/json decodes it; the
	// fast path may take only the ones marked fast.
	cases := []struct {
		rec  string
		fast bool
	}{
		{` {"report_id":"r","report":{}} `, true},
		{`{"report_id":"r","report":{"a":[1,2.5e3,-0,true,null,{"b":"\u00e9"}]}}`, true},
		{`{"report_id":null,"below_minimum":null,"report":{}}`, true},
		{`{"report":{"x":"` + "\xff\xfe" + `"},"report_id":"r"}`, true},  // raw bytes kept as they are
		{`{"other":"` + "\xff" + `","report_id":"r","report":{}}`, true}, // ignored by both
		{`{}`, true},
		{`{"Report_ID":"r","report":{}}`, false},
		{`{"report_id":"r","REPORT":{"a":1},"report":{}}`, false},
		{`{"report_id":"r","re\u0070ort":{}}`, false},
		{`{"report_id":"r","reſort":{}}`, false}, // Unicode folding
		{`{"report_id":"r","report_id":"s","report":{}}`, false},
		{`{"report_id":"r","report":{},"report":{"a":1}}`, false},
		{`{"report_id":"r\n","report":{}}`, false},
		{`{"report_id":"r\u00e9","report":{}}`, false},
		{`{"report_id":"` + "r\xff" + `","report":{}}`, false},
		{`{"report_id":1,"report":{}}`, false},
		{`{"report_id":"r","below_minimum":"true","report":{}}`, false},
		{`{"report_id":"r","below_minimum":1,"report":{}}`, false},
		{`{"report_id":"r","report":null}`, false},
		{`{"report_id":"r","report":[1]}`, false},
		{`{"report_id":"r","report":"x"}`, false},
		{`{"report_id":"r","report":{}`, false},
		{`{"report_id":"r","report":{}}x`, false},
		{`{"report_id":"r","report":{"a":01}}`, false},
		{`{"report_id":"r","report":{"a":"` + "\x01" + `"}}`, false},
		{`{"report_id":"r","report":{"a":"\x"}}`, false},
		{`{"report_id":"r","report":{"a":1,}}`, false},
		{`{"report_id":"r",}`, false},
		{`null`, false},
		{`[]`, false},
		{``, false},
		{"\xef\xbb\xbf{}", false},
		{`{"report_id":"r","report":` + strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100) + `}`, false},
	}
	for _, c := range cases {
		if took := checkSame(t, []byte(c.rec)); took != c.fast {
			t.Errorf("record %q: fast path took it: %v, want %v", c.rec, took, c.fast)
		}
	}
}

// FuzzDecodeTrackPlay compares the fast path with encoding/json on any
// bytes, seeded with the consumer's records and the hand-made cases.
//
//	go test -run '^$' -fuzz FuzzDecodeTrackPlay -fuzztime 90s ./reporter/
func FuzzDecodeTrackPlay(f *testing.F) {
	plays := variedPlays(40)
	for i := range plays {
		f.Add(consumer.AppendTrackPlay(nil, &plays[i]))
	}
	for _, s := range []string{
		`{"report_id":"r","Report":{},"report":{"a":[1,{"b":null}]}}`,
		`{"report_id":"r\u0041","below_minimum":true,"report":{"x":"\ud800"}}`,
		`{"REPORT_ID":"r","event_id":null,"report":null}`,
		"{\"report_id\":\"\xff\",\"report\":{}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkSame(t, b)
	})
}

// BenchmarkDecodeTrackPlay compares the two decoders on a consumer record.
//
//	go test -run '^$' -bench BenchmarkDecodeTrackPlay -benchmem ./reporter/
func BenchmarkDecodeTrackPlay(b *testing.B) {
	tp := play("bench-event", false, false)
	rec := consumer.AppendTrackPlay(nil, &tp)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w wireTrackPlay
			if err := decodeTrackPlay(rec, &w); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w wireTrackPlay
			if err := json.Unmarshal(rec, &w); err != nil {
				b.Fatal(err)
			}
		}
	})
}
