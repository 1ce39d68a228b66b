//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/replay"
	"github.com/playpipe/playpipe/schemas"
)

// TestReplayBrokerFrozen runs `playpipe replay` as a process and freezes
// the broker (SIGSTOP) while the replay posts, its Delivery records on
// their way: the replay must end by itself within its --kafka-timeout
// (plus the bounded client close), with an error that names the broker,
// the flag and how to resume — not hang for as long as the broker stays
// frozen. After SIGCONT a re-run of the same replay id finishes the job:
// every play of the window at the partner, no report with a final answer
// on record posted again (one final Delivery record per report for the
// replay id), and the partner's duplicates bounded by the posts labelled
// in doubt.
func TestReplayBrokerFrozen(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs 6 processes")
	}
	r := startBrokerRig(t)
	want := r.wantPlays(r.deliverFirst(t, "before the replay"))
	n := 0
	for _, c := range want {
		n += c
	}
	const id = "rp-e2e-frozen"
	args := func(extra ...string) []string {
		a := append(append(append([]string{"replay"}, r.kafkaArgs...), r.chArgs...),
			"--api-url", r.sb.URL, "--from", "-1h", "--reason", "the partner lost a day (test)", "--replay-id", id, "--json", "--progress", "0")
		return append(a, extra...)
	}
	// The sink must have the live deliveries in the ledger: the replay
	// selects there.
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; ; i++ {
		p := r.ps.Start(fmt.Sprintf("replay-dry-%d", i), args("--dry-run")...)
		code := p.Wait(t, 60*time.Second)
		res, err := replayResult(p.Log)
		if code == 0 && err == nil && res.Selected == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dry run did not select the %d delivered reports within 60 s: exit %d, %+v, %v (log %s)", n, code, res, err, p.Log)
		}
		time.Sleep(time.Second)
	}
	r.sb.Reset() // the partner loses every report

	// Run 1: slow enough to be frozen half-way.
	const kafkaTimeout = 4 * time.Second
	run1 := r.ps.Start("replay-1", args("--rate", "4", "--concurrency", "2", "--kafka-timeout", kafkaTimeout.String())...)
	for len(r.sb.LedgerSince(0).Accepted) < n/3 {
		if !run1.Running() {
			t.Fatalf("replay run 1 ended before the freeze (log %s)", run1.Log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.brokerP.Signal(t, syscall.SIGSTOP)
	frozeAt := time.Now()
	atFreeze := len(r.sb.LedgerSince(0).Accepted)
	// The bound: one wait of --kafka-timeout, then the bounded close of
	// the clients (2 × kafkax.DefaultLeaveTimeout at most).
	bound := kafkaTimeout + 2*kafkax.DefaultLeaveTimeout + 10*time.Second
	code := run1.Wait(t, bound)
	took := time.Since(frozeAt)
	log1, _ := os.ReadFile(run1.Log)
	t.Logf("replay run 1 exited %d %s after the freeze (%d of %d reports at the partner then)", code, took.Round(time.Millisecond), atFreeze, n)
	if i := bytes.Index(log1, []byte("did not answer")); i >= 0 {
		line := log1[max(0, bytes.LastIndexByte(log1[:i], '\n')+1):]
		if j := bytes.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		t.Logf("its error: %s", line)
	}
	if code == 0 || code == -2 {
		t.Errorf("replay run 1 exited %d with the broker frozen, want an error within %s", code, bound)
	}
	for _, needle := range []string{"did not answer within " + kafkaTimeout.String() + " (--kafka-timeout)", r.broker, "--replay-id " + id} {
		if !bytes.Contains(log1, []byte(needle)) {
			t.Errorf("replay run 1's error does not say %q:\n%s", needle, tail(log1, 1500))
		}
	}
	r.brokerP.Signal(t, syscall.SIGCONT)
	// Produce requests the first run's connections left in the broker's
	// socket buffers are served on waking: let them land before the re-run
	// reads the log.
	time.Sleep(2 * time.Second)

	// Run 2: the same id, resumed.
	run2 := r.ps.Start("replay-2", args("--rate", "0", "--concurrency", "4")...)
	if code := run2.Wait(t, 90*time.Second); code != 0 {
		log2, _ := os.ReadFile(run2.Log)
		t.Fatalf("replay run 2 exited %d, want 0:\n%s", code, tail(log2, 2000))
	}
	res2, err := replayResult(run2.Log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replay run 2: %+v", res2)
	// What run 1 got an answer on record for is not posted again: the
	// ledger leaves it out of the selection (once the sink has it) or the
	// deliveries log marks it done.
	if sent := res2.Selected - res2.AlreadyDone; sent >= n {
		t.Errorf("run 2 posted %d of the %d reports again (%+v): none of run 1's answers was on record", sent, n, res2)
	}

	got := r.partnerPlays()
	missing, _, _ := compare(want, got)
	if len(missing) > 0 {
		t.Errorf("%d plays of the window not at the partner after the re-run, e.g. %v", len(missing), firstPlays(missing, 3))
	}
	dups := 0
	for p, c := range got {
		if c > want[p] {
			dups += c - want[p]
		}
	}
	finals, doubt := replayDeliveries(t, r.broker, id)
	t.Logf("partner: %d plays, %d duplicates; deliveries of %s: %d reports with a final answer, %d records labelled in doubt", len(got), dups, id, len(finals), doubt)
	if len(finals) != n {
		t.Errorf("%d reports have a final Delivery record of %s, want %d", len(finals), id, n)
	}
	for rid, c := range finals {
		if c != 1 {
			t.Errorf("report %s has %d final Delivery records of %s: a final answer was posted again", rid, c, id)
		}
	}
	if dups > doubt {
		t.Errorf("the partner holds %d duplicates, but only %d posts are labelled in doubt", dups, doubt)
	}
}

// replayResult reads the JSON result a `playpipe replay --json` wrote to
// its log (the last object that starts a line).
func replayResult(log string) (replay.Result, error) {
	var res replay.Result
	b, err := os.ReadFile(log)
	if err != nil {
		return res, err
	}
	i := bytes.LastIndex(b, []byte("\n{\n"))
	if i < 0 {
		return res, fmt.Errorf("no JSON result in %s:\n%s", log, tail(b, 1000))
	}
	if err := json.NewDecoder(bytes.NewReader(b[i+1:])).Decode(&res); err != nil {
		return res, fmt.Errorf("the JSON result in %s: %w", log, err)
	}
	return res, nil
}

// replayDeliveries reads the deliveries topic and returns, for the replay
// id, the final Delivery records per report id and the records labelled in
// doubt.
func replayDeliveries(t *testing.T, broker, id string) (finals map[string]int, doubt int) {
	t.Helper()
	finals = map[string]int{}
	readTopic(t, broker, "plays.deliveries", func(rec *kgo.Record) {
		if kafkax.HasHeader(rec, schemas.HeaderLease) {
			return
		}
		var d schemas.Delivery
		if err := schemas.DecodeDelivery(rec.Value, &d); err != nil || d.ReplayID != id {
			return
		}
		if d.InDoubt || d.DoubtCause != "" {
			doubt++
		}
		if d.Outcome == schemas.OutcomeDelivered || d.Outcome == schemas.OutcomeRejected {
			finals[d.ReportID]++
		}
	})
	return finals, doubt
}

// tail is the last n bytes of b, as text.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
