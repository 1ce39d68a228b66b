package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/internal/version"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/wiring/roles"
)

// Environment variables of the --api-* flags (their defaults; the client
// signature has no flag: a secret on a command line leaks through ps and
// shell history).
const (
	envAPIURL             = "PLAYPIPE_API_URL"
	envAPIClientID        = "PLAYPIPE_API_CLIENT_ID"
	envAPIClientSignature = "PLAYPIPE_API_CLIENT_SIGNATURE" // environment or credentials file only, never a flag
	envAPIEmail           = "PLAYPIPE_API_EMAIL"
	envAPICredentialsFile = "PLAYPIPE_API_CREDENTIALS_FILE"
	envAPIUserAgent       = "PLAYPIPE_API_USER_AGENT"
	envAPIMaxConns        = "PLAYPIPE_API_MAX_CONNS"
	envAPITimeout         = "PLAYPIPE_API_TIMEOUT"
)

// registerPartnerFlags registers the --api-* flags on fs, bound to c, with
// the environment variables as defaults. PLAYPIPE_API_CLIENT_SIGNATURE has
// no flag (a secret on a command line leaks through ps and shell history):
// it is read from the environment here, or from the credentials file by
// partnerapi.New. It returns the error of an environment value that does
// not parse (nil when all do), to be reported before anything starts.
//
// Precedence: flag, then environment, then credentials file, then default.
func registerPartnerFlags(fs *flag.FlagSet, c *partnerapi.Config) (envErr error) {
	fs.StringVar(&c.BaseURL, "api-url", envDefault(envAPIURL, c.BaseURL),
		"partner API base URL, e.g. https://api.example.com (env "+envAPIURL+")")
	fs.StringVar(&c.Credentials.ClientID, "api-client-id", envDefault(envAPIClientID, c.Credentials.ClientID),
		"partner client_id (env "+envAPIClientID+"); the client_signature comes from env "+envAPIClientSignature+" or --api-credentials-file, never a flag")
	fs.StringVar(&c.CredentialsFile, "api-credentials-file", envDefault(envAPICredentialsFile, c.CredentialsFile),
		"file with client_id, client_signature and email, as JSON or KEY=VALUE lines (env "+envAPICredentialsFile+")")
	fs.StringVar(&c.Credentials.Email, "api-email", envDefault(envAPIEmail, c.Credentials.Email),
		"partner account e-mail; enables /partners/session/with-user for the restricted catalog (env "+envAPIEmail+")")
	ua := c.UserAgent
	if ua == "" {
		ua = version.UserAgent()
	}
	fs.StringVar(&c.UserAgent, "api-user-agent", envDefault(envAPIUserAgent, ua),
		"User-Agent sent to the partner API; library defaults are blocked by its edge (env "+envAPIUserAgent+")")
	maxConns := envParsed(envAPIMaxConns, cmp.Or(c.MaxConns, partnerapi.DefaultMaxConns), strconv.Atoi, "partnerapi", "an integer", &envErr)
	fs.IntVar(&c.MaxConns, "api-max-conns", maxConns,
		"maximum connections (and idle keep-alive connections) to the partner API (env "+envAPIMaxConns+")")
	timeout := envParsed(envAPITimeout, cmp.Or(c.RequestTimeout, partnerapi.DefaultRequestTimeout), time.ParseDuration, "partnerapi", "a duration such as 10s", &envErr)
	fs.DurationVar(&c.RequestTimeout, "api-timeout", timeout,
		"timeout of one attempt of one partner API request (env "+envAPITimeout+")")
	if c.Credentials.ClientSignature == "" {
		c.Credentials.ClientSignature = os.Getenv(envAPIClientSignature)
	}
	return envErr
}

// apiTarget is the partner API a role talks to: the configured --api-url,
// or, only when --sandbox is given, a built-in sandbox on loopback. There is
// no implicit fallback: a role that needs the API and has neither refuses to
// start (exit 2), so a missing PLAYPIPE_API_URL can never make a reporter
// tell finance that plays were delivered that never left the machine.
type apiTarget struct {
	cfg     partnerapi.Config
	sandbox bool
	envErr  error // an --api-* environment default that does not parse
}

// register binds the --api-* flags and --sandbox to fs; what names the
// sandbox's use in the role (its help text).
func (a *apiTarget) register(fs *flag.FlagSet, what string) {
	a.envErr = registerPartnerFlags(fs, &a.cfg)
	fs.BoolVar(&a.sandbox, "sandbox", false, "instead of --api-url: "+what+" a built-in sandbox of the partner API on loopback (seed 1, its sandbox-only credentials; for try-outs)")
}

// check reports a missing or doubled target, or an environment default that
// does not parse, as a usage error naming the flags, before anything starts.
func (a *apiTarget) check() error {
	switch {
	case a.envErr != nil:
		return usageError{a.envErr}
	case a.cfg.BaseURL == "" && !a.sandbox:
		return usageError{fmt.Errorf("no partner API configured: set --api-url (env %s) or pass --sandbox to use a built-in sandbox on loopback", envAPIURL)}
	case a.cfg.BaseURL != "" && a.sandbox:
		return usageError{fmt.Errorf("--api-url (%s) and --sandbox exclude each other: set one (%s counts as --api-url)", a.cfg.BaseURL, envAPIURL)}
	}
	return nil
}

// open returns a client of the target (roles.OpenPartner): with --sandbox it
// first serves a built-in sandbox (seed 1, its sandbox-only credentials) on
// loopback and says so. inFlight sizes the connection pool (roles.InFlight;
// 0: --api-max-conns as is). The returned stop function closes the client
// and the sandbox. tel instruments the client (zero: not instrumented). A
// configuration error is a usage error (exit 2).
func (a *apiTarget) openFor(log *slog.Logger, inFlight int, tel telemetry.Providers) (*roles.Partner, func(), error) {
	if err := a.check(); err != nil {
		return nil, func() {}, err
	}
	pc := roles.PartnerConfig{API: a.cfg, InFlight: inFlight, Telemetry: tel}
	if a.sandbox {
		pc.Sandbox = &sandbox.Config{Seed: 1, Logger: log}
	}
	p, err := roles.OpenPartner(pc, log)
	if err != nil {
		if errors.Is(err, partnerapi.ErrInvalidConfig) {
			if a.cfg.Credentials.ClientSignature == "" && !a.sandbox {
				err = fmt.Errorf("%w (the client_signature is read from env %s or --api-credentials-file)", err, envAPIClientSignature)
			}
			return nil, func() {}, usageError{err}
		}
		return nil, func() {}, err
	}
	if p.Sandbox != nil {
		log.Warn("--sandbox: using a built-in sandbox of the partner API on loopback; nothing reaches the real partner", "url", p.URL)
	}
	a.cfg.BaseURL = p.URL // the URL in use, for the delivery records
	return p, func() {
		p.Close()
		if p.Sandbox != nil {
			c := p.Sandbox.Counts()
			log.Info("built-in sandbox stopped", "accepted", c.Accepted, "standby", c.Standby, "rejected", c.Rejected, "duplicates", c.Duplicates)
		}
	}, nil
}

// open is openFor with the pool as configured (--api-max-conns), returning
// the client.
func (a *apiTarget) open(log *slog.Logger, tel telemetry.Providers) (*partnerapi.Client, func(), error) {
	p, stop, err := a.openFor(log, 0, tel)
	if err != nil {
		return nil, stop, err
	}
	return p.Client, stop, nil
}
