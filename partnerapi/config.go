package partnerapi

import (
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/internal/confcheck"
	"github.com/playpipe/playpipe/internal/version"
)

// Defaults of the Config fields for connections and retries.
const (
	DefaultMaxConns       = 64
	DefaultRequestTimeout = 30 * time.Second
	DefaultMaxAttempts    = 4
	DefaultBaseBackoff    = 200 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
	// DefaultIdleConnTimeout is below the keep-alive timeouts edges and
	// load balancers commonly use (60–75 s).
	DefaultIdleConnTimeout = 30 * time.Second
)

// Defaults of the Config fields for the session's tokens.
const (
	DefaultLiveTokenTTL    = 8 * time.Hour
	DefaultStandbyTokenTTL = 15 * time.Minute
	DefaultRenewBefore     = 5 * time.Minute
)

// ErrInvalidConfig is wrapped by every error New returns: a Config (or its
// credentials file) that does not validate.
var ErrInvalidConfig = errors.New("partnerapi: invalid config")

// configError marks an error as wrapping ErrInvalidConfig, its message as is.
type configError struct{ error }

func (e configError) Is(target error) bool { return target == ErrInvalidConfig }
func (e configError) Unwrap() error        { return e.error }

// Config configures a Client. Zero fields take the default stated in their
// comment; New validates the result once and names the offending field.
type Config struct {
	// BaseURL of the partner API, e.g. https://api.example.com (the paths
	// /partners/… are appended). Required. Flag --api-url.
	BaseURL string
	// Credentials issued out of band. ClientID and ClientSignature are
	// required; Email is optional (restricted catalog). Flags --api-client-id,
	// --api-email (the signature has no flag: cmd/playpipe reads it from the
	// environment); fields left empty are filled from CredentialsFile.
	Credentials Credentials
	// CredentialsFile, when set, is read by New to fill the Credentials
	// fields that are still empty (see LoadCredentialsFile for the format).
	// Flag --api-credentials-file.
	CredentialsFile string
	// UserAgent sent on every request. Defaults to version.UserAgent()
	// ("playpipe/<version> (partner integration)"). The API's edge blocks
	// default library agents (Go-http-client, curl, …) with 403/1010.
	// Flag --api-user-agent.
	UserAgent string
	// HTTPClient, when set, is used as is (its Transport, Timeout and
	// redirect policy); MaxConns is then ignored and Close leaves it alone.
	// Defaults to a client with its own *http.Transport sized by MaxConns.
	HTTPClient *http.Client
	// RootCAs, when set, are the certificate authorities the own transport
	// trusts for an https BaseURL instead of the system's (a private edge,
	// a test CA). The command line's equivalent is the SSL_CERT_FILE or
	// SSL_CERT_DIR environment variable, which Go reads for the system pool.
	RootCAs *x509.CertPool
	// IdleConnTimeout closes a keep-alive connection idle this long.
	// Defaults to 30s, below common edge keep-alive timeouts.
	IdleConnTimeout time.Duration
	// MaxConns bounds the connections to the API. Defaults to 64. The own
	// transport keeps MaxIdleConnsPerHost = MaxConnsPerHost = MaxConns, so
	// keep-alive connections are reused by up to MaxConns concurrent callers.
	// Flag --api-max-conns.
	MaxConns int
	// RequestTimeout bounds one attempt of one request, from dial to the
	// last byte of the answer (a play report post whose request was sent
	// and that times out is in doubt: Error.Doubt). Defaults to 30s. Flag --api-timeout,
	// env PLAYPIPE_API_TIMEOUT.
	RequestTimeout time.Duration
	// MaxAttempts bounds the attempts of one GET or session call on
	// transient errors (500, 503, timeout, connection). Defaults to 4; 1
	// disables retries. Play reports are never retried by the client.
	MaxAttempts int
	// BaseBackoff and MaxBackoff shape the exponential backoff with full
	// jitter between attempts: a random wait in [0, min(MaxBackoff,
	// BaseBackoff·2^n)), or the server's Retry-After when that is longer.
	// Defaults 200ms and 10s.
	BaseBackoff, MaxBackoff time.Duration
	// LiveTokenTTL is how long a token minted by live service is used
	// (spec: 8h). Defaults to 8h. A shorter `exp` claim in the JWT wins.
	LiveTokenTTL time.Duration
	// StandbyTokenTTL is how long a token minted in standby is used (spec:
	// about 15 minutes). Defaults to 15m.
	StandbyTokenTTL time.Duration
	// RenewBefore: a token is renewed in the background this long before it
	// expires, while callers keep using it. Defaults to 5m, and is capped at
	// a third of a token's lifetime.
	RenewBefore time.Duration
	// Logger receives session events (renewals, failures), never a token or
	// the signature, and nothing per request. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock of token lifetimes (expiry, renewal window, the
	// pause after a failed background renewal). Defaults to time.Now;
	// tests set a fake clock instead of sleeping. Timeouts and retry waits
	// are real time.
	Now func() time.Time
	// TracerProvider, MeterProvider and Propagator instrument the client
	// (spans per call, playpipe.partnerapi.sessions, W3C trace context on
	// play reports); the command passes telemetry.Role.Providers. A nil
	// provider is a no-op one (nothing is recorded; no otel global is
	// read, and the context's trace is still propagated); a nil propagator
	// is W3C trace context plus baggage (the one playpipe uses everywhere).
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
}

// withDefaults returns the config with the credentials file read and every
// zero field set to its default, then validated.
func (c Config) withDefaults() (Config, error) {
	if c.CredentialsFile != "" {
		f, err := LoadCredentialsFile(c.CredentialsFile)
		if err != nil {
			return c, configError{fmt.Errorf("Config.CredentialsFile (--api-credentials-file): %w", err)}
		}
		if c.Credentials.ClientID == "" {
			c.Credentials.ClientID = f.ClientID
		}
		if c.Credentials.ClientSignature == "" {
			c.Credentials.ClientSignature = f.ClientSignature
		}
		if c.Credentials.Email == "" {
			c.Credentials.Email = f.Email
		}
	}
	c.UserAgent = cmp.Or(c.UserAgent, version.UserAgent())
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.IdleConnTimeout = cmp.Or(c.IdleConnTimeout, DefaultIdleConnTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.BaseBackoff = cmp.Or(c.BaseBackoff, DefaultBaseBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, max(DefaultMaxBackoff, c.BaseBackoff))
	c.LiveTokenTTL = cmp.Or(c.LiveTokenTTL, DefaultLiveTokenTTL)
	c.StandbyTokenTTL = cmp.Or(c.StandbyTokenTTL, DefaultStandbyTokenTTL)
	c.RenewBefore = cmp.Or(c.RenewBefore, DefaultRenewBefore)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
	// Inline rather than internal/telemetry's helpers: the client must not
	// link the OTel SDK and exporters for three nil checks.
	if c.TracerProvider == nil {
		c.TracerProvider = tracenoop.NewTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = metricnoop.NewMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return c, c.validate()
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	u, err := url.Parse(c.BaseURL)
	switch {
	case c.BaseURL == "":
		return bad("Config.BaseURL (--api-url)", "required, e.g. https://api.example.com")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return bad("Config.BaseURL (--api-url)", "%q is not an http:// or https:// URL with a host", c.BaseURL)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return bad("Config.BaseURL (--api-url)", "must have no query, fragment or user info")
	case c.Credentials.ClientID == "":
		return bad("Config.Credentials.ClientID (--api-client-id or the credentials file)", "required")
	case c.Credentials.ClientSignature == "":
		return bad("Config.Credentials.ClientSignature (the environment or the credentials file; never a flag)", "required")
	case strings.ContainsAny(c.Credentials.ClientID, "\r\n\x00"):
		return bad("Config.Credentials.ClientID", "contains control characters")
	case c.Credentials.Email != "" && !strings.Contains(c.Credentials.Email, "@"):
		return bad("Config.Credentials.Email (--api-email)", "%q is not an e-mail address", c.Credentials.Email)
	case strings.ContainsAny(c.UserAgent, "\r\n\x00"):
		return bad("Config.UserAgent (--api-user-agent)", "contains control characters")
	}
	rule := func(broken bool, field, format string, args ...any) error {
		if !broken {
			return nil
		}
		return bad(field, format, args...)
	}
	return confcheck.First(
		rule(c.MaxConns < 1, "Config.MaxConns (--api-max-conns)", "must be ≥ 1, got %d", c.MaxConns),
		rule(c.RequestTimeout < 0, "Config.RequestTimeout (--api-timeout)", "must be > 0, got %v", c.RequestTimeout),
		rule(c.MaxAttempts < 1, "Config.MaxAttempts", "must be ≥ 1, got %d", c.MaxAttempts),
		rule(c.BaseBackoff < 0, "Config.BaseBackoff", "must be > 0, got %v", c.BaseBackoff),
		rule(c.MaxBackoff < c.BaseBackoff, "Config.MaxBackoff", "must be ≥ BaseBackoff (%v), got %v", c.BaseBackoff, c.MaxBackoff),
		rule(c.LiveTokenTTL < 0, "Config.LiveTokenTTL", "must be > 0, got %v", c.LiveTokenTTL),
		rule(c.StandbyTokenTTL < 0, "Config.StandbyTokenTTL", "must be > 0, got %v", c.StandbyTokenTTL),
		rule(c.RenewBefore < 0, "Config.RenewBefore", "must be > 0, got %v", c.RenewBefore),
	)
}

// LogValue implements slog.LogValuer: the configuration without secrets.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", c.BaseURL),
		slog.Any("credentials", c.Credentials),
		slog.String("credentials_file", c.CredentialsFile),
		slog.String("user_agent", c.UserAgent),
		slog.Int("max_conns", c.MaxConns),
		slog.Duration("request_timeout", c.RequestTimeout),
		slog.Int("max_attempts", c.MaxAttempts),
	)
}
