package analytics

import (
	"fmt"
	"sync"

	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// How the sink hands its columns to ClickHouse (decision, docs/audit.md
// "Insert API"): through clickhouse-go's public batch API, one column at a
// time — batch.Column(i).Append of a typed slice ([]int64, []string, …) —
// never by writing the driver's unexported fields.
//
// ch-go's proto.Input would take the sink's columns as they are, without
// the copy Append makes, but ch-go cannot talk to ClickHouse 18.16, the one
// server that runs here with a native-protocol port (18.16 speaks protocol
// revision 54412; ch-go needs 54429, and its first query fails with
// UNKNOWN_SETTING): code that cannot be tested here is not shipped.
//
// The sink's columns are the driver's own types: a String column is a
// []string of views of the fetched records (recordString), so Append's copy
// into the driver's column is the only copy of a value before it is
// encoded (a column of the sink's own, a byte buffer, cost one copy more).

// fillBatch appends the columns of t to the driver's batch bt, column by
// column.
func fillBatch(bt driver.Batch, t table) error {
	cols := bt.Columns()
	for i, v := range t.values() {
		var c column.Interface
		if i < len(cols) {
			c = cols[i]
		}
		if err := appendColumn(bt.Column(i), c, v); err != nil {
			return fmt.Errorf("column %d: %w", i, err)
		}
	}
	return nil
}

// appendColumn appends the sink's column v to the driver's batch column bc
// (c is the same column as column.Interface, or nil).
func appendColumn(bc driver.BatchColumn, c column.Interface, v any) error {
	switch v := v.(type) {
	case []string:
		if s, ok := c.(*column.String); ok {
			reserveStrings(s, v)
		}
		return bc.Append(v)
	case [][]string:
		return appendArrays(bc, v)
	default:
		return bc.Append(v)
	}
}

// emptyStrings is an empty Array(String) row, boxed once.
var emptyStrings any = []string{}

// appendArrays appends an Array(String) column row by row. The driver's
// Append of a [][]string takes each row through reflection (a boxed
// reflect.Value and its slow path per row); AppendRow of a []string takes
// its plain path, and the usual empty row is boxed once.
func appendArrays(c driver.BatchColumn, rows [][]string) error {
	for _, r := range rows {
		var v any = emptyStrings
		if len(r) > 0 {
			v = r
		}
		if err := c.AppendRow(v); err != nil {
			return err
		}
	}
	return nil
}

// reserveStrings makes an empty String column hold vals' bytes without
// growing, before appendColumn appends them (columns.go). The driver
// appends a batch's strings one by one to a column
// buffer that starts empty for every insert, so a 10k-row column of record
// bodies was reallocated and copied ~20 times: that growth was a quarter of
// the sink's CPU (pprof of BenchmarkSinkEndToEnd). Appending one zero-filled
// string of the column's total length, then Reset (which keeps the
// capacity), allocates the byte buffer once at its final size. (The row
// offsets still grow: the driver has no way to size them.) Columns under
// 64 KiB are left alone. The padding is shared, read-only, and bounded by
// the largest column seen (at most a batch's bytes).
func reserveStrings(c *column.String, vals []string) {
	if c.Rows() != 0 || len(vals) < 2 {
		return
	}
	n := 0
	for _, v := range vals {
		n += len(v)
	}
	if n < 64<<10 {
		return
	}
	_, _ = c.Append([]string{zeros(n)})
	c.Reset()
}

var pad struct {
	mu    sync.Mutex
	zeros string
}

// zeros returns a string of n zero bytes, shared (strings are never written).
func zeros(n int) string {
	pad.mu.Lock()
	defer pad.mu.Unlock()
	if len(pad.zeros) < n {
		pad.zeros = string(make([]byte, n+n/4))
	}
	return pad.zeros[:n]
}
