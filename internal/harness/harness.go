// Package pipeline runs every role of playpipe in one process — the enrich
// consumer, the reporter and the ClickHouse sink — over one Kafka, one partner
// API and one ClickHouse, each either configured or started locally (the
// embedded Kafka-protocol broker, the built-in sandbox, a local
// clickhouse-server). It is what `playpipe demo` and the full end-to-end tests
// run.
//
// A Pipeline owns everything it started: Close stops the roles (consumer,
// then reporter, then sink, each draining within its own deadline) and then
// the local parts, in reverse order of start. Roles can be stopped and
// started again (StopRole, StartRole) to exercise crash recovery. A Pipeline
// is safe for concurrent use.
package harness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/reporter"
)

// Role names accepted by StartRole and StopRole.
const (
	RoleConsume = "consume"
	RoleReport  = "report"
	RoleSink    = "sink"
)

// Config configures a Pipeline. Zero values start local parts.
type Config struct {
	// Kafka is the connection: Brokers, or Embedded to start an embedded
	// in-memory broker; with neither Start refuses (kafkax.ErrNoBrokers).
	Kafka kafkax.Config
	// API is the partner API client configuration; with no BaseURL the built-in
	// sandbox (configured by Sandbox) is started on loopback and its
	// credentials are used.
	API     partnerapi.Config
	Sandbox sandbox.Config
	// ClickHouse is the ledger's server: Addr, or DataDir to start (or reuse)
	// a local server in that folder; with neither Start refuses
	// (analytics.ErrNoClickHouse). NoSink skips the sink and ClickHouse.
	ClickHouse analytics.Config
	NoSink     bool
	// Consumer, Reporter and Sink configure the roles; their Kafka (and
	// ClickHouse, Source) fields are filled in by Start.
	Consumer consumer.Config
	Reporter reporter.Config
	Sink     analytics.SinkConfig
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Pipeline is a running set of roles; see the package documentation.
type Pipeline struct {
	// Kafka is the effective Kafka configuration (brokers of the embedded one if started).
	Kafka kafkax.Config
	// Sandbox is the built-in partner API sandbox, nil when the API is external.
	Sandbox *sandbox.Server
	// APIURL is the partner API base address in use.
	APIURL string
	// API is the partner API client shared by the roles.
	API *partnerapi.Client
	// ClickHouse is the effective ClickHouse configuration (zero with NoSink).
	ClickHouse analytics.Config

	opts    Config
	log     *slog.Logger
	closers []func() // local parts, stopped in reverse order
	errc    chan error

	mu       sync.Mutex
	roles    map[string]*running
	enricher *consumer.Enricher
}

type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start brings up the local parts that are not configured and starts the
// three roles. ctx bounds the start-up only; the roles run until Close.
func Start(ctx context.Context, o Config) (p *Pipeline, err error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	p = &Pipeline{opts: o, log: log, roles: map[string]*running{}, errc: make(chan error, 8)}
	started := p // p itself is nil after `return nil, err`
	defer func() {
		if err != nil {
			started.stopParts()
		}
	}()

	p.Kafka = o.Kafka
	if p.Kafka.Partitions == 0 {
		p.Kafka.Partitions = 6
	}
	if p.Kafka.ReplicationFactor == 0 {
		p.Kafka.ReplicationFactor = -1
	}
	kcfg, stopKafka, err := kafkax.Ready(ctx, p.Kafka, log)
	if err != nil {
		return nil, err
	}
	p.Kafka = kcfg
	p.closers = append(p.closers, stopKafka)

	apiCfg := o.API
	if apiCfg.BaseURL == "" {
		sb, err := sandbox.ServeLoopback(o.Sandbox)
		if err != nil {
			return nil, fmt.Errorf("pipeline: %w", err)
		}
		p.closers = append(p.closers, sb.Close)
		p.Sandbox = sb.Server
		url := sb.URL
		apiCfg.BaseURL = url
		apiCfg.Credentials = partnerapi.Credentials{ClientID: orDefault(o.Sandbox.ClientID, sandbox.DefaultClientID),
			ClientSignature: orDefault(o.Sandbox.ClientSignature, sandbox.DefaultClientSignature),
			Email:           orDefault(o.Sandbox.Email, sandbox.DefaultEmail)}
		log.Info("built-in partner API sandbox started", "url", url)
	}
	if apiCfg.Logger == nil {
		apiCfg.Logger = log
	}
	if apiCfg.MaxConns == 0 && o.Reporter.Concurrency > 0 {
		apiCfg.MaxConns = o.Reporter.Concurrency + 8
	}
	p.APIURL = apiCfg.BaseURL
	p.API, err = partnerapi.New(apiCfg)
	if err != nil {
		return nil, fmt.Errorf("pipeline: partner API client: %w", err)
	}
	p.closers = append(p.closers, p.API.Close)

	if !o.NoSink {
		ch, stop, err := analytics.LocalOrConfigured(ctx, o.ClickHouse, log)
		if err != nil {
			return nil, fmt.Errorf("pipeline: clickhouse: %w", err)
		}
		p.closers = append(p.closers, stop)
		p.ClickHouse = ch
	}

	for _, name := range p.roleNames() {
		if err := p.StartRole(name); err != nil {
			p.stopRoles()
			return nil, err
		}
	}
	return p, nil
}

func (p *Pipeline) roleNames() []string {
	if p.opts.NoSink {
		return []string{RoleConsume, RoleReport}
	}
	return []string{RoleConsume, RoleReport, RoleSink}
}

// Errors delivers the error of a role that stopped by itself (not through
// StopRole or Close): a configuration error, a lost broker.
func (p *Pipeline) Errors() <-chan error { return p.errc }

// Enricher returns the running consumer role, nil when it is stopped.
func (p *Pipeline) Enricher() *consumer.Enricher {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.enricher
}

// StartRole starts a role that is not running.
func (p *Pipeline) StartRole(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.roles[name]; ok {
		return fmt.Errorf("pipeline: role %s is already running", name)
	}
	var run func(context.Context) error
	switch name {
	case RoleConsume:
		o := p.opts.Consumer
		o.Kafka, o.Source = p.Kafka, p.API
		if o.Logger == nil {
			o.Logger = p.log.With("role", name)
		}
		e, err := consumer.New(o)
		if err != nil {
			return fmt.Errorf("pipeline: consumer: %w", err)
		}
		p.enricher = e
		run = e.Run
	case RoleReport:
		c := p.opts.Reporter
		c.Kafka = p.Kafka
		if c.PartnerURL == "" {
			c.PartnerURL = p.APIURL // recorded in every delivery: which partner target answered
		}
		if c.Logger == nil {
			c.Logger = p.log.With("role", name)
		}
		r, err := reporter.New(c, p.API)
		if err != nil {
			return fmt.Errorf("pipeline: reporter: %w", err)
		}
		run = r.Run
	case RoleSink:
		if p.opts.NoSink {
			return errors.New("pipeline: the sink is disabled (NoSink)")
		}
		c := p.opts.Sink
		c.Kafka, c.ClickHouse = p.Kafka, p.ClickHouse
		if c.Logger == nil {
			c.Logger = p.log.With("role", name)
		}
		s, err := analytics.NewSink(c)
		if err != nil {
			return fmt.Errorf("pipeline: sink: %w", err)
		}
		run = s.Run
	default:
		return fmt.Errorf("pipeline: unknown role %q; accepted: %s, %s, %s", name, RoleConsume, RoleReport, RoleSink)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	p.roles[name] = r
	go func() {
		defer close(r.done)
		r.err = run(ctx)
		if ctx.Err() == nil { // stopped by itself
			if r.err == nil {
				r.err = fmt.Errorf("pipeline: role %s stopped unexpectedly", name)
			}
			select {
			case p.errc <- fmt.Errorf("%s: %w", name, r.err):
			default:
			}
		}
	}()
	return nil
}

// StopRole cancels a running role and waits until it has returned (each role
// drains within its own shutdown deadline). It returns the role's error.
func (p *Pipeline) StopRole(name string) error {
	p.mu.Lock()
	r, ok := p.roles[name]
	delete(p.roles, name)
	if name == RoleConsume {
		p.enricher = nil
	}
	p.mu.Unlock()
	if !ok {
		return nil
	}
	r.cancel()
	<-r.done
	if r.err != nil && !errors.Is(r.err, context.Canceled) {
		return r.err
	}
	return nil
}

func (p *Pipeline) stopRoles() error {
	var errs []error
	for _, name := range []string{RoleConsume, RoleReport, RoleSink} {
		if err := p.StopRole(name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func (p *Pipeline) stopParts() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
	p.closers = nil
}

// Close stops the roles upstream first, then the local parts. Safe to call twice.
func (p *Pipeline) Close() error {
	err := p.stopRoles()
	p.stopParts()
	return err
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
