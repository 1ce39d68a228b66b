package schemas

import (
	"bytes"
	"encoding/json"
	"testing"
)

var trickyJSONStrings = []string{
	"", "plain", "GBAYE0601498", " us-s1z-99-00001\u00a0", `quote " and \ backslash`,
	"<script>&amp;</script>", "tab\tnewline\nreturn\rbell\a nul\x00 bs\b ff\f us\x1f del\x7f",
	"é ü ß 漢字 🎵", "line sep \u2028 para sep \u2029", "bad utf8 \xff\xfe end", "truncated \xe2\x82",
	"\xed\xa0\x80 surrogate", "\ufffd replacement", "\u0085 nel",
}

func checkAppendJSONString(t *testing.T, s string) {
	t.Helper()
	want, _ := json.Marshal(s)
	if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
		t.Fatalf("%q: got %s want %s", s, got, want)
	}
	if got := appendJSONString(nil, []byte(s)); !bytes.Equal(got, want) {
		t.Fatalf("[]byte %q: got %s want %s", s, got, want)
	}
}

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range trickyJSONStrings {
		checkAppendJSONString(t, s)
	}
	for b := 0; b < 256; b++ {
		checkAppendJSONString(t, string([]byte{'a', byte(b), 'z'}))
	}
}

func TestAppendJSONStringNoAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = appendJSONString(buf[:0], trickyJSONStrings[6]) }); n != 0 {
		t.Fatalf("appendJSONString allocates %v times", n)
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range trickyJSONStrings {
		f.Add(s)
	}
	f.Fuzz(checkAppendJSONString)
}
