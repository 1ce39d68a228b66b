//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// wire is one role's Kafka traffic as its playpipe_kafka_* metrics say it
// (kafkax.Wire: franz-go hooks in every client of the role).
type wire struct {
	reqs, secs                 map[string]float64 // per API (Produce, Fetch, EndTxn, …)
	prodBatches, prodRecords   float64
	fetchBatches, fetchRecords float64
}

// scrapeWire reads a role's Kafka traffic counters from its /metrics.
func scrapeWire(addr string) (wire, error) {
	w := wire{reqs: map[string]float64{}, secs: map[string]float64{}}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: scrapeTransport}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return w, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return w, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	return w, w.parse(resp.Body)
}

// parse adds the playpipe_kafka_* traffic lines of a Prometheus text
// exposition to w.
func (w *wire) parse(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "playpipe_kafka_") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return fmt.Errorf("metrics line %q: %w", line, err)
		}
		name, labels, _ := strings.Cut(fields[0], "{")
		api := ""
		if _, rest, ok := strings.Cut(labels, `api="`); ok {
			api, _, _ = strings.Cut(rest, `"`)
		}
		switch name {
		case "playpipe_kafka_requests_total":
			w.reqs[api] += v
		case "playpipe_kafka_request_seconds_total":
			w.secs[api] += v
		case "playpipe_kafka_produced_batches_total":
			w.prodBatches += v
		case "playpipe_kafka_produced_records_total":
			w.prodRecords += v
		case "playpipe_kafka_fetched_batches_total":
			w.fetchBatches += v
		case "playpipe_kafka_fetched_records_total":
			w.fetchRecords += v
		}
	}
	return sc.Err()
}

// minus is w's traffic since before.
func (w wire) minus(before wire) wire {
	d := wire{reqs: map[string]float64{}, secs: map[string]float64{},
		prodBatches: w.prodBatches - before.prodBatches, prodRecords: w.prodRecords - before.prodRecords,
		fetchBatches: w.fetchBatches - before.fetchBatches, fetchRecords: w.fetchRecords - before.fetchRecords}
	for k, v := range w.reqs {
		d.reqs[k] = v - before.reqs[k]
		d.secs[k] = w.secs[k] - before.secs[k]
	}
	return d
}

// commitAPIs are the offset commits: a group's own and a transaction's.
var commitAPIs = []string{"OffsetCommit", "TxnOffsetCommit"}

// roleWire is a role's traffic over the pipeline phase.
type roleWire struct {
	role string
	w    wire
}

// scrapeRolesWire reads the traffic counters of every role, in table order.
func scrapeRolesWire(roles map[string]*role) ([]roleWire, error) {
	var out []roleWire
	for _, n := range []string{"consume", "report", "sink"} {
		w, err := scrapeWire(roles[n].admin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		out = append(out, roleWire{n, w})
	}
	return out, nil
}

// printWire writes the roles' Kafka traffic per play: records and
// requests, and the mean wait of the requests a play waits on (a produce's
// acknowledgement, a transaction's end, an offset commit).
func printWire(w io.Writer, rw []roleWire, plays float64) {
	if len(rw) == 0 {
		return
	}
	fmt.Fprintf(w, "\nKafka traffic per play (the roles' playpipe_kafka_* metrics, franz-go hooks; a request's wait is write → answer):\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| role\t records written\t produce requests\t batches\t records read\t fetch requests\t txn ends\t commits\t other requests\t produce ack ms\t txn end ms\t commit ms\t")
	fmt.Fprintln(tw, "|---\t---:\t---:\t---:\t---:\t---:\t---:\t---:\t---:\t---:\t---:\t---:\t")
	var tot wire
	tot.reqs, tot.secs = map[string]float64{}, map[string]float64{}
	for _, r := range rw {
		printWireRow(tw, r.role, r.w, plays)
		tot.prodBatches += r.w.prodBatches
		tot.prodRecords += r.w.prodRecords
		tot.fetchBatches += r.w.fetchBatches
		tot.fetchRecords += r.w.fetchRecords
		for k, v := range r.w.reqs {
			tot.reqs[k] += v
			tot.secs[k] += r.w.secs[k]
		}
	}
	printWireRow(tw, "roles", tot, plays)
	tw.Flush()
	for _, r := range rw {
		var names []string
		for k, v := range r.w.reqs {
			if v > 0 {
				names = append(names, k)
			}
		}
		sort.Strings(names)
		parts := make([]string, 0, len(names))
		for _, k := range names {
			parts = append(parts, fmt.Sprintf("%s %.0f (%.2f ms)", k, r.w.reqs[k], 1000*r.w.secs[k]/r.w.reqs[k]))
		}
		fmt.Fprintf(w, "- %s requests: %s\n", r.role, strings.Join(parts, ", "))
	}
}

func printWireRow(tw io.Writer, name string, w wire, plays float64) {
	var commits, commitSecs, other float64
	for _, k := range commitAPIs {
		commits += w.reqs[k]
		commitSecs += w.secs[k]
	}
	for k, v := range w.reqs {
		switch k {
		case "Produce", "Fetch", "EndTxn", "OffsetCommit", "TxnOffsetCommit":
		default:
			other += v
		}
	}
	per := func(v float64) string { return strconv.FormatFloat(v/plays, 'f', 4, 64) }
	ms := func(secs, n float64) string {
		if n == 0 {
			return "–"
		}
		return strconv.FormatFloat(1000*secs/n, 'f', 2, 64)
	}
	fmt.Fprintf(tw, "| %s\t %s\t %s\t %s\t %s\t %s\t %s\t %s\t %s\t %s\t %s\t %s\t\n", name,
		per(w.prodRecords), per(w.reqs["Produce"]), per(w.prodBatches),
		per(w.fetchRecords), per(w.reqs["Fetch"]), per(w.reqs["EndTxn"]), per(commits), per(other),
		ms(w.secs["Produce"], w.reqs["Produce"]), ms(w.secs["EndTxn"], w.reqs["EndTxn"]), ms(commitSecs, commits))
}

// threadCPU is a process's CPU time per thread group: its threads' names
// (/proc/<pid>/task/<tid>/comm) with digits and trailing separators
// dropped, so that a JVM's "data-plane-kafka-request-handler-3" and "-5"
// add up, and "C2 CompilerThread0" counts with its siblings.
func threadCPU(pid int) (map[string]time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Duration{}
	for _, e := range ents {
		comm, err := os.ReadFile(filepath.Join(dir, e.Name(), "comm"))
		if err != nil {
			continue // the thread ended
		}
		cpu, err := statCPU(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		name := strings.TrimRight(strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return -1
			}
			return r
		}, strings.TrimSpace(string(comm))), "-_ #")
		out[name] += cpu
	}
	return out, nil
}

// printThreads writes the broker's CPU by thread group between two
// readings, in µs divided by div (unit says what that gives), the largest
// first (the groups under 2 % together).
func printThreads(w io.Writer, name, unit string, before, after map[string]time.Duration, div float64) {
	if len(after) == 0 {
		return
	}
	type g struct {
		name string
		cpu  time.Duration
	}
	var gs []g
	var total time.Duration
	for k, v := range after {
		d := v - before[k]
		if d > 0 {
			gs = append(gs, g{k, d})
			total += d
		}
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].cpu > gs[j].cpu })
	var parts []string
	var rest time.Duration
	for _, x := range gs {
		if x.cpu*50 < total {
			rest += x.cpu
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.1f", x.name, us(x.cpu)/div))
	}
	if rest > 0 {
		parts = append(parts, fmt.Sprintf("other %.1f", us(rest)/div))
	}
	fmt.Fprintf(w, "- %s CPU %s by thread (threads that ended meanwhile are missing): %s\n", name, unit, strings.Join(parts, ", "))
}

// marks are the times since the first event at which each stage of the
// pipeline was first seen done (0: not seen): the publisher, the enrich
// role (every event committed), the reporter (every play answered). The
// ledger is done at the run's end.
type marks struct{ published, enriched, answered time.Duration }

func (m *marks) note(at time.Duration, published, enriched, answered bool) {
	for _, x := range []struct {
		done bool
		mark *time.Duration
	}{{published, &m.published}, {enriched, &m.enriched}, {answered, &m.answered}} {
		if x.done && *x.mark == 0 {
			*x.mark = at
		}
	}
}

func (m marks) String() string {
	r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	return fmt.Sprintf("published %s, enriched %s, answered %s", r(m.published), r(m.enriched), r(m.answered))
}

// gauges sums the reporter's gauges over the scrapes of its backlog phase
// (every event enriched, plays not all answered): which of its caps held
// it — the in-flight limit, or the cap of 2 × the limit on posts at stake
// (answers waiting for Kafka's acknowledgement count), or neither (the
// leases ahead ran dry) — and where its reports waited: for a lease, for
// their marker's acknowledgement, for a worker. held counts the scrapes
// with leased reports waiting while workers were idle (a cap held them),
// dry those with nothing leased and workers idle (the intake or the
// leases were behind).
type gauges struct {
	n                             int
	inflight, atStake, limit      float64
	queued, leasing, leased, idle float64
	held, dry                     int
}

func (g *gauges) add(s state) {
	g.n++
	g.inflight += s.inflight
	g.atStake += s.atStake
	g.limit += s.limit
	g.queued += s.queued
	g.leasing += s.leasing
	g.leased += s.leased
	g.idle += s.idle
	switch {
	case s.idle > 0 && s.leased > 0:
		g.held++
	case s.idle > 0:
		g.dry++
	}
}

func (g gauges) String() string {
	if g.n == 0 {
		return "–"
	}
	n := float64(g.n)
	return fmt.Sprintf("posts on the wire %.1f, at stake %.1f (cap %.0f), limit %.1f; reports waiting for a lease %.1f, for its marker %.1f, for a worker %.1f; idle workers %.1f, with leased reports held back in %.0f %% of the scrapes, with none leased in %.0f %% (%d scrapes)",
		g.inflight/n, g.atStake/n, 2*g.limit/n, g.limit/n, g.queued/n, g.leasing/n, g.leased/n, g.idle/n, 100*float64(g.held)/n, 100*float64(g.dry)/n, g.n)
}

// printIdle writes the roles' Kafka requests per second while the pipeline
// was idle: the broker's work whatever the traffic.
func printIdle(w io.Writer, rw []roleWire, secs float64) {
	if len(rw) == 0 || secs <= 0 {
		return
	}
	var parts []string
	for _, r := range rw {
		var names []string
		for k, v := range r.w.reqs {
			if v > 0 {
				names = append(names, k)
			}
		}
		sort.Strings(names)
		var reqs []string
		for _, k := range names {
			reqs = append(reqs, fmt.Sprintf("%s %.1f", k, r.w.reqs[k]/secs))
		}
		parts = append(parts, r.role+": "+strings.Join(reqs, ", "))
	}
	fmt.Fprintf(w, "- requests per second with the pipeline idle: %s\n", strings.Join(parts, "; "))
}
