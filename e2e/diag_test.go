//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// explainDuplicates logs, for every play the partner accepted more than
// once, when it was accepted, which report ids of plays.reports carry it,
// and the Delivery records of those ids (partition/offset, attempt, in
// doubt, the playpipe-src header, time): what a reader needs to tell a
// crash double (one report id, an in-doubt re-post) from a re-derivation
// (two report ids) or an unlabelled re-post.
func explainDuplicates(t *testing.T, k *testenv.Kafka, led sandbox.LedgerSnapshot, marks map[string]time.Time) {
	t.Helper()
	arrivals := map[play][]time.Time{}
	for _, e := range led.Accepted {
		p := expect.Of(e.Report)
		arrivals[p] = append(arrivals[p], e.Arrival)
	}
	dup := map[play]bool{}
	for p, a := range arrivals {
		if len(a) > 1 {
			dup[p] = true
		}
	}
	if len(dup) == 0 {
		return
	}
	ids := map[play][]string{}
	for _, r := range k.ReadAll(t, k.Config.Topics().Reports) {
		var tp schemas.TrackPlay
		if err := json.Unmarshal(r.Value, &tp); err != nil {
			continue
		}
		r2 := tp.Report
		if p := (play{TrackID: r2.TrackID, PlayedAt: r2.PlayedAt, PlayLength: r2.PlayLength, UserID: r2.UserID, Device: r2.Device, ISRC: r2.ISRC}); dup[p] {
			ids[p] = append(ids[p], fmt.Sprintf("%s@%d/%d", tp.ReportID, r.Partition, r.Offset))
		}
	}
	want := map[string]bool{}
	for _, l := range ids {
		for _, id := range l {
			want[strings.SplitN(id, "@", 2)[0]] = true
		}
	}
	dels := map[string][]string{}
	for _, r := range k.ReadAll(t, k.Config.Topics().Deliveries) {
		var d schemas.Delivery
		src := ""
		for _, h := range r.Headers {
			if h.Key == schemas.HeaderSource {
				src = string(h.Value)
			}
		}
		if json.Unmarshal(r.Value, &d) != nil || !want[d.ReportID] {
			continue
		}
		dels[d.ReportID] = append(dels[d.ReportID], fmt.Sprintf("%s attempt=%d doubt=%t src=%s at=%s (%d/%d)",
			d.Outcome, d.Attempt, d.InDoubt, src, time.UnixMilli(d.At).Format("15:04:05.000"), r.Partition, r.Offset))
	}
	var names []string
	for n := range marks {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return marks[names[i]].Before(marks[names[j]]) })
	var ms []string
	for _, n := range names {
		ms = append(ms, n+" "+marks[n].Format("15:04:05.000"))
	}
	t.Logf("duplicates explained (%d plays; marks: %s):", len(dup), strings.Join(ms, ", "))
	var ps []play
	for p := range dup {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return arrivals[ps[i]][0].Before(arrivals[ps[j]][0]) })
	if kill, ok := marks["kill report-0"]; ok {
		before, parts := 0, map[string]int{}
		for _, p := range ps {
			if arrivals[p][0].Before(kill) {
				before++
			}
			for _, id := range ids[p] {
				parts[strings.SplitN(strings.SplitN(id, "@", 2)[1], "/", 2)[0]]++
			}
		}
		t.Logf("duplicates: first accepted before the SIGKILL was sent: %d, after: %d (posts in flight answered after the kill); by reports partition: %v",
			before, len(ps)-before, parts)
	}
	if !t.Failed() && len(ps) > 5 {
		ps = ps[:5] // the first few; all of them when the test fails
	}
	for _, p := range ps {
		var at []string
		for _, a := range arrivals[p] {
			at = append(at, a.Format("15:04:05.000"))
		}
		t.Logf("  accepted at %s; reports %v", strings.Join(at, ", "), ids[p])
		for _, id := range ids[p] {
			for _, d := range dels[strings.SplitN(id, "@", 2)[0]] {
				t.Logf("    %s", d)
			}
		}
	}
}
