package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestAuditExitCodes drives `playpipe audit` against a real ledger written
// row by row: clean → 0, an overdue pending play → 3 (unless the threshold
// allows it), a double delivery → 3, bad flags → 2.
func TestAuditExitCodes(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	ctx := context.Background()
	if _, err := analytics.Migrate(ctx, conn, ch.Database); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var offset int64
	insert := func(table, cols string, ts time.Time, vals ...any) {
		t.Helper()
		offset++
		b, err := conn.PrepareBatch(ctx, "INSERT INTO "+ch.Database+"."+table+" (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, "+cols+")")
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Append(append([]any{"plays." + table, int32(0), offset, ts, uint64(ts.UnixMilli())}, vals...)...); err != nil {
			t.Fatal(err)
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	play := func(id string, ts time.Time) { insert("plays", "report_id, event_id", ts, id, "ev-"+id) }
	delivered := func(id string) {
		insert("deliveries", "report_id, outcome, trace_id, at_ms", now, id, "delivered", "trace-"+id, now.UnixMilli())
	}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errb bytes.Buffer
		base := []string{"audit", "--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--from", "-3h", "--to", "+1m", "--log-level", "warn"}
		code := runMain(ctx, append(base, args...), &out, &errb)
		return code, out.String(), errb.String()
	}

	play("r1", now)
	delivered("r1")
	if code, out, errs := run(); code != 0 || !strings.Contains(out, "RESULT: OK") {
		t.Fatalf("clean ledger: exit %d\n%s\n%s", code, out, errs)
	}

	play("r2", now.Add(-time.Hour)) // pending for an hour
	if code, out, _ := run(); code != exitAuditProblems || !strings.Contains(out, "pending") {
		t.Fatalf("overdue pending play: exit %d, want %d\n%s", code, exitAuditProblems, out)
	}
	if code, out, _ := run("--pending-threshold", "2h"); code != 0 {
		t.Fatalf("pending within --pending-threshold 2h: exit %d, want 0\n%s", code, out)
	}
	code, out, _ := run("--list", "pending", "--format", "csv")
	if code != 0 || !strings.Contains(out, "r2,ev-r2,") {
		t.Fatalf("--list pending: exit %d\n%s", code, out)
	}

	delivered("r1") // a second, distinct delivered record
	code, out, _ = run("--pending-threshold", "2h", "--format", "json")
	if code != exitAuditProblems {
		t.Fatalf("double delivery: exit %d, want %d\n%s", code, exitAuditProblems, out)
	}
	var rep struct {
		analytics.Audit
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("json output: %v\n%s", err, out)
	}
	if rep.DeliveredTwice != 1 || rep.Delivered != 1 || rep.Pending != 1 || rep.PlaysDerived != 2 || len(rep.Problems) != 1 {
		t.Fatalf("json report: %+v", rep)
	}
	code, out, _ = run("--list", "delivered-twice")
	if code != 0 || !strings.Contains(out, "r1") || !strings.Contains(out, "trace-r1") {
		t.Fatalf("--list delivered-twice: exit %d\n%s", code, out)
	}

	for _, bad := range [][]string{{"--format", "xml"}, {"--list", "nope"}, {"--from", "yesterday"}, {"--from", "now", "--to", "-1h"}} {
		if code, _, errs := run(bad...); code != 2 || errs == "" {
			t.Errorf("%v: exit %d (stderr %q), want 2 with a message", bad, code, errs)
		}
	}
}

func TestParseAuditTime(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"now":                  now,
		"-90m":                 now.Add(-90 * time.Minute),
		"2026-11-20":           time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC),
		"2026-11-20T10:30":     time.Date(2026, 11, 20, 10, 30, 0, 0, time.UTC),
		"2026-11-20T10:30:00Z": time.Date(2026, 11, 20, 10, 30, 0, 0, time.UTC),
		"1700000000000":        time.UnixMilli(1700000000000),
	} {
		got, err := parseAuditTime(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("%q: %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseAuditTime("tomorrow", now); err == nil {
		t.Error("tomorrow accepted")
	}
}
