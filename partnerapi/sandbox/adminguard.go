package sandbox

import (
	"mime"
	"net"
	"net/http"
	"strings"
)

// adminGuard refuses what a web page in a developer's browser could send to
// the admin API (CSRF, DNS rebinding), before any route runs:
//
//   - a Host that is not the admin listener's own address, a loopback name
//     ("localhost", "*.localhost", 127.0.0.0/8, ::1) or one of
//     Config.AdminHosts → 403 (a rebound DNS name carries the attacker's
//     host name);
//   - an Origin that is not the listener's own origin ("http://" + the
//     request's Host), "null" included, or a Sec-Fetch-Site other than
//     same-origin or none → 403 (browsers send Origin on every POST, PUT
//     and DELETE, and on cross-origin GETs made by fetch);
//   - a POST, PUT, PATCH or DELETE whose Content-Type is not
//     application/json → 415, unless it has no body and no Content-Type
//     (`curl -X POST …/admin/reset`): the body types a page may send
//     without a CORS preflight (text/plain, form encodings) never reach a
//     handler.
//
// Non-browser clients (curl, the tests, the bench) send no Origin and the
// listener's address as Host, and pass.
func (s *Server) adminGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.opts.AdminAllowRemote && !isLoopback(r.RemoteAddr) {
			adminError(w, http.StatusForbidden, "the admin API answers loopback callers only")
			return
		}
		if !s.adminHostAllowed(r) {
			adminError(w, http.StatusForbidden, "the admin API answers requests addressed to its own listener only (Host "+
				quoteTrunc(r.Host)+" is foreign: DNS rebinding is refused; see Config.AdminHosts / --admin-host)")
			return
		}
		if o := r.Header.Get("Origin"); o != "" && !strings.EqualFold(o, "http://"+r.Host) {
			adminError(w, http.StatusForbidden, "cross-origin requests to the admin API are refused (Origin "+quoteTrunc(o)+")")
			return
		}
		if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
			adminError(w, http.StatusForbidden, "cross-site requests to the admin API are refused (Sec-Fetch-Site "+quoteTrunc(site)+")")
			return
		}
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
			ct := r.Header.Get("Content-Type")
			if ct == "" && r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
				break // no body at all
			}
			if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
				adminError(w, http.StatusUnsupportedMediaType, "the admin API takes JSON bodies only: send Content-Type: application/json (got "+quoteTrunc(ct)+")")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// adminHostAllowed reports whether the request's Host names the admin
// listener: its own address (the connection's local address), a loopback
// name, or one of Config.AdminHosts.
func (s *Server) adminHostAllowed(r *http.Request) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "" {
		return false
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() {
			return true
		}
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if ta, ok := la.(*net.TCPAddr); ok && ta.IP.Equal(ip) {
				return true
			}
		}
		return false
	}
	for _, h := range s.opts.AdminHosts {
		if strings.EqualFold(strings.TrimSuffix(h, "."), host) {
			return true
		}
	}
	return false
}

// quoteTrunc quotes s for an error message, cut at 64 bytes.
func quoteTrunc(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}
