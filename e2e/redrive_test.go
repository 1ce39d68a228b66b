//go:build linux

package e2e

import (
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

// TestRedriveOnePoster: `playpipe redrive --parked` racing the reporter's
// due slow retries, interrupted by kill -9 and by SIGTERM, then re-run —
// every role a process of the built binary on Apache Kafka. A parked
// report has one poster (the slow lane of its partition's owner, which
// serves the redrives' requests), so the partner holds every play, and no
// more copies of any than the audit's bound of possible extra copies.
// Before, a redrive posted itself: racing the slow lane and re-run after
// an interrupt it put copies at the partner the audit did not count.
func TestRedriveOnePoster(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary, Apache Kafka, ClickHouse and 4 processes")
	}
	const partitions = 3
	testStart := time.Now()
	dir := t.TempDir()
	bin := testenv.BuildPlaypipe(t, dir)
	k := testenv.StartApacheKafka(t, testenv.ApacheKafka{Partitions: partitions})
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Seed, o.Pages, o.ListsPerPage, o.MixesPerList = 29, 2, 2, 5 })
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond}})
	ch := testenv.StartClickHouse(t)
	ps := testenv.NewProcs(t, bin, dir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sb.ClientSignature,
		"PLAYPIPE_LOG_LEVEL=info",
	))
	kafkaArgs := []string{"--brokers", strings.Join(k.Addrs(), ","), "--partitions", strconv.Itoa(partitions)}
	chArgs := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}
	sink := &role{name: "sink", args: append(append([]string{"sink"}, kafkaArgs...), append(chArgs, "--batch-rows", "500", "--linger", "100ms")...), admin: testenv.FreeAddr(t)}
	consume := &role{name: "consume", args: append(append([]string{"consume"}, kafkaArgs...), "--api-url", sb.URL), admin: testenv.FreeAddr(t)}
	// A small budget, and slow retries due every 10 s (each report's on a
	// clock of its own): some come due while the redrives run.
	report := &role{name: "report", args: append(append([]string{"report"}, kafkaArgs...), "--api-url", sb.URL,
		"--park-after-attempts", "3", "--park-after", "2s", "--park-retries", "10s", "--backoff-max", "300ms"), admin: testenv.FreeAddr(t)}
	roles := []*role{sink, consume, report}
	for _, r := range roles {
		r.p = ps.Start(r.name, append([]string{r.args[0], "--admin-addr", r.admin}, r.args[1:]...)...)
		testenv.WaitReady(t, r.p, r.admin, 90*time.Second)
	}
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		for by := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
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
	atPartner := func() map[play]int {
		got := map[play]int{}
		for _, e := range sb.Ledger().Accepted {
			got[expect.Of(e.Report)]++
		}
		return got
	}

	// A fleet with the sandbox answering 500 to every report of one track
	// (the one nearest 5 % of its plays), and a slow fleet after it that
	// keeps the partner answering while the bad reports' budgets run out.
	sa := simArgs{events: 800, rate: 400, devices: 20, seed: 41, startMS: simulator.DefaultStart(time.Now())}
	gen, _, _, _ := expectedPlays(t, sb.Catalog(), sa.generated(t, sb.URL, creds))
	perTrack, n := map[int64]int{}, 0
	for p, c := range gen {
		perTrack[p.TrackID] += c
		n += c
	}
	var bad int64
	best := math.Inf(1)
	for tr, c := range perTrack {
		if d := math.Abs(float64(c)/float64(n) - 0.05); d < best {
			bad, best = tr, d
		}
	}
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond, TrackIDs: []int64{bad}, TrackStatus: 500}})
	want := map[play]int{}
	for i, s := range []simArgs{sa, {events: 400, rate: 20, devices: 10, seed: 42, startMS: simulator.DefaultStart(time.Now())}} {
		rec := filepath.Join(dir, "fleet"+strconv.Itoa(i)+".jsonl")
		sim := ps.Start("simulate-"+strconv.Itoa(i), append(append(append([]string{"simulate"}, kafkaArgs...), s.flags()...), "--api-url", sb.URL, "--record", rec)...)
		if code := sim.Wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("simulate %d exited %d (log %s)", i, code, sim.Log)
		}
		w, _, _, _ := expectedPlays(t, sb.Catalog(), readRecord(t, rec))
		for p, c := range w {
			want[p] += c
		}
	}
	auditArgs := append(append([]string{"audit"}, chArgs...), "--from", "-2h", "--to", "+1h", "--format", "json")
	var rep analytics.Audit
	waitFor("the audit to count parked plays", 3*time.Minute, func() bool {
		rep = runAudit(t, bin, auditArgs)
		return rep.Parked > 0
	})
	t.Logf("%s track %d: %d plays parked (of %d of the track)", since(testStart), bad, rep.Parked, perTrack[bad])

	// The fault lifted: the slow lane's retries come due while one redrive
	// is killed (-9) as soon as its requests are written, a second is
	// stopped with SIGTERM the same way, and the second is run again with
	// its id.
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond}})
	redrive := func(name, id string) *testenv.Proc {
		return ps.Start(name, append(append(append([]string{"redrive"}, kafkaArgs...), chArgs...), "--api-url", sb.URL, "--parked",
			"--track", strconv.FormatInt(bad, 10), "--replay-id", id, "--reason", "partner fixed the track", "--owner-wait", "60s")...)
	}
	written := func(p *testenv.Proc) {
		t.Helper()
		for by := time.Now().Add(time.Minute); len(testenv.GrepLog(p.Log, "redrive requests written")) == 0; time.Sleep(20 * time.Millisecond) {
			if !p.Running() || time.Now().After(by) {
				out, _ := os.ReadFile(p.Log)
				t.Fatalf("%s wrote no requests (running %v):\n%s", p.Name, p.Running(), out)
			}
		}
	}
	killed := redrive("redrive-kill", "rd-kill")
	written(killed)
	killed.Signal(t, syscall.SIGKILL)
	killed.Wait(t, 10*time.Second)
	termed := redrive("redrive-term", "rd-term")
	written(termed)
	termed.Signal(t, syscall.SIGTERM)
	tcode := termed.Wait(t, 30*time.Second)
	rerun := redrive("redrive-rerun", "rd-term")
	rcode := rerun.Wait(t, 2*time.Minute)
	out, _ := os.ReadFile(rerun.Log)
	t.Logf("%s redrive killed; SIGTERM'd one exited %d; its re-run exited %d: %s", since(testStart), tcode, rcode, lastLine(string(out)))
	if rcode != 0 {
		t.Errorf("the re-run of the redrive exited %d:\n%s", rcode, out)
	}

	waitFor("every play at the partner", 2*time.Minute, func() bool {
		missing, _, _ := compare(want, atPartner())
		return len(missing) == 0
	})
	waitFor("the audit to see no play parked or pending", 2*time.Minute, func() bool {
		rep = runAudit(t, bin, auditArgs)
		return rep.Parked == 0 && rep.Pending == 0
	})
	for _, r := range roles {
		r.p.Signal(t, syscall.SIGTERM)
	}
	for _, r := range roles {
		if code := r.p.Wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM (log %s)", r.name, code, r.p.Log)
		}
	}
	missing, dups, unexpected := compare(want, atPartner())
	t.Logf("partner: %d plays, %d missing, %d duplicates, %d unexpected; audit: delivered %d, possible extra copies %d (causes %v), replays %+v",
		len(want), len(missing), dups, len(unexpected), rep.Delivered, rep.PossibleExtraCopies, rep.DoubtfulPostsByCause, rep.Replays)
	if len(missing) > 0 || len(unexpected) > 0 {
		t.Errorf("the partner's ledger differs: %d missing (first %v), %d unexpected (first %v)", len(missing), firstPlays(missing, 3), len(unexpected), firstPlays(unexpected, 3))
	}
	if uint64(dups) > rep.PossibleExtraCopies {
		t.Errorf("%d extra copies at the partner, beyond the audit's bound of %d", dups, rep.PossibleExtraCopies)
	}
	var redriven uint64
	for _, r := range rep.Replays {
		redriven += r.Delivered
		if r.DeliveredTwice > 0 {
			t.Errorf("redrive %s delivered %d plays more than once", r.ID, r.DeliveredTwice)
		}
	}
	if redriven == 0 {
		t.Error("no play delivered by the interrupted redrives' requests (the slow lane served none of them)")
	}
}
