package sandbox_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// Lean mode: the ledger keeps the detail of the first
// LeanMaxLedgerEntries reports only, and no traceparent; every count, the
// duplicates included, stays exact.
func TestLeanLedgerIsBoundedAndCountsStayExact(t *testing.T) {
	srv, err := sandbox.New(sandbox.Config{Seed: 1, Lean: true})
	if err != nil {
		t.Fatal(err)
	}
	tok := srv.MintToken(0, false)
	h := srv.Handler()
	m := srv.Catalog().Mixes[0]
	const total, distinct = sandbox.LeanMaxLedgerEntries + 2_000, sandbox.LeanMaxLedgerEntries + 1_000
	post := func(i int) int {
		body := fmt.Sprintf(`{"trackid":%d,"playedat":%d,"playlength":30,"sourcestream":"mix","sourcedetail":"x","os":"iOS 17.4","device":"phone","country":"US","vendor":7,"userid":"u"}`,
			m.Tracks[1].ID, 1_763_000_000_000+int64(i%distinct))
		req := httptest.NewRequest("POST", "/partners/royalty-tracking", strings.NewReader(body))
		req.Header.Set("User-Agent", testUA)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", tok)
		req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	for i := range total {
		if st := post(i); st != http.StatusOK {
			t.Fatalf("report %d: status %d", i, st)
		}
	}
	c := srv.Counts()
	if c.Accepted != total || c.Duplicates != total-distinct || c.Dropped != total-sandbox.LeanMaxLedgerEntries {
		t.Fatalf("counts %+v, want accepted %d, duplicates %d, dropped %d", c, total, total-distinct, total-sandbox.LeanMaxLedgerEntries)
	}
	l := srv.Ledger()
	if len(l.Accepted) != sandbox.LeanMaxLedgerEntries || l.AcceptedCount != total {
		t.Fatalf("kept %d entries of %d, want %d", len(l.Accepted), l.AcceptedCount, sandbox.LeanMaxLedgerEntries)
	}
	for _, e := range l.Accepted[:10] {
		if e.TraceParent != "" || e.Flags == nil || e.Raw == "" {
			t.Fatalf("lean entry %+v: want raw body and flags, no traceparent", e)
		}
	}

	// The default mode keeps traceparent.
	def, err := sandbox.New(sandbox.Config{Seed: 1, MaxLedgerEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	tok, h = def.MintToken(0, false), def.Handler()
	for i := range 3 {
		if st := post(i); st != http.StatusOK {
			t.Fatalf("status %d", st)
		}
	}
	if l := def.Ledger(); len(l.Accepted) != 1 || l.Accepted[0].TraceParent == "" || l.Dropped != 2 || l.AcceptedCount != 3 {
		t.Fatalf("default ledger %+v", l)
	}
}
