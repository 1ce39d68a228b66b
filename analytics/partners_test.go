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
)

func TestIsSandboxTarget(t *testing.T) {
	extra := []string{"http://sandbox:8088/"}
	for partner, want := range map[string]bool{
		"http://127.0.0.1:8088":         true,
		"http://127.9.9.9":              true,
		"http://[::1]:40001/base":       true,
		"http://localhost:8088":         true,
		"http://api.localhost":          true,
		"http://sandbox:8088":           true, // extra, trailing slash ignored
		"https://api.partner.example":   false,
		"http://10.0.0.7:8088":          false,
		"http://127.0.0.1.example.com/": false,
		"":                              false,
		"::not a url":                   false,
	} {
		if got := IsSandboxTarget(partner, extra); got != want {
			t.Errorf("IsSandboxTarget(%q) = %v, want %v", partner, got, want)
		}
	}
}

// TestAuditPerPartnerTarget: the sink stores each delivery's partner base
// URL, and the audit counts plays delivered per partner target, marks the
// sandbox ones (loopback, or named in SandboxTargets), and never counts a
// play delivered only by a sandbox as a real delivery. Rows without a
// partner (written before the column) are listed as such.
func TestAuditPerPartnerTarget(t *testing.T) {
	e := newEnv(t)
	now := time.Now().Truncate(time.Millisecond)
	const (
		real    = "https://api.partner.example"
		loop    = "http://127.0.0.1:8088"
		compose = "http://sandbox:8088"
	)
	var recs []*kgo.Record
	play := func(ev string) string {
		id, b := playJSON(t, ev, 0, false)
		recs = append(recs, &kgo.Record{Topic: e.topics.Reports, Key: []byte(id), Value: b, Timestamp: now.Add(-time.Minute)})
		return id
	}
	deliver := func(id, ev, outcome, partner string) {
		d := schemas.Delivery{V: schemas.DeliveryVersion, ReportID: id, EventID: ev, Outcome: outcome, Attempt: 1, HTTPStatus: 200, Partner: partner, At: now.UnixMilli()}
		if outcome == schemas.OutcomeRetry {
			d.HTTPStatus, d.Reason = 503, "http_503"
		}
		recs = append(recs, &kgo.Record{Topic: e.topics.Deliveries, Key: []byte(id), Value: mustJSON(t, d), Timestamp: now})
	}
	pReal := play("p-real") // real partner only (after a retry there)
	deliver(pReal, "p-real", schemas.OutcomeRetry, real)
	deliver(pReal, "p-real", schemas.OutcomeDelivered, real)
	pLoop := play("p-loop") // the built-in sandbox only
	deliver(pLoop, "p-loop", schemas.OutcomeDelivered, loop)
	pCompose := play("p-compose") // a named sandbox only
	deliver(pCompose, "p-compose", schemas.OutcomeDelivered, compose)
	pBoth := play("p-both") // a sandbox and the real partner: a real delivery
	deliver(pBoth, "p-both", schemas.OutcomeDelivered, loop)
	deliver(pBoth, "p-both", schemas.OutcomeDelivered, real)
	pOld := play("p-old") // a row from before the partner column
	deliver(pOld, "p-old", schemas.OutcomeDelivered, "")
	e.produce(t, recs...)

	s := e.startSink(t, e.cfg)
	a := e.auditor(t)
	opts := AuditOptions{From: now.Add(-time.Hour), To: now.Add(time.Minute), Now: now, SandboxTargets: []string{compose}}
	wantBy := []PartnerCount{
		{Partner: "", Delivered: 1, Answers: 1},
		{Partner: loop, Sandbox: true, Delivered: 2, Answers: 2},
		{Partner: compose, Sandbox: true, Delivered: 1, Answers: 1},
		{Partner: real, Delivered: 2, Answers: 3},
	}
	var got *Audit
	waitFor(t, 30*time.Second, "the per-partner audit", func() (bool, string) {
		var err error
		if got, err = a.Audit(context.Background(), opts); err != nil {
			return false, err.Error()
		}
		return got.Delivered == 5 && reflect.DeepEqual(got.ByPartner, wantBy), fmt.Sprintf("delivered %d, by partner %+v", got.Delivered, got.ByPartner)
	})
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got.DeliveredToSandbox != 2 || got.DeliveredReal != 3 {
		t.Errorf("delivered %d: to sandbox %d, real %d; want 2 (p-loop, p-compose) and 3", got.Delivered, got.DeliveredToSandbox, got.DeliveredReal)
	}
	// Without the named sandbox, http://sandbox:8088 counts as real.
	opts.SandboxTargets = nil
	r2, err := a.Audit(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if r2.DeliveredToSandbox != 1 || r2.DeliveredReal != 4 {
		t.Errorf("without SandboxTargets: to sandbox %d, real %d; want 1 and 4", r2.DeliveredToSandbox, r2.DeliveredReal)
	}

	var table, js bytes.Buffer
	if err := WriteAudit(&table, got, FormatTable); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{loop + " [SANDBOX: not a real delivery]", compose + " [SANDBOX", real, "(not recorded",
		"NOTE: 2 of the 5 delivered plays were answered only by a sandbox target", "delivered to a real partner"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table output lacks %q:\n%s", w, table.String())
		}
	}
	if err := WriteAudit(&js, got, FormatJSON); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"delivered_to_sandbox": 2`, `"delivered_real": 3`, `"deliveries_by_partner"`, `"sandbox": true`} {
		if !strings.Contains(js.String(), w) {
			t.Errorf("JSON output lacks %q", w)
		}
	}
	var n uint64
	if err := e.ch.Conn(t).QueryRow(context.Background(), "SELECT count() FROM "+e.ch.Database+".deliveries WHERE partner = '"+real+"'").Scan(&n); err != nil || n != 3 {
		t.Fatalf("deliveries rows with partner %s: %d (err %v), want 3", real, n, err)
	}
}

// TestMigrationAddsPartnerToAnOldLedger: a ledger at schema version 1 with
// delivery rows gets the partner column (” for the old rows) from Migrate,
// and re-running the ALTER after a crash before its version was recorded
// is skipped instead of failing.
func TestMigrationAddsPartnerToAnOldLedger(t *testing.T) {
	e := newEnv(t)
	conn := e.ch.Conn(t)
	ctx := context.Background()
	db := e.ch.Database
	if got, err := migrate(ctx, conn, db, Migrations[:1]); err != nil || !reflect.DeepEqual(got, []uint32{1}) {
		t.Fatalf("version 1: %v %v", got, err)
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".deliveries (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, report_id, outcome)")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Append("plays.deliveries", int32(0), int64(7), time.Now(), uint64(time.Now().UnixMilli()), "old-row", "delivered"); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	got, err := Migrate(ctx, conn, db)
	if err != nil || !reflect.DeepEqual(got, []uint32{2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Fatalf("Migrate on version 1: applied %v, err %v; want [2 3 4 5 6 7 8 9]", got, err)
	}
	var topicID string
	if err := conn.QueryRow(ctx, "SELECT kafka_topic_id FROM "+db+".deliveries WHERE report_id = 'old-row'").Scan(&topicID); err != nil || topicID != "" {
		t.Fatalf("old row's kafka_topic_id %q (err %v), want '' (the unknown generation)", topicID, err)
	}
	var partner, replayID, replayReason, doubtCause string
	if err := conn.QueryRow(ctx, "SELECT partner, replay_id, replay_reason, doubt_cause FROM "+db+".deliveries WHERE report_id = 'old-row'").Scan(&partner, &replayID, &replayReason, &doubtCause); err != nil ||
		partner != "" || replayID != "" || replayReason != "" || doubtCause != "" {
		t.Fatalf("old row's partner %q, replay_id %q, replay_reason %q, doubt_cause %q (err %v), want ''", partner, replayID, replayReason, doubtCause, err)
	}
	// A crash after the ALTER, before the version was recorded: the
	// version is applied again (as a new version here) and the ALTER skipped.
	next := LatestVersion() + 1
	again := append(append([]Migration(nil), Migrations...), Migration{Version: next, Name: "re-run", Statements: Migrations[1].Statements})
	if got, err := migrate(ctx, conn, db, again); err != nil || !reflect.DeepEqual(got, []uint32{next}) {
		t.Fatalf("re-running the ALTER: applied %v, err %v; want [%d] without an error", got, err, next)
	}
}
