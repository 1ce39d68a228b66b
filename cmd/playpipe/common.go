package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
)

// partnerAPI returns a client of the configured partner API; with no
// --api-url it serves a built-in sandbox (seed 1, its sandbox-only
// credentials) on loopback and says so. why ends the warning. A
// configuration error is a usage error (exit 2).
func partnerAPI(cfg partnerapi.Config, log *slog.Logger, why string) (*partnerapi.Client, func(), error) {
	stop := func() {}
	if cfg.BaseURL == "" {
		sb, err := sandbox.ServeLoopback(sandbox.Options{Seed: 1, Logger: log})
		if err != nil {
			return nil, stop, err
		}
		log.Warn("no --api-url configured: using a built-in sandbox of the partner API on loopback ("+why+")", "url", sb.URL)
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
		return nil, func() {}, fmt.Errorf("%w: %v", errUsage, err)
	}
	return api, func() { api.Close(); stop() }, nil
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
func startTelemetry(ctx context.Context, role, adminAddr string, log *slog.Logger) (*telemetry.Role, func(), error) {
	tel, err := telemetry.StartRole(ctx, role, adminAddr, log)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: %w", err)
	}
	return tel, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tel.Close(cctx); err != nil {
			log.Warn("stopping telemetry", "role", role, "err", err)
		}
	}, nil
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
		telemetry.ConsumerLagOptions{Topics: topics})
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("lag metrics: %w", err)
	}
	return func() {
		_ = reg.Unregister()
		cl.Close()
	}, nil
}
