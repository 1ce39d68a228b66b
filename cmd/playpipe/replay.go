package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/roles"
	"github.com/playpipe/playpipe/replay"
)

func init() {
	register(command{
		name:    "replay",
		summary: "re-deliver the reports of a window the partner lost, audited as a replay (not as duplicates)",
		run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return runReplay(ctx, replay.KindReplay, args, stdout, stderr)
		},
	})
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
separated), or every rejection in [--from, --to) (the time of the rejection). Same recording
as playpipe replay: its own replay id and --reason on every answer, listed by the audit as a
replay, never counted as a duplicate. Full guide: docs/replay.md.

Example:
  playpipe redrive --brokers kafka:9092 --api-url https://api.example.com \
    --clickhouse-addr clickhouse:9000 --message "isrc is invalid" --reason "partner fixed ISRC validation"`

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

func runReplay(ctx context.Context, kind string, args []string, stdout, stderr io.Writer) error {
	synopsis := replaySynopsis
	if kind == replay.KindRedrive {
		synopsis = redriveSynopsis
	}
	fs := newFlagSet(kind, stderr, synopsis)
	var (
		lf                  logFlags
		kcfg                kafkax.Config
		api                 apiTarget
		chCfg               analytics.Config
		rcfg                replay.Config
		sel                 = replay.Selection{Kind: kind}
		from, to            string
		asJSON, liveBypassN bool
	)
	registerKafkaFlags(fs, &kcfg)
	api.register(fs, "post the reports to")
	registerClickHouseFlags(fs, &chCfg)
	lf.register(fs.StringVar)
	if kind == replay.KindReplay {
		fs.StringVar(&from, "from", "", "start of the window (inclusive; required): RFC 3339, 2026-11-21T14:02 (UTC), epoch ms, or -90m")
		fs.StringVar(&to, "to", "now", "end of the window (exclusive)")
		fs.StringVar(&sel.By, "by", replay.ByDelivered, "what the window applies to: "+strings.Join(replay.ByNames, ", ")+" (the play's time, the live delivery's time, the derivation's time)")
		fs.BoolVar(&sel.OnlyStandby, "only-standby", false, "only reports answered by standby (with --by delivered: answered by standby in the window)")
	} else {
		fs.StringVar(&from, "from", "", "only rejections at or after this time")
		fs.StringVar(&to, "to", "", "only rejections before this time")
		fs.Var(listFlag{&sel.Messages}, "message", "only rejections with this API message (repeatable)")
	}
	fs.Var(listFlag{&sel.ReportIDs}, "report-id", "only these report ids (repeatable or comma separated)")
	fs.StringVar(&rcfg.Reason, "reason", "", "why the reports are sent again (required; recorded with every delivery)")
	fs.StringVar(&rcfg.ReplayID, "replay-id", "", "the run's id: empty for a new one; an earlier id resumes it (nothing it delivered is sent again)")
	fs.BoolVar(&rcfg.DryRun, "dry-run", false, "print the counts and sample report ids; send nothing")
	fs.Float64Var(&rcfg.Rate, "rate", 50, "most posts per second (0: no limit)")
	fs.IntVar(&rcfg.Concurrency, "concurrency", 8, "most posts in flight")
	fs.IntVar(&rcfg.MaxAttempts, "max-attempts", 8, "most posts of one report answered by a transient failure or standby")
	fs.DurationVar(&rcfg.Progress, "progress", 5*time.Second, "interval of the progress lines (0: none)")
	fs.IntVar(&rcfg.Samples, "samples", 10, "report ids a --dry-run prints")
	fs.BoolVar(&liveBypassN, "live-bypass-not-delivered", false, "count a 200 served by live-bypass as not delivered (retried)")
	fs.BoolVar(&asJSON, "json", false, "print the result as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	usage := func(err error) error { return usageError{err} }
	log, err := lf.logger(stderr)
	if err != nil {
		return usage(err)
	}
	now := time.Now()
	if from != "" {
		if sel.From, err = parseAuditTime(from, now); err != nil {
			return usage(fmt.Errorf("--from: %w", err))
		}
	}
	if to != "" {
		if sel.To, err = parseAuditTime(to, now); err != nil {
			return usage(fmt.Errorf("--to: %w", err))
		}
	}
	if err := sel.Validate(); err != nil {
		return usage(err)
	}
	if strings.TrimSpace(rcfg.Reason) == "" {
		return usage(errors.New("--reason is required: say why the reports are sent again (it is recorded with every delivery)"))
	}
	if rcfg.Concurrency < 1 || rcfg.Concurrency > 1024 {
		return usage(fmt.Errorf("--concurrency must be between 1 and 1024, got %d", rcfg.Concurrency))
	}
	if rcfg.Rate < 0 || rcfg.Progress < 0 || rcfg.MaxAttempts < 1 || rcfg.Samples < 0 {
		return usage(fmt.Errorf("--rate and --progress must be ≥ 0, --max-attempts ≥ 1, --samples ≥ 0 (got %v, %v, %d, %d)", rcfg.Rate, rcfg.Progress, rcfg.MaxAttempts, rcfg.Samples))
	}
	if err := requireKafka(kcfg); err != nil {
		return err
	}
	if !rcfg.DryRun {
		if err := api.check(); err != nil {
			return err
		}
	}
	if err := requireClickHouse(chCfg); err != nil {
		return err
	}
	chCfg, stopCH, err := analytics.LocalOrConfigured(ctx, chCfg, log)
	if err != nil {
		return err
	}
	defer stopCH()
	conn, err := chCfg.Open()
	if err != nil {
		return err
	}
	defer conn.Close()
	// The selection reads deliveries.replay_id (migration 4).
	if _, err := analytics.Migrate(ctx, conn, chCfg.Database); err != nil {
		return err
	}
	kcfg, stopKafka, err := kafkax.Ready(ctx, kcfg, log)
	if err != nil {
		return err
	}
	defer stopKafka()
	rcfg.Kafka, rcfg.CH, rcfg.Database, rcfg.Logger, rcfg.Out = kcfg, conn, chCfg.Database, log, stdout
	rcfg.LiveBypassDelivered = !liveBypassN
	if rcfg.Samples == 0 {
		rcfg.Samples = -1
	}
	res, err := func() (replay.Result, error) {
		if rcfg.DryRun {
			return replay.Run(ctx, rcfg, nil, sel)
		}
		api.cfg.MaxConns = roles.PoolSize(api.cfg.MaxConns, rcfg.Concurrency)
		client, stopAPI, err := api.open(log)
		if err != nil {
			return replay.Result{}, err
		}
		defer stopAPI()
		rcfg.Partner = api.cfg.BaseURL
		return replay.Run(ctx, rcfg, client, sel)
	}()
	if res.ReplayID != "" {
		printReplayResult(stdout, kind, res, asJSON)
	}
	return err
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
	fmt.Fprintf(w, "%s %s: %d selected, %d already done, %d posts, %d delivered, %d rejected, %d unfinished, %d missing\n",
		kind, r.ReplayID, r.Selected, r.AlreadyDone, r.Posts, r.Delivered, r.Rejected, r.Unfinished, r.Missing)
}

var _ flag.Value = listFlag{}
