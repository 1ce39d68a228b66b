package analytics

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

func TestMigrateTwiceIsIdempotent(t *testing.T) {
	e := newEnv(t)
	conn := e.ch.Conn(t)
	ctx := context.Background()
	applied, err := Migrate(ctx, conn, e.ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != len(Migrations) {
		t.Fatalf("first Migrate applied %v, want every version of %d", applied, len(Migrations))
	}
	again, err := Migrate(ctx, conn, e.ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 0 {
		t.Fatalf("second Migrate applied %v, want none", again)
	}
	// A new version applies alone, once.
	extra := append(append([]Migration(nil), Migrations...), Migration{Version: 99, Name: "test table",
		Statements: []string{"CREATE TABLE IF NOT EXISTS {db}.extra (x UInt8) ENGINE = MergeTree ORDER BY x"}})
	got, err := migrate(ctx, conn, e.ch.Database, extra)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []uint32{99}) {
		t.Fatalf("migrate with a new version applied %v, want [99]", got)
	}
	versions, err := AppliedVersions(ctx, conn, e.ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	var want []uint32
	for _, m := range Migrations {
		want = append(want, m.Version)
	}
	if want = append(want, 99); !reflect.DeepEqual(versions, want) {
		t.Fatalf("recorded versions %v, want %v", versions, want)
	}
	for _, tbl := range []string{TableEvents, TablePlays, TableDeliveries, TableRejections, TableMalformed, "extra"} {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = ?", e.ch.Database, tbl).Scan(&n); err != nil || n != 1 {
			t.Fatalf("table %s: n=%d err=%v", tbl, n, err)
		}
	}
}

// fixture produces a small ledger with one play in each state and returns
// the expected report.
func fixture(t *testing.T, e *env, now time.Time) Audit {
	t.Helper()
	at := func(d time.Duration) time.Time { return now.Add(d).Truncate(time.Millisecond) }
	t0 := at(-5 * time.Minute)
	var recs []*kgo.Record
	rec := func(topic, key string, value []byte, ts time.Time) *kgo.Record {
		r := &kgo.Record{Topic: topic, Key: []byte(key), Value: value, Timestamp: ts}
		recs = append(recs, r)
		return r
	}
	// Events: three valid with plays, three not JSON, one without user_id,
	// two valid without plays.
	rec(e.topics.Events, "e1", eventJSON(t, "e1", "u1"), t0)
	rec(e.topics.Events, "e2", eventJSON(t, "e2", "u1"), t0)
	rec(e.topics.Events, "e3", eventJSON(t, "e3", "u1"), at(-time.Hour))
	rec(e.topics.Events, "bad", []byte("\xff not json {"), t0)
	rec(e.topics.Events, "e5", eventJSON(t, "e5", ""), t0)
	rec(e.topics.Events, "arr", []byte(`[{"event_id":"arr"}]`), t0) // JSON, not an object: not JSON to the audit
	rec(e.topics.Events, "null", []byte(` null`), t0)
	rec(e.topics.Events, "e6", eventJSON(t, "e6", "u1"), t0) // valid, zero plays (offset past the mix end)
	rec(e.topics.Events, "e7", eventJSON(t, "e7", "u1"), t0) // the same, rejected offset_beyond_mix by an older consumer
	e.produce(t, recs...)
	// Locate the two bad events to reference them from rejections.
	src := map[string]schemas.Source{}
	for _, r := range recs {
		src[string(r.Key)] = schemas.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
	}
	recs = nil
	rej1 := schemas.NewRejection([]byte("\xff not json {"), "", []schemas.Violation{{Reason: schemas.ReasonMalformedJSON, Detail: "invalid character"}}, src["bad"], t0.UnixMilli())
	rej2 := schemas.NewRejection(eventJSON(t, "e5", ""), "e5", []schemas.Violation{{Field: "user_id", Reason: schemas.ReasonMissingUserID}}, src["e5"], t0.UnixMilli())
	rec(e.topics.Rejected, "bad", mustJSON(t, rej1), t0)
	rec(e.topics.Rejected, "e5", mustJSON(t, rej2), t0)
	rec(e.topics.Rejected, "e5", mustJSON(t, rej2), t0) // re-published by a replay: one rejected event
	rej7 := schemas.NewRejection(eventJSON(t, "e7", "u1"), "e7", []schemas.Violation{{Field: "offset_ms", Reason: schemas.ReasonOffsetBeyondMix}}, src["e7"], t0.UnixMilli())
	rec(e.topics.Rejected, "e7", mustJSON(t, rej7), t0)
	// Two events the ingest gateway refused: never on the events topic, their
	// source is {ingest, -1, -1}; received and rejected both count them.
	gwSrc := schemas.Source{Topic: "ingest", Partition: -1, Offset: -1}
	rec(e.topics.Rejected, "g1", mustJSON(t, schemas.NewRejection([]byte(`{"x":1}`), "g1", []schemas.Violation{{Field: "country", Reason: schemas.ReasonBadCountry}}, gwSrc, t0.UnixMilli())), t0)
	rec(e.topics.Rejected, "g2", mustJSON(t, schemas.NewRejection([]byte(`{"x":2}`), "g2", []schemas.Violation{{Field: "country", Reason: schemas.ReasonBadCountry}}, gwSrc, t0.UnixMilli())), t0)

	r1, p1 := playJSON(t, "e1", 0, false)                    // delivered once
	r2, p2 := playJSON(t, "e1", 1, false)                    // standby, then delivered by the replay
	r3, p3 := playJSONAt(t, "e2", 0, false, t0.UnixMilli())  // delivered twice; carries its event's record time
	_, p1At := playJSONAt(t, "e1", 0, false, t0.UnixMilli()) // r1 derived again by a consumer that carries the time
	r4, p4 := playJSON(t, "e2", 1, false)                    // rejected by the API
	r5, p5 := playJSON(t, "e3", 0, false)                    // pending (a retry only), derived an hour ago
	r6, p6 := playJSON(t, "e3", 1, true)                     // below the minimum: not reported
	rec(e.topics.Reports, r1, p1, t0)
	rec(e.topics.Reports, r1, p1At, t0) // re-derived: one play
	rec(e.topics.Reports, r2, p2, t0)
	rec(e.topics.Reports, r3, p3, t0)
	rec(e.topics.Reports, r4, p4, t0)
	rec(e.topics.Reports, r5, p5, at(-time.Hour))
	rec(e.topics.Reports, r6, p6, at(-time.Hour))

	ms := t0.UnixMilli()
	rec(e.topics.Deliveries, r1, deliveryJSON(t, r1, "e1", schemas.OutcomeDelivered, 1, ms+100, "trace-r1", "ok"), t0)
	rec(e.topics.Deliveries, r2, deliveryJSON(t, r2, "e1", schemas.OutcomeStandby, 1, ms+150, "trace-r2a", "ok"), t0)
	rec(e.topics.Deliveries, r2, deliveryJSON(t, r2, "e1", schemas.OutcomeDelivered, 2, ms+300, "trace-r2b", "ok"), t0)
	rec(e.topics.Deliveries, r3, deliveryJSON(t, r3, "e2", schemas.OutcomeDelivered, 1, ms+200, "trace-r3a", "ok"), t0)
	rec(e.topics.Deliveries, r3, deliveryJSON(t, r3, "e2", schemas.OutcomeDelivered, 1, ms+900, "trace-r3b", "ok"), t0)
	rec(e.topics.Deliveries, r4, deliveryJSON(t, r4, "e2", schemas.OutcomeRejected, 1, ms+120, "trace-r4", "isrc is invalid"), t0)
	rec(e.topics.Deliveries, r5, deliveryJSON(t, r5, "e3", schemas.OutcomeRetry, 1, ms+120, "", ""), t0)
	rec(e.topics.Deliveries, "junk", []byte("not a delivery"), t0)
	e.produce(t, recs...)

	return Audit{
		// received: 9 records on the events topic + 2 refused at the gateway;
		// not JSON: bad, arr, null; rejected: bad, e5 (published twice), g1,
		// g2 (e7's offset_beyond_mix is not a rejection); without plays: e6, e7.
		EventsReceived: 11, EventsAtGateway: 2, EventsNotJSON: 3, EventsRejected: 4, EventsWithoutPlays: 2,
		RejectedByReason: []Count{{schemas.ReasonBadCountry, 2}, {schemas.ReasonMalformedJSON, 1}, {schemas.ReasonMissingUserID, 1}},
		PlayRecords:      7, PlaysDerived: 6, PlaysBelowMinimum: 1, PlaysReportable: 5,
		Delivered: 3, RejectedByAPI: 1, RejectedByAPIByMessage: []Count{{"isrc is invalid", 1}},
		StandbyAnswered: 1, StandbyThenDelivered: 1, Pending: 1, PendingOverdue: 1, DeliveredTwice: 1,
		// The double is one extra copy at the partner; no post's fate is unknown.
		PossibleExtraCopies: 1, PlaysWithExtraCopies: 1, DoubtfulPostsByCause: []Count{},
		Malformed: []Count{{e.topics.Deliveries, 1}},
		// delays 100, 300, 200 ms (first delivered answer − event record time)
		Delay: Delay{Plays: 3, P50MS: 200, P90MS: 300, P99MS: 300, MaxMS: 300},
	}
}

// numbers strips the window fields for comparison.
func numbers(r *Audit) Audit {
	c := *r
	c.From, c.To, c.GeneratedAt, c.PendingThreshold, c.LedgerAsOf, c.Path = time.Time{}, time.Time{}, time.Time{}, "", time.Time{}, ""
	// The per-partner numbers are TestAuditPerPartnerTarget's (partners_test.go).
	c.ByPartner, c.DeliveredToSandbox, c.DeliveredReal = nil, 0, 0
	// The replays are TestAuditReplays' (replay_test.go).
	if len(c.Replays) == 0 {
		c.Replays = nil
	}
	// The topic generations are TestTwoTopicGenerations' (generations_test.go).
	if len(c.Generations) == 0 {
		c.Generations = nil
	}
	return c
}

func TestSinkEndToEndAudit(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	want := fixture(t, e, now)
	s := e.startSink(t, e.cfg)
	a := e.auditor(t)
	opts := AuditOptions{From: now.Add(-2 * time.Hour), To: now.Add(time.Minute), PendingThreshold: 10 * time.Minute, Now: now}
	var got *Audit
	waitFor(t, 30*time.Second, "the audit to match", func() (bool, string) {
		var err error
		got, err = a.Audit(context.Background(), opts)
		if err != nil {
			return false, err.Error()
		}
		return reflect.DeepEqual(numbers(got), want), fmt.Sprintf("%+v", numbers(got))
	})
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var table bytes.Buffer
	if err := WriteAudit(&table, got, FormatTable); err != nil {
		t.Fatal(err)
	}
	t.Logf("audit:\n%s", table.String())
	for _, want := range []string{"missing_user_id", "isrc is invalid", "--list delivered-twice", "RESULT: FAIL"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table output lacks %q", want)
		}
	}
	for _, f := range []string{FormatCSV, FormatJSON} {
		var b bytes.Buffer
		if err := WriteAudit(&b, got, f); err != nil || b.Len() == 0 {
			t.Errorf("%s output: %v", f, err)
		}
	}
	if len(got.Problems()) != 2 {
		t.Fatalf("problems %q: want the overdue pending play and the double delivery", got.Problems())
	}

	ctx := context.Background()
	list := func(metric string) []ListRow {
		rows, err := a.List(ctx, opts, metric, 0)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	ids := func(rows []ListRow) []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.ReportID)
		}
		return out
	}
	r3 := schemas.ReportID("e2", 0)
	if tw := list("delivered-twice"); len(tw) != 1 || tw[0].ReportID != r3 || tw[0].Delivered != 2 || !reflect.DeepEqual(tw[0].TraceIDs, []string{"trace-r3a", "trace-r3b"}) {
		t.Fatalf("delivered-twice list: %+v", tw)
	}
	if p := list("pending"); len(p) != 1 || p[0].ReportID != schemas.ReportID("e3", 0) || !strings.HasPrefix(p[0].Detail, schemas.OutcomeRetry+" (HTTP ") {
		t.Fatalf("pending list: %+v", p)
	}
	if p := list("pending-overdue"); len(p) != 1 {
		t.Fatalf("pending-overdue list: %+v", p)
	}
	if r := list("rejected-by-api"); len(r) != 1 || r[0].ReportID != schemas.ReportID("e2", 1) || r[0].Detail != "isrc is invalid" {
		t.Fatalf("rejected-by-api list: %+v", r)
	}
	if sd := list("standby-delivered"); len(sd) != 1 || sd[0].ReportID != schemas.ReportID("e1", 1) {
		t.Fatalf("standby-delivered list: %+v", sd)
	}
	if d := ids(list("delivered")); len(d) != 3 {
		t.Fatalf("delivered list: %v", d)
	}
	rj := list("rejected")
	if len(rj) != 4 {
		t.Fatalf("rejected list: %+v", rj)
	}
	for _, r := range rj { // the event's record, or the rejection's for the gateway's refusals
		if r.Detail == "" || r.Detail == schemas.ReasonOffsetBeyondMix || !(strings.HasPrefix(r.Kafka, e.topics.Events+"/") || strings.HasPrefix(r.Kafka, e.topics.Rejected+"/") && r.Detail == schemas.ReasonBadCountry) {
			t.Fatalf("rejected list: %+v", rj)
		}
	}
	if rcv := list("received"); len(rcv) != 11 {
		t.Fatalf("received list (9 on the topic, 2 refused at the gateway): %+v", rcv)
	}
	if nj := list("not-json"); len(nj) != 3 {
		t.Fatalf("not-json list: %+v", nj)
	}
	if m := list("malformed"); len(m) != 1 || !strings.HasPrefix(m[0].Kafka, e.topics.Deliveries+"/") {
		t.Fatalf("malformed list: %+v", m)
	}
	if _, err := a.List(ctx, opts, "nope", 0); err == nil {
		t.Fatal("unknown list accepted")
	}
	// The not-JSON event's bytes are in the ledger verbatim.
	var raw string
	if err := e.ch.Conn(t).QueryRow(ctx, "SELECT raw FROM "+e.ch.Database+".events WHERE parsed = 0 AND kafka_key = 'bad'").Scan(&raw); err != nil || raw != "\xff not json {" {
		t.Fatalf("raw bytes of the not-JSON event: %q, %v", raw, err)
	}

	// A window that excludes the hour-old records drops them from the counts.
	recent := opts
	recent.From = now.Add(-30 * time.Minute)
	got, err := a.Audit(ctx, recent)
	if err != nil {
		t.Fatal(err)
	}
	if got.EventsReceived != 10 || got.PlaysDerived != 4 || got.Pending != 0 {
		t.Fatalf("recent window: events %d plays %d pending %d, want 10, 4, 0", got.EventsReceived, got.PlaysDerived, got.Pending)
	}
	if got.LedgerAsOf.IsZero() || got.LedgerAsOf.After(time.Now()) {
		t.Fatalf("ledger as of %s", got.LedgerAsOf)
	}
}

// bulk produces n events, n plays (one per event) and a delivered outcome
// for each play, all with the timestamp ts.
func bulk(t *testing.T, e *env, from, n int, ts time.Time) {
	t.Helper()
	var recs []*kgo.Record
	for i := from; i < from+n; i++ {
		id := fmt.Sprintf("ev-%06d", i)
		rid, p := playJSON(t, id, 0, false)
		recs = append(recs,
			&kgo.Record{Topic: e.topics.Events, Key: []byte(id), Value: eventJSON(t, id, "u"), Timestamp: ts},
			&kgo.Record{Topic: e.topics.Reports, Key: []byte(rid), Value: p, Timestamp: ts},
			&kgo.Record{Topic: e.topics.Deliveries, Key: []byte(rid), Value: deliveryJSON(t, rid, id, schemas.OutcomeDelivered, 1, ts.UnixMilli()+50, "", "ok"), Timestamp: ts})
	}
	e.produce(t, recs...)
}

func wantBulk(t *testing.T, a *Auditor, n int, now time.Time, timeout time.Duration) {
	t.Helper()
	opts := AuditOptions{From: now.Add(-time.Hour), To: now.Add(time.Hour), Now: now}
	waitFor(t, timeout, fmt.Sprintf("%d events, plays and deliveries in the ledger", n), func() (bool, string) {
		r, err := a.Audit(context.Background(), opts)
		if err != nil {
			return false, err.Error()
		}
		ok := r.EventsReceived == uint64(n) && r.PlaysDerived == uint64(n) && r.Delivered == uint64(n) && r.DeliveredTwice == 0 && r.Pending == 0 && r.PlayRecords == uint64(n)
		return ok, fmt.Sprintf("events %d plays %d records %d delivered %d twice %d pending %d", r.EventsReceived, r.PlaysDerived, r.PlayRecords, r.Delivered, r.DeliveredTwice, r.Pending)
	})
}

func TestSinkCrashBetweenInsertAndCommitDoesNotDoubleCount(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	const n = 2000 // 6000 records, batches of 200
	bulk(t, e, 0, n, now)

	var firstRows, secondRows atomic.Int64
	var batches atomic.Int32
	cfg := e.cfg
	cfg.afterInsert = func(rows int) error {
		firstRows.Add(int64(rows))
		if batches.Add(1) == 5 {
			return errCrash // five batches in ClickHouse, none committed after the fourth
		}
		return nil
	}
	s1 := e.startSink(t, cfg)
	select {
	case err := <-s1.done:
		if err != errCrash {
			t.Fatalf("first sink ended with %v, want the simulated crash", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("first sink did not reach its crash point")
	}
	s1.once.Do(func() { s1.cancel() })

	cfg.afterInsert = func(rows int) error { secondRows.Add(int64(rows)); return nil }
	s2 := e.startSink(t, cfg)
	wantBulk(t, e.auditor(t), n, now, 60*time.Second)
	if err := s2.stop(t); err != nil {
		t.Fatal(err)
	}
	if total := firstRows.Load() + secondRows.Load(); total <= 3*n {
		t.Fatalf("rows inserted by both sinks: %d; want more than %d (the crashed batch re-inserted)", total, 3*n)
	}
	t.Logf("rows inserted: first sink %d, second %d, records %d", firstRows.Load(), secondRows.Load(), 3*n)
}

func TestSinkCancelledMidRunResumesWithoutLossOrDoubles(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	bulk(t, e, 0, 500, now)
	s1 := e.startSink(t, e.cfg)
	a := e.auditor(t)
	wantBulk(t, a, 500, now, 30*time.Second)
	if err := s1.stop(t); err != nil {
		t.Fatalf("first sink: %v", err)
	}
	bulk(t, e, 500, 500, now) // produced while no sink runs
	s2 := e.startSink(t, e.cfg)
	wantBulk(t, a, 1000, now, 30*time.Second)
	if err := s2.stop(t); err != nil {
		t.Fatal(err)
	}
}

func TestSinkWaitsForClickHouseAndCatchesUp(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	s := e.startSink(t, e.cfg)
	a := e.auditor(t)
	bulk(t, e, 0, 300, now)
	wantBulk(t, a, 300, now, 30*time.Second)

	e.ch.Stop(t)
	bulk(t, e, 300, 700, now) // while ClickHouse is down
	time.Sleep(1500 * time.Millisecond)
	select {
	case err := <-s.done:
		t.Fatalf("sink ended while ClickHouse was down: %v", err)
	default:
	}
	e.ch.Restart(t)
	wantBulk(t, a, 1000, now, 60*time.Second)
	sinkStats := s.sink.Stats()
	if sinkStats.InsertRetries == 0 || sinkStats.Records < 3000 {
		t.Fatalf("stats after an outage: %+v; want retries > 0 and ≥ 3000 records", sinkStats)
	}
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
}

func TestSinkConfigValidate(t *testing.T) {
	e := SinkConfig{}
	if err := e.Validate(); err == nil {
		t.Fatal("empty config accepted")
	}
	base := SinkConfig{Kafka: testKafkaConfig(), ClickHouse: Config{Addr: "127.0.0.1:9000"}}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*SinkConfig){
		"--batch-rows":    func(c *SinkConfig) { c.BatchRows = -1 },
		"--linger":        func(c *SinkConfig) { c.Linger = -time.Second },
		"--clickhouse-db": func(c *SinkConfig) { c.ClickHouse.Database = "bad-name;" },
		"host:port":       func(c *SinkConfig) { c.ClickHouse.Addr = "nohost" },
	} {
		c := base
		mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v, want one naming it", name, err)
		}
	}
}

func TestSinkShutdownWithClickHouseDownCommitsNothingItDidNotInsert(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	a := e.auditor(t)
	cfg := e.cfg
	cfg.ShutdownTimeout = 500 * time.Millisecond
	s1 := e.startSink(t, cfg)
	bulk(t, e, 0, 100, now)
	wantBulk(t, a, 100, now, 30*time.Second)

	e.ch.Stop(t)
	bulk(t, e, 100, 100, now)
	time.Sleep(time.Second) // the sink reads them and cannot insert them
	start := time.Now()
	err := s1.stop(t)
	if err == nil {
		t.Fatal("Run returned nil although its last batch could not be inserted")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("shutdown took %v with a 500ms drain deadline", d)
	}
	t.Logf("shutdown error (expected): %v", err)

	e.ch.Restart(t)
	s2 := e.startSink(t, e.cfg)
	wantBulk(t, a, 200, now, 30*time.Second)
	if err := s2.stop(t); err != nil {
		t.Fatal(err)
	}
}

func TestTwoSinksShareThePartitions(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	a := e.auditor(t)
	s1 := e.startSink(t, e.cfg)
	s2 := e.startSink(t, e.cfg)
	bulk(t, e, 0, 1500, now)
	wantBulk(t, a, 1500, now, 60*time.Second)
	if err := s1.stop(t); err != nil { // s2 takes over s1's partitions
		t.Fatal(err)
	}
	bulk(t, e, 1500, 500, now)
	wantBulk(t, a, 2000, now, 60*time.Second)
	if err := s2.stop(t); err != nil {
		t.Fatal(err)
	}
	if r1, r2 := s1.sink.Stats().Records, s2.sink.Stats().Records; r1 == 0 || r2 == 0 {
		t.Logf("records per sink: %d and %d (one sink got every partition)", r1, r2)
	}
}

// TestAuditIsOneSnapshot audits repeatedly while the sink inserts plays and
// their deliveries: every audit reads one state of the ledger, so the delay's
// play count is the delivered count (every event is in the ledger first),
// pending is reportable − delivered − rejected, events without plays +
// plays = events, and the partner targets' deliveries add up to delivered,
// in each audit.
func TestAuditIsOneSnapshot(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	const n, chunk = 3000, 100
	var evs []*kgo.Record
	for i := range n {
		id := fmt.Sprintf("ev-%06d", i)
		evs = append(evs, &kgo.Record{Topic: e.topics.Events, Key: []byte(id), Value: eventJSON(t, id, "u"), Timestamp: now})
	}
	e.produce(t, evs...)
	cfg := e.cfg
	cfg.Linger = 20 * time.Millisecond
	cfg.BatchRows = chunk
	s := e.startSink(t, cfg)
	a := e.auditor(t)
	opts := AuditOptions{From: now.Add(-time.Hour), To: now.Add(time.Hour), Now: now}
	waitFor(t, 30*time.Second, "the events in the ledger", func() (bool, string) {
		r, err := a.Audit(context.Background(), opts)
		if err != nil {
			return false, err.Error()
		}
		return r.EventsReceived == n, fmt.Sprint(r.EventsReceived)
	})
	done := make(chan struct{})
	go func() { // the producer of plays and deliveries, stopped before the test ends
		defer close(done)
		for i := 0; i < n; i += chunk {
			var recs []*kgo.Record
			for j := i; j < i+chunk; j++ {
				id := fmt.Sprintf("ev-%06d", j)
				rid, p := playJSON(t, id, 0, false)
				recs = append(recs, &kgo.Record{Topic: e.topics.Reports, Key: []byte(rid), Value: p, Timestamp: now},
					&kgo.Record{Topic: e.topics.Deliveries, Key: []byte(rid), Value: deliveryJSON(t, rid, id, schemas.OutcomeDelivered, 1, now.UnixMilli()+50, "", "ok"), Timestamp: now})
			}
			e.produce(t, recs...)
			time.Sleep(30 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { <-done }) // before the env's own cleanup closes its client
	audits, moving := 0, 0
	for {
		r, err := a.Audit(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		audits++
		if r.Delivered > 0 && r.Delivered < n {
			moving++
		}
		if r.Delay.Plays != r.Delivered || r.Delivered > r.PlaysReportable || r.Pending != r.PlaysReportable-r.Delivered-r.RejectedByAPI {
			t.Fatalf("audit %d is not one state of the ledger: reportable %d delivered %d pending %d, delay over %d plays",
				audits, r.PlaysReportable, r.Delivered, r.Pending, r.Delay.Plays)
		}
		// One play per event: an event is without plays until its play is
		// in the snapshot; the partner targets' deliveries add up to delivered.
		var byPartner uint64
		for _, p := range r.ByPartner {
			byPartner += p.Delivered
		}
		if r.EventsWithoutPlays+r.PlaysDerived != r.EventsReceived || byPartner != r.Delivered {
			t.Fatalf("audit %d is not one state of the ledger: received %d, without plays %d, derived %d; delivered %d, by partner target %d",
				audits, r.EventsReceived, r.EventsWithoutPlays, r.PlaysDerived, r.Delivered, byPartner)
		}
		if r.Delivered == n {
			break
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("the ledger did not fill in a minute")
		default:
		}
	}
	<-done
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d audits, %d of them while the ledger was filling", audits, moving)
}
