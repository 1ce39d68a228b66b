package analytics

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// TestInsertArrayColumns checks that the Array(String) columns (a
// delivery's fields, a rejection's violations) arrive row for row, empty
// rows and rows of several items mixed: the insert appends them row by row.
func TestInsertArrayColumns(t *testing.T) {
	ch, conn := migratedClickHouse(t)
	ctx := context.Background()
	s, err := NewSink(SinkConfig{Kafka: testKafkaConfig(), ClickHouse: Config{Addr: ch.Addr, Database: ch.Database, User: ch.User, Password: ch.Password}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	topics := kafkax.TopicsFor("plays")
	fields := [][]string{nil, {"user_id"}, {}, {"isrc", "country", "played_at"}}
	bt := newBatch(topics)
	now := time.Now()
	for i, f := range fields {
		d := schemas.Delivery{V: schemas.DeliveryVersion, ReportID: "r" + string(rune('a'+i)), EventID: "e", Outcome: schemas.OutcomeRejected, Attempt: 1, HTTPStatus: 400, Fields: f, At: now.UnixMilli()}
		bt.add(&kgo.Record{Topic: topics.Deliveries, Offset: int64(i), Value: mustJSON(t, d), Timestamp: now})
		j := schemas.Rejection{V: schemas.RejectionVersion, EventID: "e" + string(rune('a'+i)), Reason: "invalid", Raw: "{}", At: now.UnixMilli()}
		for _, x := range f {
			j.Violations = append(j.Violations, schemas.Violation{Reason: "r-" + x, Field: x, Detail: "d-" + x})
		}
		bt.add(&kgo.Record{Topic: topics.Rejected, Offset: int64(i), Value: mustJSON(t, j), Timestamp: now})
	}
	if err := s.insert(ctx, conn, bt); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, "SELECT d.fields, r.violation_fields, r.violation_reasons FROM "+ch.Database+".deliveries AS d JOIN "+ch.Database+".rejections AS r ON d.kafka_offset = r.kafka_offset ORDER BY d.kafka_offset")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	i := 0
	for ; rows.Next(); i++ {
		var df, rf, rr []string
		if err := rows.Scan(&df, &rf, &rr); err != nil {
			t.Fatal(err)
		}
		want := fields[i]
		var wantR []string
		for _, x := range want {
			wantR = append(wantR, "r-"+x)
		}
		if !slices.Equal(df, want) || !slices.Equal(rf, want) || !slices.Equal(rr, wantR) {
			t.Errorf("row %d: fields %q, violation_fields %q, violation_reasons %q; want %q, %q, %q", i, df, rf, rr, want, want, wantR)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if i != len(fields) {
		t.Fatalf("%d rows, want %d", i, len(fields))
	}
}
