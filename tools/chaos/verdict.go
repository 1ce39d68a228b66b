//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/expect"
)

// expectation is what the partner should hold: the plays of every valid
// event Kafka acknowledged, and the event each play comes from.
type expectation struct {
	want    map[expect.Play]int
	eventOf map[expect.Play]string
	first   map[string]time.Time // event key → first published
	valid   int                  // valid events accepted
	bad     int                  // bad events on Kafka (to be rejected by consume)
	refused int                  // events the gateway refused (bad ones)
	// refused202 of them in a 202 answer (their rejection record on Kafka)
	refused202 int
	lost       []string // valid events never accepted by Kafka or the gateway
}

func expectOf(cat *sandbox.Catalog, events []event) (expectation, error) {
	x := expectation{want: map[expect.Play]int{}, eventOf: map[expect.Play]string{}, first: map[string]time.Time{}}
	for _, e := range events {
		x.first[e.key] = e.first
		switch {
		case e.refused != nil:
			x.refused++
			if e.refusedIn202 {
				x.refused202++
			}
		case !e.accepted:
			x.lost = append(x.lost, e.key)
		case e.kind != "valid":
			x.bad++
		default:
			x.valid++
			plays, _, err := expect.Event(cat, []byte(e.value))
			if err != nil {
				return x, fmt.Errorf("expected plays of %s: %w", e.key, err)
			}
			for _, p := range plays {
				x.want[p]++
				x.eventOf[p] = e.key
			}
		}
	}
	return x, nil
}

// partner reads the sandbox's ledger: the partner's truth.
func partnerLedger(admin string) (sandbox.LedgerSnapshot, error) {
	var led sandbox.LedgerSnapshot
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/admin/ledger", nil)
	if err != nil {
		return led, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return led, fmt.Errorf("sandbox ledger: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&led); err != nil {
		return led, fmt.Errorf("sandbox ledger: %w", err)
	}
	return led, nil
}

// ledgerCount is the partner's count of distinct accepted reports (cheap:
// since = max lists no entry).
func ledgerCount(admin string) (int64, error) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + admin + "/admin/ledger?since=9223372036854775807")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var led sandbox.LedgerSnapshot
	if err := json.NewDecoder(resp.Body).Decode(&led); err != nil {
		return 0, err
	}
	return led.AcceptedCount - led.Duplicates, nil
}

// auditor runs `playpipe audit` on the run's ledger.
type auditor struct{ bin, chAddr string }

func (a auditor) args(extra ...string) []string {
	return append([]string{"audit", "--clickhouse-addr", a.chAddr, "--clickhouse-db", database, "--from", "-12h", "--to", "+2h",
		"--format", "json", "--log-level", "warn"}, extra...)
}

func (a auditor) run(out any, extra ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.bin, a.args(extra...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 3) { // 3: the audit found problems; its JSON is there
		return fmt.Errorf("playpipe audit %s: %v: %s", strings.Join(extra, " "), err, strings.TrimSpace(stderr.String()))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("playpipe audit %s: %w", strings.Join(extra, " "), err)
	}
	return nil
}

func (a auditor) audit() (analytics.Audit, error) {
	var r analytics.Audit
	return r, a.run(&r)
}

// byEvent returns, per event id, the rows of an audit list.
func (a auditor) byEvent(list string) (map[string][]analytics.ListRow, error) {
	var rows []analytics.ListRow
	if err := a.run(&rows, "--list", list, "--limit", "0"); err != nil {
		return nil, err
	}
	out := map[string][]analytics.ListRow{}
	for _, r := range rows {
		out[r.EventID] = append(out[r.EventID], r)
	}
	return out, nil
}

// Verdict is the outcome, play by play.
type Verdict struct {
	Expected, AtPartner, Duplicates, Unexpected int
	Parked, RejectedByAPI                       int // missing plays the audit lists as parked / rejected
	Missing                                     []expect.Play
	Dups, Strays                                []expect.Play // extra copies of expected plays; plays no event yields
	Bad, Refused, AuditRejected                 int
	Audit                                       analytics.Audit
	Violations                                  []string
}

// judge compares the partner's ledger with the expectation, explaining
// each missing play by the audit's parked and rejected-by-API lists.
func judge(x expectation, led sandbox.LedgerSnapshot, a auditor) (Verdict, error) {
	v := Verdict{Bad: x.bad, Refused: x.refused}
	got := map[expect.Play]int{}
	for _, e := range led.Accepted {
		got[expect.Of(e.Report)]++
	}
	for _, n := range x.want {
		v.Expected += n
	}
	missing, extra := expect.Diff(x.want, got)
	for _, p := range extra {
		if x.want[p] > 0 {
			v.Duplicates++
			v.Dups = append(v.Dups, p)
		} else {
			v.Unexpected++
			v.Strays = append(v.Strays, p)
		}
	}
	v.AtPartner = v.Expected - len(missing)
	rep, err := a.audit()
	if err != nil {
		return v, err
	}
	v.Audit = rep
	v.AuditRejected = int(rep.EventsRejected)
	if len(missing) > 0 {
		parked, err := a.byEvent("parked")
		if err != nil {
			return v, err
		}
		rejected, err := a.byEvent("rejected-by-api")
		if err != nil {
			return v, err
		}
		// a missing play is explained when its event has as many plays
		// listed parked or rejected as it has plays missing
		used := map[string]int{}
		for _, p := range missing {
			ev := x.eventOf[p]
			switch used[ev]++; {
			case used[ev] <= len(parked[ev]):
				v.Parked++
			case used[ev] <= len(parked[ev])+len(rejected[ev]):
				v.RejectedByAPI++
			default:
				v.Missing = append(v.Missing, p)
			}
		}
	}
	if len(v.Missing) > 0 {
		v.Violations = append(v.Violations, fmt.Sprintf("%d expected plays neither at the partner nor parked nor rejected", len(v.Missing)))
	}
	if v.Unexpected > 0 {
		v.Violations = append(v.Violations, fmt.Sprintf("%d plays at the partner that no accepted event yields", v.Unexpected))
	}
	if uint64(v.Duplicates) > rep.PossibleExtraCopies {
		v.Violations = append(v.Violations, fmt.Sprintf("the partner holds %d duplicate plays, more than the audit's %d possible extra copies (by cause %v)",
			v.Duplicates, rep.PossibleExtraCopies, rep.DoubtfulPostsByCause))
	}
	if v.AuditRejected < x.bad+x.refused202 {
		v.Violations = append(v.Violations, fmt.Sprintf("%d bad events reached Kafka and %d were refused by the gateway in a 202, the audit counts %d rejected",
			x.bad, x.refused202, v.AuditRejected))
	}
	if len(x.lost) > 0 {
		v.Violations = append(v.Violations, fmt.Sprintf("%d events never accepted by the gateway or Kafka after the drain (e.g. %s)", len(x.lost), x.lost[0]))
	}
	return v, nil
}

// explain names up to n plays of each kind of violation (missing; more
// duplicates than the audit allows; unexpected) with the faults active
// from 30 s before their event was first published to 2 min after.
func explain(w io.Writer, v Verdict, x expectation, tl *Timeline, n int) {
	explainPlays(w, "missing", v.Missing, x, tl, n)
	if uint64(v.Duplicates) > v.Audit.PossibleExtraCopies {
		explainPlays(w, "duplicate", v.Dups, x, tl, n)
	}
	explainPlays(w, "unexpected", v.Strays, x, tl, n)
}

func explainPlays(w io.Writer, what string, plays []expect.Play, x expectation, tl *Timeline, n int) {
	for i, p := range plays {
		if i == n {
			fmt.Fprintf(w, "  … and %d more %s plays\n", len(plays)-n, what)
			break
		}
		ev, ok := x.eventOf[p]
		if !ok {
			fmt.Fprintf(w, "  %s: track %d played_at %d user %s device %s (no accepted event yields it)\n", what, p.TrackID, p.PlayedAt, p.UserID, p.Device)
			continue
		}
		at := x.first[ev]
		fmt.Fprintf(w, "  %s: event %s track %d played_at %d user %s (first published %s)\n", what, ev, p.TrackID, p.PlayedAt, p.UserID, at.Format("15:04:05.000"))
		var names []string
		for _, r := range tl.Around(at.Add(-30*time.Second), at.Add(2*time.Minute)) {
			names = append(names, fmt.Sprintf("#%d %s %s %s–%s", r.ID, r.Kind, r.Target, r.Start.Format("15:04:05"), r.End.Format("15:04:05")))
		}
		slices.Sort(names)
		fmt.Fprintf(w, "    faults around it: %s\n", strings.Join(names, "; "))
	}
}
