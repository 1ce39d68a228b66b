//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

type reportData struct {
	o             options
	recs          []Record
	roles         []Role
	others        map[string]int64
	x             expectation
	v             Verdict
	events        int
	posts, non202 int
	drain, total  time.Duration
	dir           string
}

// overlapping counts the faults whose time overlaps another's (an instant
// fault counts when it falls inside another).
func overlapping(recs []Record) int {
	n := 0
	for i, a := range recs {
		for j, b := range recs {
			if i != j && !a.Start.After(b.End) && !b.Start.After(a.End) {
				n++
				break
			}
		}
	}
	return n
}

func printReport(w io.Writer, d reportData) {
	byKind := map[Kind]int{}
	notApplied := 0
	for _, r := range d.recs {
		byKind[r.Kind]++
		if strings.Contains(r.Note, "not applied") {
			notApplied++
		}
	}
	var kinds []string
	for _, k := range AllKinds {
		if byKind[k] > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, byKind[k]))
		}
	}
	fmt.Fprintf(w, "\n== chaos verdict: seed %d, %.1f min of faults, run %s (folder %s)\n", d.o.seed, d.o.minutes, d.total.Round(time.Second), d.dir)
	fmt.Fprintf(w, "faults: %d (%d kinds, %d overlapping another, %d not applied): %s\n", len(d.recs), len(byKind), overlapping(d.recs), notApplied, strings.Join(kinds, ", "))
	if len(d.o.exclude) > 0 {
		fmt.Fprintf(w, "excluded kinds: %v\n", d.o.exclude)
	}
	fmt.Fprintf(w, "fleet: %d events (%d valid accepted, %d bad on Kafka, %d refused by the gateway, %d of them in a 202); %d gateway posts, %d not 202\n",
		d.events, d.x.valid, d.x.bad, d.x.refused, d.x.refused202, d.posts, d.non202)
	v := d.v
	fmt.Fprintf(w, "plays: %d expected; %d at the partner, %d parked (audit), %d rejected by the API (audit), %d MISSING; partner duplicates %d (audit possible extra copies %d); %d unexpected\n",
		v.Expected, v.AtPartner, v.Parked, v.RejectedByAPI, len(v.Missing), v.Duplicates, v.Audit.PossibleExtraCopies, v.Unexpected)
	fmt.Fprintf(w, "audit: delivered %d, pending %d (parked %d), rejected events %d (refused at the gateway %d), delivered twice %d; drain %s\n",
		v.Audit.Delivered, v.Audit.Pending, v.Audit.Parked, v.AuditRejected, v.Audit.EventsAtGateway, v.Audit.DeliveredTwice, d.drain.Round(time.Second))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "role\trestarts\texits not by a fault\tpeak RSS MiB\tlongest stall (partner reachable)\t")
	for _, r := range d.roles {
		own := len(ownExits(r))
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t\n", r.Name, r.Restarts, own, float64(r.PeakRSS)/1024, r.Stall.Round(time.Second))
	}
	var names []string
	for n := range d.others {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(tw, "%s\t\t\t%.0f\t\t\n", n, float64(d.others[n])/1024)
	}
	_ = tw.Flush()
	for _, r := range d.roles {
		if why := ownExitWhy(r, filepath.Join(d.dir, "logs", r.Name+".log")); why != "" {
			fmt.Fprintln(w, why)
		}
	}
	if len(v.Violations) == 0 {
		fmt.Fprintln(w, "RESULT: PASS")
		return
	}
	fmt.Fprintln(w, "RESULT: FAIL")
	for _, s := range v.Violations {
		fmt.Fprintln(w, "  violation:", s)
	}
}

// ownExits are the exits of r that no fault asked for: not by a signal,
// not a clean exit after SIGTERM.
func ownExits(r Role) []string {
	var out []string
	for _, e := range r.Exits {
		if !strings.HasPrefix(e, "signal ") && !strings.HasPrefix(e, "exit 0") {
			out = append(out, e)
		}
	}
	return out
}

// ownExitWhy says, for a role that exited on its own, how its last such
// run ended and what its log said last: the command's own error line
// ("playpipe sink: …", printed as it exits) or else its last ERROR line.
// "" when it never exited on its own.
func ownExitWhy(r Role, logPath string) string {
	own := ownExits(r)
	if len(own) == 0 {
		return ""
	}
	why := "its log has no error line"
	if line := lastErrorLine(logPath); line != "" {
		why = line
	}
	return fmt.Sprintf("  %s: %d exits not by a fault, the first %s, the last %s; last error logged: %s", r.Name, len(own), own[0], own[len(own)-1], why)
}

// lastErrorLine is the last line of the log at path that reports an
// error: the process's exit line ("playpipe <command>: …") before any
// other, else the last level=ERROR line; at most 300 bytes of it.
func lastErrorLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var exitLine, errLine string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "playpipe "):
			exitLine = line
		case strings.Contains(line, "level=ERROR"):
			errLine = line
		}
	}
	line := exitLine
	if line == "" {
		line = errLine
	}
	if len(line) > 300 {
		cut := 300
		for cut > 0 && !utf8.RuneStart(line[cut]) {
			cut-- // not inside a character
		}
		line = line[:cut] + "…"
	}
	return line
}
