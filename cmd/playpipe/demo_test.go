package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/testkit/testenv"
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

// TestDemoInterrupt sends SIGINT to the built binary in the middle of a demo:
// it must stop its roles, print a summary and exit 130, not "context canceled".
func TestDemoInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	if _, err := exec.LookPath("clickhouse-server"); err != nil {
		if _, err := exec.LookPath("clickhouse"); err != nil {
			t.Skip("no ClickHouse binary: apt-get install -y clickhouse-server")
		}
	}
	bin := filepath.Join(t.TempDir(), "playpipe")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "demo", "--events", "200000", "--rate", "2000", "--data-dir", t.TempDir(), "--progress", "200ms")
	cmd.Env = append(os.Environ(), "PLAYPIPE_ADMIN_ADDR=127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	signalled := false
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if !signalled && strings.Contains(sc.Text(), "published") && !strings.Contains(sc.Text(), "published      0") {
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			signalled = true
		}
	}
	err = cmd.Wait()
	t.Log(out.String())
	var ee *exec.ExitError
	if !signalled || !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("signalled %v, exit %v (stderr %q); want exit 130 after SIGINT", signalled, err, errOut.String())
	}
	for _, want := range []string{"interrupted after", "ledger: ", "partner API (sandbox ledger)", "fleet: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if strings.Contains(errOut.String(), "context canceled") || strings.Contains(errOut.String(), "panic") {
		t.Errorf("stderr: %s", errOut.String())
	}
}

// TestDropOldDemoDatabases: of the demo_<time> ledgers in a server, the
// demo keeps the last 3 (its own included) and never touches other databases.
func TestDropOldDemoDatabases(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	if !ch.Local() {
		t.Skip("drops databases: only on the test's own server")
	}
	conn := ch.Conn(t)
	ctx := context.Background()
	names := []string{"demo_20260101_000001", "demo_20260101_000002", "demo_20260101_000003", "demo_20260101_000004", "demo_x", "demo_20260101_000005"}
	for _, n := range names {
		if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+n); err != nil {
			t.Fatal(err)
		}
	}
	dropped, err := dropOldDemoDatabases(ctx, conn, "demo_20260101_000005", 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(dropped, ","), "demo_20260101_000001,demo_20260101_000002"; got != want {
		t.Errorf("dropped %s, want %s", got, want)
	}
	rows, err := conn.Query(ctx, "SELECT name FROM system.databases WHERE name LIKE 'demo%' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		left = append(left, n)
	}
	if got, want := strings.Join(left, ","), "demo_20260101_000003,demo_20260101_000004,demo_20260101_000005,demo_x"; got != want {
		t.Errorf("left %s, want %s", got, want)
	}
}
