package analytics

import (
	"context"
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// The HTML audit report (`playpipe audit --html FILE`): one self-contained
// page — inline CSS and SVG, no script, no network — with the same numbers as
// the table (the same Audit, so the same RESULT and exit status), charts of
// deliveries and pending over time, rejections by reason, deliveries by
// partner target (with the table's sandbox note), the delay percentiles and
// the standby episodes, and the ids behind every number
// (anchors #list-<name>, at most the list limit rows each).

// SeriesPoint is one time bucket of the window's plays.
type SeriesPoint struct {
	At        time.Time `json:"at"`        // start of the bucket
	Derived   uint64    `json:"derived"`   // reportable plays recorded in the bucket
	Delivered uint64    `json:"delivered"` // first `delivered` answers in the bucket
	Rejected  uint64    `json:"rejected"`  // first `rejected` answers (never delivered) in the bucket
	Pending   uint64    `json:"pending"`   // reportable − final at the end of the bucket
}

// StandbyEpisode is a run of `standby` answers with no gap longer than
// EpisodeGap between two of them.
type StandbyEpisode struct {
	From, To time.Time
	Answers  uint64 // standby answers in the episode
	Reports  int    // distinct reports answered
}

// EpisodeGap separates two standby episodes.
const EpisodeGap = 10 * time.Second

// HTMLAudit is everything the page shows.
type HTMLAudit struct {
	Audit    *Audit
	Bucket   time.Duration
	Series   []SeriesPoint
	Episodes []StandbyEpisode
	Lists    []HTMLList
	Limit    int
}

// HTMLList is the rows behind one number.
type HTMLList struct {
	Name, Label string
	N           uint64 // the number in the report
	Rows        []ListRow
	Play        bool // play-level rows (report ids) or event-level ones
}

// HTML gathers the page of report r (from Audit with the same options): its
// series, standby episodes and lists, read from the same ledger snapshot as r.
// limit bounds each list (≤ 0: no limit).
func (a *Auditor) HTML(ctx context.Context, o AuditOptions, r *Audit, limit int) (*HTMLAudit, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	o.asOf = max(r.LedgerAsOf.Unix(), 1)
	h := &HTMLAudit{Audit: r, Limit: limit}
	if err := a.series(ctx, o, h); err != nil {
		return nil, err
	}
	if err := a.episodes(ctx, o, h); err != nil {
		return nil, err
	}
	for _, l := range r.lines() {
		if l.list == "" || l.n == 0 || hasList(h.Lists, l.list) {
			continue
		}
		rows, err := a.list(ctx, o, l.list, limit)
		if err != nil {
			return nil, err
		}
		_, play := listConds[l.list]
		h.Lists = append(h.Lists, HTMLList{Name: l.list, Label: l.metric, N: l.n, Rows: rows, Play: play})
	}
	return h, nil
}

func hasList(ls []HTMLList, name string) bool {
	for _, l := range ls {
		if l.Name == name {
			return true
		}
	}
	return false
}

// finals is one row per reportable play of the window: when it was recorded
// and when it got its first final answer (0: none). Both joined sides are
// one row per report id and aliased: the same on 18.16 and current releases
// (see perReport).
func (a *Auditor) finals(o AuditOptions) string {
	w := window(o)
	return `(SELECT derived_ms, delivered_n, delivered_ms, rejected_ms FROM
    (SELECT report_id, max(below_minimum) AS below, min(kafka_time_ms) AS derived_ms FROM ` + a.db + `.plays WHERE ` + w + ` GROUP BY report_id) AS per_play
    ALL LEFT JOIN
    (SELECT report_id, countIf(outcome = 'delivered') AS delivered_n, minIf(at_ms, outcome = 'delivered') AS delivered_ms,
        minIf(at_ms, outcome = 'rejected') AS rejected_ms
     FROM ` + a.db + `.deliveries WHERE report_id IN (SELECT report_id FROM ` + a.db + `.plays WHERE ` + w + `)` + asOf(o) + `
     GROUP BY report_id) AS per_play_finals
    USING report_id WHERE below = 0)`
}

// niceSteps are the bucket sizes of the time charts.
var niceSteps = []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 5 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour}

func (a *Auditor) series(ctx context.Context, o AuditOptions, h *HTMLAudit) error {
	f := a.finals(o)
	var lo, hi int64
	var n uint64
	if err := a.row(ctx, `SELECT count(), toInt64(min(derived_ms)), toInt64(max(greatest(toInt64(derived_ms), if(delivered_n > 0, delivered_ms, rejected_ms)))) FROM `+f,
		&n, &lo, &hi); err != nil {
		return fmt.Errorf("analytics: audit series: %w", err)
	}
	if n == 0 {
		return nil
	}
	span := time.Duration(hi-lo) * time.Millisecond
	h.Bucket = niceSteps[len(niceSteps)-1]
	for _, s := range niceSteps {
		if span/s <= 60 {
			h.Bucket = s
			break
		}
	}
	b := strconv.FormatInt(h.Bucket.Milliseconds(), 10)
	rows, err := a.conn.Query(ctx, `SELECT b, sum(d), sum(dl), sum(rj) FROM (
    SELECT intDiv(toInt64(derived_ms), `+b+`) * `+b+` AS b, 1 AS d, 0 AS dl, 0 AS rj FROM `+f+`
    UNION ALL SELECT intDiv(delivered_ms, `+b+`) * `+b+` AS b, 0 AS d, 1 AS dl, 0 AS rj FROM `+f+` WHERE delivered_n > 0
    UNION ALL SELECT intDiv(rejected_ms, `+b+`) * `+b+` AS b, 0 AS d, 0 AS dl, 1 AS rj FROM `+f+` WHERE delivered_n = 0 AND rejected_ms > 0
) GROUP BY b ORDER BY b`)
	if err != nil {
		return fmt.Errorf("analytics: audit series: %w", err)
	}
	defer rows.Close()
	var derived, final uint64
	for rows.Next() {
		var at int64
		var p SeriesPoint
		if err := rows.Scan(&at, &p.Derived, &p.Delivered, &p.Rejected); err != nil {
			return fmt.Errorf("analytics: audit series: %w", err)
		}
		derived += p.Derived
		final += p.Delivered + p.Rejected
		if derived > final {
			p.Pending = derived - final
		}
		p.At = time.UnixMilli(at).UTC()
		h.Series = append(h.Series, p)
	}
	return rows.Err()
}

func (a *Auditor) episodes(ctx context.Context, o AuditOptions, h *HTMLAudit) error {
	rows, err := a.conn.Query(ctx, `SELECT at_ms, report_id FROM `+a.db+`.deliveries
WHERE outcome = 'standby' AND report_id IN (SELECT report_id FROM `+a.db+`.plays WHERE `+window(o)+`)`+asOf(o)+`
ORDER BY at_ms LIMIT 1 BY kafka_topic_id, kafka_topic, kafka_partition, kafka_offset LIMIT 1000000`)
	if err != nil {
		return fmt.Errorf("analytics: audit standby episodes: %w", err)
	}
	defer rows.Close()
	var cur *StandbyEpisode
	var seen map[string]bool
	for rows.Next() {
		var ms int64
		var id string
		if err := rows.Scan(&ms, &id); err != nil {
			return fmt.Errorf("analytics: audit standby episodes: %w", err)
		}
		at := time.UnixMilli(ms).UTC()
		if cur == nil || at.Sub(cur.To) > EpisodeGap {
			h.Episodes = append(h.Episodes, StandbyEpisode{From: at, To: at})
			cur = &h.Episodes[len(h.Episodes)-1]
			seen = map[string]bool{}
		}
		cur.To = at
		cur.Answers++
		if !seen[id] {
			seen[id] = true
			cur.Reports++
		}
	}
	return rows.Err()
}

// WriteHTML writes the page.
func WriteHTML(w io.Writer, h *HTMLAudit) error {
	r := h.Audit
	result, ok := "OK: every reportable play has a final outcome; none delivered more than once", true
	if ps := r.Problems(); len(ps) > 0 {
		result, ok = "FAIL: "+strings.Join(ps, "; "), false
	} else if r.Pending > 0 {
		result = fmt.Sprintf("OK (%d plays pending, none past %s; none delivered more than once)", r.Pending, r.PendingThreshold)
	}
	type row struct {
		Section, Label, List string
		N                    uint64
		Indent               int
		Linked               bool
	}
	var rows []row
	for _, l := range r.lines() {
		rows = append(rows, row{Section: l.section, Label: l.tableLabel(), List: l.list, N: l.n, Indent: l.indent, Linked: hasList(h.Lists, l.list)})
	}
	var rejects []Count
	rejects = append(rejects, r.RejectedByReason...)
	for _, c := range r.RejectedByAPIByMessage {
		rejects = append(rejects, Count{Key: "API: " + c.Key, N: c.N})
	}
	// Per partner target: the plays each one answered `delivered`.
	partners := make([]Count, 0, len(r.ByPartner))
	for _, p := range r.ByPartner {
		label := p.Partner
		switch {
		case p.Partner == "":
			label = "(not recorded)"
		case p.Sandbox:
			label += " (sandbox)"
		}
		partners = append(partners, Count{Key: label, N: p.Delivered})
	}
	return htmlTmpl.Execute(w, map[string]any{
		"R": r, "H": h, "Rows": rows, "Result": result, "OK": ok, "GenerationNotes": r.generationNotes(),
		"Timeline":   timelineSVG(h),
		"Rejects":    barsSVG(rejects, "rejections"),
		"Partners":   barsSVG(partners, "deliveries"),
		"Delay":      barsSVG(delayBars(r.Delay), "delay"),
		"Standby":    episodesSVG(h),
		"BucketText": h.Bucket.String(),
		"DelayText":  fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s", ms(r.Delay.P50MS), ms(r.Delay.P90MS), ms(r.Delay.P99MS), ms(r.Delay.MaxMS)),
	})
}

func delayBars(d Delay) []Count {
	if d.Plays == 0 {
		return nil
	}
	return []Count{{"p50 " + ms(d.P50MS), uint64(d.P50MS)}, {"p90 " + ms(d.P90MS), uint64(d.P90MS)},
		{"p99 " + ms(d.P99MS), uint64(d.P99MS)}, {"max " + ms(d.MaxMS), uint64(d.MaxMS)}}
}

const chartW, chartH, padL, padB, padT = 860.0, 240.0, 64.0, 34.0, 16.0

// timelineSVG: bars of deliveries per bucket, the line of pending plays.
func timelineSVG(h *HTMLAudit) template.HTML {
	if len(h.Series) == 0 {
		return `<p class="empty">No reportable plays in the window.</p>`
	}
	var top uint64 = 1
	for _, p := range h.Series {
		top = max(top, p.Delivered, p.Pending, p.Derived)
	}
	first := h.Series[0].At
	n := float64(h.Series[len(h.Series)-1].At.Sub(first)/h.Bucket) + 1
	bw := (chartW - padL - 8) / n
	y := func(v uint64) float64 { return padT + (chartH-padT-padB)*(1-float64(v)/float64(top)) }
	x := func(t time.Time) float64 { return padL + float64(t.Sub(first)/h.Bucket)*bw }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg role="img" aria-label="deliveries and pending over time" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f">`, chartW, chartH, chartW, chartH)
	axes(&b, top)
	for _, p := range h.Series {
		if p.Delivered > 0 {
			fmt.Fprintf(&b, `<rect class="del" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d delivered</title></rect>`,
				x(p.At)+bw*0.1, y(p.Delivered), bw*0.8, chartH-padB-y(p.Delivered), p.At.Format("15:04:05"), p.Delivered)
		}
	}
	var pts []string
	for _, p := range h.Series {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.At)+bw/2, y(p.Pending)))
	}
	fmt.Fprintf(&b, `<polyline class="pend" points="%s"/>`, strings.Join(pts, " "))
	for _, p := range h.Series {
		fmt.Fprintf(&b, `<circle class="pend" cx="%.1f" cy="%.1f" r="2.5"><title>%s: %d pending</title></circle>`, x(p.At)+bw/2, y(p.Pending), p.At.Format("15:04:05"), p.Pending)
	}
	for _, e := range h.Episodes {
		x0, x1 := x(e.From.Truncate(h.Bucket)), x(e.To.Truncate(h.Bucket))+bw
		fmt.Fprintf(&b, `<rect class="sb" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>standby %s–%s</title></rect>`, x0, padT, x1-x0, chartH-padT-padB, e.From.Format("15:04:05"), e.To.Format("15:04:05"))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text><text x="%.0f" y="%.0f" text-anchor="end">%s (UTC, %s per bar)</text>`,
		padL, chartH-10, first.Format("2006-01-02 15:04:05"), chartW-8, chartH-10, h.Series[len(h.Series)-1].At.Format("15:04:05"), h.Bucket)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func axes(b *strings.Builder, top uint64) {
	for i := 0; i <= 4; i++ {
		v := uint64(math.Round(float64(top) * float64(i) / 4))
		yy := padT + (chartH-padT-padB)*(1-float64(i)/4)
		fmt.Fprintf(b, `<line class="grid" x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f"/><text x="%.0f" y="%.1f" text-anchor="end">%d</text>`,
			padL, chartW-8, yy, yy, padL-6, yy+4, v)
	}
}

// barsSVG is a horizontal bar chart of counts.
func barsSVG(cs []Count, what string) template.HTML {
	if len(cs) == 0 {
		return template.HTML(`<p class="empty">No ` + template.HTMLEscapeString(what) + ` in the window.</p>`)
	}
	var top uint64 = 1
	for _, c := range cs {
		top = max(top, c.N)
	}
	const rowH, labelW, w = 24.0, 280.0, 860.0
	h := rowH*float64(len(cs)) + 8
	var b strings.Builder
	fmt.Fprintf(&b, `<svg role="img" aria-label="%s" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f">`, template.HTMLEscapeString(what), w, h, w, h)
	for i, c := range cs {
		y := 4 + rowH*float64(i)
		bw := (w - labelW - 80) * float64(c.N) / float64(top)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text><rect class="bar" x="%.0f" y="%.1f" width="%.1f" height="%.1f"/><text x="%.1f" y="%.1f">%d</text>`,
			labelW-8, y+16, template.HTMLEscapeString(c.Key), labelW, y+3, max(bw, 1), rowH-6, labelW+bw+6, y+16, c.N)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func episodesSVG(h *HTMLAudit) template.HTML {
	if len(h.Episodes) == 0 {
		return `<p class="empty">No standby answers in the window.</p>`
	}
	cs := make([]Count, len(h.Episodes))
	for i, e := range h.Episodes {
		cs[i] = Count{Key: fmt.Sprintf("%s → %s (%s)", e.From.Format("2006-01-02 15:04:05"), e.To.Format("15:04:05"), e.To.Sub(e.From).Round(time.Millisecond)), N: e.Answers}
	}
	return barsSVG(cs, "standby answers per episode")
}

var htmlTmpl = template.Must(template.New("audit").Funcs(template.FuncMap{
	"indent":     func(n int) template.CSS { return template.CSS(fmt.Sprintf("padding-left:%.1fem", 0.5+1.2*float64(n))) },
	"ts":         func(t time.Time) string { return t.Format("2006-01-02 15:04:05.000") },
	"rfc":        func(t time.Time) string { return t.Format(time.RFC3339) },
	"join":       strings.Join,
	"more":       func(l HTMLList) bool { return uint64(len(l.Rows)) < l.N },
	"episodeGap": func(*HTMLAudit) string { return EpisodeGap.String() },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>playpipe audit {{rfc .R.From}} → {{rfc .R.To}}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2530;margin:24px auto;max-width:920px;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dde3;padding-bottom:4px}
.meta{color:#5a6573;margin:0 0 12px}.result{padding:10px 14px;border-radius:6px;font-weight:600;margin:12px 0}
.note{background:#fff6e0;color:#7a4b00;border:1px solid #f0d48a}.ok{background:#e5f5ea;color:#17622f;border:1px solid #a8dbb7}.fail{background:#fde8e8;color:#8a1c1c;border:1px solid #f0b0b0}
table{border-collapse:collapse;width:100%}td,th{padding:3px 8px;border-bottom:1px solid #eef0f3;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums;width:7em}th.sec{background:#f3f5f8;text-transform:uppercase;font-size:12px;letter-spacing:.05em}
a{color:#1f5fbf;text-decoration:none}a:hover{text-decoration:underline}
svg{display:block;max-width:100%;height:auto;font-size:11px;fill:#3b4552}
.grid{stroke:#e3e7ec}.del{fill:#4c8ee8}.pend{stroke:#e07a10;fill:#e07a10;stroke-width:2;fill-opacity:1}polyline.pend{fill:none}
.sb{fill:#9b59b6;fill-opacity:.14}.bar{fill:#6c8fb8}.legend span{display:inline-block;margin-right:16px}
.sw{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px}
.empty{color:#7a8592;font-style:italic}.ids td{font:12px ui-monospace,Menlo,Consolas,monospace}details{margin:6px 0}summary{cursor:pointer}
</style></head><body>
<h1>playpipe audit</h1>
<p class="meta">Window {{rfc .R.From}} → {{rfc .R.To}} (record times, UTC) · generated {{rfc .R.GeneratedAt}} · ledger as of {{rfc .R.LedgerAsOf}} · pending threshold {{.R.PendingThreshold}}</p>
{{if .R.DeliveredToSandbox}}<div class="result note" id="sandbox-note">NOTE: {{.R.DeliveredToSandbox}} of the {{.R.Delivered}} delivered plays were answered only by a sandbox target: nothing reached a real partner for them</div>
{{end}}{{range .GenerationNotes}}<div class="result note">NOTE: {{.}}</div>
{{end}}<div class="result {{if .OK}}ok{{else}}fail{{end}}" id="result">RESULT: {{.Result}}</div>

<h2 id="numbers">Numbers</h2>
<table>{{$sec := ""}}{{range .Rows}}{{if ne .Section $sec}}{{$sec = .Section}}<tr><th class="sec" colspan="3">{{.Section}}</th></tr>{{end}}
<tr><td style="{{indent .Indent}}">{{.Label}}</td><td class="n">{{if .Linked}}<a href="#list-{{.List}}">{{.N}}</a>{{else}}{{.N}}{{end}}</td><td>{{if .List}}<code>--list {{.List}}</code>{{end}}</td></tr>{{end}}
<tr><th class="sec" colspan="3">delay event → first delivered ({{.R.Delay.Plays}} plays)</th></tr>
{{if .R.Delay.Plays}}<tr><td colspan="3" style="padding-left:1.7em">{{.DelayText}}</td></tr>{{end}}
</table>

<h2 id="timeline">Deliveries and pending over time</h2>
<p class="legend"><span><i class="sw" style="background:#4c8ee8"></i>delivered per {{.BucketText}}</span><span><i class="sw" style="background:#e07a10"></i>pending (reportable − final) at the end of each {{.BucketText}}</span><span><i class="sw" style="background:#9b59b6;opacity:.3"></i>standby episode</span></p>
{{.Timeline}}

<h2 id="rejects">Rejections by reason</h2>
{{.Rejects}}

<h2 id="partners">Deliveries by partner target</h2>
<p>Plays each partner base URL answered <code>delivered</code> (a sandbox target's answers are not real deliveries: {{.R.DeliveredToSandbox}} plays were delivered only to one, {{.R.DeliveredReal}} to a real partner).</p>
{{.Partners}}

<h2 id="delay">Delay percentiles (event → first delivered)</h2>
{{.Delay}}

<h2 id="standby">Standby episodes</h2>
<p>Runs of <code>standby</code> answers no more than {{.H | episodeGap}} apart; every report standby answered is replayed (answered by standby: {{.R.StandbyAnswered}}, of which later delivered: {{.R.StandbyThenDelivered}}).</p>
{{.Standby}}

<h2 id="lists">The ids behind the numbers</h2>
{{if not .H.Lists}}<p class="empty">No lists: every number is 0.</p>{{end}}
{{range .H.Lists}}<details id="list-{{.Name}}"{{if or (eq .Name "pending-overdue") (eq .Name "parked") (eq .Name "delivered-twice") (eq .Name "possibly-twice") (eq .Name "below-minimum-delivered") (eq .Name "rejected-by-api")}} open{{end}}>
<summary><b>{{.Label}}</b> — {{.N}}{{if more .}} (first {{len .Rows}}; all: <code>playpipe audit --list {{.Name}} --limit 0</code>){{end}}</summary>
<table class="ids">{{if .Play}}<tr><th>report id</th><th>event id</th><th>recorded</th><th>detail</th><th>delivered</th><th>trace ids</th></tr>
{{range .Rows}}<tr><td>{{.ReportID}}</td><td>{{.EventID}}</td><td>{{ts .At}}</td><td>{{.Detail}}</td><td>{{.Delivered}}</td><td>{{join .TraceIDs " "}}</td></tr>
{{end}}{{else}}<tr><th>event id</th><th>recorded</th><th>detail</th><th>kafka</th></tr>
{{range .Rows}}<tr><td>{{.EventID}}</td><td>{{ts .At}}</td><td>{{.Detail}}</td><td>{{.Kafka}}</td></tr>
{{end}}{{end}}</table></details>
{{end}}
</body></html>
`))
