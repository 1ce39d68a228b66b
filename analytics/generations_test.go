package analytics

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestTwoTopicGenerations: a broker that came back empty.
// The sink copies 41 events of the first life of the topics, the broker is
// replaced by an empty one (new topic ids, offsets from 0 again), and the
// sink copies 32 events of the second life at the same (topic, partition,
// offset) positions. The ledger must keep all 73 (the topic id is in every
// row and in the sorting key), the audit count each once, match each
// rejection with the event of its own generation, and say that the window
// holds two generations — without failing, the counts being unambiguous.
func TestTwoTopicGenerations(t *testing.T) {
	testenv.ForEachLedger(t, twoTopicGenerations)
}

func twoTopicGenerations(t *testing.T, l *testenv.Ledger) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k1 := testenv.StartKafka(t, 3)
	topics := k1.Config.Topics()
	a, err := NewAuditor(l.Conn, l.Database)
	if err != nil {
		t.Fatal(err)
	}
	sinkCfg := SinkConfig{Kafka: k1.Config, ClickHouse: Config{Database: l.Database}, BatchRows: 200,
		Linger: 50 * time.Millisecond, RetryMin: 50 * time.Millisecond, RetryMax: 400 * time.Millisecond, Logger: testLogger()}
	if l.Server != nil {
		sinkCfg.ClickHouse.Addr, sinkCfg.ClickHouse.User, sinkCfg.ClickHouse.Password = l.Server.Addr, l.Server.User, l.Server.Password
	} else {
		sinkCfg.conn = l.Conn // chdb: in this process, no address
	}
	o := AuditOptions{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), Now: time.Now()}

	// life publishes n events on partition 0 of the events topic and a
	// rejection of the event at offset 5.
	life := func(k *testenv.Kafka, gen string, n int) {
		t.Helper()
		prod := k.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
		topics := k.Config.Topics()
		var recs []*kgo.Record
		for i := range n {
			recs = append(recs, &kgo.Record{Topic: topics.Events, Partition: 0, Value: eventJSON(t, fmt.Sprintf("%s-ev-%02d", gen, i), "u1")})
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		j := schemas.NewRejection(recs[5].Value, gen+"-ev-05", []schemas.Violation{{Reason: "bad_country", Field: "country"}},
			schemas.Source{Topic: topics.Events, Partition: 0, Offset: 5}, time.Now().UnixMilli())
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topics.Rejected, Partition: 0, Value: mustJSON(t, j)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	sinkUntil := func(cfg SinkConfig, events, rejected uint64) {
		t.Helper()
		r := (&env{}).startSink(t, cfg)
		waitFor(t, 60*time.Second, fmt.Sprintf("%d events and %d rejected in the audit", events, rejected), func() (bool, string) {
			got, err := a.Audit(ctx, o)
			if err != nil {
				return false, err.Error() // the sink has not made the tables yet
			}
			return got.EventsReceived == events && got.EventsRejected == rejected,
				fmt.Sprintf("received %d, rejected %d", got.EventsReceived, got.EventsRejected)
		})
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	}

	life(k1, "first", 41)
	sinkUntil(sinkCfg, 41, 1)

	// The broker comes back empty: topics created again, offsets from 0.
	k1.Close()
	k2 := testenv.StartKafka(t, 3)
	life(k2, "second", 32)
	cfg := sinkCfg
	cfg.Kafka = k2.Config
	sinkUntil(cfg, 73, 2)

	got, err := a.Audit(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	exact, err := NewAuditor(l.Conn, l.Database)
	if err != nil {
		t.Fatal(err)
	}
	exact.SetLimits(Limits{Exact: true, SliceReports: 5}) // and the generations in 8 parts
	if x, err := exact.Audit(ctx, o); err != nil {
		t.Errorf("the exact path on the re-created topics' ledger: %v", err)
	} else if !reflect.DeepEqual(auditNumbers(x), auditNumbers(got)) {
		t.Errorf("the exact path on the re-created topics' ledger:\n got %+v\nwant %+v", auditNumbers(x), auditNumbers(got))
	}
	if got.EventsWithoutPlays != 71 {
		t.Errorf("valid events without plays: %d, want 71 (each rejection matched with its own generation's event)", got.EventsWithoutPlays)
	}
	if len(got.Generations) != 2 || got.Generations[0].Topic != topics.Events || got.Generations[1].Topic != topics.Rejected ||
		len(got.Generations[0].Generations) != 2 || len(got.Generations[1].Generations) != 2 {
		t.Fatalf("generations: %+v, want the events and rejected topics with two each", got.Generations)
	}
	g := got.Generations[0].Generations
	if g[0].Records != 41 || g[1].Records != 32 || g[0].ID == "" || g[1].ID == "" || g[0].ID == g[1].ID {
		t.Errorf("generations of the events topic: %+v, want two known ids of 41 and 32 records", g)
	}
	if ps := got.Problems(); len(ps) != 0 {
		t.Errorf("problems: %q, want none (two known generations are counted apart)", ps)
	}
	var out bytes.Buffer
	if err := WriteAudit(&out, got, FormatTable); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "NOTE: topic "+topics.Events+" holds 2 generations in the window") || !strings.Contains(out.String(), "RESULT: OK") {
		t.Errorf("audit output lacks the generations note or OK:\n%s", out.String())
	}
	t.Logf("audit:\n%s", out.String())
	var csvOut bytes.Buffer
	if err := WriteAudit(&csvOut, got, FormatCSV); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(csvOut.String(), "generations,records of a topic generation"); n != 4 {
		t.Errorf("CSV: %d generation rows, want 4 (two topics, two generations each):\n%s", n, csvOut.String())
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, &HTMLAudit{Audit: got}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "NOTE: topic "+topics.Events+" holds 2 generations") {
		t.Errorf("the HTML page lacks the generations note")
	}

	list, err := a.List(ctx, o, "received", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 73 {
		t.Errorf("--list received: %d rows, want 73", len(list))
	}
	rej, err := a.List(ctx, o, "rejected", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rej) != 2 {
		t.Errorf("--list rejected: %d rows, want 2", len(rej))
	}

	// The ReplacingMergeTree keeps both generations through a merge.
	if err := l.Conn.Exec(ctx, "OPTIMIZE TABLE "+l.Database+".events FINAL"); err != nil {
		t.Fatal(err)
	}
	var rows uint64
	if err := l.Conn.QueryRow(ctx, "SELECT count() FROM "+l.Database+".events").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 73 {
		t.Errorf("events rows after OPTIMIZE FINAL: %d, want 73", rows)
	}
}

// TestGenerationsAmbiguous: rows the audit cannot tell apart fail it. Two
// different records at one location of the unknown generation (two lives of
// a topic on a broker without topic ids, or rows from before schema
// version 6), and one record copied before and after the upgrade (once
// with the empty id, once with its id).
func TestGenerationsAmbiguous(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Migrate(ctx, conn, ch.Database); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ms := now.UnixMilli()
	ins := func(id string, off int, raw string) {
		t.Helper()
		q := fmt.Sprintf(`INSERT INTO %s.events (kafka_topic, kafka_partition, kafka_offset, kafka_topic_id, kafka_time, kafka_time_ms, kafka_key, parsed, event_id, raw)
SELECT 'plays.events', 0, %d, '%s', toDateTime(%d), %d, '', 1, 'e%d', '%s'`, ch.Database, off, id, ms/1000, ms, off, raw)
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	ins("", 1, `{"event_id":"a"}`)
	ins("", 1, `{"event_id":"b"}`) // another record at the same location, unknown generation
	ins("", 2, `{"event_id":"c"}`)
	ins("Xy", 2, `{"event_id":"c"}`) // the same record, before and after the upgrade
	ins("Xy", 3, `{"event_id":"d"}`)
	a, err := NewAuditor(conn, ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Audit(ctx, AuditOptions{From: now.Add(-time.Hour), To: now.Add(time.Hour), Now: now.Add(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Generations) != 1 || got.Generations[0].Clashes != 1 || got.Generations[0].UnknownOverlaps != 1 {
		t.Fatalf("generations: %+v, want plays.events with 1 clash and 1 overlap", got.Generations)
	}
	ps := strings.Join(got.Problems(), "; ")
	if !strings.Contains(ps, "cannot tell them apart") || !strings.Contains(ps, "may be counted twice") {
		t.Errorf("problems: %q", ps)
	}
}

// TestWithoutKeyChange: the fallback of a replicated table on 18.16, which
// cannot change its sorting key (TestClusterLedger runs it for real).
func TestWithoutKeyChange(t *testing.T) {
	for _, st := range topicIDStatements() {
		add, ok := withoutKeyChange(st)
		if !ok || strings.Contains(add, "ORDER BY") || !strings.HasSuffix(add, "ADD COLUMN kafka_topic_id String AFTER kafka_offset") {
			t.Errorf("%q → %q, %v", st, add, ok)
		}
	}
	if _, ok := withoutKeyChange(`ALTER TABLE {db}.deliveries ADD COLUMN partner String DEFAULT ''`); ok {
		t.Error("a plain ADD COLUMN has no key change")
	}
}
