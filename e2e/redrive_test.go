//go:build linux

package e2e

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
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
	// A small budget, and slow retries due every 10 s (each report's on a
	// clock of its own): some come due while the redrives run.
	r := startParkRig(t, 3, 29, "--park-after-attempts", "3", "--park-after", "2s", "--park-retries", "10s", "--backoff-max", "300ms")
	sb, testStart, kafkaArgs, chArgs := r.sb, r.start, r.kafkaArgs, r.chArgs

	// A fleet with the sandbox answering 500 to every report of one track
	// (the one nearest 5 % of its plays), and a slow fleet after it that
	// keeps the partner answering while the bad reports' budgets run out.
	sa := simArgs{events: 800, rate: 400, devices: 20, seed: 41, startMS: simulator.DefaultStart(time.Now())}
	bad, perTrack := r.badTrack(sa, 0.05)
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond, TrackIDs: []int64{bad}, TrackStatus: 500}})
	want := map[play]int{}
	for i, s := range []simArgs{sa, {events: 400, rate: 20, devices: 10, seed: 42, startMS: simulator.DefaultStart(time.Now())}} {
		want = merge(want, r.fleet("fleet"+strconv.Itoa(i), s))
	}
	var rep analytics.Audit
	r.waitFor("the audit to count parked plays", 3*time.Minute, func() bool {
		rep = r.audit()
		return rep.Parked > 0
	})
	t.Logf("%s track %d: %d plays parked (of %d of the track)", since(testStart), bad, rep.Parked, perTrack[bad])

	// The fault lifted: the slow lane's retries come due while one redrive
	// is killed (-9) as soon as its requests are written, a second is
	// stopped with SIGTERM the same way, and the second is run again with
	// its id.
	sb.SetFaults(r.plain)
	redrive := func(name, id string) *testenv.Proc {
		return r.ps.Start(name, append(append(append([]string{"redrive"}, kafkaArgs...), chArgs...), "--api-url", sb.URL, "--parked",
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

	r.waitFor("every play at the partner", 2*time.Minute, func() bool {
		missing, _, _ := compare(want, r.atPartner())
		return len(missing) == 0
	})
	r.waitFor("the audit to see no play parked or pending", 2*time.Minute, func() bool {
		rep = r.audit()
		return rep.Parked == 0 && rep.Pending == 0
	})
	r.stopAll()
	dups := r.checkCopies(want, rep)
	t.Logf("partner: %d plays, %d duplicates; audit: delivered %d, possible extra copies %d (causes %v), replays %+v",
		len(want), dups, rep.Delivered, rep.PossibleExtraCopies, rep.DoubtfulPostsByCause, rep.Replays)
	var redriven uint64
	for _, rp := range rep.Replays {
		redriven += rp.Delivered
		if rp.DeliveredTwice > 0 {
			t.Errorf("redrive %s delivered %d plays more than once", rp.ID, rp.DeliveredTwice)
		}
	}
	if redriven == 0 {
		t.Error("no play delivered by the interrupted redrives' requests (the slow lane served none of them)")
	}
}
