package consumer

import (
	"bytes"
	"testing"

	"github.com/playpipe/playpipe/schemas"
)

var trickyStrings = []string{
	"", "plain", "GBAYE0601498", " us-s1z-99-00001\u00a0", `quote " and \ backslash`,
	"<script>&amp;</script>", "tab\tnewline\nreturn\rbell\a nul\x00 bs\b ff\f us\x1f del\x7f",
	"é ü ß 漢字 🎵", "line sep \u2028 para sep \u2029", "bad utf8 \xff\xfe end", "truncated \xe2\x82",
	"\xed\xa0\x80 surrogate", "\ufffd replacement", "\u0085 nel",
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
