package analytics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// realRecords returns records as the pipeline writes them: the schema's
// event test files (valid and invalid), the rejections of each, track plays
// and deliveries of every outcome. fast lists those the targeted decoders
// must take (plain records of the pipeline) rather than fall back on.
func realRecords(t testing.TB) (all [][]byte, fast [][]byte) {
	files, err := filepath.Glob("../schemas/testdata/events/*/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no event test files: %v", err)
	}
	for i, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, raw)
		vs := []schemas.Violation{{Field: "user_id", Reason: schemas.ReasonMissingField, Detail: `"user_id" is required`}}
		if i%3 == 0 {
			vs = append(vs, schemas.Violation{Reason: schemas.ReasonMalformedJSON, Detail: "ü\x00\t<>&"})
		}
		rj := mustJSON(t, schemas.NewRejection(raw, "ev-"+filepath.Base(f), vs, schemas.Source{Topic: "plays.events", Partition: int32(i % 3), Offset: int64(i)}, 1_700_000_000_000))
		all = append(all, rj)
		if strings.Contains(f, "/valid/") {
			fast = append(fast, raw)
		}
	}
	// Invalid UTF-8 events (raw_base64 in their rejection).
	bad := []byte("{\"event_id\":\"\xff\xfe\"}")
	all = append(all, bad, mustJSON(t, schemas.NewRejection(bad, "", nil, schemas.Source{Topic: "plays.events"}, 1)))
	for pos := range 3 {
		for _, below := range []bool{false, true} {
			_, p := playJSON(t, "ev-1", pos, below)
			all, fast = append(all, p), append(fast, p)
		}
	}
	end, cached := int64(3), true
	p := mustJSON(t, schemas.TrackPlay{V: schemas.TrackPlayVersion, ReportID: schemas.ReportID("ev-2", 4), EventID: "ev-2", MixID: -1, Position: 4,
		OverlapMS: 1, NoUserID: true, StandbyListing: true, DerivedAt: 1,
		Report: partnerapi.PlayReport{TrackID: 9, PlayedAt: 2, PlayLength: 3, Country: "FR", EndReason: &end, CachedPlay: &cached, ISRC: "FR\u00e9\"x"}})
	all, fast = append(all, p), append(fast, p)
	for _, o := range []string{schemas.OutcomeDelivered, schemas.OutcomeRejected, schemas.OutcomeStandby, schemas.OutcomeRetry, schemas.OutcomeBlocked} {
		d := deliveryJSON(t, "rid-1", "ev-1", o, 2, 1_700_000_000_123, "4bf92f3577b34da6a3ce929d0e0e4736", "plain message")
		all, fast = append(all, d), append(fast, d)
	}
	d := mustJSON(t, schemas.Delivery{V: 1, ReportID: "r", EventID: "e", Outcome: schemas.OutcomeRejected, HTTPStatus: 400,
		Message: `isrc "X" is invalid <é>`, Fields: []string{"isrc", "user\nid"}, Replay: true, At: 5})
	all, fast = append(all, d), append(fast, d)
	d = mustJSON(t, schemas.Delivery{V: 1, ReportID: "r", EventID: "e", Outcome: schemas.OutcomeDelivered, HTTPStatus: 200, ServedBy: "live",
		Partner: "https://api.partner.example/base?q=\"é\"", At: 6})
	all, fast = append(all, d), append(fast, d)
	d = mustJSON(t, schemas.Delivery{V: 1, ReportID: "r", EventID: "e", Outcome: schemas.OutcomeDelivered, HTTPStatus: 200, InDoubt: true,
		ReplayID: "rp-1", ReplayReason: "partner lost \"14:02–14:40\"", At: 7})
	all, fast = append(all, d), append(fast, d)
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

// checkSameDecoding fails when a targeted decoder accepts b but leaves a
// value other than encoding/json's, and when the sink's decoding (targeted,
// else encoding/json) differs from encoding/json's alone.
func checkSameDecoding(t *testing.T, b []byte) {
	t.Helper()
	s := string(b)
	same := func(what string, ok bool, got, want any, err error) {
		t.Helper()
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("%s: targeted decoder accepted %q, encoding/json: %v", what, b, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s of %q:\n targeted      %#v\n encoding/json %#v", what, b, got, want)
		}
	}
	var ev, evRef eventFields
	same("event", fastEvent(s, &ev), ev, evRef, json.Unmarshal(b, &evRef))
	gotEv, gotParsed := decodeEvent(b, s)
	wantEv, wantParsed := decodeEventJSON(b)
	if gotParsed != wantParsed || gotEv != wantEv {
		t.Fatalf("event row of %q: %v/%d, want %v/%d", b, gotEv, gotParsed, wantEv, wantParsed)
	}
	var pl, plRef playRecord
	same("play", fastPlay(s, &pl), pl, plRef, json.Unmarshal(b, &plRef))
	var d, dRef schemas.Delivery
	same("delivery", fastDelivery(s, &d), d, dRef, json.Unmarshal(b, &dRef))
	var j, jRef schemas.Rejection
	same("rejection", fastRejection(s, &j), j, jRef, json.Unmarshal(b, &jRef))
}

func TestFastDecodeMatchesEncodingJSON(t *testing.T) {
	all, fast := realRecords(t)
	for _, b := range all {
		checkSameDecoding(t, b)
	}
	for _, s := range edgeRecords {
		checkSameDecoding(t, []byte(s))
	}
	// The pipeline's own records take the targeted decoders (the test fails
	// if they silently fell back to encoding/json).
	for _, b := range fast {
		var ev eventFields
		var p playRecord
		var d schemas.Delivery
		if !fastEvent(string(b), &ev) && !fastPlay(string(b), &p) && !fastDelivery(string(b), &d) {
			t.Errorf("record fell back to encoding/json: %s", b)
		}
	}
	var rejections int
	for _, b := range all {
		var j schemas.Rejection
		if strings.Contains(string(b), `"violations"`) && fastRejection(string(b), &j) {
			rejections++
			if j.Source.Topic != "plays.events" || j.At == 0 {
				t.Errorf("rejection decoded as %+v", j)
			}
		}
	}
	if rejections < 10 {
		t.Errorf("only %d rejections took the targeted decoder", rejections)
	}
}

// FuzzFastDecode: whatever the bytes, the targeted decoders agree with
// encoding/json or fall back to it (make fuzz; go test ./analytics -run '^$' -fuzz FuzzFastDecode -fuzztime 30s).
func FuzzFastDecode(f *testing.F) {
	all, _ := realRecords(f)
	for _, b := range all {
		f.Add(b)
	}
	for _, s := range edgeRecords {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkSameDecoding(t, b)
	})
}
