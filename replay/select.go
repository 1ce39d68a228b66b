package replay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// quote is a ClickHouse string literal of s.
func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func quoteList(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = quote(s)
	}
	return "(" + strings.Join(q, ", ") + ")"
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// selectReports reads the selected report ids and their records' locations
// from the ledger. A replay selects only reports the live reporter
// delivered (the others are still its job); a redrive only reports
// rejected with 400 and delivered by nobody. Reports this replay id already
// has a final answer for in the ledger are left out (see alreadyDone for
// the ones not in the ledger yet).
func selectReports(ctx context.Context, cfg Config, sel Selection) ([]item, error) {
	db := cfg.Database
	win := func(col string) string {
		var c []string
		if !sel.From.IsZero() {
			c = append(c, col+" >= "+ms(sel.From))
		}
		if !sel.To.IsZero() {
			c = append(c, col+" < "+ms(sel.To))
		}
		if len(c) == 0 {
			return "1"
		}
		return strings.Join(c, " AND ")
	}
	const standby = "(outcome = 'standby' OR served_by = 'standby')"
	var conds []string
	switch sel.Kind {
	case KindReplay:
		conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE outcome = 'delivered' AND replay_id = '')")
		switch sel.By {
		case ByEvent:
			conds = append(conds, win("played_at_ms"))
		case ByDerived:
			conds = append(conds, win("kafka_time_ms"))
		case ByDelivered:
			c := "outcome = 'delivered' AND replay_id = ''"
			if sel.OnlyStandby {
				c = standby
			}
			conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE "+c+" AND "+win("at_ms")+")")
		}
		if sel.OnlyStandby && sel.By != ByDelivered {
			conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE "+standby+")")
		}
	case KindRedrive:
		if sel.Parked {
			// Parked by the live reporter and final for nobody since (a slow
			// retry or an earlier redrive may have delivered or rejected it).
			conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE outcome = 'parked' AND "+win("at_ms")+")",
				"report_id NOT IN (SELECT report_id FROM "+db+".deliveries WHERE outcome IN ('delivered', 'rejected'))")
			break
		}
		c := "outcome = 'rejected' AND http_status = 400 AND " + win("at_ms")
		if len(sel.Messages) > 0 {
			c += " AND message IN " + quoteList(sel.Messages)
		}
		conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE "+c+")",
			"report_id NOT IN (SELECT report_id FROM "+db+".deliveries WHERE outcome = 'delivered')")
	}
	if len(sel.Tracks) > 0 {
		ts := make([]string, len(sel.Tracks))
		for i, t := range sel.Tracks {
			ts[i] = strconv.FormatInt(t, 10)
		}
		conds = append(conds, "track_id IN ("+strings.Join(ts, ", ")+")")
	}
	if len(sel.ReportIDs) > 0 {
		conds = append(conds, "report_id IN "+quoteList(sel.ReportIDs))
	}
	conds = append(conds, "kafka_topic = "+quote(cfg.Kafka.Topics().Reports),
		"report_id NOT IN (SELECT report_id FROM "+db+".deliveries WHERE replay_id = "+quote(cfg.ReplayID)+" AND outcome IN ('delivered', 'rejected'))")
	q := `SELECT report_id, any(event_id), argMin(kafka_partition, kafka_offset), min(kafka_offset), toInt64(min(kafka_time_ms))
FROM ` + db + `.plays WHERE ` + strings.Join(conds, " AND ") + `
GROUP BY report_id HAVING max(below_minimum) = 0 ORDER BY report_id`
	rows, err := cfg.CH.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("replay: select the reports in the ledger: %w", err)
	}
	defer rows.Close()
	var out []item
	for rows.Next() {
		var it item
		if err := rows.Scan(&it.reportID, &it.eventID, &it.partition, &it.offset, &it.timeMS); err != nil {
			return nil, fmt.Errorf("replay: select the reports in the ledger: %w", err)
		}
		out = append(out, it)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("replay: select the reports in the ledger: %w", err)
	}
	if sel.Kind == KindRedrive && sel.Parked && len(out) > 0 {
		if err := markDoubt(ctx, cfg, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// markDoubt marks the parked reports a live post of which may have reached
// the partner (a record of the live reporter in doubt or with a doubt
// cause): the redrive's records of them say in_doubt, so that the audit
// counts the possible copy (docs/reporter.md, "Parking": a report whose
// last post was in doubt stays in doubt).
func markDoubt(ctx context.Context, cfg Config, items []item) error {
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.reportID
	}
	rows, err := cfg.CH.Query(ctx, `SELECT DISTINCT report_id FROM `+cfg.Database+`.deliveries
WHERE replay_id = '' AND (in_doubt = 1 OR doubt_cause != '') AND report_id IN `+quoteList(ids))
	if err != nil {
		return fmt.Errorf("replay: the parked reports in doubt: %w", err)
	}
	defer rows.Close()
	doubt := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return fmt.Errorf("replay: the parked reports in doubt: %w", err)
		}
		doubt[id] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("replay: the parked reports in doubt: %w", err)
	}
	for i := range items {
		items[i].inDoubt = doubt[items[i].reportID]
	}
	return nil
}
