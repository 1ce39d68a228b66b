package analytics

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/testenv"
	"github.com/playpipe/playpipe/schemas"
)

// TestDirectColumnsLayout: the driver's column types have the layout the
// sink hands its columns over with (a failure here means the sink has
// fallen back to appending row by row: correct, but slower).
func TestDirectColumnsLayout(t *testing.T) {
	d := directColumns
	for name, f := range map[string]colField{"String": d.str, "Int32": d.i32, "Int64": d.i64, "UInt8": d.u8, "UInt64": d.u64} {
		if !f.ok {
			t.Errorf("column.%s: no field col of the proto type: the sink appends row by row", name)
		}
	}
}

// TestInsertDirectSameAsAppend inserts the same batch (every table, odd
// strings, empty and full arrays) once with the columns handed over and
// once through the driver's Append, and requires the same rows.
func TestInsertDirectSameAsAppend(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	ctx := context.Background()
	topics := kafkax.TopicsFor("plays")
	recs := benchRecords(t, topics, 300)
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
	saved := directColumns
	t.Cleanup(func() { directColumns = saved })
	sums := map[string]string{}
	for _, direct := range []bool{true, false} {
		if direct {
			directColumns = saved
		} else {
			directColumns.str, directColumns.i32, directColumns.i64, directColumns.u8, directColumns.u64 = colField{}, colField{}, colField{}, colField{}, colField{}
		}
		db := fmt.Sprintf("%s_direct_%v", ch.Database, direct)
		if _, err := Migrate(ctx, conn, db); err != nil {
			t.Fatal(err)
		}
		s, err := NewSink(SinkConfig{Kafka: testKafkaConfig(), ClickHouse: Config{Addr: ch.Addr, Database: db, User: ch.User, Password: ch.Password}, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.insert(ctx, conn, bt); err != nil {
			t.Fatalf("direct=%v: %v", direct, err)
		}
		for _, tb := range bt.tables() {
			var n, sum uint64
			q := "SELECT count(), sum(cityHash64(" + tb.columns() + ")) FROM " + db + "." + tb.name()
			if err := conn.QueryRow(ctx, q).Scan(&n, &sum); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			if n != uint64(tb.n()) || n == 0 {
				t.Errorf("direct=%v: %s has %d rows, want %d (> 0)", direct, tb.name(), n, tb.n())
			}
			got := fmt.Sprint(n, "/", sum)
			if prev, ok := sums[tb.name()]; ok && prev != got {
				t.Errorf("%s: handed over %s, appended %s (rows/hash)", tb.name(), prev, got)
			}
			sums[tb.name()] = got
		}
	}
}
