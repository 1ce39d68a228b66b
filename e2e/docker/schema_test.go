//go:build docker

package docker_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/analytics"
)

// ledgerTables are the tables the migrations create (schema_migrations aside).
var ledgerTables = []string{"events", "plays", "deliveries", "rejections", "malformed"}

// columnTypes returns table.column → type of db's ledger tables.
func columnTypes(ctx context.Context, t *testing.T, conn driver.Conn, db string) map[string]string {
	t.Helper()
	rows, err := conn.Query(ctx, "SELECT table, name, type FROM system.columns WHERE database = '"+db+"' AND table != '"+analytics.MigrationsTable+"'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var tbl, name, typ string
		if err := rows.Scan(&tbl, &name, &typ); err != nil {
			t.Fatal(err)
		}
		out[tbl+"."+name] = typ
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// assertCurrentSchema checks that the server is given the current-server
// schema and that db's ledger has it: the columns of the portable ledger
// portableDB, the listed ones LowCardinality(String), nothing else changed.
func assertCurrentSchema(ctx context.Context, t *testing.T, conn driver.Conn, db, portableDB string) {
	t.Helper()
	schema, version, err := analytics.ServerSchema(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if schema != analytics.SchemaCurrent {
		t.Fatalf("ClickHouse %s (docker-compose.yml's) gets the %s schema, want current", version, schema)
	}
	portable, cur := columnTypes(ctx, t, conn, portableDB), columnTypes(ctx, t, conn, db)
	if len(portable) == 0 {
		t.Fatalf("no ledger columns in %s", portableDB)
	}
	want := map[string]string{}
	for k, v := range portable {
		if strings.Contains(v, "LowCardinality") {
			t.Fatalf("portable ledger %s: %s is %s", portableDB, k, v)
		}
		want[k] = v
	}
	for tbl, cols := range analytics.LowCardinalityColumns {
		for _, c := range cols {
			want[tbl+"."+c] = "LowCardinality(String)"
		}
	}
	if !reflect.DeepEqual(cur, want) {
		t.Fatalf("ClickHouse %s: ledger %s columns\n%v\nwant\n%v", version, db, cur, want)
	}
}

// copyLedger creates a portable ledger in db `to` and copies every row of
// db `from` into it, inserted_at included.
func copyLedger(ctx context.Context, t *testing.T, conn driver.Conn, from, to string) {
	t.Helper()
	if _, err := analytics.MigrateWith(ctx, conn, to, analytics.SchemaPortable); err != nil {
		t.Fatalf("portable migrations on a current server: %v", err)
	}
	for _, tbl := range ledgerTables {
		if err := conn.Exec(ctx, "INSERT INTO "+to+"."+tbl+" SELECT * FROM "+from+"."+tbl); err != nil {
			t.Fatalf("copy %s.%s to %s: %v", from, tbl, to, err)
		}
	}
}

// assertSameAudit requires the same audit and the same lists from the
// ledgers in dbs a and b over window.
func assertSameAudit(ctx context.Context, t *testing.T, conn driver.Conn, a, b string, window analytics.AuditOptions) *analytics.Audit {
	t.Helper()
	var reports [2]*analytics.Audit
	var auditors [2]*analytics.Auditor
	for i, db := range []string{a, b} {
		au, err := analytics.NewAuditor(conn, db)
		if err != nil {
			t.Fatal(err)
		}
		if reports[i], err = au.Audit(ctx, window); err != nil {
			t.Fatalf("audit of %s: %v", db, err)
		}
		auditors[i] = au
	}
	ra, rb := *reports[0], *reports[1]
	ra.GeneratedAt, ra.LedgerAsOf, rb.GeneratedAt, rb.LedgerAsOf = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if !reflect.DeepEqual(ra, rb) {
		t.Errorf("audits differ:\n%s: %+v\n%s: %+v", a, ra, b, rb)
	}
	for _, metric := range analytics.ListNames() {
		la, err := auditors[0].List(ctx, window, metric, 0)
		if err != nil {
			t.Fatalf("list %s of %s: %v", metric, a, err)
		}
		lb, err := auditors[1].List(ctx, window, metric, 0)
		if err != nil {
			t.Fatalf("list %s of %s: %v", metric, b, err)
		}
		if !reflect.DeepEqual(la, lb) {
			t.Errorf("list %s differs: %s has %d rows, %s %d", metric, a, len(la), b, len(lb))
		}
	}
	return reports[0]
}

// TestMigrationsOnCurrentClickHouse: on docker-compose.yml's ClickHouse,
// Migrate picks the current-server schema (LowCardinality columns), is
// idempotent, and the portable DDL runs there too (MigrateWith).
func TestMigrationsOnCurrentClickHouse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := startClickHouse(ctx, t)
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ch.Addr},
		Auth: clickhouse.Auth{Database: ch.Database, Username: ch.User, Password: ch.Password}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	applied, err := analytics.Migrate(ctx, conn, ch.Database)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if len(applied) != len(analytics.Migrations) {
		t.Fatalf("Migrate applied %v, want every version", applied)
	}
	if again, err := analytics.Migrate(ctx, conn, ch.Database); err != nil || len(again) != 0 {
		t.Fatalf("second Migrate: applied %v, err %v; want none", again, err)
	}
	portableDB := ch.Database + "_portable"
	copyLedger(ctx, t, conn, ch.Database, portableDB)
	assertCurrentSchema(ctx, t, conn, ch.Database, portableDB)
	for _, db := range []string{ch.Database, portableDB} {
		var engines []string
		rows, err := conn.Query(ctx, "SELECT engine FROM system.tables WHERE database = '"+db+"' AND name != '"+analytics.MigrationsTable+"'")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var e string
			if err := rows.Scan(&e); err != nil {
				t.Fatal(err)
			}
			engines = append(engines, e)
		}
		rows.Close()
		if len(engines) != len(ledgerTables) || slices.ContainsFunc(engines, func(e string) bool { return e != "ReplacingMergeTree" }) {
			t.Fatalf("%s engines %v: want %d ReplacingMergeTree tables", db, engines, len(ledgerTables))
		}
	}
}
