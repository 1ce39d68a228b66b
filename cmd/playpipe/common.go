package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/wiring/roles"
)

// logFlags are the logging flags shared by every subcommand.
type logFlags struct {
	format string
	level  string
}

func (l *logFlags) register(fsRegister func(p *string, name, value, usage string)) {
	fsRegister(&l.format, "log-format", envDefault("PLAYPIPE_LOG_FORMAT", "text"), "log format: text or json (env PLAYPIPE_LOG_FORMAT)")
	fsRegister(&l.level, "log-level", envDefault("PLAYPIPE_LOG_LEVEL", "info"), "log level: debug, info, warn or error (env PLAYPIPE_LOG_LEVEL)")
}

// logger builds the slog logger the flags ask for, writing to w: records
// logged with a traced context carry trace_id and span_id, and attributes
// named like secrets are redacted.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	log, err := telemetry.NewLogger(w, l.format, l.level)
	if err != nil {
		return nil, fmt.Errorf("%w (--log-format: text, json; --log-level: debug, info, warn, error)", err)
	}
	return log, nil
}

// startTelemetry sets up OpenTelemetry for a role (OTEL_* export, metrics on
// the admin port's /metrics, /healthz, /readyz) and returns a stop function
// that flushes within ten seconds.
func startTelemetry(ctx context.Context, role, adminAddr string, pprof bool, log *slog.Logger) (*telemetry.Role, func(), error) {
	tel, err := telemetry.StartRole(ctx, role, adminAddr, log)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: %w", err)
	}
	if pprof && tel.Admin != nil {
		tel.Admin.EnablePprof()
		log.Info("pprof served on the admin listener", "url", "http://"+tel.Admin.Addr()+"/debug/pprof/")
	}
	return tel, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tel.Close(cctx); err != nil {
			log.Warn("stopping telemetry", "role", role, "err", err)
		}
	}, nil
}

// addKafkaReadyCheck registers the role's "kafka" readiness check at once,
// failing until set is called with the role's kafkax.Health (after
// kafkax.Ready): /readyz must not answer ready while the brokers are still
// being reached, or an embedded broker is still starting. The check answers
// from the Health's last probe, never waiting on the broker.
func addKafkaReadyCheck(tel *telemetry.Role) (set func(*kafkax.Health)) {
	var cur atomic.Pointer[kafkax.Health]
	tel.AddReadyCheck("kafka", func(ctx context.Context) error {
		h := cur.Load()
		if h == nil {
			return errors.New("kafka: not reached yet")
		}
		return h.Check(ctx)
	})
	return cur.Store
}

// exportLag registers the playpipe.consumer.lag gauge of group (per topic
// and partition, read from Kafka at scrape time) on the role's meter
// provider mp, and returns the function that unregisters it and closes its
// admin client.
func exportLag(kcfg kafkax.Config, mp metric.MeterProvider, group string, topics ...string) (func(), error) {
	opts, err := kcfg.ClientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("lag metrics: %w", err)
	}
	reg, err := telemetry.RegisterConsumerLag(telemetry.OrNoopMeterProvider(mp).Meter("github.com/playpipe/playpipe/cmd/playpipe"), kadm.NewClient(cl), group,
		telemetry.ConsumerLagOptions{Topics: topics, Client: cl})
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("lag metrics: %w", err)
	}
	return func() {
		_ = reg.Unregister()
		cl.Close()
	}, nil
}

// roleFlags are the flags every long-running role (consume, report, sink)
// shares: Kafka, logging, --admin-addr and --pprof.
type roleFlags struct {
	name      string
	kafka     kafkax.Config
	log       logFlags
	adminAddr *string
	pprof     *bool
}

// register binds the shared flags of the role name to fs.
func (r *roleFlags) register(fs *flag.FlagSet, name string) {
	r.name = name
	registerKafkaFlags(fs, &r.kafka)
	r.log.register(fs.StringVar)
	r.adminAddr = adminAddrFlag(fs, name)
	r.pprof = pprofFlag(fs)
}

// parse parses args and builds the logger the flags ask for (parseLogged).
func (r *roleFlags) parse(fs *flag.FlagSet, args []string, stderr io.Writer) (*slog.Logger, error) {
	return parseLogged(fs, args, &r.log, stderr)
}

// parseLogged parses args (parseFlags) and builds the logger lf asks for; a
// bad flag or log setting is a usage error, printed on stderr.
func parseLogged(fs *flag.FlagSet, args []string, lf *logFlags, stderr io.Writer) (*slog.Logger, error) {
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, errUsage
	}
	return log, nil
}

// roleRun is the running frame of a role: its telemetry (admin server with
// /metrics, /healthz, /readyz) and its Kafka, ready. close stops them in
// reverse order.
type roleRun struct {
	kafka kafkax.Config       // effective: the embedded broker's address if started
	tel   telemetry.Providers // the role's providers, for its Config
	stops []func()
}

// start starts the role's telemetry, registers the "kafka" readiness check
// (and the role's own, from checks, before Kafka is reached: /readyz must
// not answer ready while a part is still starting), and makes Kafka ready
// (roles.StartKafka). On error what was started is stopped.
func (r *roleFlags) start(ctx context.Context, log *slog.Logger, checks func(*telemetry.Role)) (*roleRun, error) {
	tel, stopTelemetry, err := startTelemetry(ctx, r.name, *r.adminAddr, *r.pprof, log)
	if err != nil {
		return nil, err
	}
	run := &roleRun{tel: tel.Providers, stops: []func(){stopTelemetry}}
	setKafkaReady := addKafkaReadyCheck(tel)
	if checks != nil {
		checks(tel)
	}
	kcfg, stopKafka, err := roles.StartKafka(ctx, r.kafka, log)
	if err != nil {
		run.close()
		return nil, err
	}
	run.onClose(stopKafka)
	h, kcfg, stopHealth, err := startKafkaHealth(ctx, r.name, kcfg, tel.Providers.Meter, log)
	if err != nil {
		run.close()
		return nil, err
	}
	run.onClose(stopHealth)
	run.kafka = kcfg
	setKafkaReady(h)
	return run, nil
}

// startWithAPI starts a role that reads Kafka and talks to the partner API
// (consume, report): it checks that Kafka is configured and that api
// answers its flags, then starts the role as start does, with the role's
// own readiness checks from checks (nil: none).
func (r *roleFlags) startWithAPI(ctx context.Context, log *slog.Logger, api *apiTarget, checks func(*telemetry.Role)) (*roleRun, error) {
	if err := requireKafka(r.kafka); err != nil {
		return nil, err
	}
	if err := api.check(); err != nil {
		return nil, err
	}
	return r.start(ctx, log, checks)
}

// onClose adds stop to what close runs (first added, last run).
func (r *roleRun) onClose(stop func()) { r.stops = append(r.stops, stop) }

// close runs the stop functions in reverse order of addition.
func (r *roleRun) close() {
	for i := len(r.stops) - 1; i >= 0; i-- {
		r.stops[i]()
	}
	r.stops = nil
}

// exportLagOf is exportLag registered as one of the run's stops.
func (r *roleRun) exportLagOf(group string, topics ...string) error {
	stop, err := exportLag(r.kafka, r.tel.Meter, group, topics...)
	if err != nil {
		return err
	}
	r.onClose(stop)
	return nil
}
