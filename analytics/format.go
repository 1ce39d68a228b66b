package analytics

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Output formats of WriteAudit and WriteList.
const (
	FormatTable = "table"
	FormatCSV   = "csv"
	FormatJSON  = "json"
)

// CheckFormat validates a --format value.
func CheckFormat(f string) error {
	switch f {
	case FormatTable, FormatCSV, FormatJSON:
		return nil
	}
	return fmt.Errorf("--format %q: accepted: table, csv, json", f)
}

// line is one number of the report with the list behind it.
type line struct {
	section, metric, key string
	n                    uint64
	list                 string
	indent               int
	// label, when set, is the table's text for the line instead of the key
	// (or the metric): a replay's rows say which figure they hold.
	label string
}

// tableLabel is the line's text in the table format: its label, else its
// key, else its metric.
func (l line) tableLabel() string {
	switch {
	case l.label != "":
		return l.label
	case l.key != "":
		return l.key
	}
	return l.metric
}

func (r *Audit) lines() []line {
	ls := []line{
		{section: "events", metric: "received", n: r.EventsReceived, list: "received"},
		{section: "events", metric: "not JSON", n: r.EventsNotJSON, list: "not-json", indent: 1},
		{section: "events", metric: "refused at the ingest gateway (also rejected)", n: r.EventsAtGateway, indent: 1},
		{section: "events", metric: "rejected", n: r.EventsRejected, list: "rejected"},
	}
	for _, c := range r.RejectedByReason {
		ls = append(ls, line{section: "events", metric: "rejected by reason", key: c.Key, n: c.N, indent: 1})
	}
	ls = append(ls,
		line{section: "events", metric: "valid, without plays", n: r.EventsWithoutPlays},
		line{section: "plays", metric: "derived", n: r.PlaysDerived, list: "derived"},
		line{section: "plays", metric: "below minimum (not reported)", n: r.PlaysBelowMinimum, list: "below-minimum", indent: 1},
		line{section: "plays", metric: "reportable", n: r.PlaysReportable, list: "reportable", indent: 1},
		line{section: "plays", metric: "delivered", n: r.Delivered, list: "delivered"},
		line{section: "plays", metric: "delivered only by a sandbox target (NOT real deliveries)", n: r.DeliveredToSandbox, indent: 1},
		line{section: "plays", metric: "delivered to a real partner", n: r.DeliveredReal, indent: 1},
		line{section: "plays", metric: "rejected by the API", n: r.RejectedByAPI, list: "rejected-by-api"},
	)
	for _, c := range r.RejectedByAPIByMessage {
		ls = append(ls, line{section: "plays", metric: "rejected by the API by message", key: c.Key, n: c.N, indent: 1})
	}
	ls = append(ls,
		line{section: "plays", metric: "answered by standby", n: r.StandbyAnswered, list: "standby"},
		line{section: "plays", metric: "answered by standby, later delivered", n: r.StandbyThenDelivered, list: "standby-delivered", indent: 1},
		line{section: "plays", metric: "pending (no final outcome)", n: r.Pending, list: "pending"},
		line{section: "plays", metric: "pending past " + r.PendingThreshold, n: r.PendingOverdue, list: "pending-overdue", indent: 1},
		line{section: "plays", metric: "parked by the reporter (retried slowly, not delivered)", n: r.Parked, list: "parked", indent: 1},
		line{section: "plays", metric: "delivered more than once", n: r.DeliveredTwice, list: "delivered-twice"},
		line{section: "plays", metric: "possibly delivered twice (an earlier post's fate unknown)", n: r.PossiblyTwice, list: "possibly-twice"},
		line{section: "plays", metric: "possible extra copies at the partner (bound)", n: r.PossibleExtraCopies, list: "extra-copies"},
	)
	for _, c := range r.DoubtfulPostsByCause {
		ls = append(ls, line{section: "plays", metric: "posts whose fate is unknown, by cause", key: c.Key, n: c.N, indent: 1})
	}
	ls = append(ls,
		line{section: "plays", metric: "below minimum but delivered", n: r.BelowMinimumDelivered, list: "below-minimum-delivered"},
		line{section: "plays", metric: "play records (incl. re-derived)", n: r.PlayRecords},
	)
	for _, p := range r.ByPartner {
		ls = append(ls, line{section: "partner targets", metric: "plays delivered by partner target", key: partnerLabel(p), n: p.Delivered})
	}
	for _, rp := range r.Replays {
		// The key (CSV) names the replay on every row; the table names it
		// once, on the plays row, and each indented row by its figure.
		key := rp.ID + " (" + rp.Reason + ")"
		ls = append(ls,
			line{section: "replays", metric: "plays re-sent by replay", key: key, n: rp.Plays, list: ReplayListPrefix + rp.ID, label: key + ": plays re-sent"},
			line{section: "replays", metric: "delivered by replay", key: key, n: rp.Delivered, list: ReplayListPrefix + rp.ID, indent: 1, label: "delivered"},
			line{section: "replays", metric: "rejected by the API during replay", key: key, n: rp.Rejected, indent: 1, label: "rejected by the API"},
			line{section: "replays", metric: "delivered more than once by the same replay", key: key, n: rp.DeliveredTwice, indent: 1, label: "delivered more than once by this replay"})
	}
	for _, c := range r.Malformed {
		ls = append(ls, line{section: "malformed", metric: "records not decodable", key: c.Key, n: c.N, list: "malformed"})
	}
	return ls
}

// WriteAudit writes the audit in the given format.
func WriteAudit(w io.Writer, r *Audit, format string) error {
	switch format {
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			*Audit
			Problems []string `json:"problems"`
		}{r, append([]string{}, r.Problems()...)})
	case FormatCSV:
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"section", "metric", "key", "value", "list"})
		for _, l := range r.lines() {
			list := ""
			if l.list != "" {
				list = "--list " + l.list
			}
			_ = cw.Write([]string{l.section, l.metric, l.key, strconv.FormatUint(l.n, 10), list})
		}
		d := r.Delay
		for _, q := range []struct {
			k string
			v float64
		}{{"plays", float64(d.Plays)}, {"p50_ms", d.P50MS}, {"p90_ms", d.P90MS}, {"p99_ms", d.P99MS}, {"max_ms", d.MaxMS}} {
			_ = cw.Write([]string{"delay", "event to delivered", q.k, strconv.FormatFloat(q.v, 'f', -1, 64), ""})
		}
		for _, row := range r.generationRows() {
			_ = cw.Write(row)
		}
		cw.Flush()
		return cw.Error()
	case FormatTable:
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "playpipe audit  %s → %s  (record times, UTC; generated %s; ledger as of %s)\n",
			r.From.Format(time.RFC3339), r.To.Format(time.RFC3339), r.GeneratedAt.Format(time.RFC3339), r.LedgerAsOf.Format(time.RFC3339))
		section := ""
		for _, l := range r.lines() {
			if l.section != section {
				section = l.section
				fmt.Fprintf(tw, "%s\t\t\n", strings.ToUpper(section))
			}
			label := l.tableLabel()
			list := ""
			if l.list != "" {
				list = "--list " + l.list
			}
			fmt.Fprintf(tw, "%s%s\t%d\t%s\n", strings.Repeat("  ", l.indent+1), label, l.n, list)
		}
		d := r.Delay
		fmt.Fprintf(tw, "DELAY event → first delivered (%d plays)\t\t\n", d.Plays)
		if d.Plays > 0 {
			fmt.Fprintf(tw, "  p50 %s  p90 %s  p99 %s  max %s\t\t\n", ms(d.P50MS), ms(d.P90MS), ms(d.P99MS), ms(d.MaxMS))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if r.DeliveredToSandbox > 0 {
			fmt.Fprintf(w, "NOTE: %d of the %d delivered plays were answered only by a sandbox target: nothing reached a real partner for them\n", r.DeliveredToSandbox, r.Delivered)
		}
		for _, n := range r.generationNotes() {
			fmt.Fprintf(w, "NOTE: %s\n", n)
		}
		if ps := r.Problems(); len(ps) > 0 {
			fmt.Fprintf(w, "RESULT: FAIL: %s\n", strings.Join(ps, "; "))
		} else if r.Pending > 0 {
			fmt.Fprintf(w, "RESULT: OK (%d plays pending, none past %s; none delivered more than once)\n", r.Pending, r.PendingThreshold)
		} else {
			fmt.Fprintf(w, "RESULT: OK: every reportable play has a final outcome; none delivered more than once\n")
		}
		return nil
	}
	return CheckFormat(format)
}

// partnerLabel names a partner target in the report: its URL, marked when it
// is a sandbox or when the rows predate the partner column.
func partnerLabel(p PartnerCount) string {
	switch {
	case p.Partner == "":
		return "(not recorded: rows written before schema version 2)"
	case p.Sandbox:
		return p.Partner + " [SANDBOX: not a real delivery]"
	}
	return p.Partner
}

func ms(v float64) string {
	return (time.Duration(v * float64(time.Millisecond))).Round(time.Millisecond).String()
}

// WriteList writes the rows of a --list in the given format.
func WriteList(w io.Writer, rows []ListRow, format string) error {
	switch format {
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	case FormatCSV:
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"report_id", "event_id", "at", "detail", "delivered", "trace_ids", "kafka"})
		for _, r := range rows {
			_ = cw.Write([]string{r.ReportID, r.EventID, r.At.Format(time.RFC3339Nano), r.Detail, strconv.FormatUint(r.Delivered, 10), strings.Join(r.TraceIDs, " "), r.Kafka})
		}
		cw.Flush()
		return cw.Error()
	case FormatTable:
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REPORT ID\tEVENT ID\tAT\tDETAIL\tDELIVERED\tTRACE IDS\tKAFKA")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", dash(r.ReportID), dash(r.EventID), r.At.Format("2006-01-02T15:04:05.000Z"),
				dash(r.Detail), r.Delivered, dash(strings.Join(r.TraceIDs, ",")), dash(r.Kafka))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "%d rows\n", len(rows))
		return nil
	}
	return CheckFormat(format)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
