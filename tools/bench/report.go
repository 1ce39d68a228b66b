//go:build linux

package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
)

var selfPID = os.Getpid()

// print writes the run's table (Markdown, so that it can go into the
// README as it is).
func (r result) print(w io.Writer, o options) {
	plays := float64(r.posted)
	rate := plays / r.elapsed.Seconds()
	c := r.ceiling
	fmt.Fprintf(w, "\nplaypipe end-to-end benchmark, %s, %s\n", r.started.Format("2006-01-02 15:04"), runtimeDesc())
	fmt.Fprintf(w, "%d events → %d plays derived, %d delivered (the partner accepted each once), every delivery in the ledger; --concurrency %d%s, %d partitions; %s\n\n",
		r.events, r.plays, r.posted, o.concurrency, strings.TrimRight(" "+o.reportArgs, " "), o.partitions, brokerDesc(o))
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| process\t CPU µs per play\t CPU, % of one core\t peak RSS MiB\t")
	fmt.Fprintln(tw, "|---\t---:\t---:\t---:\t")
	var pipeline time.Duration
	for _, p := range r.procs {
		fmt.Fprintf(tw, "| %s\t %.1f\t %.0f %%\t %.0f\t\n", p.name, us(p.cpu)/plays, 100*p.cpu.Seconds()/r.elapsed.Seconds(), float64(p.rss)/(1<<20))
		switch p.name {
		case "consume", "report", "sink":
			pipeline += p.cpu
		}
	}
	fmt.Fprintf(tw, "| roles (consume + report + sink)\t %.1f\t %.0f %%\t \t\n", us(pipeline)/plays, 100*pipeline.Seconds()/r.elapsed.Seconds())
	tw.Flush()
	fmt.Fprintf(w, "\n| measure | figure |\n|---|---:|\n")
	fmt.Fprintf(w, "| pipeline: plays/s end to end (first event published → last delivery in the ledger) | %.0f plays/s (%d in %s) |\n", rate, r.posted, r.elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "| raw HTTP ceiling: plain net/http client, same bodies, same sandbox, %d in flight | %.0f posts/s (%d in %s) |\n", o.concurrency, c.rate(), c.posts, c.elapsed.Round(time.Millisecond))
	if wu := r.warmup; wu != nil && wu.elapsed > 0 {
		fmt.Fprintf(w, "| warm-up round before, not measured otherwise (-warmup) | %.0f plays/s (%d in %s) |\n", float64(wu.posted)/wu.elapsed.Seconds(), wu.posted, wu.elapsed.Round(time.Millisecond))
	}
	if r.brokerIdle > 0 {
		fmt.Fprintf(w, "| the broker idle (every role up, nothing published; -idle): CPU, %% of one core; the same over this run, µs per play | %.1f %%; %.1f µs |\n", 100*r.brokerIdle, r.brokerIdle*float64(r.elapsed.Microseconds())/plays)
	}
	fmt.Fprintf(w, "| stages done, since the first event (the ledger at the end) | %s |\n", r.marks)
	fmt.Fprintf(w, "| the reporter's gauges, mean over its backlog (every event enriched) | %s |\n", r.gauges)
	fmt.Fprintf(w, "| pipeline / ceiling | %.1f %% |\n", 100*rate/c.rate())
	fmt.Fprintf(w, "| plain client CPU µs per post (sandbox µs per post) | %.1f (%.1f) |\n", us(c.clientCPU)/float64(c.posts), us(c.sandboxCPU)/float64(c.posts))
	printWire(w, r.wire, plays)
	printThreads(w, "broker", "µs per play", r.brokerThreads0, r.brokerThreads1, plays)
	printIdle(w, r.idleWire, o.idle.Seconds())
	printThreads(w, "broker idle", "% of one core", r.idleThreads0, r.idleThreads1, 1e4*o.idle.Seconds())
	printBrokerProfile(w, r, plays)
	printFloor(w, r)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// runtimeDesc is the machine's CPU count and the Go version.
func runtimeDesc() string {
	return fmt.Sprintf("%d CPUs, %s", runtime.NumCPU(), runtime.Version())
}
