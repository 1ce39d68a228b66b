package deploy_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestDashboardQueriesOnCluster runs every query of the finance dashboard
// on a replicated ledger (ZooKeeper and two clickhouse-server 18.16
// replicas, `migrate --cluster`), through the Distributed tables of each
// replica, and on a single-server ledger holding the same rows: the panels
// must show the same on all three (the dashboard names the tables as on
// one server: docs/audit.md, "A replicated ledger").
func TestDashboardQueriesOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ZooKeeper and three ClickHouse servers")
	}
	ctx := context.Background()
	cl := testenv.StartClickHouseCluster(t)
	one := testenv.StartClickHouse(t)
	single := one.Conn(t)
	if _, err := analytics.Migrate(ctx, single, one.Database); err != nil {
		t.Fatal(err)
	}
	var replicas []driver.Conn
	for i, addr := range cl.Addrs() {
		conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: "default"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if i == 0 {
			if _, err := analytics.MigrateCluster(ctx, conn, cl.Database, cl.Name()); err != nil {
				t.Fatal(err)
			}
		}
		// The panels name the tables unqualified: the connection's
		// database is the ledger's.
		conn.Close()
		if conn, err = clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: cl.Database}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		replicas = append(replicas, conn)
	}

	now := time.Now().Truncate(time.Second)
	base := now.Add(-2 * time.Hour)
	var offset int64
	row := func(table string, at time.Time, kv ...any) {
		offset++
		m := map[string]any{"kafka_topic": "plays." + table, "kafka_partition": int32(0), "kafka_offset": offset,
			"kafka_time": at, "kafka_time_ms": uint64(at.UnixMilli())}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		ledgerRow(t, single, table, m)
		ledgerRow(t, replicas[offset%2], table+analytics.LocalSuffix, m) // through either replica
	}
	for i := 1; i <= 6; i++ {
		row("plays", base.Add(time.Duration(i)*time.Minute), "report_id", fmt.Sprintf("p%d", i), "event_id", fmt.Sprintf("e%d", i), "below_minimum", uint8(b2i(i == 6)))
	}
	answer := func(report, outcome string, at time.Time, msg string) {
		row("deliveries", at, "report_id", report, "outcome", outcome, "at_ms", at.UnixMilli(), "message", msg)
	}
	answer("p1", "delivered", base.Add(2*time.Minute), "")
	answer("p2", "standby", base.Add(3*time.Minute), "")
	answer("p2", "delivered", base.Add(12*time.Minute), "")
	answer("p2", "delivered", base.Add(13*time.Minute), "")
	answer("p3", "rejected", base.Add(4*time.Minute), "bad isrc")
	answer("p4", "standby", base.Add(9*time.Minute), "")
	answer("p4", "retry", base.Add(10*time.Minute), "503")
	for i, reason := range []string{"missing_user_id", "missing_user_id", "invalid_json"} {
		row("rejections", base.Add(time.Minute), "reason", reason, "src_topic", "plays.events", "src_partition", int32(0), "src_offset", int64(i))
	}

	nonEmpty := 0
	for _, p := range dashboardPanels(t) {
		for _, tg := range p.Targets {
			// now() pinned: the pending panels' ages move each second,
			// and a replica's answer may come seconds after the single
			// server's (the retry below waits for replication).
			sql := strings.ReplaceAll(expandMacros(t, tg.RawSQL, now.Add(-7*24*time.Hour), now), "now()", fmt.Sprintf("toDateTime(%d)", now.Unix()))
			want, err := queryStrings(ctx, single, sql)
			if err != nil {
				t.Errorf("panel %q on one server: %v", p.Title, err)
				continue
			}
			if len(want) > 0 {
				nonEmpty++
			}
			for i, conn := range replicas {
				var got [][]string
				deadline := time.Now().Add(30 * time.Second)
				for { // the other replica's rows arrive by replication
					if got, err = queryStrings(ctx, conn, sql); err != nil || reflect.DeepEqual(got, want) || time.Now().After(deadline) {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if err != nil {
					t.Errorf("panel %q through r%d: %v\n%s", p.Title, i+1, err, sql)
				} else if !reflect.DeepEqual(got, want) {
					t.Errorf("panel %q through r%d:\n got %v\nwant %v (one server)", p.Title, i+1, got, want)
				}
			}
		}
	}
	t.Logf("%d panels with rows on one server", nonEmpty)
	if nonEmpty < 5 {
		t.Errorf("only %d panels show rows: the fixture no longer exercises the dashboard", nonEmpty)
	}
}
