package analytics

import (
	"fmt"
	"reflect"
	"unsafe"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The sink builds its columns in the driver's own representation (ch-go's
// proto columns: a String column is one byte buffer plus row offsets, an
// Int64 column a []int64) and hands them to the insert without copying them
// row by row. clickhouse-go offers no call for that: its columns append
// row by row into buffers that start empty for every insert, which cost the
// sink about a third of its CPU (pprof of BenchmarkSinkEndToEnd: the copies,
// the growth of every column, and the garbage of it all). The driver's
// column types (column.String, column.Int64…) hold the proto column as an
// unexported field named col; setColumn stores the sink's column there.
//
// That depends on the driver's layout, so it is checked once, by
// reflection: each column type must have a field col of exactly the proto
// type. When a check fails (another driver version), directColumns is false
// for that type and the sink appends through the driver's API as before,
// slower but the same rows.

// colField is the offset of a driver column type's proto column, when its
// layout is the expected one.
type colField struct {
	off uintptr
	ok  bool
}

// fieldOf checks that the driver column type C holds its data as a field
// col of type P.
func fieldOf[C, P any]() colField {
	f, ok := reflect.TypeFor[C]().FieldByName("col")
	if !ok || f.Type != reflect.TypeFor[P]() {
		return colField{}
	}
	return colField{off: f.Offset, ok: true}
}

// directColumns are the layouts setColumn relies on; tests switch them off
// to exercise the fallback.
var directColumns = struct {
	str, i32, i64, u8, u64 colField
}{
	str: fieldOf[column.String, proto.ColStr](),
	i32: fieldOf[column.Int32, proto.ColInt32](),
	i64: fieldOf[column.Int64, proto.ColInt64](),
	u8:  fieldOf[column.UInt8, proto.ColUInt8](),
	u64: fieldOf[column.UInt64, proto.ColUInt64](),
}

// put stores v as the proto column of the empty driver column c whose field
// is f, and reports whether it did. The stored slices are clipped to their
// length: should the driver ever append to the column, it copies instead of
// writing into the sink's buffers. The driver only reads the column (to
// encode it, in Send); the sink does not touch it until the insert returned.
func put[C interface{ Rows() int }, P any](c C, f colField, v P) bool {
	if !f.ok || c.Rows() != 0 {
		return false
	}
	*(*P)(unsafe.Add(reflect.ValueOf(c).UnsafePointer(), f.off)) = v
	return true
}

// setColumn hands the sink's column v to the driver's column c without
// copying, when their types allow it; it reports whether it did.
func setColumn(c column.Interface, v any) bool {
	switch v := v.(type) {
	case proto.ColStr:
		if c, ok := c.(*column.String); ok {
			return put(c, directColumns.str, proto.ColStr{Buf: clip(v.Buf), Pos: clip(v.Pos)})
		}
	case []int32:
		if c, ok := c.(*column.Int32); ok {
			return put(c, directColumns.i32, proto.ColInt32(clip(v)))
		}
	case []int64:
		if c, ok := c.(*column.Int64); ok {
			return put(c, directColumns.i64, proto.ColInt64(clip(v)))
		}
	case []uint8:
		if c, ok := c.(*column.UInt8); ok {
			return put(c, directColumns.u8, proto.ColUInt8(clip(v)))
		}
	case []uint64:
		if c, ok := c.(*column.UInt64); ok {
			return put(c, directColumns.u64, proto.ColUInt64(clip(v)))
		}
	}
	return false
}

func clip[T any](s []T) []T { return s[:len(s):len(s)] }

// appendColumn appends the sink's column v to the driver's batch column i
// (c, the batch's column i, may be nil) through the driver's API: the path
// of every column setColumn does not take.
func appendColumn(bc driver.BatchColumn, c column.Interface, v any) error {
	switch v := v.(type) {
	case proto.ColStr:
		vals := make([]string, len(v.Pos))
		for i, p := range v.Pos {
			vals[i] = unsafe.String(unsafe.SliceData(v.Buf[p.Start:p.End]), p.End-p.Start)
		}
		if s, ok := c.(*column.String); ok {
			reserveStrings(s, vals)
		}
		return bc.Append(vals)
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

// fillBatch puts the columns of t into the driver's batch bt.
func fillBatch(bt driver.Batch, t table) error {
	cols := bt.Columns()
	for i, v := range t.values() {
		var c column.Interface
		if i < len(cols) {
			c = cols[i]
		}
		if c != nil && setColumn(c, v) {
			continue
		}
		if err := appendColumn(bt.Column(i), c, v); err != nil {
			return fmt.Errorf("column %d: %w", i, err)
		}
	}
	return nil
}
