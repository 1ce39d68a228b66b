package analytics

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ClickHouse/ch-go/proto"
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
// The sink builds its String columns as ch-go's proto.ColStr (one byte
// buffer plus row offsets: no allocation per value while decoding) and
// hands them to the driver as a []string of views of that buffer; Append
// copies the bytes into the driver's own column.

// insertScratch is reused by the columns of one table's insert.
type insertScratch struct {
	strs []string
}

// fillBatch appends the columns of t to the driver's batch bt, column by
// column.
func fillBatch(bt driver.Batch, t table) error {
	cols := bt.Columns()
	var sc insertScratch
	for i, v := range t.values() {
		var c column.Interface
		if i < len(cols) {
			c = cols[i]
		}
		if err := appendColumn(bt.Column(i), c, v, &sc); err != nil {
			return fmt.Errorf("column %d: %w", i, err)
		}
	}
	return nil
}

// appendColumn appends the sink's column v to the driver's batch column bc
// (c is the same column as column.Interface, or nil).
func appendColumn(bc driver.BatchColumn, c column.Interface, v any, sc *insertScratch) error {
	switch v := v.(type) {
	case proto.ColStr:
		vals := stringViews(v, sc.strs[:0])
		sc.strs = vals
		if s, ok := c.(*column.String); ok {
			reserveStrings(s, vals)
		}
		err := bc.Append(vals)
		clear(vals) // the views must not outlive the call (see stringViews)
		return err
	case [][]string:
		return appendArrays(bc, v)
	default:
		return bc.Append(v)
	}
}

// stringViews appends to dst one string per row of c, each a view of c.Buf
// (no copy).
//
// Invariant that makes the views safe: c.Buf belongs to the sink's batch,
// which nobody writes while it is being inserted (the reader fills another
// batch; this one is reset only after its insert returned), and the views
// live only for the Append that copies them into the driver's column (the
// caller clears them right after).
func stringViews(c proto.ColStr, dst []string) []string {
	for _, p := range c.Pos {
		if p.End == p.Start {
			dst = append(dst, "")
			continue
		}
		dst = append(dst, unsafe.String(&c.Buf[p.Start], p.End-p.Start))
	}
	return dst
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
