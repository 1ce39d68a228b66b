package sandbox

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
)

// Sandbox-only credentials. They are accepted only by this emulator and are
// printed in its documentation on purpose: they are not secrets.
const (
	// DefaultClientID is the sandbox's client_id (10 characters, as the spec requires).
	DefaultClientID = "playpipe01"
	// DefaultClientSignature is the sandbox's client_signature (40
	// characters). SANDBOX ONLY: never a real partner secret.
	DefaultClientSignature = "SANDBOX-ONLY-signature-not-a-real-secret"
	// DefaultEmail is the partner account e-mail registered for DefaultClientID.
	DefaultEmail = "integration@playpipe.example"
)

// Defaults of the Config fields.
const (
	DefaultLiveTokenTTL     = 8 * time.Hour
	DefaultStandbyTokenTTL  = 15 * time.Minute
	DefaultPages            = 6
	DefaultListsPerPage     = 4
	DefaultMixesPerList     = 5
	DefaultMaxLedgerEntries = 2_000_000
	DefaultMaxBodyBytes     = 64 << 10
	// LeanMaxLedgerEntries is the MaxLedgerEntries default in lean mode.
	LeanMaxLedgerEntries = 10_000
)

// Config configures a Server. The zero value is valid: every field has a
// default, stated in its comment. New validates the options once and names the
// offending field in its error.
type Config struct {
	// Seed drives the generated catalog: the same seed always yields the same
	// pages, lists, mixes, tracks and ISRCs. Zero is a valid seed.
	Seed int64
	// ClientID accepted by the session endpoints; exactly 10 characters.
	// Defaults to DefaultClientID.
	ClientID string
	// ClientSignature accepted by the session endpoints; exactly 40
	// characters. Defaults to DefaultClientSignature. Never logged.
	ClientSignature string
	// Email of the partner account registered for ClientID (session
	// with-user). Defaults to DefaultEmail.
	Email string
	// JWTSecret signs session tokens (HS256). Defaults to 32 random bytes,
	// so tokens do not survive a restart. At least 16 bytes when set.
	JWTSecret []byte
	// LiveTokenTTL is the lifetime of a token minted in live or live-bypass
	// mode. Defaults to 8h (the spec's value).
	LiveTokenTTL time.Duration
	// StandbyTokenTTL is the lifetime of a token minted in standby.
	// Defaults to 15m (the spec's "about 15 minutes").
	StandbyTokenTTL time.Duration
	// Logger receives the server's logs (never a secret). Defaults to a
	// logger that discards.
	Logger *slog.Logger
	// Now is the clock (token issue and expiry, ledger arrival times).
	// Defaults to time.Now. Tests pass a fake clock to expire tokens.
	Now func() time.Time

	// Pages is the number of content pages of the catalog (1–100). Defaults
	// to DefaultPages. One extra page without content is always added (its
	// genre row has items: null).
	Pages int
	// ListsPerPage is the number of lists per page (1–50). Defaults to DefaultListsPerPage.
	ListsPerPage int
	// MixesPerList is the number of mixes per list (1–100). Defaults to DefaultMixesPerList.
	MixesPerList int
	// EmptyCatalog makes GET /partners/catalog answer 400 "no catalogs
	// available" (the spec's error case); pages, lists and mixes still exist.
	EmptyCatalog bool

	// Lenient turns strict mode off. Strict mode is the default (the zero
	// value), in tests and in `playpipe sandbox` alike, because the sandbox
	// exists to catch client bugs; a correct client cannot tell the modes
	// apart. In strict mode:
	//
	//   - every ranked collection arrives out of order: the catalog's (and the
	//     restricted catalog's) entries, a page's lists and a genre row's
	//     items are shuffled on the wire, and their ranking / ordering values
	//     have gaps and do not follow the ids, so a client that keeps the wire
	//     order, sorts by id or indexes by ranking shows the wrong order;
	//   - page ids (so genre row ids) and list ids are not contiguous (the
	//     first page is still 101 and the first list 2001); mix and track ids
	//     are the same in both modes, so event files and walkthroughs that
	//     name mix 30001 or track 400001 work against either;
	//   - a POST whose Content-Type is not application/json (parameters such
	//     as charset allowed) is refused with 415 and the endpoint's error
	//     shape;
	//   - a path id that is not written canonically ("030001", "-0", "+5")
	//     is refused like a missing id (the endpoint's 400);
	//   - a request with more than one Authorization header gets 401.
	//
	// Lenient mode serves the catalog sorted, with contiguous ids, and lets
	// those three request faults pass (as the sandbox did before strict mode).
	Lenient bool
	// Lean is the load-test mode: the ledger keeps the detail (raw body,
	// decoded fields, flags) of the first MaxLedgerEntries reports only,
	// which then defaults to LeanMaxLedgerEntries instead of
	// DefaultMaxLedgerEntries, and no traceparent is recorded. Counts
	// (accepted, standby, rejected, duplicates, dropped) and the duplicate
	// detection stay exact: the duplicate set keeps one 16-byte hash pair
	// per distinct accepted report, about 56 bytes (docs/sandbox.md). The
	// package never wraps Handler in tracing middleware; `playpipe sandbox
	// --lean` also leaves out the otelhttp wrapper the command adds otherwise.
	Lean bool

	// Mode is the mode the server starts in. Defaults to ModeLive.
	Mode Mode
	// Faults are the injected faults the server starts with, and returns
	// to on Reset (`playpipe sandbox --faults`). Defaults to none.
	Faults Faults
	// MaxLedgerEntries bounds the entries kept with their raw bodies
	// (accepted, standby and rejected together). Beyond it, reports are still
	// validated, counted and checked for duplicates, but their entries are
	// dropped and counted in LedgerSnapshot.Dropped. Defaults to
	// DefaultMaxLedgerEntries (LeanMaxLedgerEntries when Lean).
	MaxLedgerEntries int
	// MaxBodyBytes bounds request bodies; larger ones are answered 413.
	// Defaults to DefaultMaxBodyBytes (64 KiB).
	MaxBodyBytes int64
	// AdminAllowRemote lets AdminHandler answer callers that are not on
	// loopback. Defaults to false: non-loopback callers get 403.
	AdminAllowRemote bool
	// AdminHosts are further host names (without port) the admin API
	// answers in the Host header, e.g. a container's service name when
	// AdminAllowRemote. Its own listener address, "localhost" and loopback
	// addresses are always accepted; any other Host is refused with 403
	// (DNS rebinding).
	AdminHosts []string
}

// ErrInvalidConfig is wrapped by every error New returns for bad options.
var ErrInvalidConfig = errors.New("sandbox: invalid configuration")

func (o Config) withDefaults() (Config, error) {
	o.ClientID = cmp.Or(o.ClientID, DefaultClientID)
	o.ClientSignature = cmp.Or(o.ClientSignature, DefaultClientSignature)
	o.Email = cmp.Or(o.Email, DefaultEmail)
	if o.JWTSecret == nil {
		o.JWTSecret = make([]byte, 32)
		if _, err := io.ReadFull(rand.Reader, o.JWTSecret); err != nil {
			return o, fmt.Errorf("sandbox: JWT secret: %w", err)
		}
	}
	o.LiveTokenTTL = cmp.Or(o.LiveTokenTTL, DefaultLiveTokenTTL)
	o.StandbyTokenTTL = cmp.Or(o.StandbyTokenTTL, DefaultStandbyTokenTTL)
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Pages = cmp.Or(o.Pages, DefaultPages)
	o.ListsPerPage = cmp.Or(o.ListsPerPage, DefaultListsPerPage)
	o.MixesPerList = cmp.Or(o.MixesPerList, DefaultMixesPerList)
	if o.MaxLedgerEntries == 0 {
		o.MaxLedgerEntries = DefaultMaxLedgerEntries
		if o.Lean {
			o.MaxLedgerEntries = LeanMaxLedgerEntries
		}
	}
	o.MaxBodyBytes = cmp.Or(o.MaxBodyBytes, DefaultMaxBodyBytes)
	return o, o.validate()
}

func (o Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case len(o.ClientID) != 10:
		return bad("ClientID", "must be exactly 10 characters, got %d", len(o.ClientID))
	case len(o.ClientSignature) != 40:
		// The value itself is a secret: only its length is reported.
		return bad("ClientSignature", "must be exactly 40 characters, got %d", len(o.ClientSignature))
	case !strings.Contains(o.Email, "@"):
		return bad("Email", "%q is not an e-mail address", o.Email)
	case len(o.JWTSecret) < 16:
		return bad("JWTSecret", "must be at least 16 bytes, got %d", len(o.JWTSecret))
	case o.LiveTokenTTL < 0:
		return bad("LiveTokenTTL", "must be positive, got %v", o.LiveTokenTTL)
	case o.StandbyTokenTTL < 0:
		return bad("StandbyTokenTTL", "must be positive, got %v", o.StandbyTokenTTL)
	case o.Pages < 1 || o.Pages > 100:
		return bad("Pages", "accepted 1–100, got %d", o.Pages)
	case o.ListsPerPage < 1 || o.ListsPerPage > 50:
		return bad("ListsPerPage", "accepted 1–50, got %d", o.ListsPerPage)
	case o.MixesPerList < 1 || o.MixesPerList > 100:
		return bad("MixesPerList", "accepted 1–100, got %d", o.MixesPerList)
	case o.Mode != ModeLive && o.Mode != ModeStandby && o.Mode != ModeLiveBypass:
		return bad("Mode", "accepted live, standby, live-bypass, got %d", int(o.Mode))
	case o.MaxLedgerEntries < 0:
		return bad("MaxLedgerEntries", "must be positive, got %d", o.MaxLedgerEntries)
	case o.MaxBodyBytes < 1024:
		return bad("MaxBodyBytes", "must be at least 1024, got %d", o.MaxBodyBytes)
	}
	if err := o.Faults.Validate(); err != nil {
		return bad("Faults", "%v", err)
	}
	return nil
}

// Mode is the service mode the sandbox emulates.
type Mode int

const (
	// ModeLive is normal service: no x-service-served-by header.
	ModeLive Mode = iota
	// ModeStandby is the read-only failover: header "standby", flat session
	// shape without credential check, short-lived tokens, degraded metadata,
	// list summaries in the standby shape, play reports answered 200 without
	// validation and kept apart (not delivered).
	ModeStandby
	// ModeLiveBypass is live service reached through the failover layer:
	// header "live-bypass" on every response, otherwise live behaviour
	// (credentials checked, live shapes, reports validated and delivered).
	ModeLiveBypass
)

// String returns live, standby or live-bypass.
func (m Mode) String() string {
	switch m {
	case ModeLive:
		return "live"
	case ModeStandby:
		return "standby"
	case ModeLiveBypass:
		return "live-bypass"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// ParseMode parses live, standby or live-bypass.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "live":
		return ModeLive, nil
	case "standby":
		return ModeStandby, nil
	case "live-bypass":
		return ModeLiveBypass, nil
	}
	return 0, fmt.Errorf("sandbox: mode %q: accepted: live, standby, live-bypass", s)
}

// MarshalText implements encoding.TextMarshaler.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *Mode) UnmarshalText(b []byte) error {
	v, err := ParseMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// servedBy is the x-service-served-by header value of the mode ("" in live).
func (m Mode) servedBy() string {
	switch m {
	case ModeStandby:
		return "standby"
	case ModeLiveBypass:
		return "live-bypass"
	}
	return ""
}
