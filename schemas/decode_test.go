package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// realRecords returns records as the pipeline writes them: the event test
// files (valid and invalid), the rejections of each, track plays and
// deliveries of every outcome. fast lists those the one-pass decoders must
// take (plain records of the pipeline) rather than fall back on.
func realRecords(t testing.TB) (all [][]byte, fast [][]byte) {
	files, err := filepath.Glob("testdata/events/*/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no event test files: %v", err)
	}
	for i, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, raw)
		vs := []Violation{{Field: "user_id", Reason: ReasonMissingField, Detail: `"user_id" is required`}}
		if i%3 == 0 {
			vs = append(vs, Violation{Reason: ReasonMalformedJSON, Detail: "ü\x00\t<>&"})
		}
		rj := mustMarshal(t, NewRejection(raw, "ev-"+filepath.Base(f), vs, Source{Topic: "plays.events", Partition: int32(i % 3), Offset: int64(i)}, 1_700_000_000_000))
		all = append(all, rj)
		if strings.Contains(f, "/valid/") {
			fast = append(fast, raw)
		}
	}
	// Invalid UTF-8 events (raw_base64 in their rejection).
	bad := []byte("{\"event_id\":\"\xff\xfe\"}")
	all = append(all, bad, mustMarshal(t, NewRejection(bad, "", nil, Source{Topic: "plays.events"}, 1)))
	plays := variedPlays(60)
	for i := range plays {
		p := AppendTrackPlay(nil, &plays[i])
		all = append(all, p)
		if i%11 != 5 && i%7 != 3 { // ids without tricky strings
			fast = append(fast, p)
		}
	}
	for _, o := range []string{OutcomeDelivered, OutcomeRejected, OutcomeStandby, OutcomeRetry, OutcomeBlocked} {
		d := AppendDelivery(nil, &Delivery{V: DeliveryVersion, ReportID: "rid-1", EventID: "ev-1", Outcome: o, Attempt: 2, HTTPStatus: 200,
			Message: "plain message", LatencyUS: 1500, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", At: 1_700_000_000_123})
		all, fast = append(all, d), append(fast, d)
	}
	for _, d := range []Delivery{
		{V: 1, ReportID: "r", EventID: "e", Outcome: OutcomeRejected, HTTPStatus: 400, Message: `isrc "X" is invalid <é>`, Fields: []string{"isrc", "user\nid"}, Replay: true, At: 5},
		{V: 1, ReportID: "r", EventID: "e", Outcome: OutcomeDelivered, HTTPStatus: 200, ServedBy: "live", Partner: "https://api.partner.example/base?q=\"é\"", At: 6},
		{V: 1, ReportID: "r", EventID: "e", Outcome: OutcomeDelivered, HTTPStatus: 200, InDoubt: true, DoubtCause: DoubtTimeout, ReplayID: "rp-1", ReplayReason: "partner lost \"14:02–14:40\"", At: 7},
	} {
		b := mustMarshal(t, d)
		all, fast = append(all, b), append(fast, b)
	}
	return all, fast
}

// edgeRecords are inputs at the edges of the targeted decoders.
var edgeRecords = []string{
	``, ` `, `null`, `[]`, `[1]`, `"x"`, `1`, `{}`, ` { } `, `{}x`, `{} {}`, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`,
	`{"event_id":"a","event_id":"b"}`, `{"event_id":"a","EVENT_ID":"b"}`, `{"Event_Id":"a"}`, `{"event_\u0069d":"a"}`,
	`{"event_id":null,"mix_id":null,"user_id":"u"}`, `{"mix_id":1.0}`, `{"mix_id":1e3}`, `{"mix_id":-0}`, `{"mix_id":01}`,
	`{"mix_id":9223372036854775807}`, `{"mix_id":9223372036854775808}`, `{"mix_id":-9223372036854775808}`, `{"mix_id":-9223372036854775809}`,
	`{"mix_id":"42"}`, `{"mix_id":true}`, `{"event_id":42}`, `{"event_id":"a\"b\\c\u00e9\ud800"}`, "{\"event_id\":\"\xc3\x28\"}",
	"{\"event_id\":\"a\x01\"}", `{"x":{"y":[1,2.5e-3,{"z":null}],"w":"\n"},"event_id":"ok"}`, `{"x":[}`, `{"x":tru}`, `{"x":nul}`,
	`{"x":-}`, `{"x":1.}`, `{"x":.5}`, `{"x":1e}`, `{"x":"\x"}`, `{"x":"\u12"}`, `{"événement":1,"event_id":"a"}`,
	`{"v":1,"report_id":"r","report":{"trackid":1,"TrackID":2}}`, `{"report_id":"r","report":null}`, `{"report_id":"r","report":[]}`,
	`{"report_id":"r","report":{"isrc":"A","isrc":"B"}}`, `{"report_id":"r","position":2147483648}`, `{"report_id":"r","below_minimum":1}`,
	`{"report_id":"r","fields":null}`, `{"report_id":"r","fields":[]}`, `{"report_id":"r","fields":["a",null]}`, `{"report_id":"r","fields":[1]}`,
	`{"report_id":"r","replay":false,"replay":true}`, `{"report_id":"r","http_status":-1}`, `{"v":1,"violations":null,"source":null}`,
	`{"violations":[]}`, `{"violations":[null]}`, `{"violations":[{"reason":"r","Reason":"s"}]}`, `{"source":{"partition":2147483648}}`,
	`{"source":{"partition":-2147483648,"offset":-1}}`, `{"raw":"{\"a\":1}","raw_base64":false}`, `{"raw":"eyJ9","raw_base64":true}`, `{"raw":"{\"a","raw_len":200000,"raw_sha256":"ab","raw_truncated":true}`, `{"raw_len":1.5,"raw_truncated":"x"}`,
	`{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, "\t{\"event_id\"\r\n:\"a\"}\n",
}

// checkSameDecoding fails when a decoder of a record type gives another
// value or error than encoding/json for b (over a []byte and over a string),
// or when its one-pass decoder takes b with a value other than
// encoding/json's.
func checkSameDecoding(t *testing.T, b []byte) {
	t.Helper()
	checkDecoder(t, "track play", b, DecodeTrackPlay[[]byte], DecodeTrackPlay[string], fastTrackPlay[string])
	checkDecoder(t, "delivery", b, DecodeDelivery[[]byte], DecodeDelivery[string], fastDelivery[string])
	checkDecoder(t, "rejection", b, DecodeRejection[[]byte], DecodeRejection[string], fastRejection[string])
	checkDecoder(t, "player event", b, DecodePlayerEvent[[]byte], DecodePlayerEvent[string], fastPlayerEvent[string])
	checkSameHead(t, b)
}

func checkDecoder[T any](t *testing.T, what string, b []byte, decB func([]byte, *T) error, decS func(string, *T) error, fast func(string, *T) bool) {
	t.Helper()
	var want T
	wantErr := json.Unmarshal(b, &want)
	for i, dec := range []func(*T) error{
		func(v *T) error { return decB(b, v) },
		func(v *T) error { return decS(string(b), v) },
	} {
		var got T
		err := dec(&got)
		if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("%s (form %d) of %q: error %v, encoding/json: %v", what, i, b, err, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s (form %d) of %q:\n decoder       %#v\n encoding/json %#v", what, i, b, got, want)
		}
	}
	var got T
	if fast(string(b), &got) {
		if wantErr != nil {
			t.Fatalf("%s: one-pass decoder took %q, encoding/json: %v", what, b, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s of %q: one-pass\n decoder       %#v\n encoding/json %#v", what, b, got, want)
		}
	}
}

// checkSameHead fails t unless DecodeTrackPlayHead gives exactly what
// encoding/json gives for b; it returns whether the one-pass decoder took b.
func checkSameHead(t testing.TB, b []byte) bool {
	t.Helper()
	var want TrackPlayHead
	wantErr := json.Unmarshal(b, &want)
	var got TrackPlayHead
	gotErr := DecodeTrackPlayHead(b, &got)
	var fast TrackPlayHead
	took := fastTrackPlayHead(b, &fast)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("record %q: error %v, encoding/json: %v", b, gotErr, wantErr)
	}
	if took && wantErr != nil {
		t.Fatalf("record %q: one-pass decoder took a record encoding/json refuses (%v)", b, wantErr)
	}
	if gotErr == nil && !sameHead(got, want) {
		t.Fatalf("record %q:\n got  %+v (report %q)\n want %+v (report %q)", b, got, got.Report, want, want.Report)
	}
	if took && !sameHead(fast, want) {
		t.Fatalf("record %q: one-pass\n got  %+v (report %q)\n want %+v (report %q)", b, fast, fast.Report, want, want.Report)
	}
	if gotErr == nil {
		// The decoded report must not share the record's memory.
		c := bytes.Clone(b)
		var own TrackPlayHead
		_ = DecodeTrackPlayHead(c, &own)
		clear(c)
		if !bytes.Equal(own.Report, want.Report) {
			t.Fatalf("record %q: decoded report shares the record's memory", b)
		}
	}
	return took
}

func sameHead(a, b TrackPlayHead) bool {
	return a.ReportID == b.ReportID && a.EventID == b.EventID && a.BelowMinimum == b.BelowMinimum &&
		bytes.Equal(a.Report, b.Report) && (a.Report == nil) == (b.Report == nil)
}

// trickyRecordStrings are strings whose JSON encoding needs escapes (quotes,
// backslashes, control bytes, HTML characters, U+2028/2029), non-ASCII
// text, or nothing at all.
var trickyRecordStrings = []string{
	"", "plain", "GB-A1B-23-00042", `US"QT\1"9900`, "FR\tZ03\n1700001", "<b>&amp;</b>", "caf\u00e9 \u2028\u2029",
	"\x00\x01\x1f", "Björk – Jóga", "日本語のミックス", "emoji 🎧", `\u0041`, "/slash/", "\x7f",
}

// variedPlays builds n track plays with every field varied, tricky strings
// in the ids and the report, and the optional fields on and off.
func variedPlays(n int) []TrackPlay {
	r := rand.New(rand.NewPCG(7, 11))
	pick := func() string { return trickyRecordStrings[r.IntN(len(trickyRecordStrings))] }
	out := make([]TrackPlay, n)
	for i := range out {
		event := fmt.Sprintf("ev-%d", i)
		if i%7 == 3 {
			event += pick()
		}
		id := ReportID(event, i%5)
		if i%11 == 5 {
			id = pick()
		}
		tp := TrackPlay{
			V: TrackPlayVersion, ReportID: id, EventID: event, MixID: r.Int64N(1 << 40), Position: i % 30,
			OverlapMS: r.Int64N(600_000), BelowMinimum: i%4 == 1, NoUserID: i%6 == 2, StandbyListing: i%9 == 4,
			DerivedAt: 1_700_000_000_000 + int64(i), EventAt: int64(i%2) * (1_699_999_999_000 + int64(i)),
			Report: PlayReport{
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

func TestDecodersMatchEncodingJSON(t *testing.T) {
	all, fast := realRecords(t)
	for _, b := range all {
		checkSameDecoding(t, b)
	}
	for _, s := range edgeRecords {
		checkSameDecoding(t, []byte(s))
	}
	// The pipeline's own records take the one-pass decoders (the test fails
	// if they silently fell back to encoding/json).
	for _, b := range fast {
		var ev PlayerEvent
		var p TrackPlay
		var d Delivery
		if !fastPlayerEvent(string(b), &ev) && !fastTrackPlay(string(b), &p) && !fastDelivery(string(b), &d) {
			t.Errorf("record fell back to encoding/json: %s", b)
		}
	}
	var rejections int
	for _, b := range all {
		var j Rejection
		if strings.Contains(string(b), `"violations"`) && fastRejection(string(b), &j) {
			rejections++
			if j.Source.Topic != "plays.events" || j.At == 0 {
				t.Errorf("rejection decoded as %+v", j)
			}
		}
	}
	if rejections < 10 {
		t.Errorf("only %d rejections took the one-pass decoder", rejections)
	}
}

// TestDecodeZeroCopy: over a string, the plain strings of a decoded record
// are substrings of the input.
func TestDecodeZeroCopy(t *testing.T) {
	plays := variedPlays(1)
	s := string(AppendTrackPlay(nil, &plays[0]))
	var tp TrackPlay
	if err := DecodeTrackPlay(s, &tp); err != nil {
		t.Fatal(err)
	}
	in := func(v string) bool {
		start := strings.Index(s, v)
		return start >= 0 && len(v) > 0 && unsafeSameMemory(s[start:start+len(v)], v)
	}
	if !in(tp.EventID) || !in(tp.Report.OS) {
		t.Errorf("decoded strings are copies")
	}
}

func TestDecodeTrackPlayHead(t *testing.T) {
	fastCount := 0
	plays := variedPlays(2000)
	for i := range plays {
		b := AppendTrackPlay(nil, &plays[i])
		if checkSameHead(t, b) {
			fastCount++
		}
		// The report is posted as its exact bytes: the consumer's encoding
		// of the PlayReport.
		var got TrackPlayHead
		if err := DecodeTrackPlayHead(b, &got); err != nil {
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
	if fastCount < len(plays)*3/4 {
		t.Fatalf("one-pass decoder took %d of %d consumer records", fastCount, len(plays))
	}

	good := `{"v":1,"report_id":"r1","event_id":"e1","below_minimum":false,"report":{"trackid":1,"isrc":"A\"B"}}`
	if !checkSameHead(t, []byte(good)) {
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
		{`{"report_id":"r\n","report":{}}`, true},
		{`{"report_id":"r\u00e9","report":{}}`, true},
		{`{"report_id":"` + "r\xff" + `","report":{}}`, true},
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
		if took := checkSameHead(t, []byte(c.rec)); took != c.fast {
			t.Errorf("record %q: fast path took it: %v, want %v", c.rec, took, c.fast)
		}
	}
}

// FuzzDecodeRecords: whatever the bytes, every record decoder agrees with
// encoding/json (make fuzz; go test ./schemas -run '^$' -fuzz FuzzDecodeRecords -fuzztime 30s).
func FuzzDecodeRecords(f *testing.F) {
	all, _ := realRecords(f)
	for _, b := range all {
		f.Add(b)
	}
	for _, s := range edgeRecords {
		f.Add([]byte(s))
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
		checkSameDecoding(t, b)
	})
}

// BenchmarkDecodeTrackPlay: the reporter's decoding of a consumer record
// (the head) and the sink's (the whole record over a string), against
// encoding/json.
//
//	go test -run '^$' -bench BenchmarkDecodeTrackPlay -benchmem ./schemas/
func BenchmarkDecodeTrackPlay(b *testing.B) {
	plays := variedPlays(1)
	tp := plays[0]
	tp.ReportID, tp.EventID, tp.Report.SourceDetail, tp.Report.Device, tp.Report.UserID, tp.Report.ISRC = ReportID("bench-event", 0), "bench-event", "Test mix", "phone", "u-1", "DEX123456789"
	rec := AppendTrackPlay(nil, &tp)
	b.Run("head", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w TrackPlayHead
			if err := DecodeTrackPlayHead(rec, &w); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("head_encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w TrackPlayHead
			if err := json.Unmarshal(rec, &w); err != nil {
				b.Fatal(err)
			}
		}
	})
	s := string(rec)
	b.Run("string", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w TrackPlay
			if err := DecodeTrackPlay(s, &w); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w TrackPlay
			if err := json.Unmarshal(rec, &w); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func unsafeSameMemory(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}
