package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"sigs.k8s.io/yaml"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// The Grafana side of the dashboard, as far as the test reads it.
type dashboardJSON struct {
	UID    string      `json:"uid"`
	Panels []panelJSON `json:"panels"`
}

type panelJSON struct {
	ID         int          `json:"id"`
	Title      string       `json:"title"`
	Type       string       `json:"type"`
	Datasource dsRef        `json:"datasource"`
	Targets    []targetJSON `json:"targets"`
	Panels     []panelJSON  `json:"panels"` // rows
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type targetJSON struct {
	RefID      string `json:"refId"`
	Datasource dsRef  `json:"datasource"`
	RawSQL     string `json:"rawSql"`
}

func dashboardPanels(t *testing.T) []panelJSON {
	t.Helper()
	var d dashboardJSON
	if err := json.Unmarshal(repoFile(t, "deploy/grafana/dashboards/finance.json"), &d); err != nil {
		t.Fatalf("finance.json: %v", err)
	}
	var out []panelJSON
	var walk func([]panelJSON)
	walk = func(ps []panelJSON) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

// TestGrafanaProvisioning: the data source the dashboard uses is provisioned,
// is the ClickHouse plugin compose installs, and takes its password from the
// environment.
func TestGrafanaProvisioning(t *testing.T) {
	var prov struct {
		APIVersion  int `json:"apiVersion"`
		Datasources []struct {
			Name, UID, Type string
			JSONData        map[string]any    `json:"jsonData"`
			SecureJSONData  map[string]string `json:"secureJsonData"`
		} `json:"datasources"`
	}
	if err := yaml.Unmarshal(repoFile(t, "deploy/grafana/provisioning/datasources/clickhouse.yaml"), &prov); err != nil {
		t.Fatal(err)
	}
	if len(prov.Datasources) != 1 {
		t.Fatalf("%d data sources, want 1", len(prov.Datasources))
	}
	ds := prov.Datasources[0]
	if ds.Type != "grafana-clickhouse-datasource" {
		t.Errorf("data source type %s", ds.Type)
	}
	if !strings.Contains(string(repoFile(t, "docker-compose.yml")), "GF_PLUGINS_PREINSTALL_SYNC: "+ds.Type) {
		t.Errorf("docker-compose.yml does not install the plugin %s", ds.Type)
	}
	if pw := ds.SecureJSONData["password"]; pw != "$PLAYPIPE_CLICKHOUSE_PASSWORD" {
		t.Errorf("data source password %q: want $PLAYPIPE_CLICKHOUSE_PASSWORD (from the environment)", pw)
	}
	if ds.JSONData["defaultDatabase"] != "playpipe" {
		t.Errorf("defaultDatabase %v: the dashboard's queries name tables without a database", ds.JSONData["defaultDatabase"])
	}
	panels := dashboardPanels(t)
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	for _, p := range panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range append([]targetJSON{{Datasource: p.Datasource, RawSQL: "-"}}, p.Targets...) {
			if tg.Datasource.UID != ds.UID || tg.Datasource.Type != ds.Type {
				t.Errorf("panel %q uses data source %+v, not the provisioned %s/%s", p.Title, tg.Datasource, ds.Type, ds.UID)
			}
			if tg.RawSQL == "" {
				t.Errorf("panel %q: a target without rawSql", p.Title)
			}
		}
	}
}

var (
	timeFilterRE = regexp.MustCompile(`\$__timeFilter\(\s*([a-z_]+)\s*\)`)
	leftMacroRE  = regexp.MustCompile(`\$\{?[A-Za-z_]+`)
)

// expandMacros does what the Grafana ClickHouse plugin does with the macros
// the dashboard uses, in SQL that ClickHouse 18.16 accepts; any other macro
// or variable fails the test (add it here first).
func expandMacros(t *testing.T, sql string, from, to time.Time) string {
	t.Helper()
	f, tt := strconv.FormatInt(from.Unix(), 10), strconv.FormatInt(to.Unix(), 10)
	sql = timeFilterRE.ReplaceAllString(sql, "$1 >= toDateTime("+f+") AND $1 <= toDateTime("+tt+")")
	sql = strings.NewReplacer("$__fromTime", "toDateTime("+f+")", "$__toTime", "toDateTime("+tt+")").Replace(sql)
	if m := leftMacroRE.FindString(sql); m != "" {
		t.Fatalf("query uses %s, which the test does not expand:\n%s", m, sql)
	}
	return sql
}

// ledgerRow inserts one row naming its columns (18.16 needs them named).
func ledgerRow(t *testing.T, conn driver.Conn, table string, cols map[string]any) {
	t.Helper()
	names := keys(cols)
	b, err := conn.PrepareBatch(context.Background(), "INSERT INTO "+table+" ("+strings.Join(names, ", ")+")")
	if err != nil {
		t.Fatalf("prepare %s: %v", table, err)
	}
	vals := make([]any, len(names))
	for i, n := range names {
		vals[i] = cols[n]
	}
	if err := b.Append(vals...); err != nil {
		t.Fatalf("append %s: %v", table, err)
	}
	if err := b.Send(); err != nil {
		t.Fatalf("insert %s: %v", table, err)
	}
}

// TestDashboardQueries runs every query of the finance dashboard against a
// ledger made by analytics.Migrate, with a few plays whose answers are
// known, and checks the figures: on the local ClickHouse (18.16 here) and,
// in a test binary built with -tags chdb, on current ClickHouse through chdb
// (testenv.ForEachLedger).
func TestDashboardQueries(t *testing.T) {
	testenv.ForEachLedger(t, dashboardQueries)
}

func dashboardQueries(t *testing.T, l *testenv.Ledger) {
	conn := l.Conn // default database: the test's, so unqualified table names resolve
	ctx := context.Background()
	if _, err := analytics.Migrate(ctx, conn, l.Database); err != nil {
		t.Fatal(err)
	}

	now := time.Now().Truncate(time.Second)
	base := now.Add(-2 * time.Hour)
	var offset int64
	loc := func(topic string, at time.Time) map[string]any {
		offset++
		return map[string]any{"kafka_topic": topic, "kafka_partition": int32(0), "kafka_offset": offset,
			"kafka_time": at, "kafka_time_ms": uint64(at.UnixMilli())}
	}
	with := func(m map[string]any, kv ...any) map[string]any {
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	// Plays p1…p5 reportable, p6 below the minimum; derived at base+i min.
	for i := 1; i <= 6; i++ {
		ledgerRow(t, conn, "plays", with(loc("plays.reports", base.Add(time.Duration(i)*time.Minute)),
			"report_id", fmt.Sprintf("p%d", i), "event_id", fmt.Sprintf("e%d", i), "below_minimum", uint8(b2i(i == 6))))
	}
	answer := func(report, outcome string, at time.Time, msg string) {
		ledgerRow(t, conn, "deliveries", with(loc("plays.deliveries", at),
			"report_id", report, "outcome", outcome, "at_ms", at.UnixMilli(), "message", msg))
	}
	answer("p1", "delivered", base.Add(2*time.Minute), "")        // delay 60 s
	answer("p2", "standby", base.Add(3*time.Minute), "")          // episode 1
	answer("p2", "delivered", base.Add(12*time.Minute), "")       // delay 600 s
	answer("p2", "delivered", base.Add(13*time.Minute), "")       // a double: counted once
	answer("p3", "rejected", base.Add(4*time.Minute), "bad isrc") // rejected by the API
	answer("p4", "standby", base.Add(9*time.Minute), "")          // episode 2 (gap > 1 min)
	answer("p4", "standby", base.Add(9*time.Minute+30*time.Second), "")
	answer("p4", "retry", base.Add(10*time.Minute), "503") // still pending; p5: no answer
	for i, reason := range []string{"missing_user_id", "missing_user_id", "invalid_json"} {
		ledgerRow(t, conn, "rejections", with(loc("plays.rejected", base.Add(time.Minute)),
			"reason", reason, "src_topic", "plays.events", "src_partition", int32(0), "src_offset", int64(i)))
	}

	want := map[string][][]string{
		"Plays delivered per day":                       nil, // checked below: the days' sum
		"Pending plays":                                 {{"2", ageOf(now, base.Add(4*time.Minute))}},
		"Pending plays by age":                          {{"1-24 h", "2", ageOf(now, base.Add(5*time.Minute)), ageOf(now, base.Add(4*time.Minute))}},
		"Events rejected by reason":                     {{"missing_user_id", "2"}, {"invalid_json", "1"}},
		"Plays rejected by the partner API, by message": {{"bad isrc", "1"}},
		"Standby episodes": {
			{"1", fmtTime(base.Add(3 * time.Minute)), fmtTime(base.Add(3 * time.Minute)), "1", "1"},
			{"2", fmtTime(base.Add(9 * time.Minute)), fmtTime(base.Add(9*time.Minute + 30*time.Second)), "2", "1"},
		},
		"Delivery delay percentiles (derived -> first delivered)": nil, // checked below
	}
	panels := dashboardPanels(t)
	if len(panels) != len(want) {
		t.Errorf("%d panels, the test knows %d: add the new panel's expectations", len(panels), len(want))
	}
	for _, p := range panels {
		for _, tg := range p.Targets {
			sql := expandMacros(t, tg.RawSQL, now.Add(-7*24*time.Hour), now)
			got, err := queryStrings(ctx, conn, sql)
			if err != nil {
				t.Errorf("panel %q: %v\n%s", p.Title, err, sql)
				continue
			}
			t.Logf("panel %q: %v", p.Title, got)
			w, known := want[p.Title]
			switch {
			case !known:
				t.Errorf("panel %q: no expectation in the test", p.Title)
			case p.Title == "Plays delivered per day":
				sum := 0
				for _, r := range got {
					n, _ := strconv.Atoi(r[1])
					sum += n
				}
				if sum != 2 {
					t.Errorf("panel %q: %v, want 2 plays delivered in all", p.Title, got)
				}
			case strings.HasPrefix(p.Title, "Delivery delay"):
				// p1 60 s, p2 600 s: one or two hours of delivery.
				var maxDelay float64
				for _, r := range got {
					v, _ := strconv.ParseFloat(r[4], 64)
					maxDelay = max(maxDelay, v)
				}
				if len(got) == 0 || maxDelay != 600 {
					t.Errorf("panel %q: %v, want a max delay of 600 s", p.Title, got)
				}
			case !rowsMatch(got, w):
				t.Errorf("panel %q:\n got %v\nwant %v", p.Title, got, w)
			}
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ageOf is an age in seconds as the server computes it with now(): it may
// run a few seconds after the test's now, so rowsMatch allows that ("~").
func ageOf(now, at time.Time) string { return "~" + strconv.FormatInt(now.Unix()-at.Unix(), 10) }

// rowsMatch compares query rows with the expected ones; an expected cell
// "~N" matches a number within 10 of N.
func rowsMatch(got, want [][]string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if len(got[i]) != len(want[i]) {
			return false
		}
		for j, w := range want[i] {
			g := got[i][j]
			if approx, ok := strings.CutPrefix(w, "~"); ok {
				a, err1 := strconv.ParseInt(approx, 10, 64)
				b, err2 := strconv.ParseInt(g, 10, 64)
				if err1 != nil || err2 != nil || b < a || b > a+10 {
					return false
				}
				continue
			}
			if g != w {
				return false
			}
		}
	}
	return true
}

func fmtTime(at time.Time) string { return at.UTC().Format(time.DateTime) }

// queryStrings runs sql and returns its rows as strings (times in UTC).
func queryStrings(ctx context.Context, conn driver.Conn, sql string) ([][]string, error) {
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	var out [][]string
	for rows.Next() {
		vals := make([]any, len(types))
		for i, ct := range types {
			vals[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(vals...); err != nil {
			return nil, err
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			switch x := reflect.ValueOf(v).Elem().Interface().(type) {
			case time.Time:
				row[i] = fmtTime(x)
			default:
				row[i] = fmt.Sprint(x)
			}
		}
		out = append(out, row)
	}
	return out, rows.Err()
}
