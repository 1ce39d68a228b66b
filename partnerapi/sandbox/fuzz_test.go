package sandbox

import (
	"encoding/json"
	"strings"
	"testing"
)

func FuzzReportValidation(f *testing.F) {
	for _, s := range []string{
		`{"trackid":400001,"playedat":1763000000000,"playlength":30,"sourcestream":"mix","sourcedetail":"x","os":"iOS","device":"phone","country":"US","vendor":1}`,
		`{"trackid":1.0,"playLength":"3","country":"usa","isrc":"\u0055S","cachedplay":1,"x":{"a":[1,{"b":"}"}]}}`,
		`{"\u0074rackid":1,"trackid":2}`, `[]`, `{}`, `null`, `"str"`, `{"a":}`, `{"trackid":-0}`, ``, `{"os":"\"\\"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// The member scanner agrees with encoding/json on every valid object.
		var m map[string]json.RawMessage
		if json.Valid(body) && json.Unmarshal(body, &m) == nil && m != nil {
			got := map[string]string{}
			if !scanObject(string(body), func(k, v string) { got[k] = v }) {
				t.Fatalf("scanner refused a valid object %q", body)
			}
			if len(got) != len(m) {
				t.Fatalf("scanner found %d members, encoding/json %d: %q", len(got), len(m), body)
			}
			for k, v := range m {
				if got[k] != string(v) {
					t.Fatalf("member %q: scanner %q, encoding/json %q", k, got[k], v)
				}
			}
		}
		r, err := ValidateReport(body)
		if err != nil {
			re, ok := err.(*ReportError)
			if !ok || len(re.Fields) == 0 || !(strings.HasPrefix(re.Message(), "include the required fields: ") || strings.HasPrefix(re.Message(), "wrongly typed optional fields: ")) {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		// Accepted: the body is a JSON object whose fields agree with encoding/json.
		if json.Unmarshal(body, &m) != nil {
			t.Fatalf("accepted a body encoding/json rejects: %q", body)
		}
		var tid int64
		if json.Unmarshal(m["trackid"], &tid) != nil || tid != r.TrackID || r.TrackID < 1 {
			t.Fatalf("trackid %d vs %s", r.TrackID, m["trackid"])
		}
		var country string
		if json.Unmarshal(m["country"], &country) != nil || country != r.Country || len(country) != 2 {
			t.Fatalf("country %q vs %s", r.Country, m["country"])
		}
		_ = canonical(nil, &r)
		_ = qualityFlags(&r, &Catalog{trackByID: map[int64]*Track{r.TrackID: {ID: r.TrackID, LengthSec: 10}}})
	})
}
