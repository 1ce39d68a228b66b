package sandbox

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
)

func partnerID(clientID string) string { return "partner:" + clientID }

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
