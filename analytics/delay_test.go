package analytics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestLookupsPastTheASTLimit: the events of more plays without a carried
// time than the server's max_ast_elements (50 000) are looked up in one
// query, each delay from its event's first record (an event recorded twice,
// the earlier record counts), a play whose event is not in the ledger has
// none.
func TestLookupsPastTheASTLimit(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	ctx := context.Background()
	if _, err := Migrate(ctx, conn, ch.Database); err != nil {
		t.Fatal(err)
	}
	const n = 60_000
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+ch.Database+".events (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, event_id)")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	var l lookups
	want := map[int64]uint64{}
	for i := range n {
		id := fmt.Sprintf("ev-%d's", i) // a quote to escape
		ms := base.UnixMilli() + int64(i%1000)
		if err := b.Append("plays.events", int32(0), int64(2*i), base, uint64(ms), id); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 { // recorded a second time, later
			if err := b.Append("plays.events", int32(0), int64(2*i+1), base, uint64(ms+500), id); err != nil {
				t.Fatal(err)
			}
		}
		at := ms + 100 + int64(i%7)
		if err := l.add([]string{fmt.Sprintf("%d %s", at, id)}); err != nil {
			t.Fatal(err)
		}
		want[at-ms]++
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	if err := l.add([]string{fmt.Sprintf("%d not-in-the-ledger", base.UnixMilli())}); err != nil {
		t.Fatal(err)
	}
	a, err := NewAuditor(conn, ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]uint64{}
	if err := a.flush(ctx, AuditOptions{From: base, To: time.Now()}, &l, true, got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("delays of %d plays looked up: %v, want %v", n+1, got, want)
	}
	if len(l.delivered) != 0 {
		t.Errorf("%d events left to look up after the flush", len(l.delivered))
	}
}
