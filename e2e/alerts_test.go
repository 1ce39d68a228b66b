//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// alertCase is one alert of deploy/prometheus/alerts.yaml checked against a
// role's real /metrics: the series it reads (which must be in the
// exposition, of that type), the values fed to it (promtool's series
// notation, one a minute), and two evaluation times, one where its
// expression holds and one where it does not.
type alertCase struct {
	alert   string
	series  string
	kind    string // gauge, counter (the exposition's TYPE)
	values  string
	firesAt string // the expression holds (promtool duration)
	quietAt string // it does not
}

// checkAlertRules evaluates the alert rules with promtool (`promtool test
// rules`) on series named and labelled as the role's real /metrics output
// (exposition) has them: an alert reading a series the role does not
// export, or exports as another type (a gauge turned histogram), never
// holds, and the test fails. Skipped without promtool (Debian: apt-get
// install prometheus) unless PLAYPIPE_REQUIRE_PROMTOOL=1.
func checkAlertRules(t *testing.T, exposition []byte, cases []alertCase) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("PLAYPIPE_REQUIRE_PROMTOOL") == "1" {
			t.Fatalf("promtool not found (PLAYPIPE_REQUIRE_PROMTOOL=1): %v", err)
		}
		t.Logf("alert rules not evaluated: no promtool (apt-get install prometheus)")
		return
	}
	types, labels := parseExposition(exposition)
	_, self, _, _ := runtime.Caller(0)
	rulesPath := filepath.Join(filepath.Dir(self), "..", "deploy", "prometheus", "alerts.yaml")
	raw, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	exprOf := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprOf[r.Alert] = r.Expr
		}
	}

	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	type sample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
	type exprTest struct {
		Expr       string   `yaml:"expr"`
		EvalTime   string   `yaml:"eval_time"`
		ExpSamples []sample `yaml:"exp_samples"`
	}
	type unitTest struct {
		Interval  string     `yaml:"interval"`
		Input     []series   `yaml:"input_series"`
		ExprTests []exprTest `yaml:"promql_expr_test"`
	}
	var tests []unitTest
	for _, c := range cases {
		expr, ok := exprOf[c.alert]
		if !ok {
			t.Errorf("alert %s is not in %s", c.alert, rulesPath)
			continue
		}
		kind := types[c.series]
		if kind == "" {
			kind = types[strings.TrimSuffix(c.series, "_total")] // a counter's family named without it
		}
		lbl, seen := labels[c.series]
		if kind != c.kind || !seen {
			t.Errorf("alert %s reads %s, a %s: the role's /metrics has it as %q (a sample: %v); the alert can never fire", c.alert, c.series, c.kind, kind, seen)
			continue
		}
		// The series as the role exports it (its labels), as a scrape of
		// job playpipe stores it: one sample where the expression must hold
		// (every rule here aggregates to one series), none where it must
		// not.
		lbl = append(lbl, `job="playpipe"`, `instance="report:9462"`)
		sort.Strings(lbl)
		tests = append(tests, unitTest{Interval: "1m",
			Input: []series{{Series: c.series + "{" + strings.Join(lbl, ",") + "}", Values: c.values}},
			ExprTests: []exprTest{
				{Expr: "count(" + exprWithoutNewlines(expr) + ")", EvalTime: c.firesAt, ExpSamples: []sample{{Labels: "{}", Value: 1}}},
				{Expr: "count(" + exprWithoutNewlines(expr) + ") or vector(0)", EvalTime: c.quietAt, ExpSamples: []sample{{Labels: "{}", Value: 0}}},
			}})
	}
	if t.Failed() {
		return
	}
	test := map[string]any{"rule_files": []string{rulesPath}, "evaluation_interval": "1m", "tests": tests}
	b, err := yaml.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "alerts_test.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", path).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules on the role's real series: %v\n%s\n%s", err, out, b)
		return
	}
	t.Logf("alert rules hold on the role's real /metrics series (%d alerts): %s", len(cases), strings.TrimSpace(string(out)))
}

// parseExposition reads a Prometheus text exposition: each family's TYPE,
// and the labels of each series name's first sample.
func parseExposition(b []byte) (types map[string]string, labels map[string][]string) {
	types, labels = map[string]string{}, map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		var lbl []string
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
			// A label value may hold spaces: the labels end at the last '}'.
			if j := strings.LastIndexByte(line, '}'); line[i] == '{' && j > i+1 {
				lbl = splitLabels(line[i+1 : j])
			}
		}
		if _, ok := labels[name]; !ok {
			labels[name] = lbl
		}
	}
	return types, labels
}

// splitLabels splits a{…} label list at the commas between pairs (a comma
// inside a quoted value stays).
func splitLabels(s string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && quoted:
			i++
		case s[i] == '"':
			quoted = !quoted
		case s[i] == ',' && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// exprWithoutNewlines joins a multi-line rule expression.
func exprWithoutNewlines(e string) string { return strings.Join(strings.Fields(e), " ") }

// reportAlerts are the reporter's stuck and parked alerts.
var reportAlerts = []alertCase{
	// The oldest report pending rises a minute a minute from the start: over
	// 1 800 s after 31 minutes.
	{alert: "PlaypipeReportStuck", series: "playpipe_reporter_oldest_pending_age_seconds", kind: "gauge", values: "0+60x60", firesAt: "40m", quietAt: "20m"},
	{alert: "PlaypipeReportsFailing", series: "playpipe_reporter_failing", kind: "gauge", values: "0 0 0 5x30", firesAt: "10m", quietAt: "1m"},
	{alert: "PlaypipeReportsParked", series: "playpipe_reporter_parks_total", kind: "counter", values: "0x10 12x40", firesAt: "15m", quietAt: "5m"},
	{alert: "PlaypipeParkedBacklog", series: "playpipe_reporter_parked", kind: "gauge", values: "0 0 12x60", firesAt: "30m", quietAt: "1m"},
}
