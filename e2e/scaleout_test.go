//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// The scale-out run's shape.
const (
	scalePartitions  = 12
	scaleEvents      = 4000
	scaleRate        = 800 // events per second: the simulation lasts ~5 s
	scaleConcurrency = 32  // --concurrency of every reporter
	// Partner latency per report: posts are in flight when the reporter is
	// killed, as with a real partner.
	scaleReportLatency = 5 * time.Millisecond
)

// role is one instance of a playpipe role: its arguments (without the
// admin address) and admin address; restarts reuse both.
type role struct {
	name  string
	args  []string
	admin string
	p     *testenv.Proc
}

// TestScaleOutWithFaults is the scale-out proof: 3 report, 2 consume
// and 2 sink processes on one Apache Kafka node (12 partitions);
// while the partner answers and deliveries flow, one of each is killed with
// SIGKILL and another reporter is stopped with SIGTERM (it must exit 0); the
// killed ones are restarted under the same --instance-id; then the third
// reporter is killed for good. How long the stopped and the killed
// reporter's partitions take to reach the others (static members: the
// session timeout) is measured from the group's description. Then the partner's ledger must hold
// exactly the expected plays, with at most the killed reporter's
// --concurrency duplicates, every duplicate covered by a delivered record
// labelled in doubt, and `playpipe audit` must agree with the ledger.
func TestScaleOutWithFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs 7 processes")
	}
	testStart := time.Now()
	dir := t.TempDir()
	bin := testenv.BuildPlaypipe(t, dir)

	k := testenv.StartApacheKafka(t, testenv.ApacheKafka{Partitions: scalePartitions})
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) {
		o.Seed, o.Pages, o.ListsPerPage, o.MixesPerList = 7, 2, 2, 5
	})
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: scaleReportLatency}})
	ch := testenv.StartClickHouse(t)
	t.Logf("setup: binary built, broker %v, sandbox %s, ClickHouse %s/%s in %s", k.Addrs(), sb.URL, ch.Addr, ch.Database, time.Since(testStart).Round(time.Millisecond))

	brokers := strings.Join(k.Addrs(), ",")
	// Process logs go to the test's temp dir, or to PLAYPIPE_E2E_LOGDIR
	// (kept after the test, for a post-mortem of a passing run).
	logDir := dir
	if d := os.Getenv("PLAYPIPE_E2E_LOGDIR"); d != "" {
		logDir = filepath.Join(d, time.Now().Format("20060102T150405"))
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatalf("PLAYPIPE_E2E_LOGDIR: %v", err)
		}
		t.Logf("process logs in %s", logDir)
	}
	ps := testenv.NewProcs(t, bin, logDir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sb.ClientSignature, // environment only, never a flag
		"PLAYPIPE_LOG_LEVEL=info",
	))
	kafkaArgs := []string{"--brokers", brokers, "--partitions", strconv.Itoa(scalePartitions)}
	chArgs := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}

	newRole := func(name string, args ...string) *role {
		return &role{name: name, args: args, admin: testenv.FreeAddr(t)}
	}
	startRole := func(r *role) {
		r.p = ps.Start(r.name, append([]string{r.args[0], "--admin-addr", r.admin}, r.args[1:]...)...)
	}
	var sinks, consumers, reporters []*role
	for i := range 2 {
		sinks = append(sinks, newRole(fmt.Sprintf("sink-%d", i), append(append([]string{"sink"}, kafkaArgs...), append(chArgs,
			"--instance-id", fmt.Sprintf("e2e-sink-%d", i), "--batch-rows", "2000", "--linger", "200ms", "--retry-max", "500ms")...)...))
	}
	for i := range 2 {
		consumers = append(consumers, newRole(fmt.Sprintf("consume-%d", i), append(append([]string{"consume"}, kafkaArgs...),
			"--api-url", sb.URL, "--instance-id", fmt.Sprintf("e2e-consume-%d", i), "--transactional-id", fmt.Sprintf("e2e-enrich-%d", i))...))
	}
	for i := range 3 {
		reporters = append(reporters, newRole(fmt.Sprintf("report-%d", i), append(append([]string{"report"}, kafkaArgs...),
			"--api-url", sb.URL, "--instance-id", fmt.Sprintf("e2e-report-%d", i), "--concurrency", strconv.Itoa(scaleConcurrency), "--max-concurrency", strconv.Itoa(scaleConcurrency),
			"--backoff-max", "500ms", "--standby-probe-interval", "100ms")...))
	}
	// The first sink applies the schema alone; then everything else.
	startRole(sinks[0])
	testenv.WaitReady(t, sinks[0].p, sinks[0].admin, 60*time.Second)
	rest := append(append(append([]*role{}, sinks[1]), consumers...), reporters...)
	for _, r := range rest {
		startRole(r)
	}
	for _, r := range rest {
		testenv.WaitReady(t, r.p, r.admin, 60*time.Second)
	}
	t.Logf("7 processes ready at %s", time.Since(testStart).Round(time.Millisecond))

	gw := watchGroup(t, k, "playpipe-reporter", k.Config.Topics().Reports, scalePartitions)

	// The simulator publishes while the faults happen. The same messages
	// are generated in-process first, to place the faults as shares of the
	// expected reports; the simulator's record is the authority afterwards.
	sa := simArgs{events: scaleEvents, rate: scaleRate, devices: 60, badShare: 0.05, seed: 9, startMS: simulator.DefaultStart(time.Now())}
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

	failIfExited := func() {
		t.Helper()
		for _, r := range append(append(append([]*role{}, sinks...), consumers...), reporters...) {
			if r.p != nil && !r.p.Running() && r.p.Err != nil && !strings.Contains(r.p.Err.Error(), "signal: killed") {
				t.Fatalf("%s exited on its own: %v (log %s)", r.name, r.p.Err, r.p.Log)
			}
		}
	}
	// waitFor polls cond every 20 ms for at most d.
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			failIfExited()
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: not within %s (sandbox %+v)", what, d, sb.Counts())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	marks := map[string]time.Time{}
	accepted := func() int64 { return sb.Counts().Accepted }
	share := func(f float64) int64 { return int64(f * float64(genReports)) }

	// Fault 1: SIGKILL a consumer while events flow (1.5 s into a ~5 s
	// simulation); restart it (same --instance-id and --transactional-id)
	// a second later.
	waitFor("1.5 s of simulation", 10*time.Second, func() bool { return time.Since(simStart) >= 1500*time.Millisecond })
	if !sim.Running() {
		t.Errorf("the simulation ended before the consumer was killed: the kill did not happen mid-stream")
	}
	consumers[0].p.Signal(t, syscall.SIGKILL)
	marks["kill consume-0"] = time.Now()
	t.Logf("%6s SIGKILL %s (pid %d); partner accepted %d of %d", since(simStart), consumers[0].name, consumers[0].p.Cmd.Process.Pid, accepted(), genReports)
	consumers[0].p.Wait(t, 10*time.Second)
	time.Sleep(time.Second) // the outage (scenario): the consumer stays down a second
	startRole(consumers[0])
	t.Logf("%6s restarted %s", since(simStart), consumers[0].name)

	// Fault 2: SIGKILL a reporter and a sink while deliveries flow (at 30 %
	// of the expected reports); restart both a second later under their
	// instance ids (within the session timeout: a static member's return)
	// and measure when the reporter delivers again.
	waitFor("30% of the reports accepted", 90*time.Second, func() bool { return accepted() >= share(0.30) })
	reporters[0].p.Signal(t, syscall.SIGKILL)
	sinks[0].p.Signal(t, syscall.SIGKILL)
	marks["kill report-0"] = time.Now()
	acceptedAtKill := accepted()
	t.Logf("%6s SIGKILL %s (pid %d) and %s (pid %d); partner accepted %d", since(simStart), reporters[0].name, reporters[0].p.Cmd.Process.Pid,
		sinks[0].name, sinks[0].p.Cmd.Process.Pid, acceptedAtKill)
	reporters[0].p.Wait(t, 10*time.Second)
	sinks[0].p.Wait(t, 10*time.Second)
	time.Sleep(time.Second) // the outage (scenario): both stay down a second
	restartAt := time.Now()
	marks["restart report-0"] = restartAt
	startRole(reporters[0])
	startRole(sinks[0])
	testenv.WaitReady(t, reporters[0].p, reporters[0].admin, 30*time.Second)
	readyAfter := time.Since(restartAt)
	var resumedAfter time.Duration
	waitFor("the restarted reporter to deliver", 60*time.Second, func() bool {
		n, err := testenv.ScrapeSum(reporters[0].admin, "playpipe_deliveries_total", `outcome="delivered"`)
		if err == nil && n > 0 {
			resumedAfter = time.Since(restartAt)
			return true
		}
		return false
	})
	marks["report-0 delivers again"] = time.Now()
	t.Logf("%6s restarted %s: ready after %s, delivering after %s; restarted %s", since(simStart), reporters[0].name,
		readyAfter.Round(time.Millisecond), resumedAfter.Round(time.Millisecond), sinks[0].name)

	// Fault 3: SIGTERM another reporter (at 55 %, or once the restarted one
	// delivers); it must exit 0. It is not restarted: its partitions move
	// to the others.
	waitFor("55% of the reports accepted", 90*time.Second, func() bool { return accepted() >= share(0.55) })
	marks["term report-1"] = time.Now()
	acceptedAtTerm := accepted()
	t.Logf("%6s SIGTERM %s (pid %d); partner accepted %d", since(simStart), reporters[1].name, reporters[1].p.Cmd.Process.Pid, acceptedAtTerm)
	reporters[1].p.Stop(t, 30*time.Second)
	t.Logf("%6s %s exited 0", since(simStart), reporters[1].name)
	// Takeover: a static member does not leave the group on SIGTERM
	// (docs/reporter.md), so its partitions wait for the session timeout.
	termTakeover := gw.takeover(t, "e2e-report-1", marks["term report-1"], 60*time.Second)
	t.Logf("%6s takeover after SIGTERM: %s's partitions assigned to the others %s after the signal", since(simStart), reporters[1].name, termTakeover.Round(time.Millisecond))

	// Fault 4: SIGKILL the third reporter (at 70 %, or at once if the
	// takeover took that long) and do not restart it: report-0 takes its
	// partitions after the session timeout.
	waitFor("70% of the reports accepted", 90*time.Second, func() bool { return accepted() >= share(0.70) })
	reporters[2].p.Signal(t, syscall.SIGKILL)
	marks["kill report-2"] = time.Now()
	acceptedAtKill2 := accepted()
	t.Logf("%6s SIGKILL %s (pid %d), not restarted; partner accepted %d", since(simStart), reporters[2].name, reporters[2].p.Cmd.Process.Pid, acceptedAtKill2)
	killTakeover := gw.takeover(t, "e2e-report-2", marks["kill report-2"], 60*time.Second)
	t.Logf("%6s takeover after SIGKILL: %s's partitions assigned to %s %s after the kill", since(simStart), reporters[2].name, reporters[0].name, killTakeover.Round(time.Millisecond))

	if code := sim.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("simulate exited %d (log %s)", code, sim.Log)
	}
	simEnd := sim.Exited
	msgs := readRecord(t, recordPath)
	if len(msgs) != scaleEvents {
		t.Fatalf("the simulator recorded %d acknowledged messages, want %d", len(msgs), scaleEvents)
	}
	want, wantBelow, validEvents, badEvents := expectedPlays(t, sb.Catalog(), msgs)
	wantReports := 0
	for _, n := range want {
		wantReports += n
	}
	t.Logf("simulation: %d events (%d valid, %d bad) in %s → %d reports to post (%d distinct plays), %d below the minimum",
		len(msgs), validEvents, badEvents, simEnd.Sub(simStart).Round(time.Millisecond), wantReports, len(want), wantBelow)
	if wantReports != genReports {
		t.Errorf("the simulator's record yields %d reports, the in-process generation %d: the fault schedule was off", wantReports, genReports)
	}
	if int(acceptedAtKill) >= wantReports || int(acceptedAtTerm) >= wantReports || int(acceptedAtKill2) >= wantReports {
		t.Errorf("the reporter faults came after the end (accepted %d, %d and %d of %d): they did not happen mid-run", acceptedAtKill, acceptedAtTerm, acceptedAtKill2, wantReports)
	}

	// Wait (bounded) until the partner holds every expected play.
	waitFor("every expected play at the partner", 120*time.Second, func() bool {
		c := sb.Counts()
		return c.Accepted-c.Duplicates >= int64(len(want))
	})
	drained := time.Now()
	t.Logf("%6s the partner holds %d distinct plays: drained %s after the simulation ended", since(simStart), len(want), drained.Sub(simEnd).Round(time.Millisecond))

	// Wait (bounded) until the sinks have the ledger complete.
	auditArgs := append(append([]string{"audit"}, chArgs...), "--from", "-1h", "--to", "+1h", "--format", "json")
	var rep analytics.Audit
	waitFor("the audit to see every delivery", 90*time.Second, func() bool {
		rep = runAudit(t, bin, auditArgs)
		return rep.Delivered >= uint64(wantReports) && rep.Pending == 0 && rep.EventsReceived >= uint64(len(msgs))
	})
	t.Logf("%6s the audit sees %d delivered, %d pending", since(simStart), rep.Delivered, rep.Pending)

	// Stop everything with SIGTERM; every process must exit 0.
	var running []*role
	for _, r := range append(append(append([]*role{}, reporters...), consumers...), sinks...) {
		if r.p.Running() {
			running = append(running, r)
			r.p.Signal(t, syscall.SIGTERM)
		}
	}
	for _, r := range running {
		if code := r.p.Wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s (pid %d) exited %d after the final SIGTERM, want 0 (log %s)", r.name, r.p.Cmd.Process.Pid, code, r.p.Log)
		}
	}

	// The partner's ledger: exactly the expected plays, duplicates bounded.
	led := sb.Ledger()
	if led.Dropped != 0 {
		t.Fatalf("the sandbox dropped %d ledger entries: cannot compare", led.Dropped)
	}
	got := map[play]int{}
	for _, e := range led.Accepted {
		got[expect.Of(e.Report)]++
	}
	missing, dups, unexpected := compare(want, got)
	if len(missing) > 0 || len(unexpected) > 0 {
		t.Errorf("the partner's ledger differs from the expected plays: %d missing (first %v), %d unexpected (first %v)",
			len(missing), firstPlays(missing, 3), len(unexpected), firstPlays(unexpected, 3))
	}
	if int64(dups) != led.Duplicates {
		t.Errorf("duplicates: %d plays accepted more often than expected, the sandbox counted %d", dups, led.Duplicates)
	}
	// A crash re-posts only reports whose answer was not on record: each
	// killed reporter's posts on the wire (≤ --concurrency) and the answers
	// on their way to Kafka (about rate × produce latency; docs/reporter.md).
	// Two reporters are killed.
	if dups > 4*scaleConcurrency {
		t.Errorf("the partner holds %d duplicates, more than the two killed reporters' posts without a recorded answer can be (≤ 2 × 2 × --concurrency %d)", dups, scaleConcurrency)
	}
	explainDuplicates(t, k, led, marks)

	// The in-doubt labels, from plays.deliveries (lease markers skipped).
	inDoubt, delivered, leases := readDeliveries(t, k)
	if inDoubt < dups {
		t.Errorf("%d delivered reports labelled in doubt, fewer than the partner's %d duplicates: a crash double went unlabelled", inDoubt, dups)
	}
	if delivered != wantReports {
		t.Errorf("plays.deliveries has %d distinct delivered reports, want %d", delivered, wantReports)
	}

	// The audit agrees with the partner's ledger.
	rep = runAudit(t, bin, auditArgs)
	distinctAccepted := uint64(led.AcceptedCount - led.Duplicates)
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
		{"rejected by the API", rep.RejectedByAPI, 0},
		{"delivered more than once (recorded twice)", rep.DeliveredTwice, 0},
		{"possibly delivered twice = delivered reports labelled in doubt", rep.PossiblyTwice, uint64(inDoubt)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("audit %s: %d, want %d", c.name, c.got, c.want)
		}
	}
	// The audit counts copies: its bound on extra copies
	// is at least the partner's duplicates, and a crash is recorded as such.
	if rep.PossibleExtraCopies < uint64(dups) {
		t.Errorf("audit: possible extra copies %d, fewer than the partner's %d duplicates (by cause %v)", rep.PossibleExtraCopies, dups, rep.DoubtfulPostsByCause)
	}
	t.Logf("audit: possible extra copies %d of %d plays, doubtful posts by cause %v", rep.PossibleExtraCopies, rep.PlaysWithExtraCopies, rep.DoubtfulPostsByCause)

	// What the kills cost, for the record.
	for _, r := range []*role{reporters[0], reporters[1], reporters[2], consumers[0], sinks[0]} {
		for _, l := range testenv.GrepLog(r.p.Log, "level=WARN") {
			if len(l) > 300 {
				l = l[:300] + "…"
			}
			t.Logf("%s: %s", r.name, l)
		}
	}
	t.Logf("figures: %d reports expected; partner accepted %d (%d duplicates; --concurrency %d); %d delivered reports labelled in doubt; %d lease markers; "+
		"audit delivered %d, delivered twice %d; drained %s after the simulation; restarted reporter delivering after %s; "+
		"takeover of a reporter's partitions by the others after SIGTERM %s, after SIGKILL %s; whole test %s",
		wantReports, led.AcceptedCount, dups, scaleConcurrency, inDoubt, leases, rep.Delivered, rep.DeliveredTwice,
		drained.Sub(simEnd).Round(time.Millisecond), resumedAfter.Round(time.Millisecond), termTakeover.Round(time.Millisecond), killTakeover.Round(time.Millisecond), since(testStart))
}

func since(t0 time.Time) string { return time.Since(t0).Round(10 * time.Millisecond).String() }

// runAudit runs `playpipe audit` as a process and decodes its JSON report;
// exit status 3 (problems found) still yields the report.
func runAudit(t *testing.T, bin string, args []string) analytics.Audit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = &stdout, &stderr, testenv.ChildEnv()
	err := cmd.Run()
	if err != nil && cmd.ProcessState != nil && cmd.ProcessState.ExitCode() != 3 {
		t.Fatalf("playpipe audit: %v\n%s", err, stderr.String())
	}
	var rep analytics.Audit
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("playpipe audit --format json: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	return rep
}

// readDeliveries reads plays.deliveries and returns the distinct report ids
// delivered with the in-doubt label, the distinct report ids delivered,
// and the number of lease markers (skipped).
func readDeliveries(t *testing.T, k *testenv.Kafka) (inDoubt, delivered, leases int) {
	t.Helper()
	doubt, del := map[string]bool{}, map[string]bool{}
	for _, r := range k.ReadAll(t, k.Config.Topics().Deliveries) {
		lease := false
		for _, h := range r.Headers {
			lease = lease || h.Key == schemas.HeaderLease
		}
		if lease {
			leases++
			continue
		}
		var d schemas.Delivery
		if err := json.Unmarshal(r.Value, &d); err != nil {
			t.Errorf("plays.deliveries %d/%d: not a Delivery: %v", r.Partition, r.Offset, err)
			continue
		}
		if d.Outcome != schemas.OutcomeDelivered {
			continue
		}
		del[d.ReportID] = true
		if d.InDoubt {
			doubt[d.ReportID] = true
		}
	}
	return len(doubt), len(del), leases
}

// groupWatch polls a consumer group's description every 100 ms: which
// instance holds which partitions of a topic.
type groupWatch struct {
	partitions int
	mu         sync.Mutex
	snaps      []groupSnap
}

type groupSnap struct {
	at       time.Time
	state    string
	holders  map[string]int // instance id → partitions of the topic it holds
	assigned int            // partitions of the topic assigned to anyone
}

func watchGroup(t *testing.T, k *testenv.Kafka, group, topic string, partitions int) *groupWatch {
	t.Helper()
	adm := kadm.NewClient(k.Client(t))
	g := &groupWatch{partitions: partitions}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // owned by the test: stopped at cleanup
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			dg, err := adm.DescribeGroups(ctx, group)
			cancel()
			if err != nil {
				continue
			}
			d, ok := dg[group]
			if !ok || d.Err != nil {
				continue
			}
			s := groupSnap{at: time.Now(), state: d.State, holders: map[string]int{}}
			for _, m := range d.Members {
				id := m.MemberID
				if m.InstanceID != nil {
					id = *m.InstanceID
				}
				if c, ok := m.Assigned.AsConsumer(); ok {
					for _, tp := range c.Topics {
						if tp.Topic == topic {
							s.holders[id] += len(tp.Partitions)
							s.assigned += len(tp.Partitions)
						}
					}
				}
				if _, ok := s.holders[id]; !ok {
					s.holders[id] = 0
				}
			}
			g.mu.Lock()
			g.snaps = append(g.snaps, s)
			g.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return g
}

// takeover waits up to d until the group is stable, without instance, and
// every partition of the topic assigned to another member; it returns how
// long after since that was first seen.
func (g *groupWatch) takeover(t *testing.T, instance string, since time.Time, d time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		g.mu.Lock()
		for _, s := range g.snaps {
			if s.at.Before(since) || s.state != "Stable" {
				continue
			}
			if _, ok := s.holders[instance]; ok {
				continue
			}
			if s.assigned >= g.partitions {
				g.mu.Unlock()
				return s.at.Sub(since)
			}
		}
		var last groupSnap
		if len(g.snaps) > 0 {
			last = g.snaps[len(g.snaps)-1]
		}
		g.mu.Unlock()
		if time.Now().After(deadline) {
			t.Errorf("%s's partitions not taken over within %s (last: %s, %v, %d assigned)", instance, d, last.state, last.holders, last.assigned)
			return -1
		}
		time.Sleep(100 * time.Millisecond)
	}
}
