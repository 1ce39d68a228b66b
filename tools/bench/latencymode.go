//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/reporter"
)

// latencyRun is one reporter run of -mode latency: a fresh `playpipe
// report` process with its default flags on a backlog of -reports, against
// the sandbox answering after the latency.
type latencyRun struct {
	latency   time.Duration
	errRate   float64       // share of posts the sandbox answers 500
	poisoned  int64         // reports of the poison track (answered 500 every time), not counted in reports
	hang      bool          // the poison track is held past the reporter's timeout first
	holdRate  float64       // share of all posts held past the reporter's timeout at random
	injected  int64         // 500s the sandbox injected into the reporter's posts
	inflight  int           // the plain client's in flight
	plain     ceilingResult // the plain client before the reporter
	after     ceilingResult // and after it (zero when not run)
	reports   int64
	overall   float64       // reports/s, first answer → all final
	steady    float64       // reports/s between half and nine tenths of the reports
	toSteady  time.Duration // process start → a 1 s rate ≥ 90 % of steady
	toPlain   time.Duration // process start → a 1 s rate ≥ 90 % of the plain client's (-1: never)
	allFinal  time.Duration // first answer → every report final
	peakPosts float64       // most posts in flight seen (playpipe_reporter_posts_in_flight)
	peakLimit float64       // highest in-flight limit seen
	meanPosts float64       // mean posts in flight over the steady window
	cpu       time.Duration // the reporter's CPU over first answer → all final
}

// latencySample is one scrape of the reporter during a latency run.
type latencySample struct {
	at           time.Time
	final        float64
	posts, limit float64
}

// parseLatencies parses -latencies ("0,5ms,50ms,150ms") and -plain-inflight
// ("512,512,512,1024"; one value applies to all).
// plainRate is the plain client's rate: the mean of its runs before and
// after the reporter (this machine's speed drifts within seconds).
// With posts held at random, the rates between half and nine tenths of
// the reports final, the reporter's steady window: every report's
// delivery waits for the held ones' timeouts and retries.
func (lr latencyRun) plainRate() float64 {
	rate := ceilingResult.rate
	if lr.holdRate > 0 {
		rate = ceilingResult.steadyRate
	}
	if lr.after.posts == 0 {
		return rate(lr.plain)
	}
	return (rate(lr.plain) + rate(lr.after)) / 2
}

// plainCPU is the plain client's CPU µs per post, likewise.
func (lr latencyRun) plainCPU() float64 {
	if lr.after.posts == 0 {
		return lr.plain.cpuPerPost()
	}
	return (lr.plain.cpuPerPost() + lr.after.cpuPerPost()) / 2
}

func parseLatencies(lat, inflight string) ([]time.Duration, []int, error) {
	var ls []time.Duration
	for s := range strings.SplitSeq(lat, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < 0 || d > 5*time.Minute {
			return nil, nil, fmt.Errorf("-latencies: %q is not a duration of 0–5m", s)
		}
		ls = append(ls, d)
	}
	var ns []int
	for s := range strings.SplitSeq(inflight, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 4096 {
			return nil, nil, fmt.Errorf("-plain-inflight: %q is not a count of 1–4096", s)
		}
		ns = append(ns, n)
	}
	switch {
	case len(ns) == 1:
		for len(ns) < len(ls) {
			ns = append(ns, ns[0])
		}
	case len(ns) != len(ls):
		return nil, nil, fmt.Errorf("-plain-inflight: %d values for %d latencies", len(ns), len(ls))
	}
	return ls, ns, nil
}

// runLatencyBench is -mode latency: per latency and error rate, the
// sandbox answers every report after the latency and the share error rate
// of the posts 500 (seeded with -seed); a plain net/http client posts the
// -reports bodies with its in flight (Little's bound: in flight / latency),
// retrying a 500 with the reporter's default backoff, then a fresh reporter
// process with DEFAULT flags (no --concurrency: the adaptive limit has to
// find the in-flight itself) drains a backlog of the same reports.
func runLatencyBench(ctx context.Context, o options, log *slog.Logger) (runs []latencyRun, started time.Time, err error) {
	started = time.Now()
	lats, ins, err := parseLatencies(o.latencies, o.plainInflight)
	if err != nil {
		return nil, started, err
	}
	rates, err := parseErrorRates(o.errorRates)
	if err != nil {
		return nil, started, err
	}
	e, err := newEnv(o, log)
	if err != nil {
		return nil, started, err
	}
	defer func() { e.close(err != nil) }()
	sb, err := e.startSandbox()
	if err != nil {
		return nil, started, err
	}
	keys, values, bodies := benchPlays(o.reports)
	pkeys, pvalues, _, pothers := poisonPlays(o.reports, o.poisonShare)
	hkeys, hvalues, _, hothers := poisonPlays(o.reports, o.hangShare)
	k := 0
	for i, lat := range lats {
		type round struct {
			rate     float64
			poison   bool
			hang     bool
			holdRate float64
		}
		var rounds []round
		for _, rate := range rates {
			rounds = append(rounds, round{rate: rate})
		}
		if o.poisonShare > 0 {
			rounds = append(rounds, round{poison: true})
		}
		if o.hangShare > 0 {
			rounds = append(rounds, round{poison: true, hang: true})
		}
		if o.holdRate > 0 {
			rounds = append(rounds, round{holdRate: o.holdRate})
		}
		for _, rd := range rounds {
			k++
			lr := latencyRun{latency: lat, errRate: rd.rate, inflight: ins[i], hang: rd.hang, holdRate: rd.holdRate}
			sf := sandboxFaults{latency: lat, rate500: rd.rate, seed: uint64(o.seed), poison: rd.poison}
			what := fmt.Sprintf("latency %v, error rate %v", lat, rd.rate)
			rk, rv, rb := keys, values, bodies
			switch {
			case rd.hang:
				// The same for a track the sandbox holds past the reporter's
				// timeout.
				rk, rv, rb = hkeys, hvalues, hothers
				lr.poisoned = int64(len(hkeys) - len(hothers))
				sf.hold = o.hangHold
				what = fmt.Sprintf("latency %v, hanging track (%d reports held %v)", lat, lr.poisoned, o.hangHold)
			case rd.holdRate > 0:
				// The share of all posts held past the timeout at random: the
				// plain client with the reporter's in-flight cap, timeout and
				// retries (plainTimeout, plainRetry), so that both wait out the
				// same held posts.
				sf.holdRate, sf.hold = rd.holdRate, o.hangHold
				lr.inflight = reporter.DefaultMaxConcurrency
				what = fmt.Sprintf("latency %v, %v of posts held %v at random", lat, rd.holdRate, o.hangHold)
			case rd.poison:
				// The plain client drops the poisoned reports at once: it posts
				// the others only, the rate a reporter that parks could reach.
				rk, rv, rb = pkeys, pvalues, pothers
				lr.poisoned = int64(len(pkeys) - len(pothers))
				what = fmt.Sprintf("latency %v, poison track (%d reports)", lat, lr.poisoned)
			}
			if lr.plain, err = ceiling(ctx, sb.url, sb.admin, sb.c.pid(), rb, lr.inflight, sf); err != nil {
				return runs, started, fmt.Errorf("%s, plain client: %w", what, err)
			}
			prefix := "bench-latency-" + strconv.Itoa(k)
			if err := e.fill(ctx, prefix, rk, rv); err != nil {
				return runs, started, err
			}
			if err := e.latencyRound(ctx, sb, prefix, sf, &lr); err != nil {
				return runs, started, fmt.Errorf("%s, reporter: %w", what, err)
			}
			if lr.after, err = ceiling(ctx, sb.url, sb.admin, sb.c.pid(), rb, lr.inflight, sf); err != nil {
				return runs, started, fmt.Errorf("%s, plain client after the reporter: %w", what, err)
			}
			runs = append(runs, lr)
			log.Info("latency done", "latency", lat, "error_rate", rd.rate, "poisoned", lr.poisoned, "plain_per_s", int(lr.plainRate()), "reporter_steady_per_s", int(lr.steady),
				"plain_retried", lr.plain.retried, "reporter_500s", lr.injected,
				"peak_in_flight", lr.peakPosts, "to_steady", lr.toSteady.Round(100*time.Millisecond))
		}
	}
	return runs, started, nil
}

// latencyRound runs a reporter with default flags until every report of
// prefix is final (but lr.poisoned reports of the poison track, which the
// sandbox never takes), the sandbox with the faults sf, sampling its
// metrics every 250 ms.
func (e *env) latencyRound(ctx context.Context, p partner, prefix string, sf sandboxFaults, lr *latencyRun) error {
	n := float64(int64(e.o.reports) - lr.poisoned)
	if err := adminPost(ctx, &http.Client{Timeout: 10 * time.Second}, "http://"+p.admin+"/admin/reset", "", nil); err != nil {
		return err
	}
	if err := setFaults(ctx, p.admin, sf); err != nil { // the reset cleared them
		return err
	}
	group := prefix + "-reporter"
	args := append(append([]string{"report"}, e.kafkaArgs()...), "--topic-prefix", prefix, "--group", group, "--api-url", p.url)
	args = append(args, strings.Fields(e.o.reportArgs)...)
	if e.o.profile != "" {
		args = append(args, "--pprof")
	}
	var profDone chan error
	t0 := time.Now()
	rl, err := e.startRole(prefix+"-report", args...)
	if err != nil {
		return err
	}
	defer rl.c.stop(10 * time.Second)
	var samples []latencySample
	var cpu0 time.Duration
	deadline := time.Now().Add(e.o.timeout)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !rl.c.running() {
			return fmt.Errorf("report exited during the run (%v); log %s:\n%s", rl.c.err, rl.c.log, rl.c.tail(20))
		}
		m, err := scrape(rl.admin, map[string][]string{
			"playpipe_deliveries_total|delivered": {`outcome="delivered"`},
			"playpipe_deliveries_total|rejected":  {`outcome="rejected"`},
			"playpipe_reporter_posts_in_flight":   nil,
			"playpipe_reporter_concurrency_limit": nil,
		})
		now := time.Now()
		if err == nil {
			s := latencySample{at: now, final: m["playpipe_deliveries_total|delivered"] + m["playpipe_deliveries_total|rejected"],
				posts: m["playpipe_reporter_posts_in_flight"], limit: m["playpipe_reporter_concurrency_limit"]}
			if s.final > 0 && (len(samples) == 0 || samples[len(samples)-1].final == 0) {
				cpu0 = cpuOf(rl.c.pid())
			}
			samples = append(samples, s)
			if e.o.profile != "" && profDone == nil && s.final >= n/3 {
				// A 3 s CPU profile of the steady state, with its trace.
				profDone = make(chan error, 1)
				file := fmt.Sprintf("%s.%v", e.o.profile, lr.latency)
				go func() { profDone <- fetchProfile(rl.admin, "profile?seconds=3", file) }() // owner: this round; waited for below
			}
			if s.final >= n {
				if profDone != nil {
					if err := <-profDone; err != nil {
						return err
					}
				}
				lr.cpu = cpuOf(rl.c.pid()) - cpu0
				break
			}
		}
		if now.After(deadline) {
			return fmt.Errorf("the reporter did not answer %d reports within -timeout %s", e.o.reports, e.o.timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
	lr.summarize(t0, samples, n)
	// With a poison track, the commit points stay at its reports, retried
	// until the reporter parks them (--park-after-attempts, --park-after):
	// beyond a bench round's time. The partner's count below still proves
	// every other report was delivered once.
	if lr.poisoned == 0 {
		if err := waitCommitted(ctx, e.addrs, group, kafkax.TopicsFor(prefix).Reports); err != nil {
			return err
		}
	}
	if err := checkPartner(ctx, p.admin, int64(n)); err != nil {
		return err
	}
	lr.injected, err = injectedCount(ctx, p.admin)
	return err
}

// summarize computes the run's figures from its samples.
func (lr *latencyRun) summarize(t0 time.Time, s []latencySample, n float64) {
	lr.reports = int64(n)
	// crossing is when the final count first reached v (interpolated).
	crossing := func(v float64) time.Time {
		for i := 1; i < len(s); i++ {
			if s[i].final >= v {
				a, b := s[i-1], s[i]
				if b.final == a.final {
					return b.at
				}
				f := (v - a.final) / (b.final - a.final)
				return a.at.Add(time.Duration(f * float64(b.at.Sub(a.at))))
			}
		}
		return s[len(s)-1].at
	}
	first := crossing(1)
	lr.allFinal = s[len(s)-1].at.Sub(first)
	lr.overall = n / lr.allFinal.Seconds()
	from, to := crossing(0.5*n), crossing(0.9*n)
	lr.steady = 0.4 * n / to.Sub(from).Seconds()
	var sum, k float64
	for _, x := range s {
		if !x.at.Before(from) && !x.at.After(to) {
			sum, k = sum+x.posts, k+1
		}
	}
	if k > 0 {
		lr.meanPosts = sum / k
	}
	lr.toSteady, lr.toPlain = -1, -1
	for i := range s {
		lr.peakPosts, lr.peakLimit = max(lr.peakPosts, s[i].posts), max(lr.peakLimit, s[i].limit)
		// The rate over the last second up to sample i.
		j := i
		for j > 0 && s[i].at.Sub(s[j].at) < time.Second {
			j--
		}
		if j == i || s[i].at.Sub(s[j].at) < 900*time.Millisecond {
			continue
		}
		r := (s[i].final - s[j].final) / s[i].at.Sub(s[j].at).Seconds()
		if lr.toSteady < 0 && r >= 0.9*lr.steady {
			lr.toSteady = s[i].at.Sub(t0)
		}
		if lr.toPlain < 0 && r >= 0.9*lr.plainRate() {
			lr.toPlain = s[i].at.Sub(t0)
		}
	}
}

// printLatency writes the runs (Markdown).
func printLatency(w io.Writer, o options, runs []latencyRun, started time.Time) {
	flags := "default flags"
	if o.reportArgs != "" {
		flags = o.reportArgs
	}
	fmt.Fprintf(w, "\nplaypipe reporter (%s) vs plain client by partner latency, as processes, %s, %s; %d reports per run, %d partitions; %s\n\n",
		flags, started.Format("2006-01-02 15:04"), runtimeDesc(), o.reports, o.partitions, brokerDesc(o))
	fmt.Fprintln(w, "| partner latency | posts answered 500 | plain in flight | Little's bound /s | plain reports/s before / after | reporter steady reports/s | ratio to the plain mean | reporter overall reports/s | reporter in flight: steady mean / peak (peak limit) | start → steady | start → 90 % of plain | CPU µs/report rep / plain | 500s retried: plain before / reporter / plain after |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		little := "∞"
		if r.latency > 0 {
			little = fmt.Sprintf("%.0f", float64(r.inflight)/r.latency.Seconds())
		}
		toPlain := "never"
		if r.toPlain >= 0 {
			toPlain = r.toPlain.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(w, "| %v | %s | %d | %s | %.0f / %.0f | %.0f | %.1f %% | %.0f | %.0f / %.0f (%.0f) | %v | %s | %.1f / %.1f | %d / %d / %d |\n",
			r.latency, faultDesc(r), r.inflight, little, r.plain.rate(), r.after.rate(), r.steady, 100*r.steady/r.plainRate(), r.overall,
			r.meanPosts, r.peakPosts, r.peakLimit, r.toSteady.Round(100*time.Millisecond), toPlain,
			us(r.cpu)/float64(r.reports), r.plainCPU(), r.plain.retried, r.injected, r.after.retried)
	}
}

// faultDesc is a run's fault, for the table: the share of posts answered
// 500, or the poison track's reports.
func faultDesc(r latencyRun) string {
	if r.holdRate > 0 {
		return strconv.FormatFloat(100*r.holdRate, 'g', -1, 64) + " % of all posts held past the timeout at random"
	}
	if r.hang {
		return fmt.Sprintf("every post of track %d held past the timeout (%d reports, not counted)", poisonTrack, r.poisoned)
	}
	if r.poisoned > 0 {
		return fmt.Sprintf("every post of track %d (%d reports, not counted)", poisonTrack, r.poisoned)
	}
	return strconv.FormatFloat(100*r.errRate, 'g', -1, 64) + " %"
}

// printPoison writes, per latency with a poison round and a round without
// faults, the other reports' rate against the no-fault round (Markdown).
func printPoison(w io.Writer, runs []latencyRun) {
	clean := map[time.Duration]latencyRun{}
	for _, r := range runs {
		if r.poisoned == 0 && r.errRate == 0 && r.holdRate == 0 {
			clean[r.latency] = r
		}
	}
	header := false
	for _, r := range runs {
		c, ok := clean[r.latency]
		if r.poisoned == 0 || !ok {
			continue
		}
		if !header {
			fmt.Fprint(w, "\nA poison track: the other reports' steady rate with every post of one track answered 500 (or held past the reporter's timeout first: hang), against the round with no fault at the same latency\n\n")
			fmt.Fprintln(w, "| partner latency | fault | poison reports | other reports | reporter steady reports/s: no fault / poison | poison / no fault | plain client (drops the poison) reports/s | reporter / plain | poison posts answered 500 |")
			fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|")
			header = true
		}
		kind := "500"
		if r.hang {
			kind = "hang"
		}
		fmt.Fprintf(w, "| %v | %s | %d | %d | %.0f / %.0f | %.1f %% | %.0f | %.1f %% | %d |\n",
			r.latency, kind, r.poisoned, r.reports, c.steady, r.steady, 100*r.steady/c.steady, r.plainRate(), 100*r.steady/r.plainRate(), r.injected)
	}
}

// printHold writes the rounds with posts held at random: the reporter's
// steady rate against the plain client's with the same in-flight cap,
// timeout and retries, and how long each took until every report was
// delivered (Markdown).
func printHold(w io.Writer, runs []latencyRun) {
	header := false
	for _, r := range runs {
		if r.holdRate == 0 {
			continue
		}
		if !header {
			fmt.Fprint(w, "\nPosts held past the reporter's timeout at random (any track; a retry drawn again): every report delivered once by both; the plain client with the reporter's in-flight cap, --api-timeout and retries; rates between half and nine tenths of the reports final\n\n")
			fmt.Fprintln(w, "| partner latency | posts held | plain in flight | plain reports/s before / after | reporter steady reports/s | reporter / plain | every report delivered: plain before / reporter / plain after | retried: plain before / reporter held / plain after |")
			fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|")
			header = true
		}
		fmt.Fprintf(w, "| %v | %s %% | %d | %.0f / %.0f | %.0f | %.1f %% | %v / %v / %v | %d / %d / %d |\n",
			r.latency, strconv.FormatFloat(100*r.holdRate, 'g', -1, 64), r.inflight, r.plain.steadyRate(), r.after.steadyRate(), r.steady, 100*r.steady/r.plainRate(),
			r.plain.elapsed.Round(100*time.Millisecond), r.allFinal.Round(100*time.Millisecond), r.after.elapsed.Round(100*time.Millisecond),
			r.plain.retried, r.injected, r.after.retried)
	}
}
