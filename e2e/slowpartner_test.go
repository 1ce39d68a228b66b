//go:build linux

package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestSlowPartnerCopiesAsProcesses is TestSlowPartnerCopies (e2e/edge) with every role a
// process of the built binary: the partner records each report at once but
// answers its first two posts of it after 3 s, past `playpipe report
// --api-timeout 1s`. So every play reaches the partner three times; the
// reporter labels each timed-out post (cause timeout), and the audit — a
// `playpipe audit` process over the ledger the `playpipe sink` process wrote
// — must bound the partner's extra copies from above, copy by copy (not
// play by play), and name the cause.
func TestSlowPartnerCopiesAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs 4 processes")
	}
	dir := t.TempDir()
	bin := testenv.BuildPlaypipe(t, dir)
	k := testenv.StartApacheKafka(t, testenv.ApacheKafka{Partitions: 3})
	sb := testenv.StartSandbox(t, func(c *sandbox.Config) { c.Seed, c.Pages, c.ListsPerPage, c.MixesPerList = 5, 1, 1, 3 })
	late := &testenv.LatePartner{H: sb.Handler(), Slow: 2, Delay: 3 * time.Second}
	partnerURL := testenv.ServeHandler(t, late)
	ch := testenv.StartClickHouse(t)

	ps := testenv.NewProcs(t, bin, dir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sb.ClientSignature,
		"PLAYPIPE_LOG_LEVEL=info",
	))
	kafkaArgs := []string{"--brokers", strings.Join(k.Addrs(), ","), "--partitions", "3"}
	chArgs := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}
	start := func(name string, args ...string) *testenv.Proc {
		admin := testenv.FreeAddr(t)
		p := ps.Start(name, append([]string{args[0], "--admin-addr", admin}, args[1:]...)...)
		testenv.WaitReady(t, p, admin, 60*time.Second)
		return p
	}
	sink := start("sink", append(append([]string{"sink"}, kafkaArgs...), append(chArgs, "--linger", "200ms")...)...)
	consume := start("consume", append(append([]string{"consume"}, kafkaArgs...), "--api-url", sb.URL)...)
	report := start("report", append(append([]string{"report"}, kafkaArgs...), "--api-url", partnerURL,
		"--api-timeout", "1s", "--backoff-max", "200ms")...)

	sa := simArgs{events: 4, rate: 50, devices: 2, seed: 11, startMS: simulator.DefaultStart(time.Now())}
	recordPath := filepath.Join(dir, "simulated.jsonl")
	sim := ps.Start("simulate", append(append(append([]string{"simulate"}, kafkaArgs...), sa.flags()...),
		"--api-url", sb.URL, "--record", recordPath)...)
	if code := sim.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("simulate exited %d (log %s)", code, sim.Log)
	}
	msgs := readRecord(t, recordPath)
	want, wantBelow, _, _ := expectedPlays(t, sb.Catalog(), msgs)
	if len(want) == 0 {
		t.Fatal("the simulation yields no play to report")
	}

	// Bounded waits: every play at the partner, then the ledger complete.
	deadline := time.Now().Add(90 * time.Second)
	for c := sb.Counts(); c.Accepted-c.Duplicates < int64(len(want)); c = sb.Counts() {
		if time.Now().After(deadline) {
			t.Fatalf("the partner holds %d of %d plays after 90 s (%+v)", c.Accepted-c.Duplicates, len(want), c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	auditArgs := append(append([]string{"audit"}, chArgs...), "--from", "-1h", "--to", "+1h", "--format", "json")
	var rep analytics.Audit
	for deadline = time.Now().Add(60 * time.Second); ; {
		rep = runAudit(t, bin, auditArgs)
		if rep.Delivered >= uint64(len(want)) && rep.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit sees %d delivered, %d pending after 60 s; want %d delivered", rep.Delivered, rep.Pending, len(want))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range []*testenv.Proc{report, consume, sink} {
		p.Signal(t, syscall.SIGTERM)
	}
	for _, p := range []*testenv.Proc{report, consume, sink} {
		if code := p.Wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0 (log %s)", p.Name, code, p.Log)
		}
	}

	// The partner's ledger, play by play: every expected play, each held
	// three times (two late answers, then the one in time).
	led := sb.Ledger()
	got := map[play]int{}
	for _, e := range led.Accepted {
		got[expect.Of(e.Report)]++
	}
	missing, dups, unexpected := compare(want, got)
	if len(missing) > 0 || len(unexpected) > 0 {
		t.Fatalf("the partner's ledger differs from the expected plays: %d missing, %d unexpected", len(missing), len(unexpected))
	}
	if dups < len(want) {
		t.Errorf("the partner holds %d extra copies of %d plays: the late answers did not make the reporter post again", dups, len(want))
	}
	t.Logf("slow partner as processes: %d plays (%d below the minimum), %d posts answered late, partner extra copies %d; audit delivered %d, possible extra copies %d over %d plays, by cause %v; problems %q",
		len(want), wantBelow, late.Late(), dups, rep.Delivered, rep.PossibleExtraCopies, rep.PlaysWithExtraCopies, rep.DoubtfulPostsByCause, rep.Problems())
	if rep.PossibleExtraCopies < uint64(dups) {
		t.Errorf("audit: possible extra copies %d, fewer than the partner's %d extra copies", rep.PossibleExtraCopies, dups)
	}
	var timeouts uint64
	for _, c := range rep.DoubtfulPostsByCause {
		if c.Key == schemas.DoubtTimeout {
			timeouts = c.N
		}
	}
	if timeouts < uint64(dups) {
		t.Errorf("audit: %d doubtful posts with cause timeout, want ≥ the partner's %d extra copies (by cause %v)", timeouts, dups, rep.DoubtfulPostsByCause)
	}
	if rep.Delivered != uint64(len(want)) || rep.DeliveredTwice != 0 {
		t.Errorf("audit: delivered %d (want %d), delivered twice on record %d (want 0)", rep.Delivered, len(want), rep.DeliveredTwice)
	}
}
