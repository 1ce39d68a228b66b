//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/playpipe/playpipe/internal/chlocal"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

const topicPrefix = "plays"

// measured is one process's figures over the pipeline phase.
type measured struct {
	name string
	cpu  time.Duration // user+system over the phase
	rss  int64         // peak resident set (VmHWM), bytes
}

// result is what one run measured.
type result struct {
	events, plays, posted int64
	elapsed               time.Duration // first event published → last delivery in the ledger
	procs                 []measured    // the pipeline phase
	ceiling               ceilingResult
	started               time.Time
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// childEnv is this process's environment without PLAYPIPE_* and OTEL_*
// settings (a developer's shell must not redirect the children), plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PLAYPIPE_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

func runBench(ctx context.Context, o options, log *slog.Logger) (res result, err error) {
	res.started = time.Now()
	dir, err := os.MkdirTemp("", "playpipe-bench-")
	if err != nil {
		return res, err
	}
	var children []*child
	defer func() {
		for i := len(children) - 1; i >= 0; i-- {
			children[i].stop(10 * time.Second)
		}
		if o.keep || err != nil {
			log.Info("process logs kept", "dir", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	// The broker: kfake in this process, over TCP on loopback.
	broker, err := kafkax.StartEmbedded(topicPrefix, o.partitions)
	if err != nil {
		return res, err
	}
	defer broker.Close()
	brokers := strings.Join(broker.Addrs(), ",")

	// ClickHouse: a local server process, its data in RAM when possible
	// (every insert writes a part of a few dozen files).
	chParent := dir
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		chParent = "/dev/shm"
	}
	chDir, err := os.MkdirTemp(chParent, "playpipe-bench-clickhouse-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(chDir)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	ch, err := chlocal.Start(sctx, chlocal.Config{Dir: chDir, Logger: log})
	cancel()
	if err != nil {
		return res, fmt.Errorf("clickhouse: %w", err)
	}
	defer ch.Kill() // throwaway data
	log.Info("broker and ClickHouse up", "brokers", brokers, "clickhouse", ch.Addr(), "dir", dir)

	start := func(name string, args ...string) (*child, error) {
		c, err := startChild(dir, name, childEnv(
			"PLAYPIPE_API_CLIENT_ID="+sandbox.DefaultClientID,
			"PLAYPIPE_API_CLIENT_SIGNATURE="+sandbox.DefaultClientSignature, // environment only, never a flag
			"PLAYPIPE_LOG_LEVEL=warn",
		), o.bin, args...)
		if err == nil {
			children = append(children, c)
		}
		return c, err
	}

	// The partner API.
	apiAddr, err := freeAddr()
	if err != nil {
		return res, err
	}
	sbAdmin, err := freeAddr()
	if err != nil {
		return res, err
	}
	sb, err := start("sandbox", "sandbox", "--lean", "--addr", apiAddr, "--admin-addr", sbAdmin)
	if err != nil {
		return res, err
	}
	if err := waitHTTP(sb, "http://"+sbAdmin+"/admin/health", 30*time.Second); err != nil {
		return res, err
	}
	apiURL := "http://" + apiAddr

	// The roles, each on its own admin port.
	kafkaArgs := []string{"--brokers", brokers, "--partitions", strconv.Itoa(o.partitions)}
	type role struct {
		c     *child
		admin string
	}
	roles := map[string]*role{}
	for _, r := range []struct {
		name string
		args []string
	}{
		{"sink", append(append([]string{"sink"}, kafkaArgs...), "--clickhouse-addr", ch.Addr(), "--clickhouse-db", "playpipe_bench", "--clickhouse-user", "default")},
		{"consume", append(append([]string{"consume"}, kafkaArgs...), "--api-url", apiURL)},
		{"report", append(append([]string{"report"}, kafkaArgs...), "--api-url", apiURL, "--concurrency", strconv.Itoa(o.concurrency))},
	} {
		admin, err := freeAddr()
		if err != nil {
			return res, err
		}
		c, err := start(r.name, append([]string{r.args[0], "--admin-addr", admin}, r.args[1:]...)...)
		if err != nil {
			return res, err
		}
		roles[r.name] = &role{c: c, admin: admin}
	}
	for name, r := range roles {
		if err := waitHTTP(r.c, "http://"+r.admin+"/readyz", 90*time.Second); err != nil {
			return res, fmt.Errorf("%s: %w", name, err)
		}
	}
	log.Info("sandbox, sink, consume and report ready", "events", o.events, "concurrency", o.concurrency)

	// The processes measured in the pipeline phase, in table order.
	type tracked struct {
		name string
		pid  int
		cpu0 time.Duration
	}
	var track []*tracked
	for _, n := range []string{"consume", "report", "sink"} {
		track = append(track, &tracked{name: n, pid: roles[n].c.pid()})
	}
	track = append(track,
		&tracked{name: "sandbox (partner API)", pid: sb.pid()},
		&tracked{name: "clickhouse-server", pid: ch.PID()},
		&tracked{name: "bench (kfake broker)", pid: os.Getpid()},
	)
	for _, t := range track {
		if t.cpu0, err = cpuTime(t.pid); err != nil {
			return res, fmt.Errorf("%s: %w", t.name, err)
		}
	}

	t0 := time.Now()
	sim, err := start("simulate", append(append([]string{"simulate"}, kafkaArgs...),
		"--api-url", apiURL, "--events", strconv.Itoa(o.events), "--rate", "0",
		"--seed", strconv.FormatInt(o.seed, 10), "--bad-share", strconv.FormatFloat(o.badShare, 'f', -1, 64))...)
	if err != nil {
		return res, err
	}

	// Done when the simulator has published everything, the consumer has
	// committed every event, every derived play that is to be posted has a
	// final answer, and the ledger holds as many delivery rows as the
	// reporter recorded answers (retries included, should there be any).
	deadline := t0.Add(o.timeout)
	var last string
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		for name, r := range roles {
			if !r.c.running() {
				return res, fmt.Errorf("%s exited during the run (%v); log %s:\n%s", name, r.c.err, r.c.log, r.c.tail(20))
			}
		}
		if !sim.running() && sim.err != nil {
			return res, fmt.Errorf("simulate failed (%v); log %s:\n%s", sim.err, sim.log, sim.tail(20))
		}
		st, err := progress(roles["consume"].admin, roles["report"].admin, roles["sink"].admin)
		if err == nil {
			last = st.String()
			toPost := st.plays - st.below
			if !sim.running() && st.events >= int64(o.events) && st.final >= toPost && st.ledger >= max(toPost, st.answers) && toPost > 0 {
				res.elapsed = time.Since(t0)
				res.events, res.plays, res.posted = st.events, st.plays, st.delivered
				break
			}
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("the pipeline did not finish within -timeout %s (last: %s; scrape error: %v)", o.timeout, last, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	for _, t := range track {
		cpu, err := cpuTime(t.pid)
		if err != nil {
			return res, fmt.Errorf("%s: %w", t.name, err)
		}
		rss, err := peakRSS(t.pid)
		if err != nil {
			return res, fmt.Errorf("%s: %w", t.name, err)
		}
		res.procs = append(res.procs, measured{name: t.name, cpu: cpu - t.cpu0, rss: rss})
	}
	// The simulator has exited: its figures come from its rusage.
	if u := sim.cmd.ProcessState; u != nil {
		if ru, ok := u.SysUsage().(*syscall.Rusage); ok {
			res.procs = append(res.procs, measured{name: "simulate (publisher)", cpu: u.UserTime() + u.SystemTime(), rss: ru.Maxrss << 10})
		}
	}
	log.Info("pipeline finished", "plays", res.plays, "delivered", res.posted, "elapsed", res.elapsed.Round(time.Millisecond))
	// Nothing lost, nothing doubled: the partner's own count.
	if err := checkPartner(ctx, sbAdmin, res.posted); err != nil {
		return res, err
	}

	// The raw ceiling: the same bodies, the same sandbox, the same number in flight.
	bodies, err := reportBodies(ctx, broker.Addrs(), topicPrefix, res.plays)
	if err != nil {
		return res, err
	}
	if int64(len(bodies)) < res.posted {
		return res, fmt.Errorf("read %d report bodies back from the reports topic, but %d were delivered", len(bodies), res.posted)
	}
	res.ceiling, err = ceiling(ctx, apiURL, sbAdmin, sb.pid(), bodies, o.concurrency)
	if err != nil {
		return res, err
	}
	return res, nil
}

// state is the pipeline's progress as its roles' metrics tell it.
type state struct {
	events, plays, below, delivered, final, ledger int64
	answers                                        int64 // every answer the reporter recorded, retries included
}

func (s state) String() string {
	return fmt.Sprintf("events %d, plays %d (below minimum %d), final answers %d (delivered %d), ledger deliveries %d",
		s.events, s.plays, s.below, s.final, s.delivered, s.ledger)
}

func progress(consume, report, sink string) (state, error) {
	var s state
	c, err := scrape(consume, map[string][]string{
		"playpipe_events_in_total": nil, "playpipe_plays_derived_total": nil, "playpipe_plays_below_minimum_total": nil,
	})
	if err != nil {
		return s, fmt.Errorf("consume: %w", err)
	}
	r, err := scrape(report, map[string][]string{
		"playpipe_deliveries_total|delivered": {`outcome="delivered"`},
		"playpipe_deliveries_total|rejected":  {`outcome="rejected"`},
		"playpipe_deliveries_total|all":       nil,
	})
	if err != nil {
		return s, fmt.Errorf("report: %w", err)
	}
	k, err := scrape(sink, map[string][]string{"playpipe_sink_rows_total": {`table="deliveries"`}})
	if err != nil {
		return s, fmt.Errorf("sink: %w", err)
	}
	s.events, s.plays, s.below = int64(c["playpipe_events_in_total"]), int64(c["playpipe_plays_derived_total"]), int64(c["playpipe_plays_below_minimum_total"])
	s.delivered = int64(r["playpipe_deliveries_total|delivered"])
	s.final = s.delivered + int64(r["playpipe_deliveries_total|rejected"])
	s.answers = int64(r["playpipe_deliveries_total|all"])
	s.ledger = int64(k["playpipe_sink_rows_total"])
	if s.events == 0 && s.plays == 0 && s.final == 0 {
		return s, errors.New("no progress yet")
	}
	return s, nil
}

// checkPartner compares the sandbox's ledger totals with the plays the
// reporter delivered: every one accepted once, no duplicate.
func checkPartner(ctx context.Context, sbAdmin string, delivered int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+sbAdmin+"/admin/ledger?since=9223372036854775807", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("sandbox ledger: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sandbox ledger: %s", resp.Status)
	}
	var l struct {
		Accepted   int64 `json:"accepted_count"`
		Duplicates int64 `json:"duplicates"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return fmt.Errorf("sandbox ledger: %w", err)
	}
	if l.Accepted != delivered || l.Duplicates != 0 {
		return fmt.Errorf("the partner accepted %d reports (%d duplicates); the reporter delivered %d", l.Accepted, l.Duplicates, delivered)
	}
	return nil
}
