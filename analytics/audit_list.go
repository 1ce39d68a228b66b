package analytics

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ListRow is one record behind a number of the audit.
type ListRow struct {
	ReportID string    `json:"report_id,omitempty"`
	EventID  string    `json:"event_id,omitempty"`
	At       time.Time `json:"at"`               // record time of the play, event or rejection
	Detail   string    `json:"detail,omitempty"` // last outcome, API message, rejection reason, decode error
	// Delivered is the number of distinct `delivered` records of the play.
	Delivered uint64   `json:"delivered,omitempty"`
	TraceIDs  []string `json:"trace_ids,omitempty"` // trace ids of the play's deliveries
	Kafka     string   `json:"kafka,omitempty"`     // topic/partition@offset of an event-level record
}

// ErrUnknownList is returned by List for a metric it does not know.
var ErrUnknownList = errors.New("unknown list")

// listConds are the play-level lists: metric → condition over perReport.
var listConds = map[string]string{
	"derived":                 "1",
	"below-minimum":           "below = 1",
	"reportable":              condReportable,
	"delivered":               condDelivered,
	"rejected-by-api":         condRejected,
	"standby":                 condStandby,
	"standby-delivered":       condStandbyDel,
	"pending":                 condPending,
	"pending-overdue":         condPending, // plus the cutoff
	"parked":                  condParked,
	"delivered-twice":         condTwice,
	"possibly-twice":          condDoubt,
	"extra-copies":            condCopies,
	"below-minimum-delivered": condBelowDel,
}

// eventLists are the record-level lists.
var eventLists = []string{"received", "not-json", "rejected", "malformed"}

// ReplayListPrefix starts the List metric of one replay's plays:
// "replay:<replay id>".
const ReplayListPrefix = "replay:"

// ListNames returns the metrics List accepts, sorted (besides
// ReplayListPrefix+id).
func ListNames() []string {
	out := append([]string(nil), eventLists...)
	for k := range listConds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// List returns the records behind one number of the audit (see ListNames):
// report ids with their trace ids for play-level numbers, event records for
// event-level ones. limit ≤ 0 means no limit.
func (a *Auditor) List(ctx context.Context, o AuditOptions, metric string, limit int) ([]ListRow, error) {
	o, err := a.prepare(ctx, o)
	if err != nil {
		return nil, err
	}
	return a.list(ctx, o, metric, limit)
}

// list is List on the snapshot of o.
func (a *Auditor) list(ctx context.Context, o AuditOptions, metric string, limit int) ([]ListRow, error) {
	lim := ""
	if limit > 0 {
		lim = " LIMIT " + strconv.Itoa(limit)
	}
	q, play, err := a.listQuery(o, metric, lim)
	if err != nil {
		return nil, err
	}
	if _, ok := strings.CutPrefix(metric, ReplayListPrefix); ok {
		metric = "replay"
	} else if _, ok := listConds[metric]; ok {
		return a.listPlays(ctx, o, metric, q, limit)
	}
	out, err := a.listRows(withCheck(ctx, o, "list "+metric), q, play, nil)
	if err != nil {
		return nil, fmt.Errorf("analytics: audit list %s: %w", metric, err)
	}
	return out, nil
}

// listRows appends the rows of the List query q to out (play: the rows
// are plays, else event-level records).
func (a *Auditor) listRows(ctx context.Context, q string, play bool, out []ListRow) ([]ListRow, error) {
	if out == nil {
		out = []ListRow{}
	}
	err := a.query(ctx, q, func(rows driver.Rows) error {
		r, err := scanListRow(rows, play)
		if err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

// listQuery returns the query of a List metric (lim: its LIMIT clause) and
// whether its rows are plays (else event-level records).
func (a *Auditor) listQuery(o AuditOptions, metric, lim string) (q string, play bool, err error) {
	w := window(o)
	if id, ok := strings.CutPrefix(metric, ReplayListPrefix); ok {
		// The plays a replay answered: report id, the replay's last outcome,
		// how many of its answers said delivered.
		return `SELECT report_id, any(event_id), toUInt64(min(at_ms)), argMax(outcome, at_ms),
    toUInt64(uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, outcome = 'delivered')), groupUniqArrayIf(trace_id, trace_id != '')
FROM ` + a.db + `.deliveries
WHERE replay_id = ` + quoteSQL(id) + ` AND report_id IN (SELECT report_id FROM ` + a.db + `.plays WHERE ` + w + `
    AND report_id IN (SELECT report_id FROM ` + a.db + `.deliveries WHERE replay_id = ` + quoteSQL(id) + asOf(o) + `))` + asOf(o) + `
GROUP BY report_id ORDER BY min(at_ms), report_id` + lim, true, nil
	}
	switch metric {
	case "received", "not-json":
		return a.receivedQuery(w, metric, lim), false, nil
	case "rejected":
		// The record's location breaks ties (refusals at the gateway share
		// their source ingest/-1/-1): one order on every server and schema.
		return `SELECT '', event_id, kafka_time_ms, reason, if(src_partition >= 0, src_topic, kafka_topic), if(src_partition >= 0, src_partition, kafka_partition),
    if(src_partition >= 0, src_offset, kafka_offset) FROM ` + a.db + `.rejections
WHERE ` + w + ` AND ` + condRealReject + ` ORDER BY kafka_time_ms, src_topic, src_partition, src_offset, kafka_topic, kafka_partition, kafka_offset LIMIT 1 BY ` + rejectionKey + lim, false, nil
	case "replay":
		// A bare "replay" (without its id) names no list: its empty
		// query fails with an error naming it.
		return "", false, nil
	case "malformed":
		return `SELECT '', '', kafka_time_ms, error, kafka_topic, kafka_partition, kafka_offset FROM ` + a.db + `.malformed
WHERE ` + w + ` ORDER BY kafka_time_ms, kafka_topic, kafka_partition, kafka_offset LIMIT 1 BY kafka_topic_id, kafka_topic, kafka_partition, kafka_offset` + lim, false, nil
	}
	cond, ok := listCond(o, metric)
	if !ok {
		return "", false, fmt.Errorf("analytics: --list %q: %w; accepted: %s, %s<replay id>", metric, ErrUnknownList, strings.Join(ListNames(), ", "), ReplayListPrefix)
	}
	detail := "last_outcome"
	traces := "trace_ids"
	switch metric {
	case "pending", "pending-overdue", "parked":
		detail = lastAnswer
	case "rejected-by-api":
		detail = "reject_message"
	case "delivered-twice", "possibly-twice", "delivered":
		traces = "delivered_trace_ids"
	case "extra-copies":
		// The possible extra copies and their causes, e.g. "2: timeout, crash".
		detail = "concat(toString(" + playCopies + " - 1), ': ', arrayStringConcat(arraySort(if(delivered_n = 0, arrayDistinct(arrayConcat(doubt_causes, replay_doubt_causes)), doubt_causes)), ', '))"
		traces = "delivered_trace_ids"
	}
	return `SELECT report_id, event_id, derived_ms, ` + detail + `, delivered_n, ` + traces + ` FROM ` + a.perReportIn(o, "{range}") + `
WHERE ` + cond + ` ORDER BY derived_ms, report_id` + lim, true, nil
}

// listPickMax bounds the report ids listPick names in the list query of a
// slice; past it the query reads the whole slice.
const listPickMax = 10_000

// listPick is the condition on report ids of the list query of slice s:
// the slice's report ids that the list shows, chosen by the slice's cheap
// per-report query, as a literal set when they are at most listPickMax
// (else the slice's range); "" when there are none.
func (a *Auditor) listPick(ctx context.Context, o AuditOptions, s slice, metric string) (string, error) {
	cond, _ := listCond(o, metric)
	var ids []string
	err := a.query(ctx, `SELECT report_id FROM (`+a.slicePerReport(o, s, fmt.Sprintf("uniqUpToIf(%d)", a.limits.countsUpTo()))+`) AS per_report
WHERE `+cond+` LIMIT `+strconv.Itoa(listPickMax+1), func(rows driver.Rows) error {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		ids = append(ids, quoteSQL(id))
		return nil
	})
	switch {
	case err != nil:
		return "", err
	case len(ids) == 0:
		return "", nil
	case len(ids) > listPickMax:
		return sliceRange(s.lo, s.hi), nil
	}
	return "(" + sliceRange(s.lo, s.hi) + " AND report_id IN (" + strings.Join(ids, ", ") + "))", nil
}

// listCond is the condition of a play-level list over perReport's columns.
func listCond(o AuditOptions, metric string) (string, bool) {
	cond, ok := listConds[metric]
	if ok && metric == "pending-overdue" {
		cond += " AND derived_ms < " + o.overdueCutoff()
	}
	return cond, ok
}

// listPlays runs the play-level list query q ({range}: the report ids
// read) per slice of the window's report ids (planSlices; one slice with
// Limits.Exact), so that no query holds more than one slice's reports,
// and merges the slices' rows in the list's order (record time, report
// id), the first limit of them (limit ≤ 0: all). The report ids of a
// slice are first chosen by the slice's cheap per-report query (listPick;
// the list's condition compares counts with 0 or 1 only, which uniqUpTo
// decides exactly), so that the wide per-report query with trace ids and
// last answers reads only the plays listed.
func (a *Auditor) listPlays(ctx context.Context, o AuditOptions, metric, q string, limit int) ([]ListRow, error) {
	plan := []slice{{lo: 0, hi: stateSlices}}
	if !a.limits.Exact {
		var err error
		if plan, err = a.planSlices(ctx, o); err != nil {
			return nil, fmt.Errorf("analytics: audit list %s: %w", metric, err)
		}
	}
	out := []ListRow{}
	for i, s := range plan {
		name := "list " + metric
		if len(plan) > 1 {
			name += fmt.Sprintf(", slice %d/%d (%s)", i+1, len(plan), s)
		}
		rng, err := a.listPick(withCheck(ctx, o, name+", picking"), o, s, metric)
		if err != nil {
			return nil, fmt.Errorf("analytics: audit list %s: %w", metric, err)
		}
		if rng == "" {
			continue // no play of the slice is listed
		}
		if out, err = a.listRows(withCheck(ctx, o, name), strings.ReplaceAll(q, "{range}", rng), true, out); err != nil {
			return nil, fmt.Errorf("analytics: audit list %s: %w", metric, err)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].At.Equal(out[j].At) {
			return out[i].At.Before(out[j].At)
		}
		return out[i].ReportID < out[j].ReportID
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// lastAnswer is the detail of the pending and parked lists: the play's last
// answer, e.g. "parked (HTTP 500 http_500: internal service error; attempt
// 20)", or "" without one.
const lastAnswer = `if(last_outcome = '', '', concat(last_outcome, ' (HTTP ', toString(last_status),
    if(last_reason = '', '', concat(' ', last_reason)), if(last_message = '', '', concat(': ', last_message)),
    '; attempt ', toString(last_attempt), ')'))`

// receivedQuery is the query of the "received" and "not-json" lists over
// the window condition w.
func (a *Auditor) receivedQuery(w, metric, lim string) string {
	if metric == "received" { // plus the events refused at the ingest gateway (their rejection records)
		// The detail is cast to String: on the current-server schema
		// reason is LowCardinality(String), and the UNION needs one type
		// (docs/audit.md, "Two schema paths").
		// materialize(''): through a cluster's Distributed tables 18.16
		// refuses a constant column in a UNION ALL ("Cannot convert column
		// … non constant in source stream but must be constant in result").
		return `SELECT * FROM (SELECT materialize(''), event_id, kafka_time_ms AS t, if(parsed = 1, '', 'not JSON'), kafka_topic AS kt, kafka_partition AS kp, kafka_offset AS ko FROM ` + a.db + `.events
WHERE ` + w + ` LIMIT 1 BY kafka_topic_id, kafka_topic, kafka_partition, kafka_offset
UNION ALL SELECT materialize(''), event_id, kafka_time_ms AS t, CAST(concat('refused at the ingest gateway: ', reason) AS String), kafka_topic AS kt, kafka_partition AS kp, kafka_offset AS ko FROM ` + a.db + `.rejections
WHERE ` + w + ` AND src_partition < 0 LIMIT 1 BY kafka_topic_id, kafka_topic, kafka_partition, kafka_offset)
ORDER BY t, kt, kp, ko` + lim
	}
	return `SELECT '', event_id, kafka_time_ms, if(parsed = 1, '', 'not JSON'), kafka_topic, kafka_partition, kafka_offset FROM ` + a.db + `.events
WHERE ` + w + ` AND parsed = 0 ORDER BY kafka_time_ms, kafka_topic, kafka_partition, kafka_offset LIMIT 1 BY kafka_topic_id, kafka_topic, kafka_partition, kafka_offset` + lim
}

// scanListRow reads one row of a List query: a play's (play) or an
// event-level record's.
func scanListRow(rows driver.Rows, play bool) (ListRow, error) {
	var r ListRow
	var ms uint64
	if play {
		if err := rows.Scan(&r.ReportID, &r.EventID, &ms, &r.Detail, &r.Delivered, &r.TraceIDs); err != nil {
			return r, err
		}
		sort.Strings(r.TraceIDs)
	} else {
		var topic string
		var part int32
		var off int64
		if err := rows.Scan(&r.ReportID, &r.EventID, &ms, &r.Detail, &topic, &part, &off); err != nil {
			return r, err
		}
		r.Kafka = topic + "/" + strconv.Itoa(int(part)) + "@" + strconv.FormatInt(off, 10)
	}
	r.At = time.UnixMilli(int64(ms)).UTC()
	return r, nil
}
