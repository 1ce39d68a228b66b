//go:build linux

package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/wiring/expect"
	"github.com/playpipe/playpipe/wiring/testenv"
)

// TestPoisonTrackParkedAsProcesses is issue 29 with every role a process of
// the built binary: the sandbox answers 500 to every report of two tracks
// (its poison-track fault). `playpipe report` (a short retry budget)
// delivers every other play and parks those; the `playpipe audit` process
// over the ledger the `playpipe sink` process wrote counts and lists them as
// parked, never delivered. The fault lifted, `playpipe redrive --parked`
// re-sends them at once: the partner then holds every play exactly once, and
// the audit counts them delivered, none parked.
func TestPoisonTrackParkedAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs 5 processes")
	}
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	k := testenv.StartKafka(t, 3)
	sb := testenv.StartSandbox(t, func(c *sandbox.Config) { c.Seed, c.Pages, c.ListsPerPage, c.MixesPerList = 5, 1, 1, 3 })
	ch := testenv.StartClickHouse(t)
	// Two tracks of one mix: a few plays in ten, the others flowing around
	// them (a report's budget moves only while other reports are answered).
	poison := []int64{sb.Catalog().Mixes[0].Tracks[1].ID, sb.Catalog().Mixes[0].Tracks[2].ID}
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{TrackIDs: poison, TrackStatus: 500}})

	creds := []string{"PLAYPIPE_API_CLIENT_ID=" + sb.ClientID, "PLAYPIPE_API_CLIENT_SIGNATURE=" + sb.ClientSignature}
	ps := newProcs(t, bin, dir, childEnv(append(creds, "PLAYPIPE_LOG_LEVEL=info")...))
	kafkaArgs := []string{"--brokers", strings.Join(k.Addrs(), ","), "--partitions", "3"}
	chArgs := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}
	start := func(name string, args ...string) *proc {
		admin := testenv.FreeAddr(t)
		p := ps.start(name, append([]string{args[0], "--admin-addr", admin}, args[1:]...)...)
		waitReady(t, p, admin, 60*time.Second)
		return p
	}
	sink := start("sink", append(append([]string{"sink"}, kafkaArgs...), append(chArgs, "--linger", "200ms")...)...)
	consume := start("consume", append(append([]string{"consume"}, kafkaArgs...), "--api-url", sb.URL)...)
	report := start("report", append(append([]string{"report"}, kafkaArgs...), "--api-url", sb.URL,
		"--backoff-max", "200ms", "--park-after-attempts", "3", "--park-after", "100ms", "--park-retries", "1h")...)

	// Simulations until some poison plays are parked and every other play is
	// delivered. A report's budget moves only while other reports are
	// answered: the poison plays of a run's last moments keep retrying
	// (pending, not parked) until more reports come.
	want := map[play]int{}
	isPoison := func(p play) bool { return slices.Contains(poison, p.TrackID) }
	bad := func() (n int) {
		for p := range want {
			if isPoison(p) {
				n++
			}
		}
		return n
	}
	auditArgs := append(append([]string{"audit"}, chArgs...), "--from", "-1h", "--to", "+1h", "--format", "json")
	var rep analytics.Audit
	startMS := simulator.DefaultStart(time.Now())
	for run := 0; ; run++ {
		if run == 6 {
			t.Fatalf("after %d simulations: the audit sees %d parked of %d poison plays, %d delivered of %d", run, rep.Parked, bad(), rep.Delivered, len(want)-bad())
		}
		sa := simArgs{events: 40, rate: 100, devices: 4, seed: int64(21 + run), startMS: startMS + int64(run)*3_600_000}
		recordPath := filepath.Join(dir, fmt.Sprintf("simulated-%d.jsonl", run))
		sim := ps.start(fmt.Sprintf("simulate-%d", run), append(append(append([]string{"simulate"}, kafkaArgs...), sa.flags()...),
			"--api-url", sb.URL, "--record", recordPath)...)
		if code := sim.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("simulate exited %d (log %s)", code, sim.log)
		}
		w, _, _, _ := expectedPlays(t, sb.Catalog(), readRecord(t, recordPath))
		for p, n := range w {
			want[p] += n
		}
		deadline := time.Now().Add(15 * time.Second)
		for ; time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
			rep = runAudit(t, bin, auditArgs)
			if rep.Parked > 0 && rep.Delivered == uint64(len(want)-bad()) && rep.Pending == uint64(bad()) {
				break
			}
		}
		if rep.Parked > 0 && rep.Delivered == uint64(len(want)-bad()) && rep.Pending == uint64(bad()) {
			break
		}
	}
	t.Logf("%d plays, %d of the poison tracks: the audit counts %d delivered, %d parked, %d pending; problems %q",
		len(want), bad(), rep.Delivered, rep.Parked, rep.Pending, rep.Problems())
	if rep.Parked > rep.Pending {
		t.Errorf("audit: %d parked of %d pending: parked plays are pending", rep.Parked, rep.Pending)
	}
	if !slices.ContainsFunc(rep.Problems(), func(s string) bool { return strings.Contains(s, "parked") }) {
		t.Errorf("audit problems %q: want the parked plays", rep.Problems())
	}
	// The partner so far: every other play, none of the poison track.
	got := map[play]int{}
	for _, e := range sb.Ledger().Accepted {
		got[expect.Of(e.Report)]++
	}
	for p := range got {
		if isPoison(p) {
			t.Errorf("the partner holds a play of a poison track: %+v", p)
		}
	}

	// Lifted: the reporter's own retries deliver the poison plays not
	// parked; redrive --parked re-sends the parked ones at once (their slow
	// retry is an hour away), once the ledger has every parked record.
	sb.SetFaults(sandbox.Faults{})
	time.Sleep(3 * time.Second) // a real wait: the last parks and the sink's linger (200 ms) behind us
	rd := ps.start("redrive", append(append(append([]string{"redrive"}, kafkaArgs...), chArgs...),
		"--api-url", sb.URL, "--parked", "--reason", "partner fixed the poison tracks")...)
	if code := rd.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("redrive --parked exited %d (log %s)", code, rd.log)
	}
	deadline := time.Now().Add(60 * time.Second)
	for rep = runAudit(t, bin, auditArgs); rep.Delivered < uint64(len(want)) || rep.Parked > 0; rep = runAudit(t, bin, auditArgs) {
		if time.Now().After(deadline) {
			t.Fatalf("after the redrive the audit sees %d delivered of %d, %d parked", rep.Delivered, len(want), rep.Parked)
		}
		time.Sleep(300 * time.Millisecond)
	}
	for _, p := range []*proc{report, consume, sink} {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range []*proc{report, consume, sink} {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0 (log %s)", p.name, code, p.log)
		}
	}
	got = map[play]int{}
	for _, e := range sb.Ledger().Accepted {
		got[expect.Of(e.Report)]++
	}
	missing, dups, unexpected := compare(want, got)
	if len(missing) > 0 || len(unexpected) > 0 || dups > 0 {
		t.Errorf("the partner's ledger: %d missing, %d duplicates, %d unexpected", len(missing), dups, len(unexpected))
	}
	if rep.DeliveredTwice != 0 || rep.Pending != 0 {
		t.Errorf("audit after the redrive: delivered twice %d, pending %d; want 0, 0", rep.DeliveredTwice, rep.Pending)
	}
	if len(rep.Replays) != 1 {
		t.Errorf("audit replays %+v: want the redrive", rep.Replays)
	}
}
