//go:build linux

package e2e

import (
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// parkRig is the set-aside path's end-to-end rig: the built binary, one
// Apache Kafka node, the sandbox as the partner (its report group at 2 ms),
// ClickHouse, and a sink, a consumer and a reporter, each a process, ready.
// The tests of parking, hanging, redrive and the slow lane's owners share
// it.
type parkRig struct {
	t                 *testing.T
	start             time.Time
	dir, bin          string
	k                 *testenv.Kafka
	sb                *testenv.Sandbox
	ch                *testenv.ClickHouse
	ps                *testenv.Procs
	creds             partnerapi.Credentials
	kafkaArgs, chArgs []string
	// plain is the sandbox's faults without a fault: 2 ms per report.
	plain         sandbox.Faults
	sink, consume *role
	report        *role
	// live are the roles that must not exit on their own (waitFor checks).
	live []*role
}

// startParkRig starts the rig on partitions partitions with the sandbox's
// catalog seeded seed; the reporter runs with reportFlags after the
// brokers, partitions and partner address.
func startParkRig(t *testing.T, partitions int, seed int64, reportFlags ...string) *parkRig {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds the binary, Apache Kafka, ClickHouse and 4 processes")
	}
	r := &parkRig{t: t, start: time.Now(), dir: t.TempDir()}
	r.bin = testenv.BuildPlaypipe(t, r.dir)
	r.k = testenv.StartApacheKafka(t, testenv.ApacheKafka{Partitions: partitions})
	r.sb = testenv.StartSandbox(t, func(o *sandbox.Config) { o.Seed, o.Pages, o.ListsPerPage, o.MixesPerList = seed, 2, 2, 5 })
	r.plain = sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond}}
	r.sb.SetFaults(r.plain)
	r.ch = testenv.StartClickHouse(t)
	t.Logf("setup: binary, Apache Kafka %v, sandbox, ClickHouse in %s", r.k.Addrs(), since(r.start))
	r.ps = testenv.NewProcs(t, r.bin, r.dir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+r.sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+r.sb.ClientSignature,
		"PLAYPIPE_LOG_LEVEL=info",
	))
	r.creds = partnerapi.Credentials{ClientID: r.sb.ClientID, ClientSignature: r.sb.ClientSignature}
	r.kafkaArgs = []string{"--brokers", strings.Join(r.k.Addrs(), ","), "--partitions", strconv.Itoa(partitions)}
	r.chArgs = []string{"--clickhouse-addr", r.ch.Addr, "--clickhouse-db", r.ch.Database, "--clickhouse-user", r.ch.User}
	r.sink = &role{name: "sink", args: append(append([]string{"sink"}, r.kafkaArgs...), append(r.chArgs, "--batch-rows", "500", "--linger", "100ms")...), admin: testenv.FreeAddr(t)}
	r.consume = &role{name: "consume", args: append(append([]string{"consume"}, r.kafkaArgs...), "--api-url", r.sb.URL), admin: testenv.FreeAddr(t)}
	r.report = r.reporter("report", reportFlags...)
	for _, x := range []*role{r.sink, r.consume, r.report} {
		r.startRole(x)
		testenv.WaitReady(t, x.p, x.admin, 90*time.Second)
	}
	return r
}

// reporter is a reporter role named name (not started) with the rig's
// brokers and partner and flags.
func (r *parkRig) reporter(name string, flags ...string) *role {
	return &role{name: name, args: append(append(append([]string{"report"}, r.kafkaArgs...), "--api-url", r.sb.URL), flags...), admin: testenv.FreeAddr(r.t)}
}

// startRole starts x (again, on a restart: same arguments, same admin
// address, the same log) and counts it live; not waited for.
func (r *parkRig) startRole(x *role) {
	x.p = r.ps.Start(x.name, append([]string{x.args[0], "--admin-addr", x.admin}, x.args[1:]...)...)
	if !slices.Contains(r.live, x) {
		r.live = append(r.live, x)
	}
}

// kill stops x with SIGKILL and waits for it; it no longer counts live.
func (r *parkRig) kill(x *role) {
	r.t.Helper()
	r.retire(x)
	x.p.Signal(r.t, syscall.SIGKILL)
	x.p.Wait(r.t, 10*time.Second)
}

// stop stops x with SIGTERM and expects exit status 0; it no longer
// counts live.
func (r *parkRig) stop(x *role) {
	r.t.Helper()
	r.retire(x)
	x.p.Stop(r.t, 30*time.Second)
}

// retire no longer counts x live (the test stops it).
func (r *parkRig) retire(x *role) {
	r.live = slices.DeleteFunc(r.live, func(y *role) bool { return y == x })
}

// stopAll stops every live role with SIGTERM and expects each to exit 0.
func (r *parkRig) stopAll() {
	r.t.Helper()
	live := r.live
	r.live = nil
	for _, x := range live {
		x.p.Signal(r.t, syscall.SIGTERM)
	}
	for _, x := range live {
		if code := x.p.Wait(r.t, 30*time.Second); code != 0 {
			r.t.Errorf("%s exited %d after SIGTERM (log %s)", x.name, code, x.p.Log)
		}
	}
}

// waitFor polls cond every 50 ms for up to d; a live role that exits, or
// the time running out, fails the test.
func (r *parkRig) waitFor(what string, d time.Duration, cond func() bool) {
	r.t.Helper()
	for by := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		for _, x := range r.live {
			if !x.p.Running() {
				r.t.Fatalf("%s exited on its own: %v (log %s)", x.name, x.p.Err, x.p.Log)
			}
		}
		if time.Now().After(by) {
			r.ps.DumpLogs(30)
			r.t.Fatalf("waiting for %s: not within %s (sandbox %+v)", what, d, r.sb.Counts())
		}
	}
}

// atPartner is the partner's accepted copies of every play.
func (r *parkRig) atPartner() map[play]int {
	got := map[play]int{}
	for _, e := range r.sb.Ledger().Accepted {
		got[expect.Of(e.Report)]++
	}
	return got
}

// distinct is how many distinct reports the partner accepted.
func (r *parkRig) distinct() int64 { c := r.sb.Counts(); return c.Accepted - c.Duplicates }

// startFleet starts `playpipe simulate` with sa, recording to name.jsonl.
func (r *parkRig) startFleet(name string, sa simArgs) *testenv.Proc {
	rec := filepath.Join(r.dir, name+".jsonl")
	return r.ps.Start("simulate-"+name, append(append(append([]string{"simulate"}, r.kafkaArgs...), sa.flags()...), "--api-url", r.sb.URL, "--record", rec)...)
}

// fleetWant waits for the fleet started as name and returns the reports it
// must yield.
func (r *parkRig) fleetWant(name string, sim *testenv.Proc) map[play]int {
	r.t.Helper()
	if code := sim.Wait(r.t, 3*time.Minute); code != 0 {
		r.t.Fatalf("simulate %s exited %d (log %s)", name, code, sim.Log)
	}
	want, _, _, _ := expectedPlays(r.t, r.sb.Catalog(), readRecord(r.t, filepath.Join(r.dir, name+".jsonl")))
	return want
}

// fleet runs one simulated fleet to its end and returns what it must
// yield.
func (r *parkRig) fleet(name string, sa simArgs) map[play]int {
	r.t.Helper()
	return r.fleetWant(name, r.startFleet(name, sa))
}

// badTrack returns the track nearest share of the reports the fleet sa
// yields (generated in-process: the same messages the simulator sends),
// with the fleet's reports per track.
func (r *parkRig) badTrack(sa simArgs, share float64) (int64, map[int64]int) {
	r.t.Helper()
	gen, _, _, _ := expectedPlays(r.t, r.sb.Catalog(), sa.generated(r.t, r.sb.URL, r.creds))
	perTrack := map[int64]int{}
	for p, n := range gen {
		perTrack[p.TrackID] += n
	}
	n := total(gen)
	var bad int64
	best := math.Inf(1)
	for tr, c := range perTrack {
		if d := math.Abs(float64(c)/float64(n) - share); d < best {
			bad, best = tr, d
		}
	}
	return bad, perTrack
}

// auditArgs are `playpipe audit`'s arguments for the last two hours, JSON.
func (r *parkRig) auditArgs() []string {
	return append(append([]string{"audit"}, r.chArgs...), "--from", "-2h", "--to", "+1h", "--format", "json")
}

// audit runs `playpipe audit` and returns its report.
func (r *parkRig) audit() analytics.Audit { return runAudit(r.t, r.bin, r.auditArgs()) }

// total is the number of reports in m.
func total(m map[play]int) (n int) {
	for _, c := range m {
		n += c
	}
	return n
}

// merge returns the sum of the wants.
func merge(ms ...map[play]int) map[play]int {
	out := map[play]int{}
	for _, m := range ms {
		for p, n := range m {
			out[p] += n
		}
	}
	return out
}

// checkCopies fails the test unless the partner holds every play of want
// and nothing else, with no more extra copies than the audit's bound of
// possible extra copies; it returns the extra copies.
func (r *parkRig) checkCopies(want map[play]int, rep analytics.Audit) int {
	r.t.Helper()
	missing, dups, unexpected := compare(want, r.atPartner())
	if len(missing) > 0 || len(unexpected) > 0 {
		r.t.Errorf("the partner's ledger differs: %d missing (first %v), %d unexpected (first %v)", len(missing), firstPlays(missing, 3), len(unexpected), firstPlays(unexpected, 3))
	}
	if uint64(dups) > rep.PossibleExtraCopies {
		r.t.Errorf("%d extra copies at the partner, beyond the audit's bound of %d (causes %v)", dups, rep.PossibleExtraCopies, rep.DoubtfulPostsByCause)
	}
	return dups
}
