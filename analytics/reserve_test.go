package analytics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
)

// TestReserveStrings: the reservation leaves the column empty, and the
// values appended afterwards read back exactly (no padding leaks into them).
func TestReserveStrings(t *testing.T) {
	for _, n := range []int{0, 1, 2, 100, 5000} {
		vals := make([]string, n)
		for i := range vals {
			vals[i] = fmt.Sprintf("row-%d-%s", i, strings.Repeat("x", i%300))
		}
		c := &column.String{}
		reserveStrings(c, maxChunkBytes(vals, insertChunk))
		if c.Rows() != 0 {
			t.Fatalf("n=%d: %d rows after reserve, want 0", n, c.Rows())
		}
		if _, err := c.Append(vals); err != nil {
			t.Fatal(err)
		}
		if c.Rows() != n {
			t.Fatalf("n=%d: %d rows, want %d", n, c.Rows(), n)
		}
		for i, want := range vals {
			if got := c.Row(i, false).(string); got != want {
				t.Fatalf("n=%d: row %d = %q, want %q", n, i, got, want)
			}
		}
	}
	// A column that already holds rows is not touched.
	c := &column.String{}
	if _, err := c.Append([]string{"a"}); err != nil {
		t.Fatal(err)
	}
	reserveStrings(c, 70<<10)
	if c.Rows() != 1 || c.Row(0, false).(string) != "a" {
		t.Fatalf("a non-empty column changed: %d rows", c.Rows())
	}
}
