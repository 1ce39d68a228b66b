package schemas

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"testing"
)

// TestReportIDRule: ReportID and AppendReportID are the first 16 bytes of
// SHA-256(eventID, 0x00, position) in hex, computed here independently, for
// short, tricky and over-long event ids; AppendReportID does not allocate.
func TestReportIDRule(t *testing.T) {
	long := string(bytes.Repeat([]byte("x"), MaxEventIDLen+1))
	for _, id := range []string{"", "e", "ev-1-000001", "é 漢字 \x00 \xff", long} {
		for _, pos := range []int{0, 1, 9, 10, 123, 1 << 20} {
			h := sha256.Sum256([]byte(id + "\x00" + strconv.Itoa(pos)))
			want := hex.EncodeToString(h[:16])
			if got := ReportID(id, pos); got != want {
				t.Fatalf("ReportID(%q, %d) = %s, want %s", id, pos, got, want)
			}
			if got := string(AppendReportID([]byte("p:"), id, pos)); got != "p:"+want {
				t.Fatalf("AppendReportID(%q, %d) = %s, want p:%s", id, pos, got, want)
			}
		}
	}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = AppendReportID(buf[:0], "ev-1-000001", 3) }); n != 0 {
		t.Fatalf("AppendReportID allocates %v times", n)
	}
}
