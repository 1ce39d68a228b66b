package analytics

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// The copies the partner may hold ("the audit counts copies").
//
// A play's copies at the partner are bounded by its recorded `delivered`
// answers plus every post whose own fate is unknown: the Delivery records
// with a doubt_cause (a post that timed out, lost its connection after
// sending, got a malformed answer or an edge's page, and the first post
// after one that left no record: cancelled, or the previous owner's
// crash). Ledgers written before doubt_cause existed count one possible
// copy per play whose delivered record says in_doubt. So
//
//	extra copies of a play ≤ delivered_n + max(doubtful posts, legacy in_doubt)
//	                         + (replay delivered + replay doubtful posts, when delivered_n = 0) − 1
//
// summed over the window's reportable plays is the audit's
// PossibleExtraCopies: the partner's duplicates of the window's plays never
// exceed it. A replay's posts of a play the reporter delivered are
// deliberate copies (the partner lost it), not counted; but a play the
// reporter never delivered — parked, then re-sent by `redrive --parked` —
// gets its first delivery from the replay, and each of that run's posts in
// doubt may be a copy as well as the reporter's own.

// condCopies selects the plays with at least one possible extra copy, over
// perReport's columns.
const condCopies = "below = 0 AND " + playCopies + " > 1"

// playCopies is the bound of a play's copies at the partner.
const playCopies = "(delivered_n + greatest(doubt_n, toUInt64(doubt_delivered)) + if(delivered_n = 0, replay_delivered_n + replay_doubt_n, toUInt64(0)))"

// copies fills PossibleExtraCopies, PlaysWithExtraCopies and
// DoubtfulPostsByCause.
func (a *Auditor) copies(ctx context.Context, o AuditOptions, r *Audit) error {
	if err := a.row(ctx, `SELECT toUInt64(sum(`+playCopies+` - 1)), count() FROM `+a.perReport(o)+` WHERE `+condCopies,
		&r.PossibleExtraCopies, &r.PlaysWithExtraCopies); err != nil {
		return fmt.Errorf("analytics: audit copies: %w", err)
	}
	var err error
	if r.DoubtfulPostsByCause, err = a.counts(ctx, `SELECT doubt_cause, uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset) AS n
FROM `+a.db+`.deliveries
WHERE doubt_cause != '' AND report_id IN (SELECT report_id FROM `+a.db+`.plays WHERE `+window(o)+`)`+asOf(o)+`
  AND (replay_id = '' OR report_id NOT IN (SELECT report_id FROM `+a.db+`.deliveries WHERE outcome = 'delivered' AND replay_id = ''`+asOf(o)+`))
GROUP BY doubt_cause ORDER BY n DESC, doubt_cause`); err != nil {
		return fmt.Errorf("analytics: audit copies by cause: %w", err)
	}
	return nil
}

// copiesProblem is the Problems line of possible extra copies, "" when none.
func (r Audit) copiesProblem() string {
	if r.PossibleExtraCopies == 0 || (len(r.DoubtfulPostsByCause) == 0 && r.PossiblyTwice == 0) {
		return "" // only recorded doubles: their own line says so
	}
	var causes []string
	for _, c := range r.DoubtfulPostsByCause {
		causes = append(causes, c.Key+" "+strconv.FormatUint(c.N, 10))
	}
	if r.DeliveredTwice > 0 {
		causes = append(causes, "delivered more than once on record")
	}
	why := ""
	if len(causes) > 0 {
		why = " (posts whose fate is unknown, by cause: " + strings.Join(causes, ", ") + ")"
	}
	return fmt.Sprintf("the partner may hold up to %d extra copies of %d plays%s: check them against the partner's records (--list extra-copies)",
		r.PossibleExtraCopies, r.PlaysWithExtraCopies, why)
}
