package analytics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/playpipe/playpipe/schemas"
)

// TestLookupsPastTheASTLimit: the events of more plays without a carried
// time than the server's max_ast_elements (50 000) are looked up in one
// query, each delay from its event's first record (an event recorded twice,
// the earlier record counts), a play whose event is not in the ledger has
// none.
func TestLookupsPastTheASTLimit(t *testing.T) {
	ch, conn := migratedClickHouse(t)
	ctx := context.Background()
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

// TestDelayOfEventsRecordedTwice: the narrow form of the slices does not
// look the events recorded twice up per row; the plays whose rows carry
// only a later record's time are listed and their delays taken from the
// event's first record (firstRecords.fix). Every delay must run from the
// event's first record, in one slice, in several, with the fix list over
// its bound in a slice (the per-row transform instead), by the wide form and by the
// exact path. The plays of the events recorded twice have the largest
// delays, so a delay taken from the later record moves the quantiles. The
// plays' one partner target, a sandbox, is counted as such by every path.
func TestDelayOfEventsRecordedTwice(t *testing.T) {
	ch, conn := migratedClickHouse(t)
	ctx := context.Background()
	insert := func(table, cols string, rows [][]any) {
		t.Helper()
		b, err := conn.PrepareBatch(ctx, "INSERT INTO "+ch.Database+"."+table+" (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, "+cols+")")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if err := b.Append(r...); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	const n = 64
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	var events, plays, deliveries [][]any
	want := map[int64]uint64{}
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	for i := range n {
		id := fmt.Sprintf("ev-%d", i)
		first := base.UnixMilli() + int64(i)*1000
		later := first + 5000
		events = append(events, []any{"plays.events", int32(0), int64(2 * i), at(first), uint64(first), id, uint8(1)})
		report := schemas.ReportID(id, 0)
		// Events 0–47 recorded once, their plays carrying that time; 48–63
		// recorded again 5 s later, and their plays: 48–55 carry only the
		// later time (the consumer derived them from the second record
		// alone), 56–59 carry both (two rows), 60–63 none (old rows).
		var carried []uint64
		switch {
		case i < 48:
			carried = []uint64{uint64(first)}
		case i < 56:
			carried = []uint64{uint64(later)}
		case i < 60:
			carried = []uint64{uint64(first), uint64(later)}
		default:
			carried = []uint64{0}
		}
		if i >= 48 {
			events = append(events, []any{"plays.events", int32(0), int64(2*i + 1), at(later), uint64(later), id, uint8(1)})
		}
		for j, c := range carried {
			plays = append(plays, []any{"plays.reports", int32(0), int64(2*i + j), at(first + 200), uint64(first + 200), report, id, c})
		}
		delivered := first + 10_000 + int64(i)*100
		deliveries = append(deliveries, []any{"plays.deliveries", int32(0), int64(i), at(delivered), uint64(delivered), report, id, "delivered", delivered, "http://127.0.0.1:8088/"})
		want[delivered-first]++
	}
	insert("events", "event_id, parsed", events)
	insert("plays", "report_id, event_id, event_at_ms", plays)
	insert("deliveries", "report_id, event_id, outcome, at_ms, partner", deliveries)
	wantDelay := delayOf(want)
	o := AuditOptions{From: base.Add(-time.Minute), To: time.Now()}
	for _, l := range []Limits{{}, {SliceReports: 8}, {SliceReports: 32, lookups: 1}, {SliceReports: 8, noNarrow: true}, {Exact: true}} {
		_, got, progress := auditLimited(t, ctx, conn, ch.Database, "events recorded twice", o, l)
		if got.Delay != wantDelay || got.Delivered != n {
			t.Errorf("limits %+v: delay %+v of %d delivered plays, want %+v of %d\n%s", l, got.Delay, got.Delivered, wantDelay, n, progress)
		}
		// One partner target, a loopback one: a sandbox.
		if got.DeliveredToSandbox != n || got.DeliveredReal != 0 || len(got.ByPartner) != 1 || got.ByPartner[0].Delivered != n || got.ByPartner[0].Answers != n {
			t.Errorf("limits %+v: delivered to a sandbox %d, to a real partner %d, by partner %+v; want %d, 0, %d of %d answers", l, got.DeliveredToSandbox, got.DeliveredReal, got.ByPartner, n, n, n)
		}
	}
}
