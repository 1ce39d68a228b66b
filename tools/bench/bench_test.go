//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/reporter"
)

func TestParseOptionsRefusesBadFlags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "playpipe")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string // in the message
	}{
		{[]string{"-bin", bin, "-events", "0"}, "-events 0: accepted 1 or more"},
		{[]string{"-bin", bin, "-concurrency", "0"}, "-concurrency 0: accepted 1–1024"},
		{[]string{"-bin", bin, "-bad-share", "2"}, "-bad-share 2: accepted 0–1"},
		{[]string{"-bin", bin, "-timeout", "0s"}, "-timeout 0s: accepted a positive duration"},
		{[]string{"-bin", filepath.Join(t.TempDir(), "missing")}, "not a file (run `make build` first)"},
		{[]string{"-bin", bin, "extra"}, "bench takes flags only"},
		{[]string{"-nope"}, "flag provided but not defined: -nope"},
		{[]string{"-bin", bin, "-mode", "x"}, "-mode x: accepted e2e, report or latency"},
		{[]string{"-bin", bin, "-mode", "latency", "-latencies", "50ms,soon"}, `-latencies: "soon" is not a duration`},
		{[]string{"-bin", bin, "-mode", "latency", "-latencies", "5ms,50ms", "-plain-inflight", "1,2,3"}, "-plain-inflight: 3 values for 2 latencies"},
		{[]string{"-bin", bin, "-mode", "latency", "-error-rates", "0,0.9"}, `-error-rates: "0.9" is not a share of 0–0.5`},
		{[]string{"-bin", bin, "-mode", "report", "-rounds", "0"}, "-rounds 0: accepted 1–100"},
		{[]string{"-bin", bin, "-mode", "report", "-reports", "0"}, "-reports 0: accepted 1 or more"},
		{[]string{"-bin", bin, "-warmup-rounds", "0"}, "-warmup-rounds 0: accepted 1 or more"},
	} {
		var stderr bytes.Buffer
		_, err := parseOptions(c.args, &stderr)
		if !errors.Is(err, errUsage) {
			t.Errorf("%q: err %v, want a usage error", c.args, err)
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: stderr %q, want it to contain %q", c.args, stderr.String(), c.want)
		}
	}
	o, err := parseOptions([]string{"-bin", bin, "-events", "5"}, &bytes.Buffer{})
	if err != nil || o.events != 5 || o.concurrency != reporter.DefaultConcurrency || o.bin != bin || o.warmupRounds != 3 || o.warmup != minWarmup {
		t.Fatalf("valid flags: %+v, %v", o, err)
	}
}

// TestLatencySummary: the latency mode's figures from synthetic samples —
// a reporter ramping for 2 s, then steady at 1 000 reports/s.
func TestLatencySummary(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s []latencySample
	final := 0.0
	for i := range 100 { // 250 ms apart: 25 s
		at := t0.Add(time.Duration(i) * 250 * time.Millisecond)
		rate := 1000.0
		if i < 8 {
			rate = 125 * float64(i) // the ramp
		}
		final += rate / 4
		s = append(s, latencySample{at: at, final: final, posts: rate / 20, limit: rate / 20})
	}
	lr := latencyRun{latency: 50 * time.Millisecond, inflight: 50, plain: ceilingResult{posts: 1000, elapsed: time.Second}}
	lr.summarize(t0, s, final)
	if lr.steady < 990 || lr.steady > 1010 {
		t.Errorf("steady %.0f reports/s, want 1000", lr.steady)
	}
	if lr.toSteady < 1500*time.Millisecond || lr.toSteady > 3*time.Second {
		t.Errorf("start → steady %v, want about 2 s", lr.toSteady)
	}
	if lr.toPlain < lr.toSteady-time.Second || lr.peakPosts != 50 || lr.meanPosts != 50 {
		t.Errorf("to plain %v, peak %v, mean %v", lr.toPlain, lr.peakPosts, lr.meanPosts)
	}
	ls, ins, err := parseLatencies("0s, 5ms,150ms", "512")
	if err != nil || len(ls) != 3 || ls[2] != 150*time.Millisecond || len(ins) != 3 || ins[2] != 512 {
		t.Fatalf("parseLatencies: %v %v %v", ls, ins, err)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestProcFigures reads this process's CPU time and peak RSS: after a
// burst of work and an allocation the figures must have moved.
func TestProcFigures(t *testing.T) {
	pid := os.Getpid()
	cpu0, err := cpuTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel's own account (getrusage) says this process
	// used 100 ms more CPU — not for a wall-clock time, which a loaded
	// machine may hand to others — then /proc must agree.
	ru0 := selfRusage(t)
	x := 0
	for giveUp := time.Now().Add(30 * time.Second); selfRusage(t)-ru0 < 100*time.Millisecond; x++ {
		if time.Now().After(giveUp) {
			t.Fatal("the process got no 100 ms of CPU in 30 s")
		}
	}
	cpu1, err := cpuTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if cpu1-cpu0 < 80*time.Millisecond {
		t.Errorf("/proc says CPU time moved %v while getrusage saw 100 ms (%d rounds)", cpu1-cpu0, x)
	}
	rss0, err := peakRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 64<<20)
	for i := range b {
		b[i] = 1
	}
	rss1, err := peakRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	if rss1-rss0 < 32<<20 && rss0 < 64<<20 {
		t.Errorf("peak RSS %d → %d after touching 64 MiB", rss0, rss1)
	}
	if _, err := cpuTime(1 << 30); err == nil {
		t.Error("cpuTime of a pid that does not exist: no error")
	}
}

func TestScrapeSumsMatchingSamples(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `# HELP playpipe_deliveries_total answers
# TYPE playpipe_deliveries_total counter
playpipe_deliveries_total{outcome="delivered",partner="a"} 10
playpipe_deliveries_total{outcome="delivered",partner="b"} 5
playpipe_deliveries_total{outcome="rejected"} 2
playpipe_deliveries_total_other 100
playpipe_events_in_total 7
`)
	}))
	defer srv.Close()
	got, err := scrape(strings.TrimPrefix(srv.URL, "http://"), map[string][]string{
		"playpipe_deliveries_total|delivered": {`outcome="delivered"`},
		"playpipe_deliveries_total|all":       nil,
		"playpipe_events_in_total":            nil,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"playpipe_deliveries_total|delivered": 15, "playpipe_deliveries_total|all": 17, "playpipe_events_in_total": 7}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// selfRusage is this process's user+system CPU time as getrusage reports it.
func selfRusage(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestRoundComparesWithBothNeighbours: a reporter run is compared with the
// mean of the plain runs before and after it.
func TestRoundComparesWithBothNeighbours(t *testing.T) {
	r := reportRound{
		rep:    reportRun{reports: 30000, elapsed: time.Second, cpu: 600 * time.Millisecond},
		before: ceilingResult{posts: 40000, elapsed: time.Second, clientCPU: 800 * time.Millisecond},
		after:  ceilingResult{posts: 20000, elapsed: time.Second, clientCPU: 600 * time.Millisecond},
	}
	if got := r.rateRatio(); got != 1.0 {
		t.Errorf("rate ratio %v, want 1 (30000 against the mean of 40000 and 20000)", got)
	}
	if got := r.cpuRatio(); got != 20.0/25.0 {
		t.Errorf("CPU ratio %v, want 0.8 (20 µs against the mean of 20 and 30 µs)", got)
	}
}

func TestMachineShare(t *testing.T) {
	a := machineCPU{total: 1000, idle: 400, steal: 10}
	b := machineCPU{total: 2000, idle: 500, steal: 60}
	busy, steal := machineShare(a, b)
	if busy != 0.85 || steal != 0.05 {
		t.Errorf("busy %v steal %v, want 0.85 and 0.05", busy, steal)
	}
	if s := sampleMachine(); s.total <= 0 || s.idle < 0 || s.idle > s.total {
		t.Errorf("/proc/stat sample %+v", s)
	}
}

// TestWireParse: the roles' Kafka traffic is read per API from their
// Prometheus exposition, other metrics ignored, and a phase is the
// difference of two scrapes.
func TestWireParse(t *testing.T) {
	const before = `# HELP playpipe_kafka_requests_total x
playpipe_kafka_requests_total{api="Produce",otel_scope_name="k"} 10
playpipe_kafka_requests_total{api="Fetch",otel_scope_name="k"} 3
playpipe_kafka_request_seconds_total{api="Produce",otel_scope_name="k"} 0.05
playpipe_kafka_produced_records_total{otel_scope_name="k"} 100
playpipe_kafka_faults_total{kind="fetch_error"} 7
`
	const after = `playpipe_kafka_requests_total{api="Produce",otel_scope_name="k"} 30
playpipe_kafka_requests_total{api="Fetch",otel_scope_name="k"} 4
playpipe_kafka_requests_total{api="EndTxn",otel_scope_name="k"} 2
playpipe_kafka_request_seconds_total{api="Produce",otel_scope_name="k"} 0.25
playpipe_kafka_produced_records_total{otel_scope_name="k"} 300
playpipe_kafka_produced_batches_total{otel_scope_name="k"} 40
playpipe_kafka_fetched_records_total{otel_scope_name="k"} 500
`
	var w0, w1 wire
	w0.reqs, w0.secs = map[string]float64{}, map[string]float64{}
	w1.reqs, w1.secs = map[string]float64{}, map[string]float64{}
	if err := w0.parse(strings.NewReader(before)); err != nil {
		t.Fatal(err)
	}
	if err := w1.parse(strings.NewReader(after)); err != nil {
		t.Fatal(err)
	}
	d := w1.minus(w0)
	if d.reqs["Produce"] != 20 || d.reqs["Fetch"] != 1 || d.reqs["EndTxn"] != 2 || len(d.reqs) != 3 {
		t.Errorf("requests %v", d.reqs)
	}
	if s := d.secs["Produce"]; s < 0.199 || s > 0.201 {
		t.Errorf("produce seconds %v, want 0.2", s)
	}
	if d.prodRecords != 200 || d.prodBatches != 40 || d.fetchRecords != 500 {
		t.Errorf("records %+v", d)
	}
	var out strings.Builder
	printWire(&out, []roleWire{{"report", d}}, 100)
	if !strings.Contains(out.String(), "| report | 2.0000 ") || !strings.Contains(out.String(), "EndTxn 2 (0.00 ms)") {
		t.Errorf("table:\n%s", out.String())
	}
}

// TestFloorToolOutputs: the rates are read from the summary lines of
// Kafka's ProducerPerformance and ConsumerPerformance (4.1.0's output).
func TestFloorToolOutputs(t *testing.T) {
	prod := "50000 records sent, 10000.0 records/sec (2.86 MB/sec), 5.1 ms avg latency, 300.00 ms max latency.\n" +
		"100000 records sent, 22670.6 records/sec (6.49 MB/sec), 716.44 ms avg latency, 1220.00 ms max latency, 764 ms 50th, 1151 ms 95th, 1209 ms 99th, 1217 ms 99.9th.\n"
	line, rate, err := toolRate(prod, " records sent, ", " records/sec")
	if err != nil || rate != 22670.6 || !strings.HasPrefix(line, "100000 records sent") {
		t.Errorf("producer: %q %v %v", line, rate, err)
	}
	cons := "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec\n" +
		"2026-11-28 15:37:56:926, 2026-11-28 15:38:01:887, 28.6102, 5.7670, 100000, 20157.2264, 3471, 1490, 19.2015, 67114.0940\n"
	if _, rate, err := consumerRate(cons); err != nil || rate != 67114.094 {
		t.Errorf("consumer: %v %v", rate, err)
	}
	if _, _, err := consumerRate("Exception in thread main\n"); err == nil {
		t.Error("no CSV: no error")
	}
	if !isJIT("C CompilerThre") || isJIT("data-plane-kafk") {
		t.Error("isJIT")
	}
}
