package analytics

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// PartnerCount is what one partner target answered for the plays of an
// audit's window. Partner is the base URL the reporter posted to (the
// deliveries' partner column); "" for rows written before the column
// existed (schema version 2).
type PartnerCount struct {
	Partner string `json:"partner"`
	// Sandbox marks a sandbox target (see IsSandboxTarget): its answers are
	// never real deliveries.
	Sandbox bool `json:"sandbox"`
	// Delivered is the number of distinct plays it answered `delivered`.
	Delivered uint64 `json:"delivered"`
	// Answers is the number of distinct delivery records from it (any outcome).
	Answers uint64 `json:"answers"`
}

// IsSandboxTarget reports whether a partner base URL is a sandbox: its host
// is a loopback address (127.0.0.0/8, ::1) or localhost — where the
// built-in sandbox (--sandbox, the demo) always listens, and where no real
// partner API is — or it is one of extra (AuditOptions.SandboxTargets, for a
// sandbox on another host such as docker compose's http://sandbox:8088),
// compared without a trailing slash.
func IsSandboxTarget(partner string, extra []string) bool {
	if partner == "" {
		return false
	}
	p := strings.TrimRight(partner, "/")
	for _, e := range extra {
		if strings.TrimRight(e, "/") == p {
			return true
		}
	}
	u, err := url.Parse(partner)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// partners fills r.ByPartner and r.DeliveredToSandbox for the plays of the
// window: per partner target, the distinct plays it answered `delivered` and
// its distinct answers; and the reportable plays whose every `delivered`
// answer came from a sandbox target (delivered to nobody real). Like every
// number of an audit, it reads the audit's snapshot (o.asOf).
func (a *Auditor) partners(ctx context.Context, o AuditOptions, r *Audit) error {
	w := window(o)
	r.ByPartner = []PartnerCount{}
	var sandboxes []string
	err := a.query(ctx, `SELECT partner, uniqExactIf(report_id, outcome = 'delivered'), uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset)
FROM `+a.db+`.deliveries
WHERE report_id IN (SELECT report_id FROM `+a.db+`.plays WHERE `+w+`)`+asOf(o)+`
GROUP BY partner ORDER BY partner`, func(rows driver.Rows) error {
		var pc PartnerCount
		if err := rows.Scan(&pc.Partner, &pc.Delivered, &pc.Answers); err != nil {
			return err
		}
		pc.Sandbox = IsSandboxTarget(pc.Partner, o.SandboxTargets)
		if pc.Sandbox {
			sandboxes = append(sandboxes, quoteSQL(pc.Partner))
		}
		r.ByPartner = append(r.ByPartner, pc)
		return nil
	})
	if err != nil {
		return fmt.Errorf("analytics: audit partners: %w", err)
	}
	r.DeliveredToSandbox = 0
	if len(sandboxes) > 0 {
		in := "(" + strings.Join(sandboxes, ", ") + ")"
		if err := a.row(ctx, `SELECT count() FROM
    (SELECT report_id, max(below_minimum) AS below FROM `+a.db+`.plays WHERE `+w+` GROUP BY report_id) AS per_play
ALL INNER JOIN
    (SELECT report_id,
        countIf(outcome = 'delivered' AND partner IN `+in+`) AS sandbox_n,
        countIf(outcome = 'delivered' AND partner NOT IN `+in+`) AS real_n
     FROM `+a.db+`.deliveries
     WHERE report_id IN (SELECT report_id FROM `+a.db+`.plays WHERE `+w+`)`+asOf(o)+`
     GROUP BY report_id) AS per_play_targets
USING report_id
WHERE below = 0 AND sandbox_n > 0 AND real_n = 0`, &r.DeliveredToSandbox); err != nil {
			return fmt.Errorf("analytics: audit sandbox deliveries: %w", err)
		}
	}
	r.DeliveredReal = r.Delivered - min(r.Delivered, r.DeliveredToSandbox)
	return nil
}

// quoteSQL is s as a ClickHouse string literal (backslash escapes).
func quoteSQL(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
