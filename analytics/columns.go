package analytics

import (
	"fmt"
	"sync"
	"time"

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

// insertChunk is the most rows the sink appends to the driver's columns
// before it sends them (batch.Flush: one data block of the same INSERT).
// The driver makes fresh columns for every INSERT and appends value by
// value, so a column grew from empty to a whole table's rows of a batch,
// copying itself at every growth: a third of the insert's CPU and most of
// its garbage. In chunks, only the first chunk grows the columns; Flush
// resets them keeping their capacity, and the later chunks reuse it. The
// server squashes the blocks of one INSERT into one part
// (min_insert_block_size_rows), so the table gets as many parts as before.
var insertChunk = 1024

// fillBatch appends the rows of t to the driver's batch bt, column by
// column, sending every insertChunk rows but the last ones (Send sends
// those). A failed Flush leaves the INSERT unfinished: the caller aborts
// the batch, which closes its connection, and the server drops the INSERT.
func fillBatch(bt driver.Batch, t table) error {
	cols := bt.Columns()
	vals := t.values()
	n := t.n()
	for lo := 0; lo < n; lo += insertChunk {
		hi := min(lo+insertChunk, n)
		for i, v := range vals {
			var c column.Interface
			if i < len(cols) {
				c = cols[i]
			}
			if err := appendColumn(bt.Column(i), c, v, lo, hi); err != nil {
				return fmt.Errorf("column %d: %w", i, err)
			}
		}
		if hi < n {
			if err := bt.Flush(); err != nil {
				return fmt.Errorf("send rows %d…%d: %w", lo, hi-1, err)
			}
		}
	}
	return nil
}

// appendColumn appends rows lo…hi-1 of the sink's column v to the driver's
// batch column bc (c is the same column as column.Interface, or nil).
func appendColumn(bc driver.BatchColumn, c column.Interface, v any, lo, hi int) error {
	switch v := v.(type) {
	case []string:
		if s, ok := c.(*column.String); ok && lo == 0 {
			reserveStrings(s, maxChunkBytes(v, insertChunk))
		}
		return bc.Append(v[lo:hi])
	case [][]string:
		return appendArrays(bc, v[lo:hi])
	case []int32:
		return bc.Append(v[lo:hi])
	case []int64:
		return bc.Append(v[lo:hi])
	case []uint8:
		return bc.Append(v[lo:hi])
	case []uint64:
		return bc.Append(v[lo:hi])
	case []time.Time:
		return bc.Append(v[lo:hi])
	default:
		return fmt.Errorf("no insert for a column of %T", v)
	}
}

// maxChunkBytes is the most bytes of the values in any chunk of vals.
func maxChunkBytes(vals []string, chunk int) int {
	most := 0
	for lo := 0; lo < len(vals); lo += chunk {
		n := 0
		for _, v := range vals[lo:min(lo+chunk, len(vals))] {
			n += len(v)
		}
		most = max(most, n)
	}
	return most
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

// reserveStrings makes an empty String column hold n bytes without
// growing, before appendColumn appends the first chunk of a column
// (n is the most bytes of any chunk of it). The driver appends strings one
// by one to a byte buffer that starts empty for every insert, so a column
// of record bodies was reallocated and copied many times (~20 for a
// 10k-row column: then a quarter of the sink's CPU, pprof of
// BenchmarkSinkEndToEnd). Appending one zero-filled string of n bytes, then
// Reset (which keeps the capacity), allocates the byte buffer once at the
// size every chunk fits in. (The row offsets still grow, within the first
// chunk: the driver has no way to size them.) Under 4 KiB it is left
// alone. The padding is shared, read-only, and bounded by the largest
// chunk seen.
func reserveStrings(c *column.String, n int) {
	if c.Rows() != 0 || n < 4<<10 {
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
