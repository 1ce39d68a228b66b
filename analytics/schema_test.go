package analytics

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/playpipe/playpipe/testkit/testenv"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/schema_current.sql from the migrations")

func TestSchemaForVersion(t *testing.T) {
	for _, c := range []struct {
		version string
		want    Schema
	}{
		{"18.16.1", SchemaPortable}, // Debian's, every local test
		{"19.17.4.11", SchemaPortable},
		{"21.3.20.1", SchemaPortable},
		{"21.7.99", SchemaPortable},
		{"21.8.15.7", SchemaCurrent}, // CurrentSchemaSince
		{"21.12.1", SchemaCurrent},
		{"22.1", SchemaCurrent},
		{"24.8.4.13", SchemaCurrent},
		{"25.8.2.29", SchemaCurrent}, // docker-compose.yml's
		{"v25.8.1.1-lts", SchemaCurrent},
		{"100.0", SchemaCurrent},
		{"", SchemaPortable},
		{"unknown", SchemaPortable},
		{"25", SchemaPortable},
		{"99999999999999999999.1", SchemaPortable}, // does not fit an int
	} {
		if got := SchemaForVersion(c.version); got != c.want {
			t.Errorf("SchemaForVersion(%q) = %s, want %s", c.version, got, c.want)
		}
	}
	if SchemaPortable.String() != "portable" || SchemaCurrent.String() != "current" || Schema(7).String() != "Schema(7)" {
		t.Errorf("names: %s %s %s", SchemaPortable, SchemaCurrent, Schema(7))
	}
}

// renderSchema is every migration's statements in schema s, as one text.
func renderSchema(s Schema) string {
	var b strings.Builder
	for _, m := range Migrations {
		for i, st := range m.StatementsFor(s) {
			fmt.Fprintf(&b, "-- migration %d (%s), statement %d\n%s;\n\n", m.Version, m.Name, i+1, st)
		}
	}
	return b.String()
}

// TestCurrentSchemaGolden pins the current-server DDL (testdata/schema_current.sql,
// rewritten by -update) and checks it differs from the portable DDL only in
// the columns of LowCardinalityColumns, each defined once.
func TestCurrentSchemaGolden(t *testing.T) {
	golden := filepath.Join("testdata", "schema_current.sql")
	got := renderSchema(SchemaCurrent)
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./analytics/ -run TestCurrentSchemaGolden -update)", err)
	}
	if got != string(want) {
		t.Fatalf("the current-server DDL differs from %s (if intended, rerun with -update and review the diff):\n%s", golden, got)
	}

	if p := renderSchema(SchemaPortable); strings.Contains(p, "LowCardinality") {
		t.Fatalf("the portable DDL uses LowCardinality:\n%s", p)
	}
	// Statement by statement: the same once LowCardinality(String) reads
	// String again, and every listed column converted exactly once.
	converted := map[string]int{}
	for _, m := range Migrations {
		cur := m.StatementsFor(SchemaCurrent)
		if !reflect.DeepEqual(m.StatementsFor(SchemaPortable), m.Statements) || len(cur) != len(m.Statements) {
			t.Fatalf("migration %d: StatementsFor changed the portable statements or their number", m.Version)
		}
		for i, st := range cur {
			if back := strings.ReplaceAll(st, " LowCardinality(String)", " String"); back != m.Statements[i] {
				t.Errorf("migration %d statement %d differs beyond LowCardinality:\n%s\nportable:\n%s", m.Version, i+1, st, m.Statements[i])
			}
			tm := tableOfRE.FindStringSubmatch(st)
			for _, line := range strings.Split(st, "\n") {
				if j := strings.Index(line, " LowCardinality(String)"); j >= 0 {
					f := strings.Fields(line[:j])
					converted[tm[1]+"."+f[len(f)-1]]++
				}
			}
		}
	}
	want2 := map[string]int{}
	for tbl, cols := range LowCardinalityColumns {
		for _, c := range cols {
			want2[tbl+"."+c] = 1
		}
	}
	if !reflect.DeepEqual(converted, want2) {
		t.Fatalf("columns made LowCardinality (definitions each): %v, want each of LowCardinalityColumns once: %v", converted, want2)
	}
}

// columnTypes returns table.column → type of the ledger tables in db.
func columnTypes(t *testing.T, e *env, db string) map[string]string {
	t.Helper()
	rows, err := e.ch.Conn(t).Query(context.Background(), "SELECT table, name, type FROM system.columns WHERE database = '"+db+"' AND table != '"+MigrationsTable+"'")
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

// TestMigratePicksTheServerSchema: Migrate creates the ledger in the schema
// of the server's version (portable on 18.16, current from 21.8 on).
func TestMigratePicksTheServerSchema(t *testing.T) {
	e := &env{ch: testenv.StartClickHouse(t)}
	ctx := context.Background()
	conn := e.ch.Conn(t)
	schema, version, err := ServerSchema(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if version == "" || schema != SchemaForVersion(version) {
		t.Fatalf("ServerSchema: %s, %q", schema, version)
	}
	if _, err := Migrate(ctx, conn, e.ch.Database); err != nil {
		t.Fatal(err)
	}
	types := columnTypes(t, e, e.ch.Database)
	lc := 0
	for col, typ := range types {
		if strings.Contains(typ, "LowCardinality") {
			lc++
			tbl, name, _ := strings.Cut(col, ".")
			if schema != SchemaCurrent || !slices.Contains(LowCardinalityColumns[tbl], name) {
				t.Errorf("server %s (%s schema): %s is %s", version, schema, col, typ)
			}
		}
	}
	want := 0
	if schema == SchemaCurrent {
		for _, cols := range LowCardinalityColumns {
			want += len(cols)
		}
	}
	if lc != want {
		t.Fatalf("server %s (%s schema): %d LowCardinality columns, want %d", version, schema, lc, want)
	}
}

// TestAuditSameOnBothSchemas runs two sinks on the same records, one into a
// ledger of the portable DDL, one into a ledger of the current-server DDL
// (on 18.16 made with its experimental LowCardinality setting: the one
// feature SchemaCurrent adds), and requires the same audit and the same
// lists from both.
func TestAuditSameOnBothSchemas(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	conn := e.ch.Conn(t)
	schema, version, err := ServerSchema(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := MigrateWith(ctx, conn, e.ch.Database, SchemaPortable); err != nil {
		t.Fatal(err)
	}
	lcDB := e.ch.Database + "_lc"
	lcCtx := ctx
	if schema == SchemaPortable { // 18.16: LowCardinality is experimental there
		lcCtx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"allow_experimental_low_cardinality_type": 1}))
	}
	if !e.ch.Local() {
		t.Cleanup(func() { _ = e.ch.Conn(t).Exec(context.Background(), "DROP DATABASE IF EXISTS "+lcDB) })
	}
	if _, err := MigrateWith(lcCtx, conn, lcDB, SchemaCurrent); err != nil {
		t.Fatalf("the current-server DDL on %s: %v", version, err)
	}
	// The current ledger's columns are the portable ledger's, the listed
	// ones LowCardinality(String).
	portable, cur := columnTypes(t, e, e.ch.Database), columnTypes(t, e, lcDB)
	if len(portable) == 0 {
		t.Fatal("no ledger columns after MigrateWith portable")
	}
	want := map[string]string{}
	for k, v := range portable {
		want[k] = v
	}
	for tbl, cols := range LowCardinalityColumns {
		for _, c := range cols {
			if portable[tbl+"."+c] != "String" {
				t.Fatalf("portable %s.%s is %q, want String", tbl, c, portable[tbl+"."+c])
			}
			want[tbl+"."+c] = "LowCardinality(String)"
		}
	}
	if !reflect.DeepEqual(cur, want) {
		t.Fatalf("current ledger columns:\n%v\nwant:\n%v", cur, want)
	}

	now := time.Now()
	wantReport := fixture(t, e, now)
	e.startSink(t, e.cfg)
	lcCfg := e.cfg
	lcCfg.Group = "playpipe-sink-lc"
	lcCfg.ClickHouse.Database = lcDB
	e.startSink(t, lcCfg)

	opts := AuditOptions{From: now.Add(-2 * time.Hour), To: now.Add(time.Minute), PendingThreshold: 10 * time.Minute, Now: now}
	auditors := map[string]*Auditor{}
	for name, db := range map[string]string{"portable": e.ch.Database, "current": lcDB} {
		a, err := NewAuditor(e.ch.Conn(t), db)
		if err != nil {
			t.Fatal(err)
		}
		auditors[name] = a
	}
	reports := map[string]*Audit{}
	for _, name := range []string{"portable", "current"} {
		a := auditors[name]
		waitFor(t, 30*time.Second, "the "+name+" ledger's audit to match", func() (bool, string) {
			r, err := a.Audit(ctx, opts)
			if err != nil {
				return false, err.Error()
			}
			reports[name] = r
			return reflect.DeepEqual(numbers(r), wantReport), fmt.Sprintf("%+v", numbers(r))
		})
	}
	p, c := *reports["portable"], *reports["current"]
	p.GeneratedAt, p.LedgerAsOf, c.GeneratedAt, c.LedgerAsOf = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if !reflect.DeepEqual(p, c) { // the partner numbers too
		t.Fatalf("audits differ:\nportable %+v\ncurrent  %+v", p, c)
	}
	names := ListNames()
	sort.Strings(names)
	for _, metric := range names {
		lp, err := auditors["portable"].List(ctx, opts, metric, 0)
		if err != nil {
			t.Fatalf("portable list %s: %v", metric, err)
		}
		lc, err := auditors["current"].List(ctx, opts, metric, 0)
		if err != nil {
			t.Fatalf("current list %s: %v", metric, err)
		}
		// Kafka locations are the same records: both sinks read one topic set.
		if !reflect.DeepEqual(lp, lc) {
			t.Errorf("list %s differs:\nportable %+v\ncurrent  %+v", metric, lp, lc)
		}
	}
}
