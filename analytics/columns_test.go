package analytics

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestInsertColumnsSameAsRows inserts the same batch (every table, odd
// strings, empty and full arrays) once as the sink does (column by column,
// in chunks of rows sent as blocks of one INSERT, String columns as views
// of the records) and once row by row through the driver's batch.Append
// (which copies every value), and requires the same rows: a view that
// pointed at the wrong bytes, or a column shifted by a row or a chunk,
// changes the hash. The chunked INSERT must make one part per table.
func TestInsertColumnsSameAsRows(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	ctx := context.Background()
	topics := kafkax.TopicsFor("plays")
	recs := benchRecords(t, topics, 1500) // String columns past reserveStrings' 64 KiB
	now := time.Now()
	for i, v := range []string{`not json`, `{"v":1}`, `[1,2]`, "{\"report_id\":\"\\u00e9\xff\"}"} {
		recs = append(recs,
			&kgo.Record{Topic: topics.Reports, Offset: int64(1000 + i), Key: []byte("k"), Value: []byte(v), Timestamp: now},
			&kgo.Record{Topic: topics.Events, Offset: int64(1000 + i), Value: []byte(v), Timestamp: now},
			&kgo.Record{Topic: "elsewhere", Offset: int64(i), Value: []byte(v), Timestamp: now})
	}
	for i, f := range [][]string{nil, {"user_id"}, {}, {"isrc", "country", strings.Repeat("é", 40)}} {
		j := schemas.Rejection{V: schemas.RejectionVersion, EventID: fmt.Sprint("e", i), Reason: "invalid", Raw: `{"x":1}`, At: now.UnixMilli()}
		for _, x := range f {
			j.Violations = append(j.Violations, schemas.Violation{Reason: "r-" + x, Field: x, Detail: "d-" + x})
		}
		d := schemas.Delivery{V: schemas.DeliveryVersion, ReportID: fmt.Sprint("r", i), EventID: "e", Outcome: schemas.OutcomeRejected, Fields: f, At: now.UnixMilli()}
		recs = append(recs,
			&kgo.Record{Topic: topics.Rejected, Offset: int64(i), Value: mustJSON(t, j), Timestamp: now},
			&kgo.Record{Topic: topics.Deliveries, Offset: int64(2000 + i), Value: mustJSON(t, d), Timestamp: now})
	}
	bt := newBatch(topics)
	for _, r := range recs {
		bt.add(r)
	}
	sums := map[string]string{}
	for _, columnar := range []bool{true, false} {
		db := fmt.Sprintf("%s_columnar_%v", ch.Database, columnar)
		if _, err := Migrate(ctx, conn, db); err != nil {
			t.Fatal(err)
		}
		if columnar {
			s, err := NewSink(SinkConfig{Kafka: testKafkaConfig(), ClickHouse: Config{Addr: ch.Addr, Database: db, User: ch.User, Password: ch.Password}, Logger: testLogger()})
			if err != nil {
				t.Fatal(err)
			}
			// Chunks of an odd size: every table's rows go in several
			// blocks (batch.Flush), the last one partial.
			defer func(n int) { insertChunk = n }(insertChunk)
			insertChunk = 97
			ictx, cancel := context.WithTimeout(ctx, 30*time.Second) // insert retries until ctx ends
			err = s.insert(ictx, conn, bt)
			cancel()
			if err != nil {
				t.Fatalf("columnar: %v", err)
			}
			// The blocks of one INSERT make one part, as one block did.
			for _, tb := range bt.tables() {
				var parts, level uint64
				q := "SELECT count(), toUInt64(max(level)) FROM system.parts WHERE active AND database = '" + db + "' AND table = '" + tb.name() + "'"
				if err := conn.QueryRow(ctx, q).Scan(&parts, &level); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
				if parts != 1 || level != 0 {
					t.Errorf("%s: %d rows inserted in blocks of %d made %d parts (level %d), want 1 part of level 0", tb.name(), tb.n(), insertChunk, parts, level)
				}
			}
		} else {
			for _, tb := range bt.tables() {
				if err := insertRows(ctx, conn, db, tb); err != nil {
					t.Fatalf("rows: %s: %v", tb.name(), err)
				}
			}
		}
		for _, tb := range bt.tables() {
			var n, sum uint64
			q := "SELECT count(), sum(cityHash64(" + tb.columns() + ")) FROM " + db + "." + tb.name()
			if err := conn.QueryRow(ctx, q).Scan(&n, &sum); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			if n != uint64(tb.n()) || n == 0 {
				t.Errorf("columnar=%v: %s has %d rows, want %d (> 0)", columnar, tb.name(), n, tb.n())
			}
			got := fmt.Sprint(n, "/", sum)
			if prev, ok := sums[tb.name()]; ok && prev != got {
				t.Errorf("%s: column by column %s, row by row %s (rows/hash)", tb.name(), prev, got)
			}
			sums[tb.name()] = got
		}
	}
}

// insertRows inserts the rows of tb into db.tb row by row through the
// driver's batch.Append (the reference for TestInsertColumnsSameAsRows, and
// the row-wise variant of BenchmarkSinkBatch).
func insertRows(ctx context.Context, conn driver.Conn, db string, tb table) error {
	if tb.n() == 0 {
		return nil
	}
	bt, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+"."+tb.name()+" ("+tb.columns()+")")
	if err != nil {
		return err
	}
	vals := tb.values()
	row := make([]any, len(vals))
	for r := range tb.n() {
		for i, v := range vals {
			switch v := v.(type) {
			case []string:
				row[i] = v[r]
			case []int32:
				row[i] = v[r]
			case []int64:
				row[i] = v[r]
			case []uint8:
				row[i] = v[r]
			case []uint64:
				row[i] = v[r]
			case []time.Time:
				row[i] = v[r]
			case [][]string:
				row[i] = v[r]
			default:
				return fmt.Errorf("column %d: no row-wise case for %T", i, v)
			}
		}
		if err := bt.Append(row...); err != nil {
			_ = bt.Abort()
			return err
		}
	}
	return bt.Send()
}
