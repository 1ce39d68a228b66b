package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"
)

// Fixed answers.
var (
	bodyUnauthorized = []byte("Unauthorized")
	bodyReportOK     = []byte(`{"error":false,"message":"success"}`)
	bodyReport500    = []byte(`{"error":true,"message":"internal service error"}`)
	bodyStandby503   = []byte(`{"error":true,"reason":"standby upstream error"}`)
	bodyReport415    = []byte(`{"error":true,"message":"` + reasonContentType + `"}`)
	bodyReport429    = []byte(`{"error":true,"message":"` + reasonTooMany + `"}`)
	bodyReport413    = []byte(`{"error":true,"message":"request entity too large"}`)
	// bodyReport400 is an injected 400: the validation answer naming trackid.
	bodyReport400 = []byte(`{"error":true,"message":"` + MessageRequiredPrefix + ` trackid"}`)
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
	reasonTooMany         = "too many requests"
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

// writeJSON answers with a JSON body and counts the answer.
func (s *Server) writeJSON(w http.ResponseWriter, ep endpoint, status int, body []byte) {
	s.write(w, ep, status, "application/json; charset=utf-8", body)
}

// writeText answers with a plain-text body and counts the answer.
func (s *Server) writeText(w http.ResponseWriter, ep endpoint, status int, body []byte) {
	s.write(w, ep, status, "text/plain; charset=utf-8", body)
}

func (s *Server) write(w http.ResponseWriter, ep endpoint, status int, contentType string, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{contentType}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	s.counts.add(ep, status)
}

func (s *Server) writeError(w http.ResponseWriter, ep endpoint, status int, reason string) {
	s.writeJSON(w, ep, status, envelope(reason))
}

// writeFault answers an injected or internal failure with the endpoint's
// envelope; retryAfter, when positive, goes with a 429 or 503.
func (s *Server) writeFault(w http.ResponseWriter, ep endpoint, status int, mode Mode, retryAfter time.Duration) {
	if retryAfter > 0 && (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) {
		w.Header()["Retry-After"] = []string{retryAfterHeader(retryAfter)}
	}
	switch {
	case status == http.StatusUnauthorized:
		s.writeText(w, ep, status, bodyUnauthorized)
	case status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
		s.writeText(w, ep, status, []byte(http.StatusText(status)))
	case status == http.StatusServiceUnavailable && mode == ModeStandby:
		s.writeJSON(w, ep, status, bodyStandby503)
	case ep == epReport && status == http.StatusTooManyRequests:
		s.writeJSON(w, ep, status, bodyReport429)
	case ep == epReport && status == http.StatusBadRequest:
		s.writeJSON(w, ep, status, bodyReport400)
	case ep == epReport && status == http.StatusRequestEntityTooLarge:
		s.writeJSON(w, ep, status, bodyReport413)
	case ep == epReport:
		s.writeJSON(w, ep, status, bodyReport500)
	case status == http.StatusTooManyRequests:
		s.writeError(w, ep, status, reasonTooMany)
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

func (s *Server) bodyError(w http.ResponseWriter, ep endpoint, err error) {
	if errors.Is(err, errBodyTooLarge) {
		if ep == epReport {
			s.writeJSON(w, ep, http.StatusRequestEntityTooLarge, bodyReport413)
			return
		}
		s.writeError(w, ep, http.StatusRequestEntityTooLarge, "request entity too large")
		return
	}
	// The client went away mid-body: nobody reads the answer.
	s.counts.add(ep, 499)
}
