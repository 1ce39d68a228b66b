package analytics

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestClusterStatements: every migration statement has a cluster form: a
// CREATE becomes the replicated <table>_local (the same columns, sorting
// key and partitioning, the engine's Replicated form under the {shard} and
// {replica} macros), an ADD COLUMN alters it on one replica (replicated
// from there; ON CLUSTER kills 18.16's DDL workers), a DROP drops the view,
// or a table's Distributed and replicated forms, ON CLUSTER; the
// Distributed <table> over a replicated one is syncDistributed's
// (TestClusterLedger).
func TestClusterStatements(t *testing.T) {
	for _, s := range []Schema{SchemaPortable, SchemaCurrent} {
		for _, m := range Migrations {
			sts, err := m.clusterStatementsFor(s, "led", "c1")
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range m.StatementsFor(s) {
				if len(sts) == 0 {
					t.Fatalf("migration %d: no cluster form of %s", m.Version, st)
				}
				local := sts[0]
				sts = sts[1:]
				switch {
				case createTableRE.MatchString(st):
					cm := createTableRE.FindStringSubmatch(st)
					name := cm[1]
					wantEngine := "ENGINE = Replicated" + cm[3] + "('/clickhouse/tables/{shard}/led/" + name + "', '{replica}')"
					if !strings.HasPrefix(local, "CREATE TABLE IF NOT EXISTS {db}."+name+"_local ON CLUSTER c1 ") ||
						!strings.Contains(local, wantEngine) || !strings.HasSuffix(local, cm[5]) || !strings.Contains(local, cm[2]) {
						t.Errorf("local table of %s:\n%s", name, local)
					}
				case addColumnRE.MatchString(st):
					name := addColumnRE.FindStringSubmatch(st)[1]
					if want := strings.Replace(st, name+" ADD", name+"_local ADD", 1); local != want {
						t.Errorf("migration %d: %q, want %q", m.Version, local, want)
					}
				case strings.HasPrefix(st, "CREATE MATERIALIZED VIEW"):
					// The view on every replica, from its deliveries_local
					// into its report_state_local.
					if !strings.Contains(local, " ON CLUSTER c1 TO {db}."+TableReportState+"_local AS ") || !strings.Contains(local, " FROM {db}.deliveries_local GROUP BY ") {
						t.Errorf("migration %d: view %s", m.Version, local)
					}
				case dropTableRE.MatchString(st):
					// The view on every replica; a table's Distributed
					// form, then its replicated one, on every replica.
					name := dropTableRE.FindStringSubmatch(st)[1]
					want := []string{st + " ON CLUSTER c1"}
					if name != reportStateView {
						want = append(want, strings.Replace(st, name, name+"_local", 1)+" ON CLUSTER c1")
					}
					if len(sts) < len(want)-1 {
						t.Fatalf("migration %d: drop %s: %d statements, want %d", m.Version, name, len(sts)+1, len(want))
					}
					got := append([]string{local}, sts[:len(want)-1]...)
					sts = sts[len(want)-1:]
					if !reflect.DeepEqual(got, want) {
						t.Errorf("migration %d: drop %s: %q, want %q", m.Version, name, got, want)
					}
				default:
					t.Fatalf("migration %d: a statement of no known form: %s", m.Version, st)
				}
			}
			if len(sts) != 0 {
				t.Errorf("migration %d: %d statements too many", m.Version, len(sts))
			}
		}
	}
	if want := "CREATE TABLE IF NOT EXISTS {db}.plays ON CLUSTER c1 AS {db}.plays_local ENGINE = Distributed(c1, led, plays_local)"; distributedTable("plays", "led", "c1") != want {
		t.Errorf("distributed table:\n%s\nwant\n%s", distributedTable("plays", "led", "c1"), want)
	}
	if _, err := clusterStatements("OPTIMIZE TABLE {db}.plays FINAL", "led", "c1"); err == nil {
		t.Fatal("a statement of no known form got a cluster form")
	}
	c := Config{Database: "led", Cluster: "c1"}
	if c.WriteTable("plays") != "led.plays_local" || (Config{Database: "led"}).WriteTable("plays") != "led.plays" {
		t.Fatal("table names")
	}
	if err := (Config{Cluster: "bad-name"}).Validate(); err == nil || !strings.Contains(err.Error(), "--clickhouse-cluster") {
		t.Fatalf("a cluster name that is no identifier: %v", err)
	}
}

// TestClusterLedger runs the sink into a replicated ledger (ZooKeeper and
// two clickhouse-server 18.16 replicas, testkit/chcluster) beside a
// single-server ledger fed from the same topics: the audit, read through
// the Distributed tables of either replica, must equal the fixture's
// expected numbers and the single-server audit, list by list. It then
// checks the layout on both replicas, the refusals of a ledger of the
// other layout, and the replicated insert deduplication.
func TestClusterLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ZooKeeper and two ClickHouse servers")
	}
	cl := testenv.StartClickHouseCluster(t)
	e := newEnv(t)
	ctx := context.Background()
	now := time.Now()
	want := fixture(t, e, now)
	e.startSink(t, e.cfg)
	ccfg := e.cfg
	ccfg.Group = "playpipe-sink-cluster"
	ccfg.ClickHouse = Config{Addr: cl.Addr(), Database: cl.Database, Cluster: cl.Name()}
	// A ledger at version 7 (report_state, its view and backfills, each
	// replicated with its Distributed table): the sink's migration 8 drops
	// them on both replicas.
	upTo7 := slices.IndexFunc(Migrations, func(m Migration) bool { return m.Version == 7 }) + 1
	if applied, err := migrateLayout(ctx, cl.Conn(t, 0), cl.Database, cl.Name(), Migrations[:upTo7], nil); err != nil || len(applied) != upTo7 {
		t.Fatalf("the cluster ledger to version 7: applied %v, %v", applied, err)
	}
	stateTables := "SELECT name FROM system.tables WHERE database = '" + cl.Database + "' AND (name LIKE '%report_state%' OR name LIKE '" + TableBackfills + "%') ORDER BY name"
	for i := range 2 {
		if got := queryStrings(t, cl.Conn(t, i), stateTables); len(got) != 5 {
			t.Fatalf("r%d at version 7: %v, want report_state, its view and backfills, local and Distributed", i+1, got)
		}
	}
	began := time.Now()
	cs := e.startSink(t, ccfg)
	// No query before the sink's migrations are done: on 18.16 a query that
	// reads a table twice (an IN subquery) can deadlock with a DDL statement
	// on that table queued between its two locks (docs/audit.md, "Migrating").
	waitFor(t, 120*time.Second, "the cluster sink's migrations", func() (bool, string) {
		err := cs.sink.Ready(ctx)
		return err == nil, fmt.Sprint(err)
	})

	opts := AuditOptions{From: now.Add(-2 * time.Hour), To: now.Add(time.Minute), PendingThreshold: 10 * time.Minute, Now: now}
	single, err := NewAuditor(e.ch.Conn(t), e.ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	conns := []driver.Conn{cl.Conn(t, 0), cl.Conn(t, 1)}
	auditors := map[string]*Auditor{"one server": single}
	for i, conn := range conns {
		if auditors[fmt.Sprintf("replica r%d", i+1)], err = NewAuditor(conn, cl.Database); err != nil {
			t.Fatal(err)
		}
	}
	names := []string{"one server", "replica r1", "replica r2"}
	reports := map[string]*Audit{}
	for _, name := range names {
		a := auditors[name]
		waitFor(t, 60*time.Second, "the audit through "+name+" to match", func() (bool, string) {
			r, err := a.Audit(ctx, opts)
			if err != nil {
				return false, err.Error()
			}
			reports[name] = r
			return reflect.DeepEqual(numbers(r), want), fmt.Sprintf("%+v", numbers(r))
		})
	}
	t.Logf("the replicated ledger's audit matched through both replicas %s after the sink started", time.Since(began).Round(time.Millisecond))
	base := *reports["one server"]
	base.GeneratedAt, base.LedgerAsOf = time.Time{}, time.Time{}
	lists := ListNames()
	sort.Strings(lists)
	for _, name := range names[1:] {
		r := *reports[name]
		r.GeneratedAt, r.LedgerAsOf = time.Time{}, time.Time{}
		if !reflect.DeepEqual(base, r) {
			t.Errorf("audit through %s differs from one server's:\n%+v\n%+v", name, r, base)
		}
		// In slices of a few plays, two read at once: the same audit.
		sliced, err := NewAuditor(conns[slices.Index(names, name)-1], cl.Database)
		if err != nil {
			t.Fatal(err)
		}
		sliced.SetLimits(Limits{SliceReports: 8})
		rs, err := sliced.Audit(ctx, opts)
		if err != nil {
			t.Fatalf("%s, slices of 8 plays: %v", name, err)
		}
		rs.GeneratedAt, rs.LedgerAsOf = time.Time{}, time.Time{}
		if rs.Path = r.Path; !reflect.DeepEqual(base, *rs) {
			t.Errorf("audit through %s in slices of 8 plays differs from one server's:\n%+v\n%+v", name, *rs, base)
		}
		for _, metric := range lists {
			lb, err := single.List(ctx, opts, metric, 0)
			if err != nil {
				t.Fatalf("one server: list %s: %v", metric, err)
			}
			lc, err := auditors[name].List(ctx, opts, metric, 0)
			if err != nil {
				t.Errorf("%s: list %s: %v", name, metric, err)
				continue
			}
			if !reflect.DeepEqual(lb, lc) {
				t.Errorf("list %s through %s differs:\n%+v\none server:\n%+v", metric, name, lc, lb)
			}
		}
	}

	// The HTML page's data (time series, standby episodes, partner
	// counts): the same through either replica as on one server.
	hb, err := single.HTML(ctx, opts, reports["one server"], 0)
	if err != nil {
		t.Fatalf("one server: HTML: %v", err)
	}
	for _, name := range names[1:] {
		hc, err := auditors[name].HTML(ctx, opts, reports[name], 0)
		if err != nil {
			t.Errorf("%s: HTML: %v", name, err)
			continue
		}
		hc.Audit = hb.Audit
		if !reflect.DeepEqual(hb, hc) {
			t.Errorf("HTML page data through %s differs:\n%+v\none server:\n%+v", name, hc, hb)
		}
	}

	// The layout, on both replicas: no report_state left.
	for i, conn := range conns {
		if got := queryStrings(t, conn, stateTables); len(got) != 0 {
			t.Errorf("r%d after migration 8: %v left", i+1, got)
		}
		for _, tbl := range ledgerTableNames(Migrations) {
			var local, dist string
			q := "SELECT engine FROM system.tables WHERE database = '" + cl.Database + "' AND name = ?"
			if err := conn.QueryRow(ctx, q, tbl+LocalSuffix).Scan(&local); err != nil {
				t.Fatalf("r%d %s%s: %v", i+1, tbl, LocalSuffix, err)
			}
			if err := conn.QueryRow(ctx, q, tbl).Scan(&dist); err != nil {
				t.Fatalf("r%d %s: %v", i+1, tbl, err)
			}
			if local != "ReplicatedReplacingMergeTree" || dist != "Distributed" {
				t.Errorf("r%d: %s%s is %s, %s is %s", i+1, tbl, LocalSuffix, local, tbl, dist)
			}
		}
	}
	// Every column reached both replicas: the ADD COLUMNs ran on one
	// replica only and were replicated.
	var colsOf [2]map[string][]string
	for i, conn := range conns {
		if colsOf[i], err = tableColumns(ctx, conn, cl.Database); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(colsOf[0], colsOf[1]) {
		t.Errorf("the replicas' columns differ:\nr1 %v\nr2 %v", colsOf[0], colsOf[1])
	}
	if n := len(colsOf[0]["deliveries"+LocalSuffix]); n < 10 {
		t.Errorf("r1's deliveries%s has %d columns: %v", LocalSuffix, n, colsOf[0]["deliveries"+LocalSuffix])
	}
	// Through the other replica: nothing to apply, no DDL.
	if applied, err := MigrateCluster(ctx, conns[1], cl.Database, cl.Name()); err != nil || len(applied) != 0 {
		t.Fatalf("MigrateCluster through r2: applied %v, %v; want nothing", applied, err)
	}
	// A run interrupted before its Distributed tables were made: one
	// missing, one over old columns. The next run applies nothing and
	// makes both again, on both replicas; the audit reads them as before.
	for _, st := range []string{
		"DROP TABLE " + cl.Database + ".deliveries ON CLUSTER " + cl.Name(),
		"DROP TABLE " + cl.Database + ".plays ON CLUSTER " + cl.Name(),
		"CREATE TABLE " + cl.Database + ".plays ON CLUSTER " + cl.Name() + " (play_id String) ENGINE = Distributed(" + cl.Name() + ", " + cl.Database + ", plays_local)",
	} {
		if err := conns[0].Exec(ctx, st); err != nil {
			t.Fatalf("%s: %v", st, err)
		}
	}
	if applied, err := MigrateCluster(ctx, conns[1], cl.Database, cl.Name()); err != nil || len(applied) != 0 {
		t.Fatalf("MigrateCluster after an interrupted run: applied %v, %v; want nothing", applied, err)
	}
	for i, conn := range conns {
		waitFor(t, 30*time.Second, fmt.Sprintf("r%d's Distributed tables in step", i+1), func() (bool, string) {
			cols, err := tableColumns(ctx, conn, cl.Database)
			if err != nil {
				return false, err.Error()
			}
			for _, tbl := range []string{"deliveries", "plays"} {
				if !reflect.DeepEqual(cols[tbl], cols[tbl+LocalSuffix]) {
					return false, fmt.Sprintf("%s: %v, local %v", tbl, cols[tbl], cols[tbl+LocalSuffix])
				}
			}
			return true, ""
		})
		r, err := auditors[fmt.Sprintf("replica r%d", i+1)].Audit(ctx, opts)
		if err != nil || !reflect.DeepEqual(numbers(r), want) {
			t.Errorf("audit through r%d after the repair: %+v, %v", i+1, r, err)
		}
	}
	// The other layout is refused, by name.
	if _, err := Migrate(ctx, conns[0], cl.Database); err == nil || !strings.Contains(err.Error(), "--clickhouse-cluster") {
		t.Errorf("a single-server Migrate of the cluster ledger: %v", err)
	}
	plain := cl.Database + "_plain"
	if _, err := Migrate(ctx, conns[0], plain); err != nil {
		t.Fatal(err)
	}
	if _, err := MigrateCluster(ctx, conns[0], plain, cl.Name()); err == nil || !strings.Contains(err.Error(), "made for one server") {
		t.Errorf("MigrateCluster of a single-server ledger: %v", err)
	}
	if _, err := MigrateCluster(ctx, conns[0], cl.Database, "nosuch"); err == nil || !strings.Contains(err.Error(), "no such cluster") {
		t.Errorf("an unknown cluster: %v", err)
	}

	// Replicated insert deduplication: the same block (inserted_at given,
	// so byte for byte the same) inserted through r1 and again through r2
	// is stored once.
	insert := func(conn driver.Conn) {
		t.Helper()
		b, err := conn.PrepareBatch(ccfg.ClickHouse.insertContext(ctx), "INSERT INTO "+ccfg.ClickHouse.WriteTable(TableMalformed)+
			" (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, inserted_at, kafka_key, error, raw)")
		if err != nil {
			t.Fatal(err)
		}
		at := time.Unix(1_700_000_000, 0)
		for i := range 3 {
			if err := b.Append("dedup.test", int32(0), int64(i), at, uint64(at.UnixMilli()), at, "k", "e", "r"); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	insert(conns[0])
	insert(conns[1])
	insert(conns[0])
	waitFor(t, 30*time.Second, "the block on both replicas", func() (bool, string) {
		var counts []uint64
		for _, conn := range conns {
			var n uint64
			if err := conn.QueryRow(ctx, "SELECT count() FROM "+ccfg.ClickHouse.WriteTable(TableMalformed)+" WHERE kafka_topic = 'dedup.test'").Scan(&n); err != nil {
				return false, err.Error()
			}
			counts = append(counts, n)
		}
		if counts[0] > 3 || counts[1] > 3 {
			t.Fatalf("the same block inserted 3 times is stored as %v rows on r1, r2: not deduplicated", counts)
		}
		return counts[0] == 3 && counts[1] == 3, fmt.Sprint(counts)
	})
}

// queryStrings is the one String column of every row of q.
func queryStrings(t *testing.T, conn driver.Conn, q string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return out
}
