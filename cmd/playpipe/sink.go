package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/wiring/roles"
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
		rf roleFlags
		sc analytics.SinkConfig
	)
	rf.register(fs, "sink")
	registerClickHouseFlags(fs, &sc.ClickHouse)
	registerSinkFlags(fs, &sc)
	log, err := rf.parse(fs, args, stderr)
	if err != nil {
		return err
	}
	if err := checkSink(rf.kafka, sc); err != nil {
		if errors.Is(err, errUsage) { // names the flags; printed by runMain
			return err
		}
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	// The readiness checks exist from the first /readyz on: not ready while
	// Kafka or ClickHouse are being reached (a local server starting), nor
	// until the sink has applied the ledger schema, nor whenever either
	// stops answering.
	var readySink atomic.Pointer[analytics.Sink]
	run, err := rf.start(ctx, log, func(tel *telemetry.Role) {
		tel.AddReadyCheck("clickhouse", func(ctx context.Context) error {
			s := readySink.Load()
			if s == nil {
				return errors.New("clickhouse: not reached yet")
			}
			return s.Ready(ctx)
		})
	})
	if err != nil {
		return err
	}
	defer run.close()
	chcfg, stopCH, err := localOrConfigured(ctx, sc.ClickHouse, log)
	if err != nil {
		return err
	}
	run.onClose(stopCH)
	if err := run.exportLagOf(sc.Group, run.kafka.Topics().Ledger()...); err != nil {
		return err
	}
	sc.Logger = log
	s, err := roles.NewSink(sc, run.kafka, chcfg, run.tel, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	readySink.Store(s)
	return s.Run(ctx)
}

// registerSinkFlags binds the sink's own flags (not Kafka's nor ClickHouse's)
// to sc.
func registerSinkFlags(fs *flag.FlagSet, sc *analytics.SinkConfig) {
	fs.StringVar(&sc.Group, "group", envDefault("PLAYPIPE_SINK_GROUP", "playpipe-sink"), "consumer group of the sink (env PLAYPIPE_SINK_GROUP)")
	fs.IntVar(&sc.BatchRows, "batch-rows", 10000, "most records per insert (10k-row batches are the sweet spot; small batches cost the server much more per row)")
	fs.DurationVar(&sc.Linger, "linger", time.Second, "longest a non-empty batch waits for more records before it is inserted")
	fs.DurationVar(&sc.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long to keep inserting and committing what was read")
	fs.DurationVar(&sc.RetryMax, "retry-max", 5*time.Second, "longest wait between insert attempts while ClickHouse fails")
}

// checkSink checks the flags before anything starts: Kafka and ClickHouse
// named (usage errors naming the flags), and the sink's own settings, with
// placeholders for the addresses only known once the parts run.
func checkSink(kcfg kafkax.Config, sc analytics.SinkConfig) error {
	if err := requireKafka(kcfg); err != nil {
		return err
	}
	if err := requireClickHouse(sc.ClickHouse); err != nil {
		return err
	}
	sc.Kafka, sc.ClickHouse.Addr = kcfg, "127.0.0.1:0"
	if sc.Kafka.Embedded {
		sc.Kafka.Embedded, sc.Kafka.EmbeddedPort, sc.Kafka.Brokers = false, 0, []string{"127.0.0.1:0"}
	}
	return sc.Validate()
}
