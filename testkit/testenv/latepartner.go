package testenv

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
)

// LatePartner wraps a partner API handler (the sandbox's): the first Slow
// posts of each play report body are handled at once — they reach the
// partner's ledger — and answered only after Delay, when a reporter with a
// shorter timeout has given up on them; later posts are answered at once.
// It is the partner that records a report and answers late, as the real one
// did when it answered after 20 s. Other requests pass
// through untouched.
type LatePartner struct {
	H     http.Handler
	Slow  int
	Delay time.Duration

	mu    sync.Mutex
	seen  map[string]int
	slowN int
}

// Late returns the number of posts answered late so far.
func (s *LatePartner) Late() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slowN
}

// ServeHTTP implements http.Handler.
func (s *LatePartner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != partnerapi.PathRoyaltyTracking {
		s.H.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[string]int{}
	}
	s.seen[string(body)]++
	late := s.seen[string(body)] <= s.Slow
	if late {
		s.slowN++
	}
	s.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if !late {
		s.H.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	s.H.ServeHTTP(rec, r) // the partner records the report now …
	t := time.NewTimer(s.Delay)
	defer t.Stop()
	select { // … and answers late (or not at all: the client left)
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}
