package sandbox

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
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
	s.faults.Store(newFaultState(Faults{}))
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

// Reset empties the ledger and the counters, clears the faults and returns
// to the starting mode (Config.Mode). Tokens stay valid unless they were
// minted in a standby episode that the reset ends; revocations stay in
// force (a revoked token never comes back).
func (s *Server) Reset() {
	s.ledger.reset()
	s.counts.reset()
	s.SetFaults(Faults{})
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

// Revocations is the number of RevokeTokens calls so far.
func (s *Server) Revocations() uint64 { return s.revoked.Load() }

func partnerID(clientID string) string { return "partner:" + clientID }

// endpoint identifies an API route (for counters and faults).
type endpoint uint8

const (
	epSession endpoint = iota
	epSessionUser
	epCatalog
	epRestricted
	epPage
	epList
	epGenres
	epMix
	epReport
	epOther
	numEndpoints
)

var endpointNames = [numEndpoints]string{"session", "session_with_user", "catalog", "catalog_restricted", "page", "list", "genres", "mix", "report", "other"}

var endpointGroup = [numEndpoints]Group{GroupSession, GroupSession, GroupCatalog, GroupCatalog, GroupCatalog, GroupCatalog, GroupCatalog, GroupMix, GroupReport, GroupCatalog}

// route maps a path to its endpoint, the id segment (for the four {id}
// routes; "" when missing) and the method it accepts.
func route(path string) (ep endpoint, id string, method string) {
	rest, ok := strings.CutPrefix(path, "/partners/")
	if !ok {
		return epOther, "", ""
	}
	switch rest {
	case "session":
		return epSession, "", http.MethodPost
	case "session/with-user":
		return epSessionUser, "", http.MethodPost
	case "catalog":
		return epCatalog, "", http.MethodGet
	case "catalog/restricted":
		return epRestricted, "", http.MethodGet
	case "royalty-tracking":
		return epReport, "", http.MethodPost
	}
	head, id, _ := strings.Cut(rest, "/")
	switch head {
	case "page":
		return epPage, id, http.MethodGet
	case "list":
		return epList, id, http.MethodGet
	case "genres":
		return epGenres, id, http.MethodGet
	case "mix":
		return epMix, id, http.MethodGet
	}
	return epOther, "", ""
}

// Fixed answers.
var (
	bodyUnauthorized = []byte("Unauthorized")
	bodyReportOK     = []byte(`{"error":false,"message":"success"}`)
	bodyReport500    = []byte(`{"error":true,"message":"internal service error"}`)
	bodyStandby503   = []byte(`{"error":true,"reason":"standby upstream error"}`)
	bodyReport415    = []byte(`{"error":true,"message":"` + reasonContentType + `"}`)
)

const (
	reasonInternal        = "internal service error"
	reasonCredentials     = "credentials invalid"
	reasonPartnerNotFound = "partner not found"
	reasonNoCatalogs      = "no catalogs available"
	reasonNoPartnerCat    = "no catalogs available for this partner"
	reasonNoResults       = "no results for given type"
	reasonRowID           = "please provide a music row id as a URL parameter"
	reasonMixID           = "Please provide a mix ID as a URL parameter"
	reasonMixNotFound     = "Mix not found"
	reasonSessionMissing  = "please provide user information to create session: email, salt"
	reasonSessionUserMiss = "please provide user information to create session: email, client_id, client_signature"
	reasonContentType     = "Content-Type must be application/json"
)

// jsonContentType reports whether the Content-Type header values are one
// application/json media type (parameters such as charset allowed, any case).
func jsonContentType(vs []string) bool {
	if len(vs) != 1 {
		return false
	}
	v := vs[0]
	if v == "application/json" || v == "application/json; charset=utf-8" {
		return true
	}
	mt, _, err := mime.ParseMediaType(v)
	return err == nil && mt == "application/json"
}

func envelope(reason string) []byte {
	b, _ := json.Marshal(struct {
		Error  bool    `json:"error"`
		Reason string  `json:"reason"`
		Mix    *string `json:"mix"`
	}{true, reason, nil})
	return b
}

func (s *Server) writeJSON(w http.ResponseWriter, ep endpoint, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{"application/json; charset=utf-8"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	s.counts.add(ep, status)
}

func (s *Server) writeText(w http.ResponseWriter, ep endpoint, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{"text/plain; charset=utf-8"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	s.counts.add(ep, status)
}

func (s *Server) writeError(w http.ResponseWriter, ep endpoint, status int, reason string) {
	s.writeJSON(w, ep, status, envelope(reason))
}

// writeFault answers an injected or internal failure with the endpoint's envelope.
func (s *Server) writeFault(w http.ResponseWriter, ep endpoint, status int, mode Mode) {
	switch {
	case status == http.StatusUnauthorized:
		s.writeText(w, ep, status, bodyUnauthorized)
	case status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
		s.writeText(w, ep, status, []byte(http.StatusText(status)))
	case status == http.StatusServiceUnavailable && mode == ModeStandby:
		s.writeJSON(w, ep, status, bodyStandby503)
	case ep == epReport:
		s.writeJSON(w, ep, status, bodyReport500)
	default:
		s.writeError(w, ep, status, reasonInternal)
	}
}

var errBodyTooLarge = errors.New("sandbox: request body too large")

func (s *Server) readBody(r *http.Request) ([]byte, error) {
	limit := s.opts.MaxBodyBytes
	if n := r.ContentLength; n >= 0 {
		if n > limit {
			return nil, errBodyTooLarge
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, fmt.Errorf("sandbox: reading body: %w", err)
		}
		return b, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("sandbox: reading body: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, errBodyTooLarge
	}
	return b, nil
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	ep, id, method := route(r.URL.Path)
	// The edge layer comes before everything, the mode header included.
	if EdgeBlocked(r.Header.Get("User-Agent")) {
		s.writeText(w, ep, http.StatusForbidden, []byte(edgeBody))
		return
	}
	mode, episode := s.modeEpisode()
	if sb := mode.servedBy(); sb != "" {
		w.Header()["X-Service-Served-By"] = []string{sb}
	}
	if ep == epOther {
		s.writeError(w, ep, http.StatusNotFound, "not found")
		return
	}
	if r.Method != method {
		w.Header().Set("Allow", method)
		s.writeError(w, ep, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	fs := s.faults.Load()
	if fs.any {
		if d := fs.groups[endpointGroup[ep]].Latency; d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
	}
	strict := !s.opts.Lenient
	var cl claims
	if ep != epSession && ep != epSessionUser {
		var ok bool
		if strict && len(r.Header["Authorization"]) > 1 {
			// Two tokens: which one counts is undefined, so neither does.
			s.writeText(w, ep, http.StatusUnauthorized, bodyUnauthorized)
			return
		}
		if cl, ok = s.authorize(r.Header.Get("Authorization"), mode, episode); !ok {
			s.writeText(w, ep, http.StatusUnauthorized, bodyUnauthorized)
			return
		}
	}
	if fs.any {
		if st := fs.draw(endpointGroup[ep]); st != 0 {
			s.writeFault(w, ep, st, mode)
			return
		}
	}
	if strict && method == http.MethodPost && !jsonContentType(r.Header["Content-Type"]) {
		if ep == epReport {
			s.writeJSON(w, ep, http.StatusUnsupportedMediaType, bodyReport415)
		} else {
			s.writeError(w, ep, http.StatusUnsupportedMediaType, reasonContentType)
		}
		return
	}
	si := 0
	if mode == ModeStandby {
		si = 1
	}
	switch ep {
	case epSession, epSessionUser:
		s.serveSession(w, r, ep, mode, episode)
	case epCatalog:
		if s.bodies.catalog == nil {
			s.writeError(w, ep, http.StatusBadRequest, reasonNoCatalogs)
			return
		}
		s.writeJSON(w, ep, http.StatusOK, s.bodies.catalog)
	case epRestricted:
		s.serveRestricted(w, r, cl)
	case epPage:
		s.serveByID(w, ep, id, s.bodies.pages, reasonNoResults, http.StatusBadRequest, reasonNoResults)
	case epList:
		s.serveByID(w, ep, id, s.bodies.lists[si], reasonNoResults, http.StatusBadRequest, reasonNoResults)
	case epGenres:
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
	case epMix:
		s.serveByID(w, ep, id, s.bodies.mixes[si], reasonMixID, http.StatusNotFound, reasonMixNotFound)
	case epReport:
		s.serveReport(w, r, mode)
	}
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

// authorize verifies the raw JWT of the Authorization header.
func (s *Server) authorize(h string, mode Mode, episode uint64) (claims, bool) {
	if h == "" || strings.ContainsAny(h, " \t") { // "Bearer <jwt>" and any decoration
		return claims{}, false
	}
	c, err := s.signer.verify(h, s.opts.Now())
	if err != nil {
		return claims{}, false
	}
	if c.Sby != 0 && (mode != ModeStandby || c.Sby != episode) {
		return claims{}, false // standby-minted, and that standby episode has ended
	}
	if c.Rev < s.revoked.Load() {
		return claims{}, false // revoked (RevokeTokens)
	}
	return c, true
}

func (s *Server) serveSession(w http.ResponseWriter, r *http.Request, ep endpoint, mode Mode, episode uint64) {
	body, err := s.readBody(r)
	if err != nil {
		s.bodyError(w, ep, err)
		return
	}
	req := decodeSessionRequest(body)
	now := s.opts.Now()
	if mode == ModeStandby {
		// Standby: no credential check, a short-lived token, the flat shape.
		c := claims{Sub: deref(req.ClientID), Sby: episode, Rev: s.revoked.Load(), Iat: now.Unix(), Exp: now.Add(s.opts.StandbyTokenTTL).Unix()}
		if ep == epSessionUser {
			// Standby lifts credential verification only: the token is
			// still bound to the partner identity of the e-mail, so the
			// restricted catalog keeps the partner's restrictions.
			email := deref(req.Email)
			if email == "" {
				s.writeError(w, ep, http.StatusUnauthorized, reasonSessionUserMiss)
				return
			}
			if !strings.EqualFold(email, s.opts.Email) {
				s.writeError(w, ep, http.StatusBadRequest, reasonPartnerNotFound)
				return
			}
			c.Pid = partnerID(s.opts.ClientID)
		}
		var out wireSessionFlat
		out.Session.Token = s.signer.mint(c)
		s.writeJSON(w, ep, http.StatusOK, mustJSON(out))
		return
	}
	id, sig, email := deref(req.ClientID), deref(req.ClientSignature), deref(req.Email)
	if ep == epSession {
		if id == "" || sig == "" {
			s.writeError(w, ep, http.StatusUnauthorized, reasonSessionMissing)
			return
		}
	} else if id == "" || sig == "" || email == "" {
		s.writeError(w, ep, http.StatusUnauthorized, reasonSessionUserMiss)
		return
	}
	if !s.credentialsOK(id, sig) {
		s.writeError(w, ep, http.StatusBadRequest, reasonCredentials)
		return
	}
	c := claims{Sub: id, Rev: s.revoked.Load(), Iat: now.Unix(), Exp: now.Add(s.opts.LiveTokenTTL).Unix()}
	if ep == epSession {
		var out wireSessionLive
		out.Session.Token.Token = s.signer.mint(c)
		s.writeJSON(w, ep, http.StatusOK, mustJSON(out))
		return
	}
	if !strings.EqualFold(email, s.opts.Email) {
		s.writeError(w, ep, http.StatusBadRequest, reasonPartnerNotFound)
		return
	}
	c.Pid = partnerID(id)
	var out wireSessionFlat
	out.Session.Token = s.signer.mint(c)
	s.writeJSON(w, ep, http.StatusOK, mustJSON(out))
}

// decodeSessionRequest reads the three fields by their exact (case-sensitive)
// names; a field that is absent, null or not a string is nil, and a body that
// is not a JSON object has no fields at all.
func decodeSessionRequest(body []byte) wireSessionRequest {
	var req wireSessionRequest
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return req
	}
	str := func(k string) *string {
		var v string
		if raw, ok := m[k]; ok && json.Unmarshal(raw, &v) == nil && raw[0] == '"' {
			return &v
		}
		return nil
	}
	req.ClientID, req.ClientSignature, req.Email = str("client_id"), str("client_signature"), str("email")
	return req
}

func (s *Server) credentialsOK(id, sig string) bool {
	idOK := subtle.ConstantTimeCompare([]byte(id), []byte(s.opts.ClientID))
	sigOK := subtle.ConstantTimeCompare([]byte(sig), []byte(s.opts.ClientSignature))
	return idOK&sigOK == 1
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (s *Server) bodyError(w http.ResponseWriter, ep endpoint, err error) {
	if errors.Is(err, errBodyTooLarge) {
		if ep == epReport {
			s.writeJSON(w, ep, http.StatusRequestEntityTooLarge, []byte(`{"error":true,"message":"request entity too large"}`))
			return
		}
		s.writeError(w, ep, http.StatusRequestEntityTooLarge, "request entity too large")
		return
	}
	// The client went away mid-body: nobody reads the answer.
	s.counts.add(ep, 499)
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

func (s *Server) serveReport(w http.ResponseWriter, r *http.Request, mode Mode) {
	body, err := s.readBody(r)
	if err != nil {
		s.bodyError(w, epReport, err)
		return
	}
	now := s.opts.Now()
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
