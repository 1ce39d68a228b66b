package schemas

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func i64(v int64) *int64 { return &v }

// TestParseEventOptions covers the deployment policies of ValidateOptions.
func TestParseEventOptions(t *testing.T) {
	const noUser = `{"event_id":"e","mix_id":1,"started_at":1700000000000,"offset_ms":0,"duration_ms":1000,"country":"de","os":"o","device":"d","vendor":5}`
	const noVendor = `{"event_id":"e","mix_id":1,"started_at":1700000000000,"offset_ms":0,"duration_ms":1000,"user_id":"u","country":"DE","os":"o","device":"d"}`
	tests := []struct {
		name       string
		raw        string
		opts       ValidateOptions
		wantReason []string // nil: valid
		check      func(t *testing.T, ev PlayerEvent)
	}{
		{name: "missing user quarantined by default", raw: noUser, wantReason: []string{ReasonMissingUserID}},
		{name: "missing user let through by policy", raw: noUser, opts: ValidateOptions{AllowMissingUserID: true},
			check: func(t *testing.T, ev PlayerEvent) {
				if ev.UserID != "" || ev.Country != "DE" || *ev.Vendor != 5 {
					t.Errorf("got %+v", ev)
				}
			}},
		{name: "missing vendor without default", raw: noVendor, wantReason: []string{ReasonMissingField}},
		{name: "missing vendor takes the default", raw: noVendor, opts: ValidateOptions{DefaultVendor: i64(9)},
			check: func(t *testing.T, ev PlayerEvent) {
				if ev.Vendor == nil || *ev.Vendor != 9 {
					t.Errorf("vendor %v, want 9", ev.Vendor)
				}
			}},
		{name: "present vendor wins over the default", raw: noUser, opts: ValidateOptions{AllowMissingUserID: true, DefaultVendor: i64(9)},
			check: func(t *testing.T, ev PlayerEvent) {
				if *ev.Vendor != 5 {
					t.Errorf("vendor %d, want 5", *ev.Vendor)
				}
			}},
		{name: "wrong type user_id is not also missing", raw: strings.Replace(noVendor, `"user_id":"u"`, `"user_id":7`, 1), opts: ValidateOptions{DefaultVendor: i64(1)},
			wantReason: []string{ReasonWrongType}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, vs := ParseEvent([]byte(tt.raw), tt.opts)
			var got []string
			for _, v := range vs {
				got = append(got, v.Reason)
			}
			if !reflect.DeepEqual(got, tt.wantReason) {
				t.Fatalf("reasons %v, want %v (%v)", got, tt.wantReason, vs)
			}
			if tt.check != nil {
				tt.check(t, ev)
			}
		})
	}
}

func TestParseEventDefaultVendorNotAliased(t *testing.T) {
	def := i64(9)
	ev, vs := ParseEvent([]byte(`{"event_id":"e","mix_id":1,"started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"DE","os":"o","device":"d"}`),
		ValidateOptions{DefaultVendor: def})
	if vs != nil {
		t.Fatal(vs)
	}
	*ev.Vendor = 1
	if *def != 9 {
		t.Fatalf("changing the event's vendor changed the configured default to %d", *def)
	}
}

var knownReasons = map[string]bool{
	ReasonMalformedJSON: true, ReasonMissingField: true, ReasonWrongType: true, ReasonBadEventID: true,
	ReasonBadCountry: true, ReasonNegativeOffset: true, ReasonBadDuration: true, ReasonBadStartedAt: true,
	ReasonEmptyField: true, ReasonMissingUserID: true, ReasonDuplicateKey: true, ReasonKeyCase: true, ReasonImplausibleTime: true,
}

// FuzzParseEvent feeds arbitrary bytes to ParseEvent: it must not panic and
// must return either a valid event and no violation, or at least one
// violation with a known reason and a zero event. A valid event re-encoded
// parses to itself, and both policies agree on everything but their rules.
func FuzzParseEvent(f *testing.F) {
	for _, c := range goldenCases(f) {
		f.Add(c.raw)
	}
	f.Add([]byte(`{"event_id":"e","mix_id":1,"mix_id":"dup","started_at":1,"offset_ms":0,"duration_ms":1,"user_id":"u","country":"zz","os":"o","device":"d","vendor":1}`))
	f.Add([]byte(`{"event_id":null,"vendor":1e400}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, vs := ParseEvent(raw, ValidateOptions{})
		if vs == nil {
			if ev.EventID == "" || len(ev.EventID) > MaxEventIDLen || ev.StartedAt <= 0 || ev.OffsetMS < 0 || ev.DurationMS <= 0 ||
				ev.UserID == "" || ev.OS == "" || ev.Device == "" || ev.Vendor == nil || ev.SourceStream == "" {
				t.Fatalf("accepted an event that breaks a rule: %+v", ev)
			}
			if len(ev.Country) != 2 || ev.Country[0] < 'A' || ev.Country[0] > 'Z' || ev.Country[1] < 'A' || ev.Country[1] > 'Z' {
				t.Fatalf("accepted country %q", ev.Country)
			}
			b, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			ev2, vs2 := ParseEvent(b, ValidateOptions{})
			if vs2 != nil || !reflect.DeepEqual(ev, ev2) {
				t.Fatalf("round trip: %+v %v != %+v", ev2, vs2, ev)
			}
		} else {
			if !reflect.DeepEqual(ev, PlayerEvent{}) {
				t.Fatalf("violations %v with a non-zero event %+v", vs, ev)
			}
			for _, v := range vs {
				if !knownReasons[v.Reason] || v.Detail == "" {
					t.Fatalf("violation without a known reason or detail: %+v", v)
				}
			}
		}
		// The lenient policy can only remove the policy violations.
		_, lv := ParseEvent(raw, ValidateOptions{AllowMissingUserID: true, DefaultVendor: i64(1)})
		var strict []Violation
		for _, v := range vs {
			if v.Reason == ReasonMissingUserID || (v.Field == "vendor" && v.Reason == ReasonMissingField) {
				continue
			}
			strict = append(strict, v)
		}
		if !reflect.DeepEqual(strict, lv) {
			t.Fatalf("lenient policy gave %v, want %v", lv, strict)
		}
	})
}
