package jsonenc

import (
	"bytes"
	"encoding/json"
	"testing"
)

var tricky = []string{
	"", "plain", "GBAYE0601498", " us-s1z-99-00001\u00a0", `quote " and \ backslash`,
	"<script>&amp;</script>", "tab\tnewline\nreturn\rbell\a nul\x00 bs\b ff\f us\x1f del\x7f",
	"é ü ß 漢字 🎵", "line sep \u2028 para sep \u2029", "bad utf8 \xff\xfe end", "truncated \xe2\x82",
	"\xed\xa0\x80 surrogate", "\ufffd replacement", "\u0085 nel",
}

func check(t *testing.T, s string) {
	t.Helper()
	want, _ := json.Marshal(s)
	if got := AppendString(nil, s); !bytes.Equal(got, want) {
		t.Fatalf("%q: got %s want %s", s, got, want)
	}
	if got := AppendString(nil, []byte(s)); !bytes.Equal(got, want) {
		t.Fatalf("[]byte %q: got %s want %s", s, got, want)
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range tricky {
		check(t, s)
	}
	for b := 0; b < 256; b++ {
		check(t, string([]byte{'a', byte(b), 'z'}))
	}
}

func TestAppendStringNoAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = AppendString(buf[:0], tricky[6]) }); n != 0 {
		t.Fatalf("AppendString allocates %v times", n)
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range tricky {
		f.Add(s)
	}
	f.Fuzz(check)
}
