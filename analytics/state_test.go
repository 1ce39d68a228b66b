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
// double read again) — gives the same figures, equal to the scenario's;
// and the play-level lists read in slices are the scenario's.
func checkPaths(t *testing.T, ctx context.Context, conn driver.Conn, db string, o AuditOptions, x expectation, name string) {
	t.Helper()
	want := auditNumbers(&x.audit)
	// The delivered plays that carry no event record time look their
	// events up in one query when few, else slice by slice (the last
	// limits).
	var uncarried uint64
	for _, p := range x.plays {
		if !p.below && p.delivered() && p.carriedMS == 0 {
			uncarried++
		}
	}
	for i, l := range []Limits{{Exact: true}, {}, {SliceReports: 1 + want.PlaysDerived/8}, {SliceReports: 1 + want.PlaysDerived/3, upTo: 1}, {SliceReports: max(1, uncarried/2)}} {
		lists := i == 2 // the play-level lists, in slices
		a, err := NewAuditor(conn, db)
		if err != nil {
			t.Fatal(err)
		}
		var progress strings.Builder
		l.Progress = &progress
		a.SetLimits(l)
		got, err := a.Audit(ctx, o)
		if err != nil {
			t.Fatalf("%s: audit with %+v: %v", name, l, err)
		}
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
		perSlice := strings.Contains(progress.String(), "delay of plays without their event's time, slice")
		if !l.Exact && perSlice != (uncarried > max(l.SliceReports, 1_000_000*b2u64(l.SliceReports == 0))) {
			t.Errorf("%s: limits %+v: %d delivered plays without a carried time, read per slice: %v", name, l, uncarried, perSlice)
		}
		if l.Exact != strings.HasPrefix(got.Path, "exact") || !strings.Contains(progress.String(), "playpipe audit: ") {
			t.Errorf("%s: limits %+v: path %q, progress %q", name, l, got.Path, progress.String())
		}
	}
}

func b2u64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
