package schemas

import (
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// fastVsSlowSeeds are inputs at the edges of what the fast path takes: each
// must give the same result through ParseEvent as through encoding/json.
var fastVsSlowSeeds = []string{
	`{"event_id":"e","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"de","os":"o","device":"d","vendor":1}`,
	// Escapes and unicode in values.
	`{"event_id":"e\"\\\/\b\f\n\r\t","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"\u00e9\u4e2d","country":"D\u0045","os":"o","device":"d","vendor":1}`,
	`{"event_id":"\ud83c\udfa7","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"\ud83c","country":"DE","os":"\udfa7x","device":"\ud83c\u0041","vendor":1,"source_stream":"\uD83C\uDFA7"}`,
	`{"event_id":"é🎧","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"DÉ","os":"o","device":"d","vendor":1}`,
	`{"event_id":"e\'","mix_id":1}`,
	`{"event_id":"e\u12","mix_id":1}`,
	"{\"event_id\":\"e\x01\",\"mix_id\":1}",
	// Keys: escaped, other case, Unicode folding (K is KELVIN SIGN, ſ LONG S).
	`{"event\u005fid":"e","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`,
	`{"EVENT_ID":"e","Mix_Id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`,
	`{"event_id":"e","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"DE","oſ":"o","device":"d","vendor":1,"jump_forward":true}`,
	`{"event_id":"e","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1,"cached":false,"event_id":"e2"}`,
	// Duplicate keys, including with null.
	`{"event_id":"e","event_id":null,"mix_id":1}`,
	`{"event_id":null,"event_id":"e","mix_id":1}`,
	`{"cached":true,"cached":"x"}`,
	`{"x":1,"x":2,"event_id":"e"}`,
	// Unknown fields of every type, nested.
	`{"a":{"b":[1,{"c":null},"d",true,false,-0.5e+3,[]],"e":{}},"event_id":"e","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`,
	`{"a":[1,],"event_id":"e"}`,
	`{"a":{"b":1,},"event_id":"e"}`,
	`{"a":[` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `]}`,
	`{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":1e}`, `{"a":.5}`, `{"a":tru}`, `{"a":nul}`,
	`{"":1,"_":"\u0000"}`,
	// Numbers.
	`{"mix_id":9223372036854775807,"started_at":-9223372036854775808,"offset_ms":-0,"duration_ms":0}`,
	`{"mix_id":9223372036854775808,"started_at":-9223372036854775809}`,
	`{"mix_id":99999999999999999999,"vendor":1.0,"end_reason":1e3}`,
	`{"mix_id":01,"vendor":1E3}`,
	`{"mix_id":-01}`,
	`{"mix_id":1.5,"started_at":"1","offset_ms":true,"duration_ms":null,"cached":1,"jump_forward":"true","event_id":5}`,
	`{"end_reason":-0.0,"vendor":0e0}`,
	// Whitespace and structure.
	" \t\r\n{ \"event_id\" : \"e\" , \"mix_id\" : 1 } \n",
	"\v{\"event_id\":\"e\"}",
	"{\"event_id\":\"e\"}\f",
	"\u00a0{\"event_id\":\"e\"}",
	`{"event_id":"e"}x`, `{"event_id":"e"}{}`, `{"event_id":"e"`, `{"event_id":"e",}`, `{"event_id" "e"}`,
	`{,}`, `{}`, ` {} `, `{"event_id":}`, `{"event_id"`, `{"event_id`, `{`, `{"a":"b`,
	`{"cached":True}`, `{"cached":nulll}`, `{"cached":null,"jump_forward":false}`,
	// Strict keys: duplicates (also of unknown keys and past the fast path's
	// unknown-key limit), case variants beside and instead of the field.
	`{"x":1,"y":{"x":2},"x\u0000":3,"X":4}`,
	`{"event_id":"e","EVENT_ID":"f","event_id":"g","Event_Id":"h"}`,
	`{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1,"i":1,"a":2}`,
	`{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1,"a":2}`,
	`{"x\u0041":1,"xA":2}`,
	// Implausible times: seconds, microseconds, 2100, 2^63−1, overflowing sums.
	`{"event_id":"t","mix_id":1,"started_at":1768100000,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"de","os":"o","device":"d","vendor":1}`,
	`{"event_id":"t","mix_id":1,"started_at":1768100000000000,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"de","os":"o","device":"d","vendor":1}`,
	`{"event_id":"t","mix_id":1,"started_at":4102444800000,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"de","os":"o","device":"d","vendor":1}`,
	`{"event_id":"t","mix_id":1,"started_at":9223372036854775807,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"de","os":"o","device":"d","vendor":1}`,
	`{"event_id":"t","mix_id":1,"started_at":1768100000000,"offset_ms":9223372036854775807,"duration_ms":9223372036854775807,"user_id":"u","country":"de","os":"o","device":"d","vendor":1}`,
}

// TestFastPathTaken checks that the fast path does answer for the common
// events: the valid examples and the invalid ones that are well-formed JSON
// with the right types.
func TestFastPathTaken(t *testing.T) {
	for _, c := range goldenCases(t) {
		var r rawEvent
		ok := fastDecodeEvent(c.raw, &r)
		if c.valid && !ok {
			t.Errorf("%s: the fast path gave up on a valid event", c.name)
		}
	}
	for _, s := range []string{
		fastVsSlowSeeds[0], fastVsSlowSeeds[1], fastVsSlowSeeds[2], fastVsSlowSeeds[15],
		`{"":1,"_":"\u0000"}`, ` {} `, `{"mix_id":-0,"cached":null}`,
	} {
		var r rawEvent
		if !fastDecodeEvent([]byte(s), &r) {
			t.Errorf("the fast path gave up on %s", s)
		}
	}
	for _, s := range []string{
		`{"event\u005fid":"e"}`, `{"EVENT_ID":"e"}`, `{"oſ":"o"}`, `{"event_id":"e","event_id":null}`,
		`{"mix_id":1.0}`, `{"mix_id":1e3}`, `{"mix_id":9223372036854775808}`, `{"mix_id":"1"}`, `{"a":01}`,
		`{"a":1}x`, "\v{}", `{"a":[1,]}`, `{"x":1,"x":2}`, `{"Country":"DE"}`,
		`{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1,"i":1}`,
	} {
		var r rawEvent
		if fastDecodeEvent([]byte(s), &r) {
			t.Errorf("the fast path answered for %s, which encoding/json must decide", s)
		}
	}
}

// TestFastPathDecodes checks a few decodings against hand-written values
// (not only against encoding/json).
func TestFastPathDecodes(t *testing.T) {
	raw := []byte(`{"event_id":"a\"\u00e9\ud83c\udfa7\ud83c","mix_id":-9223372036854775808,"started_at":9223372036854775807,"offset_ms":-0,"duration_ms":7,` +
		`"country":"de","os":"o","device":null,"vendor":0,"cached":false,"jump_forward":true,"x":{"y":[{}]}}`)
	var r rawEvent
	if !fastDecodeEvent(raw, &r) {
		t.Fatal("fast path gave up")
	}
	if r.EventID == nil || *r.EventID != "a\"é🎧\uFFFD" {
		t.Errorf("event_id %q", deref(r.EventID))
	}
	if *r.MixID != -1<<63 || *r.StartedAt != 1<<63-1 || *r.OffsetMS != 0 || *r.DurationMS != 7 || *r.Vendor != 0 {
		t.Errorf("integers %d %d %d %d %d", *r.MixID, *r.StartedAt, *r.OffsetMS, *r.DurationMS, *r.Vendor)
	}
	if r.Device != nil || r.UserID != nil || r.SourceStream != nil || r.EndReason != nil {
		t.Errorf("absent or null fields set: %+v", r)
	}
	if *r.Country != "de" || *r.OS != "o" || *r.Cached != false || *r.JumpForward != true {
		t.Errorf("fields %q %q %v %v", *r.Country, *r.OS, *r.Cached, *r.JumpForward)
	}
}

func deref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// parseEventSlow is ParseEvent without the fast path: the reference the fast
// path is held to by FuzzParseEventFastVsSlow (test-only: the binary never
// needs it).
func parseEventSlow(raw []byte, opts ValidateOptions) (PlayerEvent, []Violation) {
	if !utf8.Valid(raw) || !looksLikeObject(raw) {
		return PlayerEvent{}, []Violation{{Reason: ReasonMalformedJSON, Detail: malformedDetail(raw, nil)}}
	}
	return parseEventJSON(raw, opts)
}

// FuzzParseEventFastVsSlow holds ParseEvent (fast path first) to exactly the
// results of the encoding/json path, under both policies.
func FuzzParseEventFastVsSlow(f *testing.F) {
	for _, c := range goldenCases(f) {
		f.Add(c.raw)
	}
	for _, s := range fastVsSlowSeeds {
		f.Add([]byte(s))
	}
	policies := []ValidateOptions{{}, {AllowMissingUserID: true, DefaultVendor: i64(7)},
		{ArrivalMS: 1_768_100_000_000}, {ArrivalMS: 1_700_000_100_000, Window: TimeWindow{Back: time.Hour, Ahead: time.Minute}}}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, opts := range policies {
			ev, vs := ParseEvent(raw, opts)
			wantEv, wantVs := parseEventSlow(raw, opts)
			if !reflect.DeepEqual(ev, wantEv) || !reflect.DeepEqual(vs, wantVs) {
				t.Fatalf("ParseEvent(%q, %+v):\n fast: %+v %#v\n slow: %+v %#v", raw, opts, ev, vs, wantEv, wantVs)
			}
		}
	})
}
