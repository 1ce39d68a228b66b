package reporter

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// TestBacklogMemory measures the peak RSS of a reporter process working
// through a backlog of PLAYPIPE_BACKLOG reports (e.g. 1000000) for 15 s, next
// to the same run with a backlog of 200 000: memory must not grow with the
// backlog. Skipped unless PLAYPIPE_BACKLOG is set (it produces the whole
// backlog into the embedded broker first):
//
//	PLAYPIPE_BACKLOG=1000000 go test -run TestBacklogMemory -v -timeout 10m ./reporter/
func TestBacklogMemory(t *testing.T) {
	big, _ := strconv.Atoi(os.Getenv("PLAYPIPE_BACKLOG"))
	if big <= 0 {
		t.Skip("set PLAYPIPE_BACKLOG=1000000 to run the backlog memory measurement")
	}
	small := 200_000
	peakSmall, doneSmall := backlogRun(t, small)
	peakBig, doneBig := backlogRun(t, big)
	t.Logf("peak RSS of the reporter process: %.1f MiB with a %d backlog (%d delivered in the window), %.1f MiB with a %d backlog (%d delivered)",
		float64(peakSmall)/(1<<20), small, doneSmall, float64(peakBig)/(1<<20), big, doneBig)
	if peakBig > peakSmall*3/2 {
		t.Errorf("peak RSS grows with the backlog: %d vs %d bytes", peakBig, peakSmall)
	}
}

// backlogRun publishes n reports, runs a reporter process over them for at
// most 15 s and returns its peak RSS (VmHWM, sampled until just before the
// SIGTERM; not rusage, whose maxrss of a forked child can include the
// parent's) and the reports delivered.
func backlogRun(t *testing.T, n int) (peak int64, delivered int64) {
	e := newE2E(t, 6, func(o *sandbox.Config) { o.MaxLedgerEntries = 1 })
	e.group = fmt.Sprintf("reporter-backlog-%d", n)
	topic := e.kafka.Config.Topics().Reports
	cl := e.kafka.Client(t, kgo.MaxBufferedRecords(100_000), kgo.ProducerLinger(5*time.Millisecond))
	start := time.Now()
	var firstErr error
	for i := range n {
		tp := play(fmt.Sprintf("backlog-%d", i), false, false)
		v, _ := json.Marshal(tp)
		cl.Produce(t.Context(), &kgo.Record{Topic: topic, Key: []byte(tp.ReportID), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	if err := cl.Flush(t.Context()); err != nil || firstErr != nil {
		t.Fatalf("produce backlog: %v %v", err, firstErr)
	}
	t.Logf("backlog of %d reports produced in %v", n, time.Since(start).Round(time.Millisecond))
	var env []string
	if dir := os.Getenv("PLAYPIPE_BACKLOG_HEAPPROFILE_DIR"); dir != "" {
		env = append(env, fmt.Sprintf("%s=%s/heap-%d.pprof", envChildHeapProf, dir, n))
	}
	c := e.startChild(0, 48, env...)
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; time.Now().Before(deadline) && e.sb.Ledger().AcceptedCount < int64(n); i++ {
		if rss := vmHWM(c.cmd.Process.Pid); rss > peak {
			peak = rss
		}
		if i%10 == 0 && os.Getenv("PLAYPIPE_BACKLOG_TRACE") != "" {
			t.Logf("t=%ds peak RSS %.1f MiB, delivered %d", i/10, float64(peak)/(1<<20), e.sb.Ledger().AcceptedCount)
		}
		time.Sleep(100 * time.Millisecond) // the RSS sampling period (a real measurement)
	}
	if rss := vmHWM(c.cmd.Process.Pid); rss > peak {
		peak = rss
	}
	delivered = e.sb.Ledger().AcceptedCount
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("reporter process: %v\n%s", err, c.out.String())
	}
	return peak, delivered
}

// vmHWM reads the peak resident set size of a process, in bytes.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}
