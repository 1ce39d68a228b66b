//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// reportRun is one run of the reporter process in -mode report.
type reportRun struct {
	reports    int64         // reports answered in the measured window
	elapsed    time.Duration // first answer seen → every report final
	cpu        time.Duration // the reporter's utime+stime over the window
	cpuTotal   time.Duration // the reporter's utime+stime from its start (start-up, group join included)
	sandboxCPU time.Duration // the sandbox's over the window
	brokerCPU  time.Duration // the broker's over the window: this process for kfake (with its polling of the reporter's metrics), the JVM for Apache Kafka
	rss        int64         // the reporter's peak RSS
	busy       float64       // the machine's CPU busy share over the window
	steal      float64       // the machine's CPU share stolen by the hypervisor
}

func (r reportRun) rate() float64 { return float64(r.reports) / r.elapsed.Seconds() }

// cpuPerReport is the reporter's CPU µs per report over the window.
func (r reportRun) cpuPerReport() float64 { return us(r.cpu) / float64(r.reports) }

// reportRound is one round: the reporter, between two runs of the plain
// client (the one before is the previous round's after). The reporter is
// compared with the mean of its two neighbours: this machine's speed
// drifts by up to a fifth within seconds (the CPU per post of the very
// same client moves with it), and a drift across a round then biases
// neither side.
type reportRound struct {
	rep           reportRun
	before, after ceilingResult
}

func (r reportRound) plainRate() float64 { return (r.before.rate() + r.after.rate()) / 2 }

func (r reportRound) plainCPU() float64 { return (r.before.cpuPerPost() + r.after.cpuPerPost()) / 2 }

func (r reportRound) rateRatio() float64 { return r.rep.rate() / r.plainRate() }

func (r reportRound) cpuRatio() float64 { return r.rep.cpuPerReport() / r.plainCPU() }

// reportResult is what -mode report measured.
type reportResult struct {
	started time.Time
	rounds  []reportRound
}

// runReportBench is -mode report: the reporter as a process against a plain
// net/http client, on the same play reports, the same sandbox process and
// the same number in flight. It starts the broker and `playpipe sandbox
// --lean` once; then, per round, (a) fills a fresh reports topic (a new
// topic prefix per round, so a fresh deliveries topic too) with the
// -reports pre-enriched TrackPlay records, resets the sandbox's ledger and
// runs a fresh `playpipe report` process in a new group until every report
// has a final answer, checking afterwards that the group committed every
// offset and that the partner accepted each report once; (b) resets the
// ledger and lets the plain client post the same report bodies byte for
// byte (it also runs once before the first round: each reporter run is
// compared with the plain runs on either side). The reporter's window
// starts at its first answer (start-up and group join excluded; its CPU
// from process start is shown apart).
func runReportBench(ctx context.Context, o options, log *slog.Logger) (res reportResult, err error) {
	res.started = time.Now()
	e, err := newEnv(o, log)
	if err != nil {
		return res, err
	}
	defer func() { e.close(err != nil) }()
	sb, err := e.startSandbox()
	if err != nil {
		return res, err
	}
	keys, values, bodies := benchPlays(o.reports)
	log.Info("broker and sandbox up", "reports", o.reports, "rounds", o.rounds, "concurrency", o.concurrency, "dir", e.dir)
	before, err := ceiling(ctx, sb.url, sb.admin, sb.c.pid(), bodies, o.concurrency, sandboxFaults{})
	if err != nil {
		return res, fmt.Errorf("plain client before round 1: %w", err)
	}
	for r := range o.rounds {
		prefix := "bench-report-" + strconv.Itoa(r+1)
		if err := e.fill(ctx, prefix, keys, values); err != nil {
			return res, err
		}
		round := reportRound{before: before}
		if round.rep, err = e.reporterRound(ctx, sb, prefix, r == 0); err != nil {
			return res, fmt.Errorf("round %d, reporter: %w", r+1, err)
		}
		if round.after, err = ceiling(ctx, sb.url, sb.admin, sb.c.pid(), bodies, o.concurrency, sandboxFaults{}); err != nil {
			return res, fmt.Errorf("round %d, plain client: %w", r+1, err)
		}
		before = round.after
		res.rounds = append(res.rounds, round)
		log.Info("round done", "round", r+1, "reporter_per_s", int(round.rep.rate()), "plain_per_s", int(round.plainRate()),
			"rate_ratio", fmt.Sprintf("%.3f", round.rateRatio()), "cpu_ratio", fmt.Sprintf("%.3f", round.cpuRatio()))
	}
	return res, nil
}

// benchPlays returns n distinct valid play reports: the TrackPlay records'
// keys and values, and the report bodies they carry (what the reporter
// posts, byte for byte).
func benchPlays(n int) (keys, values, bodies [][]byte) {
	keys, values, bodies, _ = poisonPlays(n, 0)
	return keys, values, bodies
}

// poisonTrack is the track whose every report the sandbox answers 500 in a
// -poison-share round.
const poisonTrack = 666

// poisonPlays is benchPlays with a share of the reports (spread evenly:
// every 1/share-th) of poisonTrack instead of the bench track; others are
// the bodies of the rest, for the plain client, which drops a poisoned
// report at once.
func poisonPlays(n int, share float64) (keys, values, bodies, others [][]byte) {
	every := 0
	if share > 0 {
		every = max(1, int(1/share+0.5))
	}
	now := time.Now().UnixMilli()
	for i := range n {
		ev := "bench-report-" + strconv.Itoa(i)
		id := schemas.ReportID(ev, 0)
		track := int64(1001)
		if every > 0 && i%every == every/2 {
			track = poisonTrack
		}
		tp := schemas.TrackPlay{
			V: schemas.TrackPlayVersion, ReportID: id, EventID: ev, MixID: 1, OverlapMS: 65_000, DerivedAt: now,
			Report: schemas.PlayReport{
				TrackID: track, PlayedAt: 1_700_000_000_000 + int64(i), PlayLength: 65, SourceStream: "mix",
				SourceDetail: "Bench mix", OS: "android 14", Device: "phone", Country: "DE", Vendor: 7, UserID: id,
			},
		}
		v, _ := json.Marshal(tp)
		b, _ := json.Marshal(tp.Report)
		keys, values, bodies = append(keys, []byte(id)), append(values, v), append(bodies, b)
		if track != poisonTrack {
			others = append(others, b)
		}
	}
	return keys, values, bodies, others
}

// fill creates the topics of prefix and produces the records to its
// reports topic (not measured).
func (e *env) fill(ctx context.Context, prefix string, keys, values [][]byte) error {
	cfg := kafkax.Config{Brokers: e.addrs, TopicPrefix: prefix, Partitions: e.o.partitions, ReplicationFactor: -1}
	if err := kafkax.EnsureTopics(ctx, cfg); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...), kgo.DefaultProduceTopic(cfg.Topics().Reports),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	const batch = 5000
	recs := make([]*kgo.Record, 0, batch)
	for i := 0; i < len(keys); i += batch {
		recs = recs[:0]
		for j := i; j < min(i+batch, len(keys)); j++ {
			recs = append(recs, &kgo.Record{Key: keys[j], Value: values[j]})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("fill %s: %w", cfg.Topics().Reports, err)
		}
	}
	return nil
}

// reporterRound resets the sandbox's ledger, runs a fresh reporter on the
// reports topic of prefix until every report is final, and checks the
// outcome: every offset committed, every report accepted once.
func (e *env) reporterRound(ctx context.Context, p partner, prefix string, profile bool) (reportRun, error) {
	var run reportRun
	n := int64(e.o.reports)
	if err := adminPost(ctx, &http.Client{Timeout: 10 * time.Second}, "http://"+p.admin+"/admin/reset", "", nil); err != nil {
		return run, err
	}
	group := prefix + "-reporter"
	args := append(append([]string{"report"}, e.kafkaArgs()...), "--topic-prefix", prefix, "--group", group,
		"--api-url", p.url, "--concurrency", strconv.Itoa(e.o.concurrency),
		// The plain client's in flight, fixed: like is compared with like
		// (-mode latency runs the adaptive limit).
		"--max-concurrency", strconv.Itoa(e.o.concurrency))
	if profile && e.o.profile != "" {
		args = append(args, "--pprof")
	}
	rl, err := e.startRole(prefix+"-report", args...)
	if err != nil {
		return run, err
	}
	defer rl.c.stop(10 * time.Second)
	w, err := waitFinal(ctx, rl, p, e.brokerPID, n, e.o.timeout, profile && e.o.profile != "", e.o.profile)
	if err != nil {
		return run, err
	}
	run = w
	if run.rss, err = peakRSS(rl.c.pid()); err != nil {
		return run, err
	}
	if err := waitCommitted(ctx, e.addrs, group, kafkax.TopicsFor(prefix).Reports); err != nil {
		return run, err
	}
	return run, checkPartner(ctx, p.admin, n)
}

// waitFinal polls the reporter's metrics until n reports are final (the
// window opens at the first answer seen) and measures the window. With
// profile, a CPU profile of the window's first 3 s goes to file.
func waitFinal(ctx context.Context, rl *role, p partner, brokerPID int, n int64, timeout time.Duration, profile bool, file string) (reportRun, error) {
	var run reportRun
	pid := rl.c.pid()
	deadline := time.Now().Add(timeout)
	var t0 time.Time
	var cpu0, sb0, br0 time.Duration
	var m0 machineCPU
	var d0 int64
	var profDone chan error
	for {
		if err := ctx.Err(); err != nil {
			return run, err
		}
		if !rl.c.running() {
			return run, fmt.Errorf("report exited during the run (%v); log %s:\n%s", rl.c.err, rl.c.log, rl.c.tail(20))
		}
		final, err := finalAnswers(rl.admin)
		now := time.Now()
		switch {
		case err != nil || final == 0:
		case t0.IsZero():
			t0, d0, cpu0, sb0, br0, m0 = now, final, cpuOf(pid), cpuOf(p.c.pid()), cpuOf(brokerPID), sampleMachine()
			if profile {
				profDone = make(chan error, 1)
				go func() { profDone <- fetchProfile(rl.admin, "profile?seconds=3", file) }() // owner: this round; waited for below
			}
		case final >= n:
			run.elapsed, run.reports = now.Sub(t0), final-d0
			run.cpu, run.cpuTotal, run.sandboxCPU, run.brokerCPU = cpuOf(pid)-cpu0, cpuOf(pid), cpuOf(p.c.pid())-sb0, cpuOf(brokerPID)-br0
			run.busy, run.steal = machineShare(m0, sampleMachine())
			if profDone != nil {
				if err := <-profDone; err != nil {
					return run, err
				}
				// The allocations since the process started (sampled).
				if err := fetchProfile(rl.admin, "allocs", file+".allocs"); err != nil {
					return run, err
				}
			}
			return run, nil
		}
		if now.After(deadline) {
			return run, fmt.Errorf("the reporter did not answer %d reports within -timeout %s (last: %d, %v)", n, timeout, final, err)
		}
		// Scraping costs the reporter CPU (the exposition): often enough
		// to see the first answer, then every 50 ms.
		if t0.IsZero() {
			time.Sleep(10 * time.Millisecond)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// finalAnswers is the reporter's count of final answers (delivered and
// rejected) from its metrics.
func finalAnswers(admin string) (int64, error) {
	m, err := scrape(admin, map[string][]string{
		"playpipe_deliveries_total|delivered": {`outcome="delivered"`},
		"playpipe_deliveries_total|rejected":  {`outcome="rejected"`},
	})
	if err != nil {
		return 0, err
	}
	return int64(m["playpipe_deliveries_total|delivered"] + m["playpipe_deliveries_total|rejected"]), nil
}

// fetchProfile writes /debug/pprof/<which> of the process behind admin to
// file.
func fetchProfile(admin, which, file string) error {
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + admin + "/debug/pprof/" + which)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("cpu profile: %s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("cpu profile: %w", err)
	}
	return f.Close()
}

// waitCommitted waits until group has committed the end offset of every
// partition of topic.
func waitCommitted(ctx context.Context, brokers []string, group, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return fmt.Errorf("end offsets of %s: %w", topic, err)
		}
		com, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return fmt.Errorf("committed offsets of %s: %w", group, err)
		}
		behind := int64(0)
		ends.Each(func(o kadm.ListedOffset) {
			c, ok := com.Lookup(topic, o.Partition)
			if !ok {
				behind += o.Offset
				return
			}
			behind += max(0, o.Offset-c.At)
		})
		if behind == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("group %s: %d records of %s not committed 30 s after the last answer", group, behind, topic)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// print writes the rounds and their medians (Markdown).
func (r reportResult) print(w io.Writer, o options) {
	fmt.Fprintf(w, "\nplaypipe reporter vs plain client, as processes, %s, %s; %d reports per run, --concurrency %d, %d partitions; %s\n\n",
		r.started.Format("2006-01-02 15:04"), runtimeDesc(), o.reports, o.concurrency, o.partitions, brokerDesc(o))
	fmt.Fprintln(w, "| round | reporter reports/s | plain posts/s before / after | rate ratio | reporter CPU µs/report (from start) | plain CPU µs/post before / after | CPU ratio | sandbox µs/post rep / plain after | broker µs/report | machine busy % rep / plain after | steal % rep / plain after | reporter peak RSS MiB |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var rates, cpus []float64
	for i, x := range r.rounds {
		fmt.Fprintf(w, "| %d | %.0f | %.0f / %.0f | %.1f %% | %.1f (%.1f) | %.1f / %.1f | %.1f %% | %.1f / %.1f | %.1f | %.0f / %.0f | %.1f / %.1f | %.0f |\n", i+1,
			x.rep.rate(), x.before.rate(), x.after.rate(), 100*x.rateRatio(),
			x.rep.cpuPerReport(), us(x.rep.cpuTotal)/float64(o.reports), x.before.cpuPerPost(), x.after.cpuPerPost(),
			100*x.cpuRatio(), us(x.rep.sandboxCPU)/float64(x.rep.reports), us(x.after.sandboxCPU)/float64(x.after.posts),
			us(x.rep.brokerCPU)/float64(x.rep.reports), 100*x.rep.busy, 100*x.after.busy, 100*x.rep.steal, 100*x.after.steal, float64(x.rep.rss)/(1<<20))
		rates, cpus = append(rates, x.rateRatio()), append(cpus, x.cpuRatio())
	}
	fmt.Fprintf(w, "| **median** | | | **%.1f %%** | | | **%.1f %%** | | | | | |\n", 100*median(rates), 100*median(cpus))
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
