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
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/playpipe/playpipe/internal/chlocal"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/kafkanode"
)

const topicPrefix = "plays"

// warmupSeed times the warm-up round's number (1, 2, …) is added to -seed
// for its events: other event ids.
const warmupSeed = 1 << 20

// measured is one process's figures over the pipeline phase.
type measured struct {
	name string
	cpu  time.Duration // user+system over the phase
	rss  int64         // peak resident set (VmHWM), bytes
	// broker: this row is the broker's (kfake's: the bench process).
	broker bool
}

// result is what one run measured.
type result struct {
	events, plays, posted int64
	elapsed               time.Duration // first event published → last delivery in the ledger
	procs                 []measured    // the pipeline phase
	ceiling               ceilingResult
	started               time.Time
	wire                  []roleWire // each role's Kafka traffic over the pipeline phase
	marks                 marks      // when each stage was done
	gauges                gauges     // the reporter's gauges while it had a backlog
	warmup                *result    // the warm-up round (-warmup), unmeasured but for its rate
	kafka                 string     // the broker: kafkaKfake or kafkaApache
	partitions            int
	brokerPID             int
	floor                 floorResult // Kafka's own tools after the run (Apache Kafka)
	brokerIdle            float64     // the broker's CPU share of one core with the pipeline idle (-idle)
	idleWire              []roleWire  // the roles' requests meanwhile
	// The broker's CPU per thread group before and after -idle.
	idleThreads0, idleThreads1 map[string]time.Duration
	// The broker's CPU per thread group before and after the pipeline
	// phase (Apache Kafka only: kfake's is the bench process's).
	brokerThreads0, brokerThreads1 map[string]time.Duration
	prof                           profileResult // -broker-profile (jfr.go)
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

// env is what every mode of the benchmark shares: the run folder (process
// logs), the embedded broker and the processes started, which close stops
// in reverse order.
type env struct {
	o       options
	log     *slog.Logger
	dir     string
	addrs   []string // the broker's addresses
	brokers string   // comma separated, for --brokers
	// brokerPID is the broker's process: this one for kfake, the JVM
	// for Apache Kafka; brokerName says which, for the tables.
	brokerPID  int
	brokerName string
	children   []*child
	cleanup    []func() // run by close, last first
}

// newEnv makes the run folder and starts the broker: kfake in this
// process, over TCP on loopback, or with -kafka apache one Apache Kafka
// node (KRaft, a JVM from the jars `make kafka` resolved) in the run folder.
func newEnv(o options, log *slog.Logger) (*env, error) {
	dir, err := os.MkdirTemp("", "playpipe-bench-")
	if err != nil {
		return nil, fmt.Errorf("run folder: %w", err)
	}
	e := &env{o: o, log: log, dir: dir}
	if err := e.startBroker(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e.brokers = strings.Join(e.addrs, ",")
	return e, nil
}

func (e *env) startBroker() error {
	if e.o.kafka != kafkaApache {
		b, err := kafkax.StartEmbedded(topicPrefix, e.o.partitions)
		if err != nil {
			return err
		}
		e.cleanup = append(e.cleanup, b.Close)
		e.addrs, e.brokerPID, e.brokerName = b.Addrs(), os.Getpid(), "bench (kfake broker)"
		return nil
	}
	in, err := kafkanode.FindInstall(os.Getenv("PLAYPIPE_KAFKA_VERSION"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := kafkanode.Start(ctx, kafkanode.Config{Dir: filepath.Join(e.dir, "kafka"), Install: in, Heap: "1g",
		Props: map[string]string{"num.partitions": strconv.Itoa(e.o.partitions)}})
	if err != nil {
		return err
	}
	e.cleanup = append(e.cleanup, c.Close)
	e.addrs, e.brokerPID = c.Addrs(), c.Brokers()[0].PID()
	e.brokerName = "Apache Kafka " + in.Version + " broker (JVM)"
	return nil
}

// close stops the children (SIGTERM, then SIGKILL), runs the clean-ups and
// removes the run folder unless -keep or the run failed.
func (e *env) close(failed bool) {
	for i := len(e.children) - 1; i >= 0; i-- {
		e.children[i].stop(10 * time.Second)
	}
	for i := len(e.cleanup) - 1; i >= 0; i-- {
		e.cleanup[i]()
	}
	if e.o.keep || failed {
		e.log.Info("process logs kept", "dir", e.dir)
		return
	}
	_ = os.RemoveAll(e.dir)
}

// start runs the binary as a child with the sandbox's credentials in its
// environment (never in flags).
func (e *env) start(name string, args ...string) (*child, error) {
	c, err := startChild(e.dir, name, childEnv(
		"PLAYPIPE_API_CLIENT_ID="+sandbox.DefaultClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sandbox.DefaultClientSignature,
		"PLAYPIPE_LOG_LEVEL=warn",
	), e.o.bin, args...)
	if err == nil {
		e.children = append(e.children, c)
	}
	return c, err
}

// kafkaArgs are the Kafka flags of every role.
func (e *env) kafkaArgs() []string {
	return []string{"--brokers", e.brokers, "--partitions", strconv.Itoa(e.o.partitions)}
}

// startClickHouse starts a local ClickHouse server, its data in RAM when
// possible (every insert writes a part of a few dozen files).
func (e *env) startClickHouse(ctx context.Context) (*chlocal.Server, error) {
	parent := e.dir
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		parent = "/dev/shm"
	}
	chDir, err := os.MkdirTemp(parent, "playpipe-bench-clickhouse-")
	if err != nil {
		return nil, fmt.Errorf("clickhouse folder: %w", err)
	}
	e.cleanup = append(e.cleanup, func() { _ = os.RemoveAll(chDir) })
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ch, err := chlocal.Start(sctx, chlocal.Config{Dir: chDir, Binary: os.Getenv("PLAYPIPE_CLICKHOUSE_BIN"), Logger: e.log})
	if err != nil {
		return nil, fmt.Errorf("clickhouse: %w", err)
	}
	e.cleanup = append(e.cleanup, ch.Kill) // throwaway data
	return ch, nil
}

// partner is the sandbox process: the partner API and its admin API.
type partner struct {
	c     *child
	url   string // http://host:port of the API
	admin string // host:port of the admin API
}

// startSandbox starts `playpipe sandbox --lean` and waits for its health.
func (e *env) startSandbox() (partner, error) {
	var p partner
	apiAddr, err := freeAddr()
	if err != nil {
		return p, err
	}
	if p.admin, err = freeAddr(); err != nil {
		return p, err
	}
	if p.c, err = e.start("sandbox", "sandbox", "--lean", "--addr", apiAddr, "--admin-addr", p.admin); err != nil {
		return p, err
	}
	if err := waitHTTP(p.c, "http://"+p.admin+"/admin/health", 30*time.Second); err != nil {
		return p, err
	}
	p.url = "http://" + apiAddr
	return p, nil
}

// role is a pipeline role's process and its admin address (metrics).
type role struct {
	c     *child
	admin string
}

// startRole starts a role (args[0] is its subcommand) on its own admin port.
func (e *env) startRole(name string, args ...string) (*role, error) {
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	c, err := e.start(name, append([]string{args[0], "--admin-addr", admin}, args[1:]...)...)
	if err != nil {
		return nil, err
	}
	return &role{c: c, admin: admin}, nil
}

// startRoles starts sink, consume and report and waits until all are ready.
func (e *env) startRoles(ch *chlocal.Server, p partner) (map[string]*role, error) {
	ka := e.kafkaArgs()
	roles := map[string]*role{}
	for _, r := range []struct {
		name string
		args []string
	}{
		{"sink", append(append([]string{"sink"}, ka...), "--clickhouse-addr", ch.Addr(), "--clickhouse-db", "playpipe_bench", "--clickhouse-user", "default")},
		{"consume", append(append([]string{"consume"}, ka...), "--api-url", p.url)},
		{"report", append(append(append([]string{"report"}, ka...), "--api-url", p.url, "--concurrency", strconv.Itoa(e.o.concurrency)), e.reportFlags()...)},
	} {
		rl, err := e.startRole(r.name, r.args...)
		if err != nil {
			return nil, err
		}
		roles[r.name] = rl
	}
	for name, r := range roles {
		if err := waitHTTP(r.c, "http://"+r.admin+"/readyz", 90*time.Second); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return roles, nil
}

// tracked is a process whose CPU is measured over a phase.
type tracked struct {
	name string
	pid  int
	cpu0 time.Duration
}

// trackProcs lists the processes measured in the pipeline phase, in table
// order, with their CPU time so far.
func trackProcs(roles map[string]*role, p partner, ch *chlocal.Server, brokerName string, brokerPID int) ([]*tracked, error) {
	var track []*tracked
	for _, n := range []string{"consume", "report", "sink"} {
		track = append(track, &tracked{name: n, pid: roles[n].c.pid()})
	}
	track = append(track,
		&tracked{name: "sandbox (partner API)", pid: p.c.pid()},
		&tracked{name: "clickhouse-server", pid: ch.PID()},
		&tracked{name: brokerName, pid: brokerPID},
	)
	if brokerPID != os.Getpid() {
		track = append(track, &tracked{name: "bench (polls the roles' metrics)", pid: os.Getpid()})
	}
	for _, t := range track {
		var err error
		if t.cpu0, err = cpuTime(t.pid); err != nil {
			return nil, fmt.Errorf("%s: %w", t.name, err)
		}
	}
	return track, nil
}

// runBench is the end-to-end mode: the whole pipeline, then the ceiling.
func runBench(ctx context.Context, o options, log *slog.Logger) (res result, err error) {
	res.started, res.kafka, res.partitions = time.Now(), o.kafka, o.partitions
	e, err := newEnv(o, log)
	if err != nil {
		return res, err
	}
	res.brokerPID = e.brokerPID
	defer func() { e.close(err != nil) }()
	ch, err := e.startClickHouse(ctx)
	if err != nil {
		return res, err
	}
	log.Info("broker and ClickHouse up", "brokers", e.brokers, "clickhouse", ch.Addr(), "dir", e.dir)
	sb, err := e.startSandbox()
	if err != nil {
		return res, err
	}
	roles, err := e.startRoles(ch, sb)
	if err != nil {
		return res, err
	}
	log.Info("sandbox, sink, consume and report ready", "events", o.events, "concurrency", o.concurrency)
	var base state
	prof, err := e.startProfile(ctx) // -broker-profile (jfr.go), nil without
	if err != nil {
		return res, err
	}
	if o.warmup > 0 {
		// The same pipeline first takes -warmup events of other seeds
		// (other event ids), unmeasured, in -warmup-rounds rounds: the
		// broker's JVM compiles its hot code (half its CPU in the first
		// seconds of a fresh node), the roles' mix caches fill, the groups
		// settle. One round is not enough: at the next round's start a new
		// publisher's first produce requests made the JVM throw away the
		// produce path it had compiled for the reporter's alone (its C2
		// code "made not entrant", then compiled again, in the measured
		// round); the later warm-up rounds take that, less each time, as a
		// broker in service, fed by publishers and roles at once, has long
		// done.
		warm := &result{}
		rounds := min(o.warmupRounds, o.warmup)
		for i := range rounds {
			n := o.warmup / rounds
			if i == rounds-1 {
				n = o.warmup - i*n
			}
			var w result
			if _, base, err = e.runPipeline(ctx, roles, sb, &w, n, o.seed+warmupSeed*int64(i+1), base); err != nil {
				return res, fmt.Errorf("warm-up round %d: %w", i+1, err)
			}
			warm.plays, warm.posted, warm.elapsed = warm.plays+w.plays, warm.posted+w.posted, warm.elapsed+w.elapsed
		}
		res.warmup = warm
		log.Info("warm-up finished", "rounds", rounds, "plays", warm.plays, "elapsed", warm.elapsed.Round(time.Millisecond))
	}
	if o.idle > 0 {
		if err := e.measureIdle(roles, &res); err != nil {
			return res, err
		}
	}
	if err := prof.startRound(ctx, res.started); err != nil {
		return res, err
	}
	track, err := trackProcs(roles, sb, ch, e.brokerName, e.brokerPID)
	if err != nil {
		return res, err
	}
	wire0, err := scrapeRolesWire(roles)
	if err != nil {
		return res, err
	}
	if o.kafka == kafkaApache {
		res.brokerThreads0, _ = threadCPU(e.brokerPID)
	}
	profDone := e.profileReporter(roles["report"])
	sim, end, err := e.runPipeline(ctx, roles, sb, &res, o.events, o.seed, base)
	if perr := profDone(); err == nil && perr != nil {
		err = perr
	}
	if err != nil {
		return res, err
	}
	if err := res.collect(track, sim); err != nil {
		return res, err
	}
	wire1, err := scrapeRolesWire(roles)
	if err != nil {
		return res, err
	}
	if o.kafka == kafkaApache {
		res.brokerThreads1, _ = threadCPU(e.brokerPID)
	}
	if res.prof, err = prof.finish(ctx); err != nil {
		return res, err
	}
	for i := range wire1 {
		res.wire = append(res.wire, roleWire{wire1[i].role, wire1[i].w.minus(wire0[i].w)})
	}
	log.Info("pipeline finished", "plays", res.plays, "delivered", res.posted, "elapsed", res.elapsed.Round(time.Millisecond))
	// Nothing lost, nothing doubled: the partner's own count.
	if err := checkPartner(ctx, sb.admin, end.delivered); err != nil {
		return res, err
	}
	res.ceiling, err = e.rawCeiling(ctx, sb, res)
	if err != nil || o.kafka != kafkaApache || o.floorRecords == 0 {
		return res, err
	}
	res.floor, err = e.runFloor(ctx)
	return res, err
}

// reportFlags are the reporter's flags beyond the bench's own: -report-args,
// and --pprof for -report-profile.
func (e *env) reportFlags() []string {
	f := strings.Fields(e.o.reportArgs)
	if e.o.reportProfile != "" {
		f = append(f, "--pprof")
	}
	return f
}

// reportProfileFor is how long -report-profile profiles the reporter from
// the measured round's start: within the shortest rounds' backlog (about
// 8 s at 40 000 events here).
const reportProfileFor = 5 * time.Second

// profileReporter starts fetching a CPU profile of the reporter
// (-report-profile) for reportProfileFor and returns the wait for it and
// its error; without the flag, a no-op.
func (e *env) profileReporter(r *role) (wait func() error) {
	if e.o.reportProfile == "" {
		return func() error { return nil }
	}
	file := fmt.Sprintf("%s.%s.%s.pprof", e.o.reportProfile, e.o.kafka, time.Now().UTC().Format("150405"))
	done := make(chan error, 1)
	go func() {
		done <- fetchProfile(r.admin, fmt.Sprintf("profile?seconds=%d", int(reportProfileFor.Seconds())), file)
	}()
	return func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("-report-profile: %w", err)
		}
		e.log.Info("reporter profiled", "file", file, "for", reportProfileFor)
		return nil
	}
}

// measureIdle measures the broker's CPU (and, on Apache Kafka, per thread
// group) and the roles' Kafka requests for -idle with every role up and
// nothing published: what the broker spends per second whatever the
// traffic (fetches long-polling, heartbeats, probes, its own housekeeping).
func (e *env) measureIdle(roles map[string]*role, res *result) error {
	c0, err := cpuTime(e.brokerPID)
	if err != nil {
		return err
	}
	w0, err := scrapeRolesWire(roles)
	if err != nil {
		return err
	}
	if e.o.kafka == kafkaApache {
		res.idleThreads0, _ = threadCPU(e.brokerPID)
	}
	time.Sleep(e.o.idle)
	if e.o.kafka == kafkaApache {
		res.idleThreads1, _ = threadCPU(e.brokerPID)
	}
	c1, err := cpuTime(e.brokerPID)
	if err != nil {
		return err
	}
	w1, err := scrapeRolesWire(roles)
	if err != nil {
		return err
	}
	res.brokerIdle = float64(c1-c0) / float64(e.o.idle)
	for i := range w1 {
		res.idleWire = append(res.idleWire, roleWire{w1[i].role, w1[i].w.minus(w0[i].w)})
	}
	return nil
}

// runPipeline starts the simulator with n events of seed and waits until
// the pipeline is done with them: the simulator has published everything,
// the consumer has committed every event, every derived play that is to be
// posted has a final answer, and the ledger holds as many delivery rows as
// the reporter recorded answers (retries included, should there be any).
// base is the roles' state before (their counters are cumulative: a
// warm-up round came first); res gets this round's figures. It returns the
// (exited) simulator and the roles' state at the end.
func (e *env) runPipeline(ctx context.Context, roles map[string]*role, p partner, res *result, n int, seed int64, base state) (*child, state, error) {
	o := e.o
	t0 := time.Now()
	sim, err := e.start("simulate", append(append([]string{"simulate"}, e.kafkaArgs()...),
		"--api-url", p.url, "--events", strconv.Itoa(n), "--rate", "0",
		"--seed", strconv.FormatInt(seed, 10), "--bad-share", strconv.FormatFloat(o.badShare, 'f', -1, 64))...)
	if err != nil {
		return nil, base, err
	}
	deadline := t0.Add(o.timeout)
	want := base.events + int64(n)
	var last string
	for {
		if err := ctx.Err(); err != nil {
			return nil, base, err
		}
		for name, r := range roles {
			if !r.c.running() {
				return nil, base, fmt.Errorf("%s exited during the run (%v); log %s:\n%s", name, r.c.err, r.c.log, r.c.tail(20))
			}
		}
		if !sim.running() && sim.err != nil {
			return nil, base, fmt.Errorf("simulate failed (%v); log %s:\n%s", sim.err, sim.log, sim.tail(20))
		}
		st, err := progress(roles["consume"].admin, roles["report"].admin, roles["sink"].admin)
		if err == nil {
			last = st.String()
			toPost := st.plays - st.below
			res.marks.note(time.Since(t0), !sim.running(), st.events >= want, st.events >= want && st.final >= toPost)
			if st.events >= want && st.final < toPost {
				res.gauges.add(st) // the reporter's backlog phase
			}
			if !sim.running() && st.events >= want && st.final >= toPost && st.ledger >= max(toPost, st.answers) && toPost > base.plays-base.below {
				res.elapsed = time.Since(t0)
				res.events, res.plays, res.posted = st.events-base.events, st.plays-base.plays, st.delivered-base.delivered
				return sim, st, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, base, fmt.Errorf("the pipeline did not finish within -timeout %s (last: %s; scrape error: %v)", o.timeout, last, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// collect adds the tracked processes' CPU and peak RSS over the phase, and
// the exited simulator's from its rusage.
func (r *result) collect(track []*tracked, sim *child) error {
	for _, t := range track {
		cpu, err := cpuTime(t.pid)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		rss, err := peakRSS(t.pid)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		r.procs = append(r.procs, measured{name: t.name, cpu: cpu - t.cpu0, rss: rss, broker: t.pid == r.brokerPID})
	}
	if u := sim.cmd.ProcessState; u != nil {
		if ru, ok := u.SysUsage().(*syscall.Rusage); ok {
			r.procs = append(r.procs, measured{name: "simulate (publisher)", cpu: u.UserTime() + u.SystemTime(), rss: ru.Maxrss << 10})
		}
	}
	return nil
}

// rawCeiling is the plain client on the very bodies the reporter posted
// (read back from the reports topic), the same sandbox, the same number in
// flight.
func (e *env) rawCeiling(ctx context.Context, p partner, res result) (ceilingResult, error) {
	bodies, err := reportBodies(ctx, e.addrs, topicPrefix, res.plays)
	if err != nil {
		return ceilingResult{}, err
	}
	if int64(len(bodies)) < res.posted {
		return ceilingResult{}, fmt.Errorf("read %d report bodies back from the reports topic, but %d were delivered", len(bodies), res.posted)
	}
	return ceiling(ctx, p.url, p.admin, p.c.pid(), bodies, e.o.concurrency, sandboxFaults{})
}

// state is the pipeline's progress as its roles' metrics tell it.
type state struct {
	events, plays, below, delivered, final, ledger int64
	answers                                        int64 // every answer the reporter recorded, retries included
	// The reporter's gauges: posts on the wire, posts at stake (on the
	// wire or answers not acknowledged by Kafka), the in-flight limit.
	inflight, atStake, limit float64
	// Where the reporter's reports wait before their post: for a lease,
	// for their marker's acknowledgement, for a worker; and its idle
	// workers.
	queued, leasing, leased, idle float64
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
		"playpipe_reporter_posts_in_flight":   nil,
		"playpipe_reporter_at_stake":          nil,
		"playpipe_reporter_concurrency_limit": nil,
		"playpipe_reporter_reports_queued":    nil,
		"playpipe_reporter_reports_leasing":   nil,
		"playpipe_reporter_reports_leased":    nil,
		"playpipe_reporter_idle_workers":      nil,
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
	s.inflight, s.atStake, s.limit = r["playpipe_reporter_posts_in_flight"], r["playpipe_reporter_at_stake"], r["playpipe_reporter_concurrency_limit"]
	s.queued, s.leasing, s.leased, s.idle = r["playpipe_reporter_reports_queued"], r["playpipe_reporter_reports_leasing"], r["playpipe_reporter_reports_leased"], r["playpipe_reporter_idle_workers"]
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
