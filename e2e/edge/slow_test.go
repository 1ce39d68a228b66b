//go:build unix

package edge

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/wiring/testenv"
)

// slowPartner wraps the sandbox's API: the first `slow` posts of each
// report body are taken by the sandbox at once (they reach its ledger) and
// answered only after delay, when the reporter has given up on them; later
// posts are answered at once. A partner that records a report and answers
// late, as the real one did when it answered after 20 s.
type slowPartner struct {
	h     http.Handler
	slow  int
	delay time.Duration

	mu    sync.Mutex
	seen  map[string]int
	slowN int
}

func (s *slowPartner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != partnerapi.PathRoyaltyTracking {
		s.h.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.seen[string(body)]++
	late := s.seen[string(body)] <= s.slow
	if late {
		s.slowN++
	}
	s.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if !late {
		s.h.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, r) // the partner records the report now …
	t := time.NewTimer(s.delay)
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

// TestSlowPartnerCopies (issue 22, item 4): the partner records every report
// but answers its first two posts after 3 s, past the reporter's 1 s
// --api-timeout. Each play then reaches the partner three times; the
// reporter labels the two timed-out posts in doubt (cause timeout), and the
// audit's bound on extra copies is at least the partner's duplicates —
// counting copies, not plays.
func TestSlowPartnerCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	sb := testenv.StartSandbox(t, func(c *sandbox.Config) { c.Seed = 5; c.Pages, c.ListsPerPage, c.MixesPerList = 1, 1, 3 })
	sp := &slowPartner{h: sb.Handler(), slow: 2, delay: 3 * time.Second, seen: map[string]int{}}
	url := testenv.ServeHandler(t, sp)
	r := runPipeline(t, pipelineRun{sb: sb, apiURL: url, requestTimeout: time.Second, events: 3, rate: 50})
	sp.mu.Lock()
	slowN := sp.slowN
	sp.mu.Unlock()
	t.Logf("slow partner: %d plays delivered, %d posts answered late, partner duplicates %d, plays labelled in doubt %d, audit possible extra copies %d (%d plays), doubtful posts by cause %v; problems %q",
		r.plays, slowN, r.duplicates, r.inDoubtPlays, r.audit.PossibleExtraCopies, r.audit.PlaysWithExtraCopies, r.audit.DoubtfulPostsByCause, r.audit.Problems())
	if r.duplicates < int64(r.plays) {
		t.Errorf("the partner holds %d duplicates of %d plays: the slow answers did not make the reporter post again", r.duplicates, r.plays)
	}
	if !r.hasCause(schemas.DoubtTimeout) {
		t.Errorf("no post labelled with cause timeout: %v", r.audit.DoubtfulPostsByCause)
	}
}
