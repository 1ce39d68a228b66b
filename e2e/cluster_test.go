//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// The replicated-ledger run's shape.
const (
	clusterPartitions = 6
	clusterEvents     = 3000
	clusterRate       = 500 // events per second: the simulation lasts ~6 s
)

// TestReplicatedLedgerWithKills is the replicated ledger's proof, on
// the real parts: Debian's ZooKeeper and two clickhouse-server 18.16
// replicas of a 1-shard cluster (testkit/chcluster), the ledger created by
// `playpipe migrate --cluster`, and the pipeline as separate processes of
// the built binary (sink, consume, report, simulate). While deliveries
// flow, replica r1 — the first address of the sink's --clickhouse-addr —
// is killed with SIGKILL (the sink goes on through r2), then the sink is
// killed with SIGKILL while an INSERT of it runs on r2 (seen in
// system.processes); both are restarted. Then, through each replica alone:
// `playpipe audit` must exit 0 and equal the partner's ledger (every play
// delivered once: nothing lost, nothing doubled), the records of every
// topic must be in the replica's tables exactly once by Kafka location
// (after OPTIMIZE … FINAL, once as rows too), and `playpipe replay
// --dry-run` must select the same on both.
func TestReplicatedLedgerWithKills(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary, runs ZooKeeper, two ClickHouse replicas and 4 processes")
	}
	testStart := time.Now()
	dir := t.TempDir()
	bin := testenv.BuildPlaypipe(t, dir)
	k := testenv.StartKafka(t, clusterPartitions)
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) {
		o.Seed, o.Pages, o.ListsPerPage, o.MixesPerList = 11, 2, 2, 5
	})
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond}})
	cl := testenv.StartClickHouseCluster(t)
	addrs := cl.Addrs()
	t.Logf("setup: binary, broker, sandbox, ZooKeeper %s and replicas r1 %s, r2 %s in %s", cl.ZooKeeper().Addr(), addrs[0], addrs[1], since(testStart))

	ps := testenv.NewProcs(t, bin, dir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sb.ClientSignature,
		"PLAYPIPE_LOG_LEVEL=info",
	))
	kafkaArgs := []string{"--brokers", strings.Join(k.Addrs(), ","), "--partitions", strconv.Itoa(clusterPartitions)}
	// Every role reaches the ledger through either replica, r1 first.
	chArgs := []string{"--clickhouse-addr", cl.Addr(), "--clickhouse-db", cl.Database, "--clickhouse-cluster", cl.Name()}
	// through is the ledger reached through replica i alone.
	through := func(i int) []string {
		return []string{"--clickhouse-addr", addrs[i], "--clickhouse-db", cl.Database, "--clickhouse-cluster", cl.Name()}
	}

	// The ledger is created by the command a user runs, through r2.
	out, code := runBinary(t, bin, append([]string{"migrate", "--cluster", cl.Name()}, through(1)[:4]...)...)
	if code != 0 || !strings.Contains(out, "on cluster "+cl.Name()) {
		for i := range addrs {
			t.Logf("replica r%d's error log:\n%s", i+1, cl.Replica(i).LogTail())
		}
		t.Fatalf("playpipe migrate --cluster exited %d: %s", code, out)
	}
	t.Logf("%s", strings.TrimSpace(out))

	sink := &role{name: "sink", args: append(append(append([]string{"sink"}, kafkaArgs...), chArgs...),
		"--batch-rows", "500", "--linger", "100ms", "--retry-max", "500ms"), admin: testenv.FreeAddr(t)}
	consume := &role{name: "consume", args: append(append([]string{"consume"}, kafkaArgs...), "--api-url", sb.URL), admin: testenv.FreeAddr(t)}
	report := &role{name: "report", args: append(append([]string{"report"}, kafkaArgs...), "--api-url", sb.URL,
		"--concurrency", "16", "--backoff-max", "500ms"), admin: testenv.FreeAddr(t)}
	start := func(r *role) {
		r.p = ps.Start(r.name, append([]string{r.args[0], "--admin-addr", r.admin}, r.args[1:]...)...)
	}
	for _, r := range []*role{sink, consume, report} {
		start(r)
	}
	for _, r := range []*role{sink, consume, report} {
		testenv.WaitReady(t, r.p, r.admin, 60*time.Second)
	}

	sa := simArgs{events: clusterEvents, rate: clusterRate, devices: 40, badShare: 0.05, seed: 21, startMS: simulator.DefaultStart(time.Now())}
	creds := partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature}
	genWant, _, _, _ := expectedPlays(t, sb.Catalog(), sa.generated(t, sb.URL, creds))
	genReports := 0
	for _, n := range genWant {
		genReports += n
	}
	recordPath := filepath.Join(dir, "simulated.jsonl")
	simStart := time.Now()
	sim := ps.Start("simulate", append(append(append([]string{"simulate"}, kafkaArgs...), sa.flags()...),
		"--api-url", sb.URL, "--record", recordPath)...)

	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			for _, r := range []*role{sink, consume, report} {
				if !r.p.Running() && r.p.Err != nil && !strings.Contains(r.p.Err.Error(), "signal: killed") {
					t.Fatalf("%s exited on its own: %v (log %s)", r.name, r.p.Err, r.p.Log)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: not within %s (sandbox %+v)", what, d, sb.Counts())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	accepted := func() int64 { return sb.Counts().Accepted }

	// Kill 1: replica r1, the sink's first address, at 25 % of the reports.
	waitFor("25% of the reports accepted", 90*time.Second, func() bool { return accepted() >= int64(genReports/4) })
	r1PID := cl.Replica(0).PID()
	cl.Kill(0)
	killedR1 := time.Now()
	t.Logf("%6s SIGKILL replica r1 (pid %d); partner accepted %d of %d", since(simStart), r1PID, accepted(), genReports)

	// Kill 2: the sink, while one of its INSERTs runs on r2.
	r2 := cl.Conn(t, 1)
	var seen string
	waitFor("an INSERT of the sink running on r2", 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := r2.QueryRow(ctx, "SELECT any(query) FROM system.processes WHERE query LIKE 'INSERT INTO "+cl.Database+".%'").Scan(&seen); err != nil {
			return false
		}
		return seen != ""
	})
	sink.p.Signal(t, syscall.SIGKILL)
	if len(seen) > 80 {
		seen = seen[:80] + "…"
	}
	t.Logf("%6s SIGKILL sink (pid %d) while r2 ran %q; partner accepted %d", since(simStart), sink.p.Cmd.Process.Pid, seen, accepted())
	sink.p.Wait(t, 10*time.Second)

	// Both stay down a second, then come back: the sink first (it reaches
	// r2 while r1 starts), then r1.
	time.Sleep(time.Second)
	start(sink)
	restartCtx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	if err := cl.Restart(restartCtx, 0); err != nil {
		t.Fatal(err)
	}
	cancel()
	restartedR1 := time.Now()
	t.Logf("%6s restarted the sink and replica r1 (down %s; pid %d)", since(simStart), restartedR1.Sub(killedR1).Round(time.Millisecond), cl.Replica(0).PID())
	testenv.WaitReady(t, sink.p, sink.admin, 60*time.Second)

	if code := sim.Wait(t, 90*time.Second); code != 0 {
		t.Fatalf("simulate exited %d (log %s)", code, sim.Log)
	}
	msgs := readRecord(t, recordPath)
	if len(msgs) != clusterEvents {
		t.Fatalf("the simulator recorded %d acknowledged messages, want %d", len(msgs), clusterEvents)
	}
	want, wantBelow, _, badEvents := expectedPlays(t, sb.Catalog(), msgs)
	wantReports := 0
	for _, n := range want {
		wantReports += n
	}
	waitFor("every expected play at the partner", 120*time.Second, func() bool {
		c := sb.Counts()
		return c.Accepted-c.Duplicates >= int64(len(want))
	})
	t.Logf("%6s the partner holds %d distinct plays (%d reports expected)", since(simStart), len(want), wantReports)

	// Wait (bounded) until the audit through each replica alone sees the
	// whole ledger: r1 catches up once its old ZooKeeper session expired.
	auditArgs := func(i int) []string {
		return append(append([]string{"audit"}, through(i)...), "--from", "-1h", "--to", "+1h", "--format", "json")
	}
	caughtUp := map[int]time.Duration{}
	for i := range 2 {
		waitFor(fmt.Sprintf("the audit through r%d to see every delivery", i+1), 120*time.Second, func() bool {
			rep, _ := auditThrough(t, bin, auditArgs(i))
			// Every number the checks below compare: each table of the
			// ledger replicates on its own, so one can lag behind another
			// on a replica that is catching up (docs/audit.md).
			if rep.Delivered >= uint64(wantReports) && rep.Pending == 0 && rep.EventsReceived >= uint64(len(msgs)) &&
				rep.EventsRejected >= uint64(badEvents) && rep.PlaysDerived >= uint64(wantReports+wantBelow) && rep.PlaysBelowMinimum >= uint64(wantBelow) {
				return true
			}
			time.Sleep(300 * time.Millisecond) // an audit is a process: poll gently
			return false
		})
		caughtUp[i] = time.Since(restartedR1)
	}
	t.Logf("%6s the audit complete through r1 %s and r2 %s after r1's restart", since(simStart), caughtUp[0].Round(time.Millisecond), caughtUp[1].Round(time.Millisecond))
	if n, _ := ledgerRecords(t, cl.Conn(t, 0), cl.Database); n > 0 {
		t.Logf("r1's own tables hold %d rows at this point", n)
	}

	for _, r := range []*role{report, consume, sink} {
		r.p.Stop(t, 30*time.Second)
	}

	// The partner's ledger: exactly the expected plays, no duplicate (the
	// reporter was not killed).
	led := sb.Ledger()
	if led.Dropped != 0 {
		t.Fatalf("the sandbox dropped %d ledger entries: cannot compare", led.Dropped)
	}
	got := map[play]int{}
	for _, e := range led.Accepted {
		got[expect.Of(e.Report)]++
	}
	missing, dups, unexpected := compare(want, got)
	if len(missing) > 0 || len(unexpected) > 0 || dups != 0 {
		t.Errorf("the partner's ledger differs from the expected plays: %d missing (first %v), %d unexpected (first %v), %d duplicates",
			len(missing), firstPlays(missing, 3), len(unexpected), firstPlays(unexpected, 3), dups)
	}
	distinctAccepted := uint64(led.AcceptedCount - led.Duplicates)

	// Through each replica: the audit exits 0 and equals the partner's ledger.
	var reps [2]analytics.Audit
	for i := range 2 {
		rep, code := auditThrough(t, bin, auditArgs(i))
		reps[i] = rep
		if code != 0 {
			t.Errorf("playpipe audit through r%d exited %d, want 0 (problems %q)", i+1, code, rep.Problems())
		}
		checks := []struct {
			name      string
			got, want uint64
		}{
			{"delivered = distinct plays the partner accepted", rep.Delivered, distinctAccepted},
			{"delivered = expected reports", rep.Delivered, uint64(wantReports)},
			{"events received", rep.EventsReceived, uint64(len(msgs))},
			{"events rejected", rep.EventsRejected, uint64(badEvents)},
			{"plays derived", rep.PlaysDerived, uint64(wantReports + wantBelow)},
			{"plays below minimum", rep.PlaysBelowMinimum, uint64(wantBelow)},
			{"pending", rep.Pending, 0},
			{"delivered more than once", rep.DeliveredTwice, 0},
			{"possibly delivered twice", rep.PossiblyTwice, 0},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("audit through r%d: %s: %d, want %d", i+1, c.name, c.got, c.want)
			}
		}
		t.Logf("audit through r%d (exit %d): received %d, rejected %d, derived %d (%d below minimum), delivered %d, pending %d, delivered twice %d, possibly twice %d",
			i+1, code, rep.EventsReceived, rep.EventsRejected, rep.PlaysDerived, rep.PlaysBelowMinimum, rep.Delivered, rep.Pending, rep.DeliveredTwice, rep.PossiblyTwice)
	}
	for i := range reps { // the window (-1h…+1h) and the times are the run's
		reps[i].From, reps[i].To, reps[i].GeneratedAt, reps[i].LedgerAsOf = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	}
	if !equalJSON(t, reps[0], reps[1]) {
		t.Errorf("the audits through r1 and r2 differ:\n%+v\n%+v", reps[0], reps[1])
	}

	// The replay selection reads through the Distributed tables too.
	var replays [2]string
	for i := range 2 {
		out, code := runBinary(t, bin, append(append(append([]string{"replay", "--dry-run", "--from", "-1h", "--reason", "cluster check"}, kafkaArgs...), through(i)...), "--api-url", sb.URL)...)
		if code != 0 {
			t.Errorf("playpipe replay --dry-run through r%d exited %d: %s", i+1, code, out)
		}
		replays[i] = strings.TrimSpace(out)
	}
	t.Logf("replay --dry-run through r1: %s", replays[0])
	sel := func(s string) string { _, after, _ := strings.Cut(s, "):"); return after }
	if sel(replays[0]) == "" || sel(replays[0]) != sel(replays[1]) {
		t.Errorf("replay --dry-run selected differently through r1 and r2:\n%s\n%s", replays[0], replays[1])
	}

	// The records of every topic, once each by Kafka location, in each
	// replica's own tables: r1 has caught up (bounded wait: replication
	// resumes once its old ZooKeeper session expired). Until then reads
	// through r1's Distributed tables went to r2 (a replica that has not
	// synced its queue reports an unbounded delay), so the audits above
	// do not show r1's own state; this does.
	topics := k.Config.Topics()
	wantRecords := map[string]uint64{}
	for _, topic := range topics.Ledger() {
		for _, r := range k.ReadAll(t, topic) {
			if !kafkax.HasHeader(r, schemas.HeaderLease) {
				wantRecords[topic]++
			}
		}
	}
	conns := []driver.Conn{cl.Conn(t, 0), r2}
	var r1Complete time.Duration
	for i, conn := range conns {
		var last map[string]uint64
		waitFor(fmt.Sprintf("r%d's own tables to hold every record", i+1), 120*time.Second, func() bool {
			last = topicRecords(t, conn, cl.Database)
			if fmt.Sprint(last) == fmt.Sprint(wantRecords) {
				return true
			}
			time.Sleep(200 * time.Millisecond)
			return false
		})
		if i == 0 {
			r1Complete = time.Since(restartedR1)
		}
		rows, distinct := ledgerRecords(t, conn, cl.Database)
		t.Logf("r%d's own tables: %v distinct records per topic (= the topics); %d rows for %d records before merges", i+1, last, rows, distinct)
	}
	t.Logf("%6s r1's own tables complete %s after its restart", since(simStart), r1Complete.Round(time.Millisecond))

	// Rows doubled by the sink's re-inserts after its kill merge away
	// (ReplacingMergeTree) under OPTIMIZE … FINAL, replicated to r2.
	ctx := context.Background()
	for _, tbl := range []string{"events", "plays", "deliveries", "rejections", "malformed"} {
		var n uint64
		if err := conns[0].QueryRow(ctx, "SELECT count() FROM "+cl.Database+"."+tbl+analytics.LocalSuffix).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			continue // 18.16 fails OPTIMIZE of an empty replicated table ("Unknown log entry type: 0")
		}
		if err := conns[0].Exec(ctx, "OPTIMIZE TABLE "+cl.Database+"."+tbl+analytics.LocalSuffix+" FINAL"); err != nil {
			t.Fatalf("OPTIMIZE %s: %v", tbl, err)
		}
	}
	for i, conn := range conns {
		var rows, distinct uint64
		waitFor(fmt.Sprintf("r%d merged", i+1), 60*time.Second, func() bool {
			rows, distinct = ledgerRecords(t, conn, cl.Database)
			return rows == distinct
		})
		if perTopic := topicRecords(t, conn, cl.Database); fmt.Sprint(perTopic) != fmt.Sprint(wantRecords) {
			t.Errorf("r%d after OPTIMIZE: %v distinct records per topic, the topics hold %v", i+1, perTopic, wantRecords)
		}
		t.Logf("r%d after OPTIMIZE … FINAL: %d rows = %d distinct records", i+1, rows, distinct)
	}
	t.Logf("figures: %d events, %d reports; r1 down %s; its own tables complete %s after its restart; whole test %s",
		len(msgs), wantReports, restartedR1.Sub(killedR1).Round(time.Millisecond), r1Complete.Round(time.Millisecond), since(testStart))
}

// runBinary runs the playpipe binary to its end (at most a minute) and
// returns its combined output and exit status.
func runBinary(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	// Four minutes: past the servers' distributed_ddl_task_timeout (180 s),
	// so an ON CLUSTER statement that a replica never ran ends with
	// ClickHouse's own error, not a kill with no output (CI: a migration
	// killed at 3 minutes once, at 1 minute once before).
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var buf bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = &buf, &buf, testenv.ChildEnv()
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("playpipe %s: %v", args[0], err)
	}
	return buf.String(), cmd.ProcessState.ExitCode()
}

// auditThrough runs `playpipe audit --format json` and returns its report
// (zero when it printed none) and exit status.
func auditThrough(t *testing.T, bin string, args []string) (analytics.Audit, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = &stdout, &stderr, testenv.ChildEnv()
	_ = cmd.Run()
	var rep analytics.Audit
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		rep = analytics.Audit{} // none printed (the replica is down or lagging): the caller polls
	}
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return rep, code
}

// ledgerRecords counts the rows and the distinct Kafka locations of the
// replica's replicated tables.
func ledgerRecords(t *testing.T, conn driver.Conn, db string) (rows, distinct uint64) {
	t.Helper()
	if err := conn.QueryRow(context.Background(), "SELECT count(), uniqExact(kafka_topic, kafka_partition, kafka_offset) FROM ("+ledgerUnion(db)+")").Scan(&rows, &distinct); err != nil {
		t.Fatalf("count the ledger's rows: %v", err)
	}
	return rows, distinct
}

// topicRecords counts the distinct Kafka locations per topic in the
// replica's replicated tables.
func topicRecords(t *testing.T, conn driver.Conn, db string) map[string]uint64 {
	t.Helper()
	rs, err := conn.Query(context.Background(), "SELECT kafka_topic, uniqExact(kafka_topic, kafka_partition, kafka_offset) FROM ("+ledgerUnion(db)+") GROUP BY kafka_topic")
	if err != nil {
		t.Fatalf("count the ledger's records: %v", err)
	}
	defer rs.Close()
	out := map[string]uint64{}
	for rs.Next() {
		var topic string
		var n uint64
		if err := rs.Scan(&topic, &n); err != nil {
			t.Fatal(err)
		}
		out[topic] = n
	}
	return out
}

func ledgerUnion(db string) string {
	var parts []string
	for _, tbl := range []string{"events", "plays", "deliveries", "rejections", "malformed"} {
		parts = append(parts, "SELECT kafka_topic, kafka_partition, kafka_offset FROM "+db+"."+tbl+analytics.LocalSuffix)
	}
	return strings.Join(parts, " UNION ALL ")
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	if err1 != nil || err2 != nil {
		t.Fatalf("json: %v %v", err1, err2)
	}
	return bytes.Equal(ja, jb)
}
