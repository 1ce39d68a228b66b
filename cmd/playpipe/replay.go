package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/replay"
	"github.com/playpipe/playpipe/wiring/roles"
)

func init() {
	register(replayCommand(replay.KindReplay, "re-deliver the reports of a window the partner lost, audited as a replay (not as duplicates)"))
}

// replayCommand is the command of a kind of replay run (replay.KindReplay,
// replay.KindRedrive), named after it.
func replayCommand(kind, summary string) command {
	return command{
		name:    kind,
		summary: summary,
		run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return runReplay(ctx, kind, args, stdout, stderr)
		},
	}
}

const replaySynopsis = `Re-delivers the reports of a window, for example after the partner lost the reports its
standby took between 14:02 and 14:40. Selects, in the ClickHouse ledger, the reports the live
reporter delivered whose play (--by event), live delivery (--by delivered) or derivation
(--by derived) lies in [--from, --to), optionally only those answered by standby
(--only-standby); reads their records from an explicit offset range of <prefix>.reports
(ListOffsets by timestamp; the live reporter's group is untouched); posts each record's exact
report bytes; publishes every answer to <prefix>.deliveries with replay_id and replay_reason.
The audit lists the replay in its own section and never counts it as "delivered more than
once". Re-running with the same --replay-id sends nothing that replay already delivered.
Full guide: docs/replay.md.

Example:
  playpipe replay --brokers kafka:9092 --api-url https://api.example.com \
    --clickhouse-addr clickhouse:9000 --from 2026-11-21T14:02:00Z --to 2026-11-21T14:40:00Z \
    --by delivered --only-standby --reason "partner ticket #4711: standby lost reports" --dry-run`

const redriveSynopsis = `Re-sends reports the partner API rejected (400) and nobody delivered since, after a fix
(ours or the partner's): selected by --message (repeatable), --report-id (repeatable or comma
separated), --track, or every rejection in [--from, --to) (the time of the rejection). With
--parked it asks the live reporter to re-send at once the reports it parked (their transient
failures outlasted its retry budget): the reporter owning each report posts it, one poster per
report, and the run waits up to --owner-wait for the outcomes. Same recording
as playpipe replay: its own replay id and --reason on every answer, listed by the audit as a
replay, never counted as a duplicate. Full guide: docs/replay.md.

Example:
  playpipe redrive --brokers kafka:9092 --api-url https://api.example.com \
    --clickhouse-addr clickhouse:9000 --message "isrc is invalid" --reason "partner fixed ISRC validation"
  playpipe redrive --brokers kafka:9092 --api-url https://api.example.com \
    --clickhouse-addr clickhouse:9000 --parked --track 4711 --reason "partner fixed track 4711"`

// int64List collects a repeatable, comma-separated flag of integers.
type int64List struct{ v *[]int64 }

func (l int64List) String() string {
	if l.v == nil {
		return ""
	}
	out := make([]string, len(*l.v))
	for i, n := range *l.v {
		out[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(out, ",")
}

func (l int64List) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer: %q", f)
		}
		*l.v = append(*l.v, n)
	}
	return nil
}

// listFlag collects a repeatable, comma-separated flag.
type listFlag struct{ v *[]string }

func (l listFlag) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ",")
}
func (l listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l.v = append(*l.v, p)
		}
	}
	return nil
}

// replayFlags are the flags of playpipe replay and playpipe redrive.
type replayFlags struct {
	lf                  logFlags
	kcfg                kafkax.Config
	api                 apiTarget
	chCfg               analytics.Config
	rcfg                replay.Config
	sel                 replay.Selection
	from, to            string
	asJSON, liveBypassN bool
}

func (f *replayFlags) register(fs *flag.FlagSet) {
	registerKafkaFlags(fs, &f.kcfg)
	f.api.register(fs, "post the reports to")
	registerClickHouseFlags(fs, &f.chCfg)
	f.lf.register(fs.StringVar)
	if f.sel.Kind == replay.KindReplay {
		fs.StringVar(&f.from, "from", "", "start of the window (inclusive; required): RFC 3339, 2026-11-21T14:02 (UTC), epoch ms, or -90m")
		fs.StringVar(&f.to, "to", "now", "end of the window (exclusive)")
		fs.StringVar(&f.sel.By, "by", replay.ByDelivered, "what the window applies to: "+strings.Join(replay.ByNames, ", ")+" (the play's time, the live delivery's time, the derivation's time)")
		fs.BoolVar(&f.sel.OnlyStandby, "only-standby", false, "only reports answered by standby (with --by delivered: answered by standby in the window)")
	} else {
		fs.StringVar(&f.from, "from", "", "only rejections at or after this time")
		fs.StringVar(&f.to, "to", "", "only rejections before this time")
		fs.Var(listFlag{&f.sel.Messages}, "message", "only rejections with this API message (repeatable)")
		fs.BoolVar(&f.sel.Parked, "parked", false, "re-send the reports the live reporter parked (no final answer since) instead of rejected ones, through the reporter that owns each; --from/--to then bound when they were parked")
		fs.DurationVar(&f.rcfg.OwnerWait, "owner-wait", replay.DefaultOwnerWait, "with --parked: longest the run waits for the reporter to serve its requests (those not served stay queued and are served once)")
		fs.Var(int64List{&f.sel.Tracks}, "track", "only plays of these track ids (repeatable or comma separated)")
	}
	fs.Var(listFlag{&f.sel.ReportIDs}, "report-id", "only these report ids (repeatable or comma separated)")
	fs.StringVar(&f.rcfg.Reason, "reason", "", "why the reports are sent again (required; recorded with every delivery)")
	fs.StringVar(&f.rcfg.ReplayID, "replay-id", "", "the run's id: empty for a new one; an earlier id resumes it (nothing it delivered is sent again)")
	fs.BoolVar(&f.rcfg.DryRun, "dry-run", false, "print the counts and sample report ids; send nothing")
	fs.Float64Var(&f.rcfg.Rate, "rate", 50, "most posts per second (0: no limit)")
	fs.IntVar(&f.rcfg.Concurrency, "concurrency", 8, "most posts in flight")
	fs.IntVar(&f.rcfg.MaxAttempts, "max-attempts", 8, "most posts of one report answered by a transient failure or standby")
	fs.DurationVar(&f.rcfg.Progress, "progress", 5*time.Second, "interval of the progress lines (0: none)")
	fs.DurationVar(&f.rcfg.KafkaTimeout, "kafka-timeout", replay.DefaultKafkaTimeout, "longest the run waits on Kafka (a request, a Delivery record's acknowledgement, a read while the broker does not answer); past it the run ends with an error and --replay-id resumes it")
	fs.IntVar(&f.rcfg.Samples, "samples", 10, "report ids a --dry-run prints")
	fs.BoolVar(&f.liveBypassN, "live-bypass-not-delivered", false, "count a 200 served by live-bypass as not delivered (retried)")
	fs.BoolVar(&f.asJSON, "json", false, "print the result as JSON")
}

// check reads the window (times relative to now) and checks the flags; an
// error is a usage error.
func (f *replayFlags) check(now time.Time) error {
	var err error
	if f.from != "" {
		if f.sel.From, err = parseAuditTime(f.from, now); err != nil {
			return fmt.Errorf("--from: %w", err)
		}
	}
	if f.to != "" {
		if f.sel.To, err = parseAuditTime(f.to, now); err != nil {
			return fmt.Errorf("--to: %w", err)
		}
	}
	if err := f.sel.Validate(); err != nil {
		return err
	}
	rcfg := &f.rcfg
	if strings.TrimSpace(rcfg.Reason) == "" {
		return errors.New("--reason is required: say why the reports are sent again (it is recorded with every delivery)")
	}
	if rcfg.Concurrency < 1 || rcfg.Concurrency > 1024 {
		return fmt.Errorf("--concurrency must be between 1 and 1024, got %d", rcfg.Concurrency)
	}
	if rcfg.KafkaTimeout <= 0 {
		return fmt.Errorf("--kafka-timeout must be > 0, got %v", rcfg.KafkaTimeout)
	}
	if rcfg.Rate < 0 || rcfg.Progress < 0 || rcfg.MaxAttempts < 1 || rcfg.Samples < 0 {
		return fmt.Errorf("--rate and --progress must be ≥ 0, --max-attempts ≥ 1, --samples ≥ 0 (got %v, %v, %d, %d)", rcfg.Rate, rcfg.Progress, rcfg.MaxAttempts, rcfg.Samples)
	}
	return nil
}

func runReplay(ctx context.Context, kind string, args []string, stdout, stderr io.Writer) error {
	synopsis := replaySynopsis
	if kind == replay.KindRedrive {
		synopsis = redriveSynopsis
	}
	fs := newFlagSet(kind, stderr, synopsis)
	f := replayFlags{sel: replay.Selection{Kind: kind}}
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	usage := func(err error) error { return usageError{err} }
	log, err := f.lf.logger(stderr)
	if err != nil {
		return usage(err)
	}
	if err := f.check(time.Now()); err != nil {
		return usage(err)
	}
	if err := requireKafka(f.kcfg); err != nil {
		return err
	}
	if !f.rcfg.DryRun {
		if err := f.api.check(); err != nil {
			return err
		}
	}
	chCfg, conn, closeLedger, err := openLedger(ctx, f.chCfg, log)
	if err != nil {
		return err
	}
	defer closeLedger()
	// The selection reads deliveries.replay_id (migration 4).
	if _, err := chCfg.Migrate(ctx, conn); err != nil {
		return err
	}
	kcfg, stopKafka, err := kafkax.Ready(ctx, f.kcfg, log)
	if err != nil {
		return err
	}
	defer stopKafka()
	rcfg := f.rcfg
	rcfg.Kafka, rcfg.CH, rcfg.Database, rcfg.Logger, rcfg.Out = kcfg, conn, chCfg.Database, log, stdout
	if f.asJSON {
		// With --json, stdout carries the result alone: one JSON object a
		// script can read whole. The progress lines go to stderr.
		rcfg.Out = stderr
	}
	rcfg.LiveBypassDelivered = !f.liveBypassN
	if rcfg.Samples == 0 {
		rcfg.Samples = -1
	}
	res, err := f.run(ctx, rcfg, log)
	if res.ReplayID != "" {
		printReplayResult(stdout, kind, res, f.asJSON)
	}
	return err
}

// run runs the replay with rcfg: without a partner API client on a dry
// run, else with one of up to rcfg.Concurrency connections.
func (f *replayFlags) run(ctx context.Context, rcfg replay.Config, log *slog.Logger) (replay.Result, error) {
	if rcfg.DryRun {
		return replay.Run(ctx, rcfg, nil, f.sel)
	}
	f.api.cfg.MaxConns = roles.PoolSize(f.api.cfg.MaxConns, rcfg.Concurrency)
	client, stopAPI, err := f.api.open(log, telemetry.Providers{}) // no telemetry set up: not instrumented
	if err != nil {
		return replay.Result{}, err
	}
	defer stopAPI()
	rcfg.Partner = f.api.cfg.BaseURL
	return replay.Run(ctx, rcfg, client, f.sel)
}

func printReplayResult(w io.Writer, kind string, r replay.Result, asJSON bool) {
	if asJSON {
		b, _ := json.MarshalIndent(r, "", "  ")
		fmt.Fprintln(w, string(b))
		return
	}
	if r.DryRun {
		fmt.Fprintf(w, "%s %s (dry run, nothing sent): %d selected, %d already delivered by this replay id, %d to send\n",
			kind, r.ReplayID, r.Selected, r.AlreadyDone, r.Selected-r.AlreadyDone)
		if len(r.Samples) > 0 {
			fmt.Fprintf(w, "sample report ids: %s\n", strings.Join(r.Samples, " "))
		}
		return
	}
	fmt.Fprintf(w, "%s %s: %d selected, %d already done, %d posts, %d delivered, %d rejected, %d unfinished, %d missing, %d untried, %d queued\n",
		kind, r.ReplayID, r.Selected, r.AlreadyDone, r.Posts, r.Delivered, r.Rejected, r.Unfinished, r.Missing, r.Untried, r.Queued)
}

var _ flag.Value = listFlag{}
