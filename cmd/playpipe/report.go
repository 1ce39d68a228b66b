package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/reporter"
)

func init() {
	register(command{
		name:    "report",
		summary: "deliver the track plays of <prefix>.reports to the partner API; outcomes to <prefix>.deliveries",
		run:     runReport,
	})
}

const reportSynopsis = `Consumes <prefix>.reports in a consumer group and posts every track play to the partner
API (POST /partners/royalty-tracking), with many reports in flight, retries with backoff,
standby-aware replay, and offsets committed only past final outcomes. Every answer is
published to <prefix>.deliveries. A blocked User-Agent or refused credentials stop it with
exit status 78 and nothing more committed. Full guide: docs/reporter.md.

Example (brokers and API from the environment; the signature never on the command line):
  PLAYPIPE_API_CLIENT_SIGNATURE=... playpipe report --brokers kafka:9092 \
    --api-url https://api.example.com --api-client-id abcdefghij --concurrency 48

--brokers (or --embedded-kafka) and --api-url (or --sandbox) are required: without them
the command refuses to start (exit 2) rather than post to a built-in sandbox or run on an
in-memory broker by accident. Try-out: playpipe report --embedded-kafka --sandbox`

// exitConfig is the exit status of a configuration error (sysexits EX_CONFIG).
const exitConfig = 78

type configExit struct{ error }

func (configExit) ExitCode() int   { return exitConfig }
func (e configExit) Unwrap() error { return e.error }

func runReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("report", stderr, reportSynopsis)
	var (
		lf   logFlags
		kcfg kafkax.Config
		api  apiTarget
		rcfg reporter.Config
	)
	kcfg.RegisterFlags(fs)
	api.register(fs, "post the reports to")
	rcfg.RegisterFlags(fs)
	lf.register(fs.StringVar)
	adminAddr := telemetry.AdminAddrFlag(fs, "report")
	pprof := pprofFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	if err := requireKafka(kcfg); err != nil {
		return err
	}
	if err := api.check(); err != nil {
		return err
	}
	tel, stopTelemetry, err := startTelemetry(ctx, "report", *adminAddr, *pprof, log)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	setKafkaReady := addKafkaReadyCheck(tel)
	kcfg, stopKafka, err := kafkax.Ready(ctx, kcfg, log)
	if err != nil {
		return err
	}
	defer stopKafka()
	setKafkaReady(kcfg)
	if api.cfg.MaxConns < rcfg.Concurrency {
		// Every post in flight needs its own keep-alive connection.
		api.cfg.MaxConns = rcfg.Concurrency
	}
	client, stopAPI, err := api.open(log)
	if err != nil {
		return err
	}
	defer stopAPI()
	rcfg.Kafka = kcfg
	rcfg.Logger = log
	rcfg.PartnerURL = api.cfg.BaseURL // --api-url, or the sandbox's loopback URL
	rep, err := reporter.New(rcfg, client)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	stopLag, err := exportLag(kcfg, rcfg.Group, kcfg.Topics().Reports)
	if err != nil {
		return err
	}
	defer stopLag()
	if err := rep.Run(ctx); err != nil {
		if errors.Is(err, reporter.ErrInvalidConfig) {
			return configExit{err}
		}
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// Stopped (SIGTERM, Ctrl-C) while a step was still under way,
			// e.g. describing the topics at start ("dial …: operation was
			// canceled"): the stop interrupted it, it did not fail. Any
			// other error, even after a stop, still exits 1.
			log.Warn("report: stopped during a step", "err", err)
			return nil
		}
		return err
	}
	return nil
}
