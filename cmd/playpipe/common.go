package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
)

// apiTarget is the partner API a role talks to: the configured --api-url,
// or, only when --sandbox is given, a built-in sandbox on loopback. There is
// no implicit fallback: a role that needs the API and has neither refuses to
// start (exit 2), so a missing PLAYPIPE_API_URL can never make a reporter
// tell finance that plays were delivered that never left the machine.
type apiTarget struct {
	cfg     partnerapi.Config
	sandbox bool
}

// register binds the --api-* flags and --sandbox to fs; what names the
// sandbox's use in the role (its help text).
func (a *apiTarget) register(fs *flag.FlagSet, what string) {
	a.cfg.RegisterFlags(fs)
	fs.BoolVar(&a.sandbox, "sandbox", false, "instead of --api-url: "+what+" a built-in sandbox of the partner API on loopback (seed 1, its sandbox-only credentials; for try-outs)")
}

// check reports a missing or doubled target as a usage error naming the
// flags, before anything starts.
func (a *apiTarget) check() error {
	switch {
	case a.cfg.BaseURL == "" && !a.sandbox:
		return usageError{fmt.Errorf("no partner API configured: set --api-url (env %s) or pass --sandbox to use a built-in sandbox on loopback", partnerapi.EnvURL)}
	case a.cfg.BaseURL != "" && a.sandbox:
		return usageError{fmt.Errorf("--api-url (%s) and --sandbox exclude each other: set one (%s counts as --api-url)", a.cfg.BaseURL, partnerapi.EnvURL)}
	}
	return nil
}

// open returns a client of the target: with --sandbox it first serves a
// built-in sandbox (seed 1, its sandbox-only credentials) on loopback and
// says so. The returned stop function closes the client and the sandbox. A
// configuration error is a usage error (exit 2).
func (a *apiTarget) open(log *slog.Logger) (*partnerapi.Client, func(), error) {
	if err := a.check(); err != nil {
		return nil, func() {}, err
	}
	cfg := a.cfg
	stop := func() {}
	if a.sandbox {
		sb, err := sandbox.ServeLoopback(sandbox.Config{Seed: 1, Logger: log})
		if err != nil {
			return nil, stop, err
		}
		log.Warn("--sandbox: using a built-in sandbox of the partner API on loopback; nothing reaches the real partner", "url", sb.URL)
		stop = func() {
			sb.Close()
			c := sb.Counts()
			log.Info("built-in sandbox stopped", "accepted", c.Accepted, "standby", c.Standby, "rejected", c.Rejected, "duplicates", c.Duplicates)
		}
		cfg.BaseURL = sb.URL
		cfg.Credentials = partnerapi.Credentials{ClientID: sandbox.DefaultClientID, ClientSignature: sandbox.DefaultClientSignature}
	}
	cfg.Logger = log
	api, err := partnerapi.New(cfg)
	if err != nil {
		stop()
		return nil, func() {}, usageError{err}
	}
	a.cfg.BaseURL = cfg.BaseURL // the URL in use, for the delivery records
	return api, func() { api.Close(); stop() }, nil
}

// requireKafka reports a role with neither --brokers nor --embedded-kafka
// (or an invalid Kafka configuration) as a usage error naming the flags.
func requireKafka(kcfg kafkax.Config) error {
	if err := kcfg.Validate(); err != nil {
		return usageError{err}
	}
	if err := kcfg.RequireBrokers(); err != nil {
		return usageError{fmt.Errorf("kafka: %w", err)}
	}
	return nil
}

// requireClickHouse reports a role with neither --clickhouse-addr nor
// --clickhouse-data (or both) as a usage error naming the flags.
func requireClickHouse(cfg analytics.Config) error {
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	if err := cfg.RequireServer(); err != nil {
		return usageError{fmt.Errorf("analytics: %w", err)}
	}
	return nil
}

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

func envDefault(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
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

// pprofFlag binds --pprof: net/http/pprof on the admin listener.
func pprofFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("pprof", os.Getenv("PLAYPIPE_PPROF") == "true",
		"serve net/http/pprof under /debug/pprof/ on the admin listener (env PLAYPIPE_PPROF=true); off by default")
}

// addKafkaReadyCheck registers the role's "kafka" readiness check at once,
// failing until set is called with the effective configuration (after
// kafkax.Ready): /readyz must not answer ready while the brokers are still
// being reached, or an embedded broker is still starting.
func addKafkaReadyCheck(tel *telemetry.Role) (set func(kafkax.Config)) {
	var cur atomic.Pointer[kafkax.Config]
	tel.AddReadyCheck("kafka", func(ctx context.Context) error {
		k := cur.Load()
		if k == nil {
			return errors.New("kafka: not reached yet")
		}
		return kafkax.Ping(ctx, *k)
	})
	return func(k kafkax.Config) { cur.Store(&k) }
}

// exportLag registers the playpipe.consumer.lag gauge of group (per topic
// and partition, read from Kafka at scrape time) on the role's meter, and
// returns the function that unregisters it and closes its admin client.
func exportLag(kcfg kafkax.Config, group string, topics ...string) (func(), error) {
	opts, err := kcfg.ClientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("lag metrics: %w", err)
	}
	reg, err := telemetry.RegisterConsumerLag(otel.Meter("github.com/playpipe/playpipe/cmd/playpipe"), kadm.NewClient(cl), group,
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
