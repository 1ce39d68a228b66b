//go:build linux

package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// The slow lane's owners change under it: adversarial end-to-end tests of
// the set-aside path, every role a process of the built binary on Apache
// Kafka, the sandbox the partner. Each counts the partner's copies of every
// play against the audit's bound of possible extra copies, finds nothing
// lost, and reads <prefix>.parked at the end: every parked report's last
// state there is its removal (a write of parked state by an old owner after
// its successor's would bring a delivered report back).

// parkedFlags park a report after 3 failures over 2 s and retry it on the
// slow lane every retries.
func parkedFlags(retries string) []string {
	return []string{"--park-after-attempts", "3", "--park-after", "2s", "--park-retries", retries, "--backoff-max", "300ms"}
}

// parkTrack publishes a fleet with the sandbox answering 500 to every
// report of one track (the one nearest 5 % of its plays), then a slow fleet
// that keeps the partner answering while the bad reports' budgets run out,
// and waits until the audit counts every report of the track in the first
// fleet parked. It returns what both fleets must yield, the track, and the
// parked reports counted.
func (r *parkRig) parkTrack() (map[play]int, int64, uint64) {
	r.t.Helper()
	sa := simArgs{events: 800, rate: 400, devices: 20, seed: 41, startMS: simulator.DefaultStart(time.Now())}
	bad, _ := r.badTrack(sa, 0.05)
	r.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond, TrackIDs: []int64{bad}, TrackStatus: 500}})
	wantA := r.fleet("a", sa)
	nBad := 0
	for p, n := range wantA {
		if p.TrackID == bad {
			nBad += n
		}
	}
	if nBad == 0 {
		r.t.Fatalf("track %d has no report in the first fleet", bad)
	}
	wantB := r.fleet("b", simArgs{events: 400, rate: 20, devices: 10, seed: 42, startMS: simulator.DefaultStart(time.Now())})
	var rep analytics.Audit
	r.waitFor("the audit to count the first fleet's reports of the bad track parked", 3*time.Minute, func() bool {
		rep = r.audit()
		return rep.Parked >= uint64(nBad)
	})
	r.t.Logf("%s track %d: %d plays parked (%d of the first fleet)", since(r.start), bad, rep.Parked, nBad)
	return merge(wantA, wantB), bad, rep.Parked
}

// badAccepted counts the partner's accepted copies of track's reports.
func (r *parkRig) badAccepted(track int64) int {
	n := 0
	for p, c := range r.atPartner() {
		if p.TrackID == track {
			n += c
		}
	}
	return n
}

// parkedLeft reads <prefix>.parked to its end and returns the report ids
// whose last record there is an entry, not its removal.
func (r *parkRig) parkedLeft() []string {
	r.t.Helper()
	last := map[string]bool{}
	for _, rec := range r.k.ReadAll(r.t, r.k.Config.Topics().Parked) {
		if strings.HasPrefix(string(rec.Key), schemas.RedriveKeyPrefix) {
			continue
		}
		last[string(rec.Key)] = len(rec.Value) > 0
	}
	var left []string
	for id, entry := range last {
		if entry {
			left = append(left, id)
		}
	}
	return left
}

// finish waits for every play at the partner and for the audit to see
// nothing parked or pending, stops every role, and checks the partner's
// copies against the audit's bound and <prefix>.parked.
func (r *parkRig) finish(want map[play]int) analytics.Audit {
	r.t.Helper()
	r.waitFor("every play at the partner", 3*time.Minute, func() bool {
		missing, _, _ := compare(want, r.atPartner())
		return len(missing) == 0
	})
	var rep analytics.Audit
	r.waitFor("the audit to see no play parked or pending", 2*time.Minute, func() bool {
		rep = r.audit()
		return rep.Parked == 0 && rep.Pending == 0
	})
	r.stopAll()
	rep = r.audit()
	dups := r.checkCopies(want, rep)
	inDoubt, _, _ := readDeliveries(r.t, r.k)
	r.t.Logf("%s partner: %d plays, %d extra copies; %d delivered reports labelled in doubt; audit: delivered %d, possible extra copies %d (causes %v)",
		since(r.start), total(want), dups, inDoubt, rep.Delivered, rep.PossibleExtraCopies, rep.DoubtfulPostsByCause)
	if left := r.parkedLeft(); len(left) > 0 {
		r.t.Errorf("%d reports delivered but still parked in the parked topic (first %v): a write of parked state after its removal", len(left), left[:min(3, len(left))])
	}
	return rep
}

// TestParkedRevocationMidSlowRetry: reporters join and leave while the slow
// lane's retries are under way. Two reporters share the partitions while
// every post of the parked track is held 1.5 s and answered 500 (the slow
// retries, one a second, are in flight most of the time): a third joins,
// and the first is stopped with SIGTERM. The fault lifted with every post
// held 1 s, the slow retries deliver: a fourth joins and the second is
// stopped with SIGTERM in the middle of them. Each revocation waits for the
// partition's slow retries or abandons their posts (the next owner posts
// again, labelled in doubt): the partner holds every play, no more extra
// copies than the audit counts, and no parked report comes back.
func TestParkedRevocationMidSlowRetry(t *testing.T) {
	r := startParkRig(t, 6, 29, parkedFlags("1s")...)
	want, bad, _ := r.parkTrack()

	reporters := []*role{r.report}
	join := func(name string) {
		t.Helper()
		x := r.reporter(name, parkedFlags("1s")...)
		r.startRole(x)
		testenv.WaitReady(t, x.p, x.admin, 90*time.Second)
		reporters = append(reporters, x)
	}
	join("report-2")
	held := sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond, TrackIDs: []int64{bad}, TrackStatus: 500, Hold: 1500 * time.Millisecond}}
	r.sb.SetFaults(held)
	injected := r.sb.Counts().Injected
	r.waitFor("slow retries held by the partner", time.Minute, func() bool { return r.sb.Counts().Injected > injected+5 })
	join("report-3") // a revocation in the middle of held slow retries
	time.Sleep(3 * time.Second)
	injected = r.sb.Counts().Injected
	r.stop(reporters[0]) // SIGTERM: its partitions go to the others
	t.Logf("%s report-3 joined and report stopped while slow retries were held (%d held posts since)", since(r.start), r.sb.Counts().Injected-injected)

	// The fault lifted, every report answered after 1 s: the slow retries
	// deliver while the owners change again.
	r.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: time.Second}})
	before := r.badAccepted(bad)
	join("report-4")
	r.stop(reporters[1])
	t.Logf("%s report-4 joined and report-2 stopped while the slow lane delivered (%d of the track's reports accepted by then, %d before)",
		since(r.start), r.badAccepted(bad), before)
	r.sb.SetFaults(r.plain)
	rep := r.finish(want)
	// Only SIGTERMs: a slow retry whose post was cancelled says so in its
	// entry, and the next owner's post is labelled cancelled, not crash.
	for _, c := range rep.DoubtfulPostsByCause {
		if c.Key == schemas.DoubtCrash && c.N > 0 {
			t.Errorf("%d doubtful posts labelled crash after SIGTERMs only (causes %v)", c.N, rep.DoubtfulPostsByCause)
		}
	}
}

// TestParkedOwnerKilledMidSlowRetry: kill -9 of the owner during slow
// retries. Every post of the parked track held by the partner (the post in
// flight at the moment of the kill), the reporter is killed and restarted
// under its instance id: its successor finds the entries saying posting and
// posts again, labelled in doubt. Then, the fault lifted with every post
// answered after 500 ms, it is killed again as the partner accepts the
// first of the slow retries' posts (answers taken, not yet on record), and
// another instance takes its partitions over after the session timeout.
// The partner holds every play, no more extra copies than the audit
// counts, and no parked report comes back.
func TestParkedOwnerKilledMidSlowRetry(t *testing.T) {
	flags := append(parkedFlags("2s"), "--instance-id", "park-kill-1")
	r := startParkRig(t, 6, 29, flags...)
	want, bad, parked := r.parkTrack()

	// 1. The posts held: kill -9 with the slow lane's every slot (32) held
	// by a post in flight, then a restart under the same instance id.
	r.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond, TrackIDs: []int64{bad}, TrackStatus: 500, Hold: 5 * time.Minute}})
	injected := r.sb.Counts().Injected
	r.waitFor("the slow lane's posts held by the partner", time.Minute, func() bool {
		return r.sb.Counts().Injected-injected >= int64(min(parked, 32))
	})
	r.kill(r.report)
	t.Logf("%s reporter killed with %d posts held", since(r.start), r.sb.Counts().Injected-injected)
	r.startRole(r.report)
	testenv.WaitReady(t, r.report.p, r.report.admin, 90*time.Second)

	// 2. The fault lifted, every report answered after 500 ms: kill -9 as
	// the partner accepts the first of the slow retries' posts.
	r.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 500 * time.Millisecond}})
	r.waitFor("a slow retry's post accepted", time.Minute, func() bool { return r.badAccepted(bad) > 0 })
	r.kill(r.report)
	t.Logf("%s reporter killed again with %d of the track's reports accepted", since(r.start), r.badAccepted(bad))
	r.sb.SetFaults(r.plain)
	other := r.reporter("report-2", parkedFlags("2s")...)
	r.startRole(other)
	testenv.WaitReady(t, other.p, other.admin, 90*time.Second)
	r.finish(want)
}

// TestParkedOwnerPausedPastSession: a zombie owner. The owner is paused
// (SIGSTOP) with its slow retries' posts held by the partner, past its
// session timeout: another reporter takes its partitions and, the fault
// lifted, delivers the parked reports. Resumed (SIGCONT), the old owner
// reads the answers of its held posts (500); it must record none of them
// (the pause fence): written after its successor's tombstones, their next
// states brought 16 delivered reports back into the parked topic before.
func TestParkedOwnerPausedPastSession(t *testing.T) {
	r := startParkRig(t, 6, 29, parkedFlags("1s")...)
	want, bad, _ := r.parkTrack()
	r.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond, TrackIDs: []int64{bad}, TrackStatus: 500, Hold: 3 * time.Second}})
	injected := r.sb.Counts().Injected
	r.waitFor("the slow lane's posts held by the partner", time.Minute, func() bool { return r.sb.Counts().Injected-injected >= 32 })
	old := r.report
	old.p.Signal(t, syscall.SIGSTOP)
	other := r.reporter("report-2", parkedFlags("1s")...)
	r.startRole(other)
	testenv.WaitReady(t, other.p, other.admin, 90*time.Second)
	// Past the old owner's session timeout (6 s): its partitions are the
	// other's, which recovers and delivers them once the fault is lifted.
	time.Sleep(8 * time.Second)
	r.sb.SetFaults(r.plain)
	r.waitFor("the parked reports delivered by the new owner", 2*time.Minute, func() bool {
		missing, _, _ := compare(want, r.atPartner())
		return len(missing) == 0
	})
	time.Sleep(2 * time.Second)
	old.p.Signal(t, syscall.SIGCONT)
	t.Logf("%s old owner resumed", since(r.start))
	time.Sleep(10 * time.Second)
	r.finish(want)
	paused, unrecorded := testenv.GrepLog(old.p.Log, "was paused: slow retries under way"), testenv.GrepLog(old.p.Log, "paused during the slow retry")
	t.Logf("the old owner saw its pause %d times and left %d slow retries' answers unrecorded", len(paused), len(unrecorded))
	if len(paused) == 0 {
		t.Error("the old owner never saw its pause")
	}
}
