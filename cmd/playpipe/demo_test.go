package main

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDemo runs `playpipe demo` as a newcomer would (scaled down): embedded
// Kafka, the built-in sandbox, a local clickhouse-server, every role, a 500
// storm and a standby window, and checks the verdict it prints.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	if _, err := exec.LookPath("clickhouse-server"); err != nil {
		if _, err := exec.LookPath("clickhouse"); err != nil {
			t.Skip("no ClickHouse binary: apt-get install -y clickhouse-server")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := runMain(ctx, []string{"demo", "--events", "1500", "--rate", "1500", "--data-dir", t.TempDir(),
		"--storm-at", "0.1", "--storm", "300ms", "--standby-at", "0.4", "--standby", "300ms", "--progress", "300ms"}, &out, &errOut)
	t.Log(out.String())
	if code != 0 {
		t.Fatalf("demo exited %d: %s", code, errOut.String())
	}
	for _, want := range []string{"500 storm begins", "failover to STANDBY", "live service is back",
		"Every play was delivered exactly once", "RESULT: OK"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "NOT every play") {
		t.Error("demo reports a failed audit")
	}
	// The windows are scheduled by progress: standby answered reports, which
	// were replayed (the sandbox ledger's count in the final line).
	m := regexp.MustCompile(`(\d+) reports accepted, (\d+) answered by standby and replayed`).FindStringSubmatch(out.String())
	if m == nil || m[2] == "0" {
		t.Errorf("standby answered no report (%v): the window missed the traffic", m)
	}
	// Every progress line agrees with itself: plays ≥ delivered and
	// pending = plays − delivered − rejected.
	re := regexp.MustCompile(`plays +(\d+) +delivered +(\d+) +rejected +(\d+) +pending +(\d+)`)
	lines := re.FindAllStringSubmatch(out.String(), -1)
	if len(lines) == 0 {
		t.Error("no progress line")
	}
	for _, l := range lines {
		plays, _ := strconv.Atoi(l[1])
		del, _ := strconv.Atoi(l[2])
		rej, _ := strconv.Atoi(l[3])
		pend, _ := strconv.Atoi(l[4])
		if plays < del || pend != plays-del-rej {
			t.Errorf("inconsistent progress line %q", l[0])
		}
	}
}

func TestDemoFlagErrors(t *testing.T) {
	for _, args := range [][]string{{"--events", "0"}, {"--bad-share", "2"}, {"--ingest-share", "-1"}, {"--storm-rate", "1.5"},
		{"--progress", "0"}, {"--standby", "-1s"}, {"--storm", "-1s"}, {"--drain-timeout", "0s"}, {"--kafka-sasl", "NOPE"}} {
		var errOut bytes.Buffer
		code := runMain(context.Background(), append([]string{"demo"}, args...), &bytes.Buffer{}, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), args[0]) {
			t.Errorf("%v: exit %d, message %q: want 2 and the flag named", args, code, errOut.String())
		}
	}
}
