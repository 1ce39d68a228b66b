package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/reporter"
	"github.com/playpipe/playpipe/wiring/roles"
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
		rf   roleFlags
		api  apiTarget
		rcfg reporter.Config
	)
	rf.register(fs, "report")
	api.register(fs, "post the reports to")
	registerReporterFlags(fs, &rcfg)
	log, err := rf.parse(fs, args, stderr)
	if err != nil {
		return err
	}
	// /readyz says degraded while the reporter posts, the partner answers
	// and nothing is delivered (reporter.Reporter.Ready).
	var running atomic.Pointer[reporter.Reporter]
	run, err := rf.startWithAPI(ctx, log, &api, func(tel *telemetry.Role) {
		tel.AddReadyCheck("delivery", func(context.Context) error {
			if rep := running.Load(); rep != nil {
				return rep.Ready()
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	defer run.close()
	// Every post in flight needs its own keep-alive connection, up to the
	// cap of the adaptive limit.
	maxInFlight := cmp.Or(rcfg.MaxConcurrency, max(reporter.DefaultMaxConcurrency, rcfg.Concurrency))
	partner, stopAPI, err := api.openFor(log, roles.InFlight(maxInFlight, false), run.tel)
	if err != nil {
		return err
	}
	run.onClose(stopAPI)
	rcfg.Logger = log
	rep, err := roles.NewReporter(rcfg, run.kafka, partner, run.tel, log) // PartnerURL: --api-url, or the sandbox's loopback URL
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	if err := run.exportLagOf(rcfg.Group, run.kafka.Topics().Reports); err != nil {
		return err
	}
	running.Store(rep)
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
