//go:build linux

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
)

// options are the run's settings: flags, defaulting to CHAOS_* variables.
type options struct {
	bin      string
	minutes  float64
	seed     int64
	exclude  []Kind
	rate     float64
	dir      string
	heap     string
	meanGap  time.Duration
	maxStall time.Duration
	planOnly bool
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.StringVar(&o.bin, "bin", "bin/playpipe", "the built playpipe binary")
	minutes := fs.String("minutes", envOr("CHAOS_MINUTES", "10"), "minutes of faults (env CHAOS_MINUTES)")
	seed := fs.String("seed", envOr("CHAOS_SEED", "1"), "seed of the fault schedule and the fleet (env CHAOS_SEED)")
	exclude := fs.String("exclude", os.Getenv("CHAOS_EXCLUDE"), "fault kinds left out, comma separated (env CHAOS_EXCLUDE), e.g. hang")
	rate := fs.String("rate", envOr("CHAOS_RATE", "40"), "events per second the fleet publishes (env CHAOS_RATE)")
	fs.StringVar(&o.dir, "dir", os.Getenv("CHAOS_DIR"), "folder of the run's logs and timeline (env CHAOS_DIR); empty: a new one under the system's temp folder")
	fs.StringVar(&o.heap, "broker-heap", envOr("CHAOS_BROKER_HEAP", "512m"), "each broker's -Xmx (env CHAOS_BROKER_HEAP)")
	fs.DurationVar(&o.meanGap, "mean-gap", 8*time.Second, "mean time between two faults' starts")
	fs.DurationVar(&o.maxStall, "max-stall", 3*time.Minute, "a role without progress this long while the partner was reachable is a violation")
	fs.BoolVar(&o.planOnly, "plan", false, "print the schedule and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.minutes, err = strconv.ParseFloat(*minutes, 64); err != nil || o.minutes <= 0 {
		return o, fmt.Errorf("minutes %q: want a positive number", *minutes)
	}
	if o.seed, err = strconv.ParseInt(*seed, 10, 64); err != nil {
		return o, fmt.Errorf("seed %q: want an integer", *seed)
	}
	if o.rate, err = strconv.ParseFloat(*rate, 64); err != nil || o.rate <= 0 {
		return o, fmt.Errorf("rate %q: want a positive number", *rate)
	}
	if o.exclude, err = ParseKinds(*exclude); err != nil {
		return o, err
	}
	return o, nil
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	total := time.Duration(o.minutes * float64(time.Minute))
	plan := Plan(o.seed, total, o.meanGap, Enabled(o.exclude))
	if o.planOnly {
		for _, f := range plan {
			fmt.Printf("%4d %8s %-10s %-8s %-10s %s\n", f.ID, f.At, f.Kind, f.For, f.Target, f.Param)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, o, plan, total)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		code = 2
	}
	os.Exit(code)
}

// run starts the rig, plays the schedule, drains and judges; it returns
// the exit status (1: a violation).
func run(ctx context.Context, o options, plan []Fault, total time.Duration) (int, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return 0, err
	}
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", fmt.Sprintf("playpipe-chaos-seed%d-", o.seed)); err != nil {
			return 0, err
		}
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return 0, err
	}
	if b, err := json.MarshalIndent(plan, "", " "); err == nil {
		_ = os.WriteFile(filepath.Join(o.dir, "schedule.json"), b, 0o644)
	}
	fmt.Printf("chaos: seed %d, %s of faults (%d planned), fleet %.0f events/s, run folder %s\n", o.seed, total, len(plan), o.rate, o.dir)
	began := time.Now()
	r, err := startRig(ctx, o.dir, bin, o.heap, log)
	defer func() {
		r.Close()
		_ = os.RemoveAll(filepath.Join(o.dir, "kafka"))
	}()
	if err != nil {
		return 0, err
	}
	if err := r.waitReady(ctx, 3*time.Minute); err != nil {
		return 0, err
	}
	gen, err := generator(ctx, r, o, total)
	if err != nil {
		return 0, err
	}
	fl, err := newFleet(gen, o.rate, r.ingest, r.kafka.Addrs(), r.kcfg.Topics().Events)
	if err != nil {
		return 0, err
	}
	defer fl.close()
	fl.run()
	time.Sleep(15 * time.Second) // the pipeline warm before the first fault
	t0 := time.Now()
	tl, err := newTimeline(filepath.Join(o.dir, "timeline.jsonl"), t0)
	if err != nil {
		return 0, err
	}
	defer tl.Close()
	tl.Phase("schedule", fmt.Sprintf("seed %d, %d faults over %s, setup took %s", o.seed, len(plan), total, t0.Sub(began).Round(time.Second)))
	r.super.SetReachable(func(t time.Time) bool { return !tl.PartnerFaultAt(t) })
	r.super.SetOnExit(tl.Exit)
	nm := &nemesis{r: r, tl: tl, tracks: trackIDs(r.cat), down: map[int]bool{}}
	log.Info("chaos: schedule begins", "faults", len(plan))
	nm.run(ctx, t0, plan)
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	lifted := nm.liftAll()
	tl.Phase("lifted", fmt.Sprint(lifted))
	log.Info("chaos: faults lifted; draining")
	pending := fl.halt(time.Minute)
	tl.Phase("fleet-halted", fmt.Sprintf("%d events not accepted", pending))
	r.super.SetReachable(func(time.Time) bool { return false }) // no new work: no progress due
	events, posts, non202 := fl.snapshot()
	x, err := expectOf(r.cat, events)
	if err != nil {
		return 0, err
	}
	drainTook := drain(ctx, r, x, log)
	tl.Phase("drained", drainTook.String())
	roles, others := r.super.Snapshot()
	notReady := r.super.NotReady()
	led, err := partnerLedger(r.sbAdmin)
	if err != nil {
		return 0, err
	}
	v, err := judge(x, led, auditor{bin: bin, chAddr: r.chAddr})
	if err != nil {
		return 0, err
	}
	for _, nr := range notReady {
		v.Violations = append(v.Violations, "role left dead or not ready: "+nr)
	}
	for _, ro := range roles {
		if ro.Stall > o.maxStall {
			v.Violations = append(v.Violations, fmt.Sprintf("%s made no progress for %s while the partner was reachable", ro.Name, ro.Stall.Round(time.Second)))
		}
	}
	recs := tl.Records()
	printReport(os.Stdout, reportData{o: o, recs: recs, roles: roles, others: others, x: x, v: v, events: len(events), posts: posts, non202: non202,
		drain: drainTook, total: time.Since(began), dir: o.dir})
	if len(v.Violations) > 0 {
		explain(os.Stdout, v, x, tl, 10)
		return 1, nil
	}
	return 0, nil
}

// generator is the simulator's event generator over the sandbox's
// catalog, walked through the partner API as `playpipe simulate` does.
func generator(ctx context.Context, r *Rig, o options, total time.Duration) (*simulator.Generator, error) {
	api, err := partnerapi.New(partnerapi.Config{BaseURL: "http://" + r.sbAPI,
		Credentials: partnerapi.Credentials{ClientID: sandbox.DefaultClientID, ClientSignature: sandbox.DefaultClientSignature}})
	if err != nil {
		return nil, err
	}
	defer api.Close()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	mixes, err := simulator.CatalogFromAPI(wctx, api, 0)
	if err != nil {
		return nil, fmt.Errorf("catalog walk: %w", err)
	}
	n := int(o.rate*(total.Seconds()+300)) + 1000
	// 20 events per device keep every started_at within a few hours of
	// now, inside the consumer's plausible-time window.
	return simulator.NewGenerator(simulator.Config{Kafka: r.kcfg, Mixes: mixes, Events: n, Devices: max(50, n/20), BadShare: 0.02,
		Seed: o.seed, StartMS: time.Now().Add(-2 * time.Hour).UnixMilli()})
}

func trackIDs(cat *sandbox.Catalog) []int64 {
	var out []int64
	for _, id := range cat.MixIDs() {
		m, _ := cat.Mix(id)
		for _, t := range m.Tracks {
			if !slices.Contains(out, t.ID) {
				out = append(out, t.ID)
			}
		}
	}
	slices.Sort(out)
	return out
}

// drain waits until the partner holds every expected play, as long as it
// makes progress: it stops once a minute passes without a new report at
// the partner (what is missing then is parked, rejected or lost: the
// verdict tells). Then it waits, the same way, for the audit's ledger to
// catch up with the partner.
func drain(ctx context.Context, r *Rig, x expectation, log *slog.Logger) time.Duration {
	began := time.Now()
	want := 0
	for _, n := range x.want {
		want += n
	}
	last, lastN := time.Now(), int64(-1)
	for ctx.Err() == nil && time.Since(last) < time.Minute {
		n, err := ledgerCount(r.sbAdmin)
		if err == nil && n != lastN {
			last, lastN = time.Now(), n
			if n >= int64(want) {
				break
			}
		}
		time.Sleep(2 * time.Second)
	}
	log.Info("chaos: partner drained", "accepted", lastN, "expected", want, "took", time.Since(began).Round(time.Second))
	a := auditor{bin: r.bin, chAddr: r.chAddr}
	last, lastDone := time.Now(), uint64(0)
	for ctx.Err() == nil && time.Since(last) < time.Minute {
		rep, err := a.audit()
		if err == nil {
			done := rep.Delivered + rep.RejectedByAPI + rep.Parked
			if done != lastDone {
				last, lastDone = time.Now(), done
			}
			if done >= uint64(want) && rep.Pending == rep.Parked {
				break
			}
		}
		time.Sleep(5 * time.Second)
	}
	return time.Since(began)
}
