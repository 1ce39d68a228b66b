package chdbconn_test

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestDriverBehavesAlike: on every ledger backend (clickhouse-go on
// clickhouse-server; this package's Conn on chdb with -tags chdb) a batch
// insert reads back byte for byte and the typed scans the ledger uses give
// the same values and refuse the same conversions.
func TestDriverBehavesAlike(t *testing.T) {
	testenv.ForEachLedger(t, func(t *testing.T, l *testenv.Ledger) {
		ctx := context.Background()
		if err := l.Conn.Exec(ctx, `CREATE TABLE `+l.Database+`.t (s String, i32 Int32, i64 Int64, u8 UInt8, u64 UInt64,
    at DateTime, arr Array(String), f Float64, d String DEFAULT 'dflt', ins DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY i64`); err != nil {
			t.Fatal(err)
		}
		at := time.Unix(1_700_000_123, 0).UTC()
		odd := "\xff not json {'\\\n\x00\t ü"
		b, err := l.Conn.PrepareBatch(ctx, "INSERT INTO "+l.Database+".t (s, i32, i64, u8, u64, at, arr, f)")
		if err != nil {
			t.Fatal(err)
		}
		// Column-wise, as the sink appends.
		for i, v := range []any{[]string{odd, "plain"}, []int32{-1, 2}, []int64{-9_000_000_000, 1}, []uint8{1, 0},
			[]uint64{1 << 63, 7}, []time.Time{at, at.Add(time.Second)}, [][]string{{"a", odd}, {}}, []float64{0.25, -3}} {
			if err := b.Column(i).Append(v); err != nil {
				t.Fatalf("column %d: %v", i, err)
			}
		}
		// Row-wise.
		if err := b.Append("row", int32(3), int64(3), uint8(1), uint64(3), at, []string{"x"}, 1.5); err != nil {
			t.Fatal(err)
		}
		if b.Rows() != 3 {
			t.Fatalf("batch rows %d, want 3", b.Rows())
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
		type rowT struct {
			s      string
			i32    int32
			i64    int64
			u8     uint8
			u64    uint64
			at     time.Time
			arr    []string
			f      float64
			d      string
			insAge int64
		}
		rows, err := l.Conn.Query(ctx, "SELECT s, i32, i64, u8, u64, at, arr, f, d, toInt64(now()) - toInt64(ins) FROM t ORDER BY i64")
		if err != nil {
			t.Fatal(err)
		}
		var got []rowT
		for rows.Next() {
			var r rowT
			if err := rows.Scan(&r.s, &r.i32, &r.i64, &r.u8, &r.u64, &r.at, &r.arr, &r.f, &r.d, &r.insAge); err != nil {
				t.Fatal(err)
			}
			r.at = r.at.UTC()
			if r.insAge < 0 || r.insAge > 60 {
				t.Errorf("inserted_at-like DEFAULT now() is %d s old", r.insAge)
			}
			r.insAge = 0
			got = append(got, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		want := []rowT{
			{odd, -1, -9_000_000_000, 1, 1 << 63, at, []string{"a", odd}, 0.25, "dflt", 0},
			{"plain", 2, 1, 0, 7, at.Add(time.Second), []string{}, -3, "dflt", 0},
			{"row", 3, 3, 1, 3, at, []string{"x"}, 1.5, "dflt", 0},
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("read back:\n got %#v\nwant %#v", got, want)
		}

		// Placeholders, counts, arrays of quantiles.
		var n uint64
		if err := l.Conn.QueryRow(ctx, "SELECT count() FROM t WHERE s = ? AND i64 > ?", odd, int64(-10_000_000_000)).Scan(&n); err != nil || n != 1 {
			t.Fatalf("count with placeholders: %d, %v", n, err)
		}
		var qs []float64
		if err := l.Conn.QueryRow(ctx, "SELECT quantilesExact(0.5, 0.9)(f) FROM t").Scan(&qs); err != nil || !reflect.DeepEqual(qs, []float64{0.25, 1.5}) {
			t.Fatalf("quantiles %v, %v", qs, err)
		}
		// What clickhouse-go refuses, refused alike.
		var wrong int64
		if err := l.Conn.QueryRow(ctx, "SELECT count() FROM t").Scan(&wrong); err == nil {
			t.Error("a UInt64 scanned into an int64 without an error")
		}
		var s string
		if err := l.Conn.QueryRow(ctx, "SELECT s FROM t WHERE 0").Scan(&s); !errors.Is(err, sql.ErrNoRows) {
			t.Errorf("no row: %v, want sql.ErrNoRows", err)
		}
		if err := l.Conn.Exec(ctx, "SELECT nonsense("); err == nil {
			t.Error("a syntax error passed")
		}
		// A missing table is ClickHouse's code 60 (what the sink's
		// re-migration looks for), as a *clickhouse.Exception.
		_, err = l.Conn.PrepareBatch(ctx, "INSERT INTO "+l.Database+".missing (a)")
		var ex *clickhouse.Exception
		if !errors.As(err, &ex) || ex.Code != 60 {
			t.Errorf("batch for a missing table: %v, want a clickhouse.Exception with code 60", err)
		}
		err = l.Conn.QueryRow(ctx, "SELECT count() FROM "+l.Database+".missing").Scan(&n)
		if !errors.As(err, &ex) || ex.Code != 60 {
			t.Errorf("query of a missing table: %v, want a clickhouse.Exception with code 60", err)
		}
	})
}
