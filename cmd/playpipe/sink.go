package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
)

func init() {
	register(command{
		name:    "sink",
		summary: "copy the four topics into the ClickHouse audit ledger (batched, idempotent)",
		run:     runSink,
	})
}

const sinkSynopsis = `Consumes <prefix>.events, .reports, .rejected and .deliveries (consumer group,
read_committed) and inserts every record into the ledger tables in batches; offsets are
committed only after ClickHouse confirmed the insert, and re-inserted rows after a crash
are recognised by their Kafka topic/partition/offset. While ClickHouse is down the sink
waits and retries; it never drops a record. Applies the schema migrations at start-up.
Full guide: docs/audit.md.

Example (the password from the environment only):
  PLAYPIPE_CLICKHOUSE_PASSWORD=... playpipe sink --brokers kafka:9092 \
    --clickhouse-addr clickhouse:9000 --clickhouse-user playpipe --batch-rows 10000 --linger 1s

--brokers (or --embedded-kafka) and --clickhouse-addr (or --clickhouse-data DIR) are
required: without them the command refuses to start (exit 2). With --clickhouse-data the
sink runs a local clickhouse-server in DIR (or reuses the one already running there) and
restarts it, on the same ports, if it dies. /readyz answers ready only while Kafka and
ClickHouse both answer.`

func runSink(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sink", stderr, sinkSynopsis)
	var (
		lf   logFlags
		kcfg kafkax.Config
		sc   analytics.SinkConfig
	)
	kcfg.RegisterFlags(fs)
	sc.ClickHouse.RegisterFlags(fs)
	lf.register(fs.StringVar)
	adminAddr := telemetry.AdminAddrFlag(fs, "sink")
	pprof := pprofFlag(fs)
	fs.StringVar(&sc.Group, "group", envDefault("PLAYPIPE_SINK_GROUP", "playpipe-sink"), "consumer group of the sink (env PLAYPIPE_SINK_GROUP)")
	fs.IntVar(&sc.BatchRows, "batch-rows", 10000, "most records per insert (10k-row batches are the sweet spot; small batches cost the server much more per row)")
	fs.DurationVar(&sc.Linger, "linger", time.Second, "longest a non-empty batch waits for more records before it is inserted")
	fs.DurationVar(&sc.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long to keep inserting and committing what was read")
	fs.DurationVar(&sc.RetryMax, "retry-max", 5*time.Second, "longest wait between insert attempts while ClickHouse fails")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	// Check the flags before starting anything.
	if err := requireKafka(kcfg); err != nil {
		return err
	}
	if err := requireClickHouse(sc.ClickHouse); err != nil {
		return err
	}
	check := sc
	check.Kafka, check.ClickHouse.Addr = kcfg, "127.0.0.1:0"
	if check.Kafka.Embedded {
		check.Kafka.Embedded, check.Kafka.EmbeddedPort, check.Kafka.Brokers = false, 0, []string{"127.0.0.1:0"}
	}
	if err := check.Validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	tel, stopTelemetry, err := startTelemetry(ctx, "sink", *adminAddr, *pprof, log)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	// The readiness checks exist from the first /readyz on: not ready while
	// Kafka or ClickHouse are being reached (a local server starting), nor
	// until the sink has applied the ledger schema, nor whenever either
	// stops answering.
	setKafkaReady := addKafkaReadyCheck(tel)
	var readySink atomic.Pointer[analytics.Sink]
	tel.AddReadyCheck("clickhouse", func(ctx context.Context) error {
		s := readySink.Load()
		if s == nil {
			return errors.New("clickhouse: not reached yet")
		}
		return s.Ready(ctx)
	})
	kcfg, stopKafka, err := kafkax.Ready(ctx, kcfg, log)
	if err != nil {
		return err
	}
	defer stopKafka()
	setKafkaReady(kcfg)
	chcfg, stopCH, err := analytics.LocalOrConfigured(ctx, sc.ClickHouse, log)
	if err != nil {
		return err
	}
	defer stopCH()
	sc.ClickHouse = chcfg
	stopLag, err := exportLag(kcfg, sc.Group, kcfg.Topics().All()...)
	if err != nil {
		return err
	}
	defer stopLag()
	sc.Kafka, sc.Logger = kcfg, log
	s, err := analytics.NewSink(sc)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	readySink.Store(s)
	return s.Run(ctx)
}
