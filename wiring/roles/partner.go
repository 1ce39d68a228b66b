package roles

import (
	"cmp"
	"fmt"
	"log/slog"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/reporter"
)

// consumerFetches is the partner requests an enrich consumer has in flight:
// the default of consumer.Config.FetchConcurrency.
const consumerFetches = 8

// PoolSize is the one sizing rule of a partner API client's connection pool
// (partnerapi.Config.MaxConns): the configured bound (partnerapi.DefaultMaxConns
// when 0), raised to inFlight, the requests the roles sharing the client may
// have in flight at once, so that every one of them keeps its own keep-alive
// connection.
func PoolSize(maxConns, inFlight int) int {
	if maxConns == 0 {
		maxConns = partnerapi.DefaultMaxConns
	}
	return max(maxConns, inFlight)
}

// InFlight is the partner requests a reporter posting with concurrency
// (reporter.DefaultConcurrency when 0) has in flight, plus those of an
// enrich consumer when one shares the client.
func InFlight(concurrency int, withConsumer bool) int {
	if concurrency == 0 {
		concurrency = reporter.DefaultConcurrency
	}
	if withConsumer {
		concurrency += consumerFetches
	}
	return concurrency
}

// PartnerConfig is the partner API the roles talk to.
type PartnerConfig struct {
	// API configures the client. Its MaxConns is sized by PoolSize with
	// InFlight.
	API partnerapi.Config
	// Sandbox, when not nil, serves a built-in sandbox of the partner API
	// with this configuration on loopback and points the client at it, with
	// the sandbox's credentials (ClientID and ClientSignature, or their
	// defaults; Email as given). API.BaseURL is then ignored.
	Sandbox *sandbox.Config
	// InFlight is the requests the roles sharing the client may have in
	// flight at once (see InFlight); 0 leaves API.MaxConns alone.
	InFlight int
	// Telemetry instruments the client: nil API.MeterProvider,
	// API.TracerProvider and API.Propagator take its providers.
	Telemetry telemetry.Providers
}

// Partner is an open partner API target.
type Partner struct {
	// Client is the partner API client the roles share.
	Client *partnerapi.Client
	// URL is the base address in use: the configured one or the sandbox's.
	URL string
	// Sandbox is the built-in sandbox, nil when the API is external.
	Sandbox *sandbox.Loopback
}

// OpenPartner opens the partner API target of cfg: with cfg.Sandbox it
// first serves the sandbox on loopback. An invalid client configuration is
// an error wrapping partnerapi.ErrInvalidConfig. Close stops both.
func OpenPartner(cfg PartnerConfig, log *slog.Logger) (*Partner, error) {
	p := &Partner{}
	api := cfg.API
	if cfg.Sandbox != nil {
		sb, err := sandbox.ServeLoopback(*cfg.Sandbox)
		if err != nil {
			return nil, fmt.Errorf("built-in sandbox: %w", err)
		}
		p.Sandbox = sb
		api.BaseURL = sb.URL
		api.Credentials = partnerapi.Credentials{
			ClientID:        cmp.Or(cfg.Sandbox.ClientID, sandbox.DefaultClientID),
			ClientSignature: cmp.Or(cfg.Sandbox.ClientSignature, sandbox.DefaultClientSignature),
			Email:           cfg.Sandbox.Email,
		}
	}
	api.Logger = cmp.Or(api.Logger, log, slog.Default())
	api.MeterProvider = cmp.Or(api.MeterProvider, cfg.Telemetry.Meter)
	api.TracerProvider = cmp.Or(api.TracerProvider, cfg.Telemetry.Tracer)
	api.Propagator = cmp.Or(api.Propagator, cfg.Telemetry.Propagator)
	if cfg.InFlight > 0 {
		api.MaxConns = PoolSize(api.MaxConns, cfg.InFlight)
	}
	client, err := partnerapi.New(api)
	if err != nil {
		p.Close()
		return nil, err
	}
	p.Client, p.URL = client, api.BaseURL
	return p, nil
}

// Close closes the client, then stops the sandbox it served, if any.
func (p *Partner) Close() {
	if p.Client != nil {
		p.Client.Close()
	}
	if p.Sandbox != nil {
		p.Sandbox.Close()
	}
}
