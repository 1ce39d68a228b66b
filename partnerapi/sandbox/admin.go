package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// AdminUsage documents the admin API (printed by `playpipe sandbox --help`).
const AdminUsage = `Admin API (JSON bodies with Content-Type: application/json; loopback callers only
unless allowed; a foreign Host or Origin is refused with 403, a non-JSON body with 415):
  GET    /admin/health            {"ok":true,"mode":"live"}
  GET    /admin/mode              {"mode":"live"|"standby"|"live-bypass"}
  PUT    /admin/mode              body {"mode":"standby"}; entering standby starts an episode,
                                  leaving it kills every token minted during it
  GET    /admin/faults            the injected faults (fail_next = what remains)
  PUT    /admin/faults            body {"report":{"rate_500":0.1,"rate_503":0,"rate_429":0,"retry_after":"2s",
                                  "latency":"20ms","fail_next":3,"fail_next_status":503,
                                  "track_ids":[400001],"track_status":500,"body_over":2048,"body_over_status":413},
                                  "session":{…},"catalog":{…},"mix":{…},"seed":7}: replaces every fault;
                                  groups: session, catalog (catalog, restricted, page, list, genres), mix, report;
                                  rates: shares of the group's requests (one seeded draw, sum ≤ 1);
                                  retry_after: Retry-After on injected 429 and 503;
                                  fail_next_status: 401, 429, 500 (default), 502, 503, 504;
                                  "ids":[42] restricts a group's fail_next and rates to those path ids;
                                  report only: track_ids / body_over answer every report of those
                                  tracks / longer than N bytes with track_status (500 default) /
                                  body_over_status (413 default): 400, 401, 413, 429, 500, 502, 503, 504
  PATCH  /admin/faults            JSON merge patch (RFC 7386) of the faults: sets or lifts one fault,
                                  keeps the others, e.g. {"report":{"track_ids":null}} lifts the track fault
  DELETE /admin/faults            no faults
  POST   /admin/reset             empty ledger and counters, the starting faults (--faults), starting mode
  GET    /admin/ledger[?since=N]  accepted reports (raw body, decoded fields, arrival, flags,
                                  duplicate), standby reports, rejected reports, reports answered
                                  with an injected fault (status, fault), counts, counters;
                                  since=N keeps entries with seq > N
  GET    /admin/counters          answers per endpoint and HTTP status
  GET    /admin/catalog           the generated catalog with every mix's full track listing
  POST   /admin/token             body {"ttl":"2s","with_user":false}: mint a session token as
                                  the session endpoint would in the current mode (ttl 0: default)
  POST   /admin/revoke-tokens     revoke every session token minted so far (they answer 401
                                  from now on; new sessions work): {"revocations":N}`

// AdminHandler is the admin API (see AdminUsage). Callers not on loopback
// get 403 unless Config.AdminAllowRemote; cross-origin requests, foreign
// Host headers and non-JSON bodies are refused (adminGuard).
func (s *Server) AdminHandler() http.Handler { return s.admin }

// adminMux is the admin API's route table (see AdminUsage), behind the
// loopback, Host, Origin and Content-Type checks (adminGuard).
func (s *Server) adminMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/health", s.adminHealth)
	mux.HandleFunc("GET /admin/mode", func(w http.ResponseWriter, r *http.Request) {
		adminJSON(w, http.StatusOK, map[string]string{"mode": s.Mode().String()})
	})
	mux.HandleFunc("PUT /admin/mode", s.adminSetMode)
	mux.HandleFunc("POST /admin/mode", s.adminSetMode)
	mux.HandleFunc("GET /admin/faults", func(w http.ResponseWriter, r *http.Request) {
		adminJSON(w, http.StatusOK, s.Faults())
	})
	mux.HandleFunc("PUT /admin/faults", s.adminSetFaults)
	mux.HandleFunc("POST /admin/faults", s.adminSetFaults)
	mux.HandleFunc("PATCH /admin/faults", s.adminPatchFaults)
	mux.HandleFunc("DELETE /admin/faults", func(w http.ResponseWriter, r *http.Request) {
		s.SetFaults(Faults{})
		adminJSON(w, http.StatusOK, s.Faults())
	})
	mux.HandleFunc("POST /admin/reset", func(w http.ResponseWriter, r *http.Request) {
		s.Reset()
		s.adminHealth(w, r)
	})
	mux.HandleFunc("GET /admin/ledger", s.adminLedger)
	mux.HandleFunc("GET /admin/counters", func(w http.ResponseWriter, r *http.Request) {
		adminJSON(w, http.StatusOK, s.counts.snapshot())
	})
	mux.HandleFunc("GET /admin/catalog", func(w http.ResponseWriter, r *http.Request) {
		adminJSON(w, http.StatusOK, s.cat)
	})
	mux.HandleFunc("POST /admin/token", s.adminToken)
	mux.HandleFunc("POST /admin/revoke-tokens", func(w http.ResponseWriter, r *http.Request) {
		adminJSON(w, http.StatusOK, map[string]uint64{"revocations": s.RevokeTokens()})
	})
	return s.adminGuard(mux)
}

// adminHealth answers {"ok":true,"mode":…}.
func (s *Server) adminHealth(w http.ResponseWriter, _ *http.Request) {
	adminJSON(w, http.StatusOK, map[string]any{"ok": true, "mode": s.Mode().String()})
}

// adminSetMode sets the mode of the body {"mode":…}.
func (s *Server) adminSetMode(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Mode string `json:"mode"`
	}
	if err := decodeStrict(r, &req); err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	m, err := ParseMode(req.Mode)
	if err != nil {
		adminError(w, http.StatusBadRequest, "mode: "+err.Error())
		return
	}
	s.SetMode(m)
	adminJSON(w, http.StatusOK, map[string]string{"mode": m.String()})
}

// adminSetFaults replaces the injected faults with the body's.
func (s *Server) adminSetFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	if err := decodeStrict(r, &f); err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.applyFaults(w, f, "sandbox faults set")
}

// applyFaults validates f, makes it the injected faults and answers with
// them (400 with the reason when f is invalid).
func (s *Server) applyFaults(w http.ResponseWriter, f Faults, logMsg string) {
	if err := f.Validate(); err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.SetFaults(f)
	s.log.Info(logMsg)
	adminJSON(w, http.StatusOK, s.Faults())
}

// adminPatchFaults merges the body (a JSON merge patch, RFC 7386) into the
// injected faults: a member set to null is lifted, the others are kept.
func (s *Server) adminPatchFaults(w http.ResponseWriter, r *http.Request) {
	var patch any
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.UseNumber()
	if err := dec.Decode(&patch); err != nil {
		adminError(w, http.StatusBadRequest, fmt.Sprintf("request body: %v", err))
		return
	}
	f, err := patchFaults(s.Faults(), patch)
	if err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.applyFaults(w, f, "sandbox faults patched")
}

// patchFaults applies the JSON merge patch to cur.
func patchFaults(cur Faults, patch any) (Faults, error) {
	b, err := json.Marshal(cur)
	if err != nil {
		return Faults{}, fmt.Errorf("encoding the faults: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return Faults{}, fmt.Errorf("decoding the faults: %w", err)
	}
	if b, err = json.Marshal(mergePatch(doc, patch)); err != nil {
		return Faults{}, fmt.Errorf("encoding the patched faults: %w", err)
	}
	var f Faults
	dec = json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Faults{}, fmt.Errorf("patched faults: %w", err)
	}
	return f, nil
}

// mergePatch is RFC 7386: objects merge member by member, null deletes,
// anything else replaces.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
		} else {
			t[k] = mergePatch(t[k], v)
		}
	}
	return t
}

// adminLedger answers the ledger, since=N: its entries with seq > N.
func (s *Server) adminLedger(w http.ResponseWriter, r *http.Request) {
	var since uint64
	if v := r.URL.Query().Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			adminError(w, http.StatusBadRequest, "since: a non-negative integer expected")
			return
		}
		since = n
	}
	l := s.ledger.snapshot(since)
	l.Counters = s.counts.snapshot()
	adminJSON(w, http.StatusOK, l)
}

// adminToken mints a session token: body {"ttl":"2s","with_user":false}.
func (s *Server) adminToken(w http.ResponseWriter, r *http.Request) {
	var req struct {
		TTL      string `json:"ttl"`
		WithUser bool   `json:"with_user"`
	}
	if err := decodeStrict(r, &req); err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	var ttl time.Duration
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d < 0 {
			adminError(w, http.StatusBadRequest, "ttl: a non-negative Go duration expected, e.g. \"2s\"")
			return
		}
		ttl = d
	}
	adminJSON(w, http.StatusOK, map[string]string{"token": s.MintToken(ttl, req.WithUser)})
}

func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func decodeStrict(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

func adminJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func adminError(w http.ResponseWriter, status int, msg string) {
	adminJSON(w, status, map[string]string{"error": msg})
}
