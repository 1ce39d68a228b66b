package analytics

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// checkPaths: the same ledger audited by the exact path (the raw ledger in
// one pass) and by slices — one, several, and several with the distinct
// records counted exactly after uniqUpTo (a bound of 1: every slice with a
// double read again), and several by the wide form only (no narrow
// form, audit_fast.go) — gives the same figures, equal to the scenario's;
// and the play-level lists read in slices are the scenario's.
func checkPaths(t *testing.T, ctx context.Context, conn driver.Conn, db string, o AuditOptions, x expectation, name string) {
	t.Helper()
	want := auditNumbers(&x.audit)
	// The delivered plays that carry no event record time: their events
	// looked up by id after the slices, or joined per slice (lookups: 1);
	// the events recorded twice handed to the slices, or the events table
	// joined per slice (recordedTwice: -1).
	var uncarried uint64
	for _, p := range x.plays {
		if !p.below && p.delivered() && p.carriedMS == 0 {
			uncarried++
		}
	}
	for i, l := range []Limits{{Exact: true}, {}, {SliceReports: 1 + want.PlaysDerived/8}, {SliceReports: 1 + want.PlaysDerived/3, upTo: 1},
		{lookups: 1}, {SliceReports: 1 + want.PlaysDerived/8, recordedTwice: -1}, {SliceReports: 1 + want.PlaysDerived/8, noNarrow: true}} {
		lists := i == 2 // the play-level lists, in slices
		a, got, progress := auditLimited(t, ctx, conn, db, name, o, l)
		if g := auditNumbers(got); !reflect.DeepEqual(g, want) {
			t.Errorf("%s: audit (path %s)\n got %+v\nwant %+v", name, got.Path, g, want)
		}
		if lists { // the play-level lists, slice by slice
			for metric := range listConds {
				rows, err := a.List(ctx, o, metric, 0)
				if err != nil || !listsEqual(rows, x.lists[metric], false) {
					t.Errorf("%s: list %s in slices of %d plays: %v\n got %+v\nwant %+v", name, metric, l.SliceReports, err, rows, x.lists[metric])
				}
			}
			if rows, err := a.List(ctx, o, "derived", 3); err != nil || !listsEqual(rows, x.lists["derived"][:min(3, len(x.lists["derived"]))], false) {
				t.Errorf("%s: list derived limited to 3, in slices: %+v, %v", name, rows, err)
			}
		}
		if l.upTo == 1 && want.DeliveredTwice > 0 && !strings.Contains(progress.String(), "exact counts") {
			t.Errorf("%s: a double with uniqUpTo(1): no slice read again with exact counts:\n%s", name, progress.String())
		}
		lookedUp, joined := strings.Contains(progress.String(), "plays without their event's time ("), strings.Contains(progress.String(), "plays without their event's time, slice")
		switch {
		case l.Exact || l.recordedTwice < 0:
			if lookedUp || joined {
				t.Errorf("%s: limits %+v: the events of plays without a carried time looked up:\n%s", name, l, progress.String())
			}
		case l.lookups == 1 && uncarried > 1 && !joined, l.lookups == 0 && uncarried > 0 && !lookedUp:
			t.Errorf("%s: limits %+v: %d delivered plays without a carried time: looked up %v, joined per slice %v:\n%s", name, l, uncarried, lookedUp, joined, progress.String())
		}
		if l.Exact != strings.HasPrefix(got.Path, "exact") || !strings.Contains(progress.String(), "playpipe audit: ") {
			t.Errorf("%s: limits %+v: path %q, progress %q", name, l, got.Path, progress.String())
		}
	}
}

// auditLimited audits o on db with limits l, their progress lines written
// to the builder it returns with the auditor and the audit; an error stops
// the test (what names the case).
func auditLimited(t *testing.T, ctx context.Context, conn driver.Conn, db, what string, o AuditOptions, l Limits) (*Auditor, *Audit, *strings.Builder) {
	t.Helper()
	a, err := NewAuditor(conn, db)
	if err != nil {
		t.Fatal(err)
	}
	progress := &strings.Builder{}
	l.Progress = progress
	a.SetLimits(l)
	got, err := a.Audit(ctx, o)
	if err != nil {
		t.Fatalf("%s: audit with %+v: %v", what, l, err)
	}
	return a, got, progress
}
