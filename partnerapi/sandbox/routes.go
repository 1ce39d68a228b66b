package sandbox

import (
	"net/http"
	"strings"
	"time"
)

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

// serveAPI answers one request to the partner API: the checks every
// endpoint shares (gate, then admit), then the endpoint (dispatch).
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	ep, id, method := route(r.URL.Path)
	fs := s.faults.Load()
	mode, episode, ok := s.gate(w, r, ep, method, fs)
	if !ok {
		return
	}
	cl, ok := s.admit(w, r, ep, id, method, fs, mode, episode)
	if !ok {
		return
	}
	s.dispatch(w, r, ep, id, mode, episode, cl, fs)
}

// gate applies the checks before the token: the edge layer, the served-by
// header of the mode, the route and its method, and the injected latency.
// It returns the mode and standby episode of the request, and false when
// the request was answered (or its client went away).
func (s *Server) gate(w http.ResponseWriter, r *http.Request, ep endpoint, method string, fs *faultState) (Mode, uint64, bool) {
	// The edge layer comes before everything, the mode header included.
	if EdgeBlocked(r.Header.Get("User-Agent")) {
		s.writeText(w, ep, http.StatusForbidden, []byte(edgeBody))
		return 0, 0, false
	}
	mode, episode := s.modeEpisode()
	if sb := mode.servedBy(); sb != "" {
		w.Header()["X-Service-Served-By"] = []string{sb}
	}
	if ep == epOther {
		s.writeError(w, ep, http.StatusNotFound, "not found")
		return mode, episode, false
	}
	if r.Method != method {
		w.Header().Set("Allow", method)
		s.writeError(w, ep, http.StatusMethodNotAllowed, "method not allowed")
		return mode, episode, false
	}
	if fs.any {
		if d := fs.groups[endpointGroup[ep]].Latency; d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return mode, episode, false
			}
		}
	}
	return mode, episode, true
}

// admit checks the token (but on the session endpoints), draws the injected
// faults (for the path id; play reports draw theirs in serveReport) and checks the content type of a POST. It returns the token's
// claims, and false when the request was answered.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, ep endpoint, id, method string, fs *faultState, mode Mode, episode uint64) (claims, bool) {
	strict := !s.opts.Lenient
	var cl claims
	if ep != epSession && ep != epSessionUser {
		var ok bool
		if strict && len(r.Header["Authorization"]) > 1 {
			// Two tokens: which one counts is undefined, so neither does.
			s.writeText(w, ep, http.StatusUnauthorized, bodyUnauthorized)
			return cl, false
		}
		if cl, ok = s.authorize(r.Header.Get("Authorization"), mode, episode); !ok {
			s.writeText(w, ep, http.StatusUnauthorized, bodyUnauthorized)
			return cl, false
		}
	}
	// Play reports draw their faults once the body is read (serveReport):
	// payload faults need it, and the ledger keeps what was refused.
	if fs.any && ep != epReport {
		if st, _ := fs.draw(endpointGroup[ep], id); st != 0 {
			s.writeFault(w, ep, st, mode, fs.groups[endpointGroup[ep]].RetryAfter)
			return cl, false
		}
	}
	if strict && method == http.MethodPost && !jsonContentType(r.Header["Content-Type"]) {
		if ep == epReport {
			s.writeJSON(w, ep, http.StatusUnsupportedMediaType, bodyReport415)
		} else {
			s.writeError(w, ep, http.StatusUnsupportedMediaType, reasonContentType)
		}
		return cl, false
	}
	return cl, true
}

// dispatch answers an admitted request with its endpoint.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request, ep endpoint, id string, mode Mode, episode uint64, cl claims, fs *faultState) {
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
		s.serveGenres(w, ep, id, si)
	case epMix:
		s.serveByID(w, ep, id, s.bodies.mixes[si], reasonMixID, http.StatusNotFound, reasonMixNotFound)
	case epReport:
		s.serveReport(w, r, mode, fs)
	}
}
