package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/reporter"
	"github.com/playpipe/playpipe/wiring/roles"
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
	// Telemetry instruments the roles and the partner API client (the
	// providers of telemetry.Setup; a Config field of a role set already
	// wins). Zero: nothing is recorded, trace context still propagates.
	Telemetry telemetry.Providers
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

	partner  *roles.Partner
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
// three roles, wired by wiring/roles as `playpipe consume`, `report` and
// `sink` wire them. ctx bounds the start-up only; the roles run until Close.
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

	kcfg, stopKafka, err := roles.StartKafka(ctx, o.Kafka, log)
	if err != nil {
		return nil, err
	}
	p.Kafka = kcfg
	p.closers = append(p.closers, stopKafka)

	if err := p.openPartner(); err != nil {
		return nil, err
	}

	if !o.NoSink {
		ch, stop, err := analytics.LocalOrConfigured(ctx, o.ClickHouse, log)
		if err != nil {
			return nil, fmt.Errorf("harness: clickhouse: %w", err)
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

// openPartner opens the partner API the roles share: the configured one, or
// (no API.BaseURL) the built-in sandbox of o.Sandbox on loopback, its
// credentials used with its e-mail (restricted catalog) too. The pool is
// sized for the reporter and the consumer sharing it (roles.PoolSize).
func (p *Pipeline) openPartner() error {
	pc := roles.PartnerConfig{API: p.opts.API, InFlight: roles.InFlight(p.opts.Reporter.Concurrency, true), Telemetry: p.opts.Telemetry}
	if pc.API.BaseURL == "" {
		sb := p.opts.Sandbox
		if sb.Email == "" {
			sb.Email = sandbox.DefaultEmail
		}
		pc.Sandbox = &sb
	}
	partner, err := roles.OpenPartner(pc, p.log)
	if err != nil {
		return fmt.Errorf("harness: partner API: %w", err)
	}
	p.closers = append(p.closers, partner.Close)
	p.partner, p.API, p.APIURL = partner, partner.Client, partner.URL
	if partner.Sandbox != nil {
		p.Sandbox = partner.Sandbox.Server
		p.log.Info("built-in partner API sandbox started", "url", partner.URL)
	}
	return nil
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
		return fmt.Errorf("harness: role %s is already running", name)
	}
	run, err := p.newRole(name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	p.roles[name] = r
	go func() {
		defer close(r.done)
		r.err = run(ctx)
		if ctx.Err() == nil { // stopped by itself
			if r.err == nil {
				r.err = fmt.Errorf("harness: role %s stopped unexpectedly", name)
			}
			select {
			case p.errc <- fmt.Errorf("%s: %w", name, r.err):
			default:
			}
		}
	}()
	return nil
}

// newRole builds the role name (wiring/roles) over the pipeline's parts
// and returns its Run. Called with p.mu held.
func (p *Pipeline) newRole(name string) (func(context.Context) error, error) {
	log := p.log.With("role", name)
	switch name {
	case RoleConsume:
		e, err := roles.NewEnricher(p.opts.Consumer, p.Kafka, p.API, p.opts.Telemetry, log)
		if err != nil {
			return nil, fmt.Errorf("harness: consumer: %w", err)
		}
		p.enricher = e
		return e.Run, nil
	case RoleReport:
		r, err := roles.NewReporter(p.opts.Reporter, p.Kafka, p.partner, p.opts.Telemetry, log)
		if err != nil {
			return nil, fmt.Errorf("harness: reporter: %w", err)
		}
		return r.Run, nil
	case RoleSink:
		if p.opts.NoSink {
			return nil, errors.New("harness: the sink is disabled (NoSink)")
		}
		s, err := roles.NewSink(p.opts.Sink, p.Kafka, p.ClickHouse, p.opts.Telemetry, log)
		if err != nil {
			return nil, fmt.Errorf("harness: sink: %w", err)
		}
		return s.Run, nil
	}
	return nil, fmt.Errorf("harness: unknown role %q; accepted: %s, %s, %s", name, RoleConsume, RoleReport, RoleSink)
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
