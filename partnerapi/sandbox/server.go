package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server is the partner API emulator. Create it with New; serve Handler (the
// API behind the edge layer) and AdminHandler (the admin API) on listeners
// of your choice.
type Server struct {
	opts   Config
	log    *slog.Logger
	cat    *Catalog
	bodies *bodies
	signer *signer
	ledger *ledger
	counts counters

	// state packs the mode (low 8 bits) and the standby episode (the rest):
	// a token minted in standby carries the episode and dies when it ends.
	state  atomic.Uint64
	faults atomic.Pointer[faultState]
	// revoked is the revocation generation: every token carries the one
	// current when it was minted, and a token from an older generation is
	// rejected (RevokeTokens).
	revoked atomic.Uint64

	restricted sync.Map // country → []byte, for with-user tokens

	api, admin http.Handler
}

// New builds the catalog from opts.Seed, encodes every fixed response and
// returns a Server in opts.Mode. It fails only on invalid options.
func New(opts Config) (*Server, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{opts: o, log: o.Logger, signer: newSigner(o.JWTSecret), ledger: newLedger(o.MaxLedgerEntries)}
	s.cat = newCatalog(o)
	s.bodies = encodeBodies(s.cat, o.EmptyCatalog)
	s.faults.Store(newFaultState(o.Faults))
	s.setMode(o.Mode)
	s.api = http.HandlerFunc(s.serveAPI)
	s.admin = s.adminMux()
	return s, nil
}

// Handler is the partner API, behind the edge layer.
func (s *Server) Handler() http.Handler { return s.api }

// Catalog is the generated content (read-only).
func (s *Server) Catalog() *Catalog { return s.cat }

// Mode returns the current mode.
func (s *Server) Mode() Mode { m, _ := s.modeEpisode(); return m }

// SetMode switches the mode. Entering standby starts a new standby episode;
// leaving it kills every token minted during it.
func (s *Server) SetMode(m Mode) {
	if m != ModeLive && m != ModeStandby && m != ModeLiveBypass {
		return
	}
	s.setMode(m)
	s.log.Info("sandbox mode", "mode", m.String())
}

func (s *Server) setMode(m Mode) {
	for {
		old := s.state.Load()
		ep := old >> 8
		if m == ModeStandby && Mode(old&0xff) != ModeStandby {
			ep++
		}
		if s.state.CompareAndSwap(old, ep<<8|uint64(m)) {
			return
		}
	}
}

func (s *Server) modeEpisode() (Mode, uint64) {
	v := s.state.Load()
	return Mode(v & 0xff), v >> 8
}

// SetFaults replaces the injected faults (FailNext counters restart from the
// given values). Out-of-range values are clamped (rates to 0–1, latency to
// 0–5m, an unknown FailNextStatus to 500); use Faults.Validate to check first.
func (s *Server) SetFaults(f Faults) { s.faults.Store(newFaultState(f.clamp())) }

// Faults returns the injected faults, FailNext as what remains of it.
func (s *Server) Faults() Faults { return s.faults.Load().current() }

// Ledger returns a copy of the ledger and the counters.
func (s *Server) Ledger() LedgerSnapshot {
	l := s.ledger.snapshot(0)
	l.Counters = s.counts.snapshot()
	return l
}

// Reset empties the ledger and the counters, returns to the starting
// faults (Config.Faults, none by default) and to the starting mode
// (Config.Mode). Tokens stay valid unless they were
// minted in a standby episode that the reset ends; revocations stay in
// force (a revoked token never comes back).
func (s *Server) Reset() {
	s.ledger.reset()
	s.counts.reset()
	s.SetFaults(s.opts.Faults)
	s.setMode(s.opts.Mode)
}

// MintToken mints a session token as the session endpoint would in the
// current mode, with the given lifetime (0: the mode's default). withUser
// binds it to the partner identity (restricted catalog). For tests and the
// admin API (expired and short-lived tokens).
func (s *Server) MintToken(ttl time.Duration, withUser bool) string {
	mode, episode := s.modeEpisode()
	c := claims{Sub: s.opts.ClientID, Rev: s.revoked.Load()}
	if ttl <= 0 {
		ttl = s.opts.LiveTokenTTL
		if mode == ModeStandby {
			ttl = s.opts.StandbyTokenTTL
		}
	}
	if mode == ModeStandby {
		c.Sby = episode
	}
	if withUser {
		c.Pid = partnerID(s.opts.ClientID)
	}
	now := s.opts.Now()
	c.Iat, c.Exp = now.Unix(), now.Add(ttl).Unix()
	return s.signer.mint(c)
}

// RevokeTokens revokes, server-side, every session token minted so far, in
// every mode: from now on each of them answers 401 "Unauthorized" on a data
// endpoint, as the spec says for an invalid token, and the client must take
// a new session (tokens minted afterwards work). A token being minted
// concurrently with the call may fall on either side of it. It returns the
// number of revocations so far. Revocations live in memory: a sandbox
// restarted with the same --jwt-secret-file accepts the old tokens again.
func (s *Server) RevokeTokens() uint64 {
	n := s.revoked.Add(1)
	s.log.Info("sandbox tokens revoked", "revocations", n)
	return n
}

// serveGenres answers a genre row of the live (si 0) or standby (1) bodies.
func (s *Server) serveGenres(w http.ResponseWriter, ep endpoint, id string, si int) {
	n, ok := s.parseID(id)
	if !ok {
		s.writeError(w, ep, http.StatusBadRequest, reasonRowID)
		return
	}
	if b, ok := s.bodies.genres[si][n]; ok {
		// An existing row; one without items is served as items: null.
		s.writeJSON(w, ep, http.StatusOK, b)
		return
	}
	// No such row: the spec keeps items: null for an existing row, and
	// its answer for an id without content is 400 "no results for given
	// type" (the page endpoint's, same id space), so a client can tell a
	// wrong id from an empty row.
	s.writeError(w, ep, http.StatusBadRequest, reasonNoResults)
}

// parseID accepts a decimal integer path segment (digits only, optional
// minus). In strict mode it must also be canonical, as a JSON integer is
// written: no leading zero ("030001") and no "-0".
func (s *Server) parseID(id string) (int64, bool) {
	if id == "" || len(id) > 20 {
		return 0, false
	}
	d := strings.TrimPrefix(id, "-")
	if d == "" || strings.TrimLeft(d, "0123456789") != "" {
		return 0, false
	}
	if !s.opts.Lenient && d[0] == '0' && (len(d) > 1 || len(id) > 1) {
		return 0, false
	}
	n, err := strconv.ParseInt(id, 10, 64)
	return n, err == nil
}

func (s *Server) serveByID(w http.ResponseWriter, ep endpoint, id string, m map[int64][]byte, missingReason string, unknownStatus int, unknownReason string) {
	n, ok := s.parseID(id)
	if !ok {
		s.writeError(w, ep, http.StatusBadRequest, missingReason)
		return
	}
	b, ok := m[n]
	if !ok {
		s.writeError(w, ep, unknownStatus, unknownReason)
		return
	}
	s.writeJSON(w, ep, http.StatusOK, b)
}

func (s *Server) serveRestricted(w http.ResponseWriter, r *http.Request, cl claims) {
	if cl.Pid == "" {
		// No partner identity: the unrestricted catalog.
		if s.bodies.catalog == nil {
			s.writeError(w, epRestricted, http.StatusBadRequest, reasonNoCatalogs)
			return
		}
		s.writeJSON(w, epRestricted, http.StatusOK, s.bodies.catalog)
		return
	}
	country := r.Header.Get("EDGE-IPCountry")
	if len(country) != 2 || !isLetter(country[0]) || !isLetter(country[1]) {
		country = "" // not exactly two letters: ignored
	}
	country = strings.ToUpper(country)
	if s.opts.EmptyCatalog {
		s.writeError(w, epRestricted, http.StatusBadRequest, reasonNoPartnerCat)
		return
	}
	b, ok := s.restricted.Load(country)
	if !ok {
		var body []byte
		if pages := s.cat.RestrictedPages(country); len(pages) > 0 {
			salt := uint64(saltRestricted)
			for i := range len(country) {
				salt = salt<<8 | uint64(country[i])
			}
			body = s.cat.catalogBody(pages, salt)
		}
		b, _ = s.restricted.LoadOrStore(country, body)
	}
	if b.([]byte) == nil {
		s.writeError(w, epRestricted, http.StatusBadRequest, reasonNoPartnerCat)
		return
	}
	s.writeJSON(w, epRestricted, http.StatusOK, b.([]byte))
}

// holdReport waits d, or until ctx (the request's) ends: it reports whether
// the hold ran its course.
func holdReport(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *Server) serveReport(w http.ResponseWriter, r *http.Request, mode Mode, fs *faultState) {
	body, err := s.readBody(r)
	if err != nil {
		s.bodyError(w, epReport, err)
		return
	}
	now := s.opts.Now()
	if fs.any {
		if v := fs.drawReport(body); v.status != 0 {
			// Refused by an injected fault: kept apart, never accepted.
			s.ledger.addInjected(InjectedEntry{Arrival: now, Raw: string(body), Status: v.status, Fault: v.kind})
			if v.hold > 0 && !holdReport(r.Context(), v.hold) {
				return // the client went away: nobody reads an answer
			}
			if v.reset {
				panic(http.ErrAbortHandler) // HTTP/1: the connection closes; HTTP/2: the stream is reset
			}
			s.writeFault(w, epReport, v.status, mode, fs.groups[GroupReport].RetryAfter)
			return
		}
	}
	var traceParent string
	if !s.opts.Lean {
		traceParent = r.Header.Get("Traceparent")
	}
	if mode == ModeStandby {
		// Standby answers 200 without validating or forwarding.
		s.ledger.addStandby(StandbyEntry{Arrival: now, Raw: string(body), TraceParent: traceParent})
		s.writeJSON(w, epReport, http.StatusOK, bodyReportOK)
		return
	}
	raw := string(body) // kept in the ledger; the decoded strings share it
	rep, err := validateReport(body, raw)
	if err != nil {
		var re *ReportError
		errors.As(err, &re)
		msg := re.Message()
		s.ledger.addRejected(RejectedEntry{Arrival: now, Raw: raw, Message: msg})
		b, _ := json.Marshal(struct {
			Error   bool   `json:"error"`
			Message string `json:"message"`
		}{true, msg})
		s.writeJSON(w, epReport, http.StatusBadRequest, b)
		return
	}
	var flags []Flag
	if !s.ledger.full() {
		flags = qualityFlags(&rep, s.cat) // only kept entries carry them
	}
	s.ledger.addAccepted(LedgerEntry{
		Arrival: now, Raw: raw, Report: rep, Flags: flags,
		ServedBy: mode.servedBy(), TraceParent: traceParent,
	})
	s.writeJSON(w, epReport, http.StatusOK, bodyReportOK)
}
