//go:build linux

package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestPoisonTrackParked is the end-to-end proof of parking, every role a
// process of the built binary on Apache Kafka: a partner that answers 500
// to every report of one track (a bug on one payload; 500 is transient, so
// it is retried) no longer stops the flow.
//
//  1. A first fleet without the fault: its rate is the baseline.
//  2. A second fleet with the sandbox answering 500 to every report of one
//     track (about 3 % of its plays): every other report is delivered (the
//     rate is logged against the baseline: rates are the bench's to judge,
//     not a test's), the bad track's reports are parked with a Delivery
//     record each and `playpipe audit --list parked` lists them with their
//     last answer, never as delivered.
//  3. The fault lifted, `playpipe redrive --parked` delivers them: then
//     the partner holds every expected play, duplicates no more than the
//     posts labelled in doubt, and the audit has nothing parked or pending.
func TestPoisonTrackParked(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary, Apache Kafka, ClickHouse and 4 processes")
	}
	const partitions = 6
	testStart := time.Now()
	dir := t.TempDir()
	bin := testenv.BuildPlaypipe(t, dir)
	k := testenv.StartApacheKafka(t, testenv.ApacheKafka{Partitions: partitions})
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Seed, o.Pages, o.ListsPerPage, o.MixesPerList = 29, 2, 2, 5 })
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond}})
	ch := testenv.StartClickHouse(t)
	t.Logf("setup: binary, Apache Kafka %v, sandbox, ClickHouse in %s", k.Addrs(), since(testStart))

	ps := testenv.NewProcs(t, bin, dir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sb.ClientSignature,
		"PLAYPIPE_LOG_LEVEL=info",
	))
	kafkaArgs := []string{"--brokers", strings.Join(k.Addrs(), ","), "--partitions", strconv.Itoa(partitions)}
	chArgs := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}
	sink := &role{name: "sink", args: append(append([]string{"sink"}, kafkaArgs...), append(chArgs, "--batch-rows", "500", "--linger", "100ms")...), admin: testenv.FreeAddr(t)}
	consume := &role{name: "consume", args: append(append([]string{"consume"}, kafkaArgs...), "--api-url", sb.URL), admin: testenv.FreeAddr(t)}
	// A small budget, so the test parks within seconds; a slow lane that
	// waits an hour, so only the redrive delivers the parked reports.
	report := &role{name: "report", args: append(append([]string{"report"}, kafkaArgs...), "--api-url", sb.URL,
		"--park-after-attempts", "3", "--park-after", "2s", "--park-retries", "1h", "--backoff-max", "300ms"), admin: testenv.FreeAddr(t)}
	roles := []*role{sink, consume, report}
	for _, r := range roles {
		r.p = ps.Start(r.name, append([]string{r.args[0], "--admin-addr", r.admin}, r.args[1:]...)...)
		testenv.WaitReady(t, r.p, r.admin, 90*time.Second)
	}
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		for by := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
			for _, r := range roles {
				if !r.p.Running() {
					t.Fatalf("%s exited on its own: %v (log %s)", r.name, r.p.Err, r.p.Log)
				}
			}
			if time.Now().After(by) {
				ps.DumpLogs(30)
				t.Fatalf("waiting for %s: not within %s (sandbox %+v)", what, d, sb.Counts())
			}
		}
	}
	creds := partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature}
	distinct := func() int64 { c := sb.Counts(); return c.Accepted - c.Duplicates }

	// fleet runs one simulated fleet and returns what it must yield.
	fleet := func(name string, seed int64) (map[play]int, int) {
		sa := simArgs{events: 1500, rate: 1000, devices: 30, badShare: 0, seed: seed, startMS: simulator.DefaultStart(time.Now())}
		rec := filepath.Join(dir, name+".jsonl")
		sim := ps.Start("simulate-"+name, append(append(append([]string{"simulate"}, kafkaArgs...), sa.flags()...), "--api-url", sb.URL, "--record", rec)...)
		if code := sim.Wait(t, 2*time.Minute); code != 0 {
			t.Fatalf("simulate %s exited %d (log %s)", name, code, sim.Log)
		}
		want, below, _, _ := expectedPlays(t, sb.Catalog(), readRecord(t, rec))
		return want, below
	}
	total := func(m map[play]int) (n int) {
		for _, c := range m {
			n += c
		}
		return n
	}

	// 1. The baseline: a fleet without the fault. (The simulator's
	// timeline is its own: each fleet's plays differ by seed.)
	t0 := time.Now()
	wantA, _ := fleet("a", 31)
	nA := total(wantA)
	waitFor("the first fleet's plays at the partner", 3*time.Minute, func() bool { return distinct() >= int64(len(wantA)) })
	rateA := float64(nA) / time.Since(t0).Seconds()
	t.Logf("%s fleet a: %d reports delivered at %.0f reports/s (publish to last delivery)", since(testStart), nA, rateA)

	// 2. The bad track: the one nearest 3 % of the second fleet's plays
	// (generated in-process first: the same messages the simulator sends).
	sb2 := simArgs{events: 1500, rate: 1000, devices: 30, badShare: 0, seed: 32, startMS: simulator.DefaultStart(time.Now())}
	genB, _, _, _ := expectedPlays(t, sb.Catalog(), sb2.generated(t, sb.URL, creds))
	perTrack := map[int64]int{}
	for p, n := range genB {
		perTrack[p.TrackID] += n
	}
	var bad int64
	best := math.Inf(1)
	for tr, n := range perTrack {
		if d := math.Abs(float64(n)/float64(total(genB)) - 0.03); d < best {
			bad, best = tr, d
		}
	}
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond, TrackIDs: []int64{bad}, TrackStatus: 500}})
	t1 := time.Now()
	wantB, _ := fleet("b", 32)
	nB, nBad := total(wantB), 0
	for p, n := range wantB {
		if p.TrackID == bad {
			nBad += n
		}
	}
	if nBad == 0 || nBad == nB {
		t.Fatalf("track %d has %d of the second fleet's %d reports: the fault must hit some and spare others", bad, nBad, nB)
	}
	goodB := 0
	for p := range wantB {
		if p.TrackID != bad {
			goodB++
		}
	}
	atPartner := func() map[play]int {
		got := map[play]int{}
		for _, e := range sb.Ledger().Accepted {
			got[expect.Of(e.Report)]++
		}
		return got
	}
	goodDelivered := func() int {
		got, n := atPartner(), 0
		for p := range wantB {
			if p.TrackID != bad && got[p] > 0 {
				n++
			}
		}
		return n
	}
	waitFor("every other report of the second fleet at the partner", 3*time.Minute, func() bool { return goodDelivered() >= goodB })
	rateB := float64(nB-nBad) / time.Since(t1).Seconds()
	t.Logf("%s fleet b: %d reports, %d of track %d answered 500 each time; the other %d delivered at %.0f reports/s (%.0f %% of fleet a's rate)",
		since(testStart), nB, nBad, bad, nB-nBad, rateB, 100*rateB/rateA)

	// The bad track's reports are parked, durably: the audit lists them.
	// A report's budget runs while the partner takes other reports (an
	// outage of the whole partner parks nothing): a third fleet goes on
	// publishing slowly, as fleets do, while the second's bad reports are
	// parked. Its own reports of the bad track may be parked or still
	// failing when the fault is lifted; either way they end delivered.
	sc := simArgs{events: 600, rate: 30, devices: 10, badShare: 0, seed: 33, startMS: simulator.DefaultStart(time.Now())}
	recC := filepath.Join(dir, "c.jsonl")
	simC := ps.Start("simulate-c", append(append(append([]string{"simulate"}, kafkaArgs...), sc.flags()...), "--api-url", sb.URL, "--record", recC)...)
	auditArgs := append(append([]string{"audit"}, chArgs...), "--from", "-2h", "--to", "+1h", "--format", "json")
	var rep analytics.Audit
	waitFor("the audit to count the second fleet's parked plays", 3*time.Minute, func() bool {
		rep = runAudit(t, bin, auditArgs)
		return rep.Parked >= uint64(nBad)
	})
	if code := simC.Wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("simulate c exited %d (log %s)", code, simC.Log)
	}
	wantC, _, _, _ := expectedPlays(t, sb.Catalog(), readRecord(t, recC))
	nBadC := 0
	for p, n := range wantC {
		if p.TrackID == bad {
			nBadC += n
		}
	}
	rep = runAudit(t, bin, auditArgs)
	if rep.Parked < uint64(nBad) || rep.Parked > uint64(nBad+nBadC) {
		t.Errorf("the audit counts %d parked plays, want %d of the second fleet and at most %d more of the third (track %d)", rep.Parked, nBad, nBadC, bad)
	}
	// Each row's own last answer: a count over the whole output would also
	// count "500" in ids, times and the header.
	rows, with500 := auditList(t, bin, chArgs, "parked"), 0
	for _, r := range rows {
		if strings.Contains(r.Detail, "HTTP 500 ") {
			with500++
		}
	}
	if with500 < nBad {
		t.Errorf("audit --list parked shows %d of %d rows with the last answer 500, want %d (first %+v)", with500, len(rows), nBad, firstRows(rows, 3))
	}
	for p := range wantB {
		if p.TrackID == bad && atPartner()[p] > 0 {
			t.Fatalf("a report of track %d is at the partner while every post of it was answered 500", bad)
		}
	}
	t.Logf("%s %d plays parked and listed by the audit; delivered %d, pending %d", since(testStart), rep.Parked, rep.Delivered, rep.Pending)

	// 3. The fault lifted, redrive delivers the parked reports.
	sb.SetFaults(sandbox.Faults{})
	redrive := append(append(append([]string{"redrive"}, kafkaArgs...), chArgs...), "--api-url", sb.URL, "--parked",
		"--track", strconv.FormatInt(bad, 10), "--reason", fmt.Sprintf("partner fixed track %d", bad), "--rate", "0", "--concurrency", "16")
	rd := ps.Start("redrive", redrive...) // the sandbox's credentials in its environment
	code := rd.Wait(t, 2*time.Minute)
	rdOut, _ := os.ReadFile(rd.Log)
	if code != 0 {
		t.Fatalf("playpipe redrive --parked exited %d:\n%s", code, rdOut)
	}
	t.Logf("redrive: %s", lastLine(string(rdOut)))
	want := map[play]int{}
	for p, n := range wantA {
		want[p] += n
	}
	for p, n := range wantB {
		want[p] += n
	}
	for p, n := range wantC {
		want[p] += n
	}
	waitFor("every play at the partner", 2*time.Minute, func() bool { return distinct() >= int64(len(want)) })
	waitFor("the audit to see the parked plays delivered", 2*time.Minute, func() bool {
		rep = runAudit(t, bin, auditArgs)
		return rep.Parked == 0 && rep.Delivered >= uint64(total(want))
	})
	for _, r := range roles {
		r.p.Signal(t, syscall.SIGTERM)
	}
	for _, r := range roles {
		if code := r.p.Wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM (log %s)", r.name, code, r.p.Log)
		}
	}
	led := sb.Ledger()
	missing, dups, unexpected := compare(want, atPartner())
	if len(missing) > 0 || len(unexpected) > 0 {
		t.Errorf("the partner's ledger differs: %d missing (first %v), %d unexpected (first %v)", len(missing), firstPlays(missing, 3), len(unexpected), firstPlays(unexpected, 3))
	}
	inDoubt, _, _ := readDeliveries(t, k)
	t.Logf("partner: %d accepted, %d duplicates; %d delivered reports labelled in doubt; audit: delivered %d, parked %d, pending %d",
		led.AcceptedCount, dups, inDoubt, rep.Delivered, rep.Parked, rep.Pending)
	if dups > inDoubt {
		t.Errorf("%d duplicates at the partner, more than the %d posts labelled in doubt", dups, inDoubt)
	}
	if rep.Pending != 0 || rep.Parked != 0 {
		t.Errorf("audit after the redrive: %d pending, %d parked, want none", rep.Pending, rep.Parked)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
