package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestHoldFault: a report of a held track waits the hold, then gets the
// track's status (or its connection reset); the other tracks are answered at
// once meanwhile; a client that gives up first finds the report injected,
// never accepted; hold_rate holds its share of all reports.
func TestHoldFault(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	base := validReport(sb)
	bad := base["trackid"].(int64)
	var good int64
	for _, tr := range sb.Catalog().Mixes[1].Tracks {
		if tr.ID != bad {
			good = tr.ID
			break
		}
	}
	const hold = 400 * time.Millisecond
	put := func(faults string) {
		t.Helper()
		wantStatus(t, a.doURL("PUT", sb.AdminURL+"/admin/faults", "", faults, "Content-Type", "application/json"), 200)
	}
	post := func(ctx context.Context, rep map[string]any) (int, time.Duration, error) {
		b, _ := json.Marshal(rep)
		req, _ := http.NewRequestWithContext(ctx, "POST", sb.URL+"/partners/royalty-tracking", bytes.NewReader(b))
		req.Header.Set("User-Agent", testUA)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", tok)
		start := time.Now()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, time.Since(start), err
		}
		res.Body.Close()
		return res.StatusCode, time.Since(start), nil
	}

	put(`{"report":{"track_ids":[` + itoa(int(bad)) + `],"track_status":503,"hold":"400ms"}}`)
	done := make(chan struct{})
	var st int
	var took time.Duration
	var err error
	go func() {
		defer close(done)
		st, took, err = post(context.Background(), with(base, "playedat", int64(1_763_000_000_000)))
	}()
	for i := range 5 { // answered at once while the held one waits
		gs, gt, gerr := post(context.Background(), with(base, "trackid", good, "playedat", int64(1_763_000_000_100+i)))
		if gerr != nil || gs != 200 || gt > hold/2 {
			t.Fatalf("good track during the hold: %d in %v, %v", gs, gt, gerr)
		}
	}
	<-done
	if err != nil || st != 503 || took < hold {
		t.Fatalf("held track: %d after %v (want 503 after ≥ %v), %v", st, took, hold, err)
	}

	// The client gives up first: injected, never accepted.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, _, err = post(ctx, with(base, "playedat", int64(1_763_000_000_001)))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a client timing out before the hold ends: %v", err)
	}

	// hold_reset: no answer at all after the hold.
	put(`{"report":{"track_ids":[` + itoa(int(bad)) + `],"hold":"400ms","hold_reset":true}}`)
	st, took, err = post(context.Background(), with(base, "playedat", int64(1_763_000_000_002)))
	if err == nil || took < hold {
		t.Fatalf("reset after the hold: status %d after %v, err %v", st, took, err)
	}

	// hold_rate: a share of every report, seeded.
	put(`{"seed":3,"report":{"hold_rate":0.5,"hold":"150ms","hold_status":500}}`)
	held := 0
	for i := range 20 {
		st, took, err := post(context.Background(), with(base, "trackid", good, "playedat", int64(1_763_000_001_000+i)))
		switch {
		case err != nil:
			t.Fatal(err)
		case st == 500 && took >= 150*time.Millisecond:
			held++
		case st != 200:
			t.Fatalf("hold_rate: status %d after %v", st, took)
		}
	}
	if held < 4 || held > 16 {
		t.Fatalf("hold_rate 0.5 held %d of 20", held)
	}
	l := sb.Ledger()
	var byKind = map[string]int{}
	for _, e := range l.Injected {
		byKind[e.Fault]++
	}
	if byKind[sandbox.FaultTrack] != 3 || byKind[sandbox.FaultHold] != held {
		t.Fatalf("injected by fault %v, want track 3, hold %d", byKind, held)
	}
	for _, e := range l.Accepted {
		if e.Report.TrackID == bad {
			t.Fatalf("a held report was accepted: %s", e.Raw)
		}
	}

	// Out of range: refused, naming the field.
	r := a.doURL("PUT", sb.AdminURL+"/admin/faults", "", `{"report":{"hold":"11m"}}`, "Content-Type", "application/json")
	wantStatus(t, r, 400)
	r = a.doURL("PUT", sb.AdminURL+"/admin/faults", "", `{"mix":{"hold_rate":0.1}}`, "Content-Type", "application/json")
	wantStatus(t, r, 400)
}
