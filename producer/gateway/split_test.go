package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
)

func TestSplitBatch(t *testing.T) {
	tests := []struct {
		body   string
		ndjson bool
		want   []string
		err    bool
	}{
		{body: `[{"a":1}, {"b":[1,2]} ,3]`, want: []string{`{"a":1}`, `{"b":[1,2]}`, `3`}},
		{body: " \n[\n{\"a\":1}\n]\n", want: []string{`{"a":1}`}},
		{body: "{\"a\":1}\r\n\n \t\n  {\"b\":2}  \n{bad", want: []string{`{"a":1}`, `  {"b":2}  `, `{bad`}},
		{body: `[{"a":1}]`, ndjson: true, want: []string{`[{"a":1}]`}}, // declared NDJSON: one (malformed) event
		{body: `{"a":1}`, want: []string{`{"a":1}`}},
		{body: "", want: nil},
		{body: `[`, err: true},
		{body: `[1,]`, err: true},
		{body: `[1] [2]`, err: true},
		{body: `[1,2,3,4]`, err: true},      // more than 3
		{body: "1\n2\n3\n\n4\n", err: true}, // more than 3
		{body: "1\n2\n3\n\n\n", want: []string{"1", "2", "3"}},
	}
	for i, tt := range tests {
		got, err := splitBatch([]byte(tt.body), tt.ndjson, 3)
		if (err != nil) != tt.err {
			t.Errorf("%d %q: err %v", i, tt.body, err)
			continue
		}
		var gs []string
		for _, g := range got {
			gs = append(gs, string(g))
		}
		if fmt.Sprint(gs) != fmt.Sprint(tt.want) {
			t.Errorf("%d %q: got %q, want %q", i, tt.body, gs, tt.want)
		}
	}
}

// FuzzSplitBatch: any body splits without panic into at most maxEvents
// non-blank events; array elements are valid JSON values; NDJSON events are
// trimmed lines of the body.
func FuzzSplitBatch(f *testing.F) {
	for _, s := range []string{`[{"a":1},2]`, "{\"a\":1}\n{\"b\":2}", "[", " \n", `["x",{"y":[1,{}]}]  `, "\x00\xff\n["} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, ndjson bool) {
		const max = 5
		got, err := splitBatch(body, ndjson, max)
		if err != nil {
			if errors.Is(err, errTooManyEvents) && len(got) != 0 {
				t.Fatal("events returned with an error")
			}
			return
		}
		if len(got) > max {
			t.Fatalf("%d events, max %d", len(got), max)
		}
		isArray := !ndjson && len(bytes.TrimLeft(body, " \t\r\n")) > 0 && bytes.TrimLeft(body, " \t\r\n")[0] == '['
		for _, e := range got {
			if len(e) == 0 {
				t.Fatal("an empty event")
			}
			if isArray && !json.Valid(e) {
				t.Fatalf("array element %q is not valid JSON", e)
			}
			if !isArray && (!bytes.Contains(body, e) || bytes.Contains(e, []byte{'\n'})) {
				t.Fatalf("NDJSON event %q is not a line of the body", e)
			}
		}
	})
}
