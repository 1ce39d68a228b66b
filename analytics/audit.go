package analytics

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/schemas"
)

// AuditOptions select the window of an audit.
type AuditOptions struct {
	// From and To bound the window [From, To) on the Kafka timestamps of the
	// records: events and rejections by their own record time, track plays by
	// theirs. Outcomes of the plays in the window count whenever they were
	// recorded (up to now), so a play reported after To is delivered, not pending.
	From, To time.Time
	// PendingThreshold: a pending play whose record is older than this
	// (relative to Now) is overdue. Defaults to 10 minutes.
	PendingThreshold time.Duration
	// Now defaults to time.Now().
	Now time.Time
	// SandboxTargets are partner base URLs to treat as sandboxes besides the
	// loopback ones (IsSandboxTarget): their answers are not real deliveries.
	SandboxTargets []string

	// schema is the ledger's schema version (set by prepare).
	schema uint32

	// asOf is the ledger snapshot (unix seconds of inserted_at) every query
	// of one Audit or List is bounded by; 0: none (set by snapshot).
	asOf int64
}

func (o AuditOptions) withDefaults() AuditOptions {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.To.IsZero() {
		o.To = o.Now
	}
	if o.PendingThreshold == 0 {
		o.PendingThreshold = 10 * time.Minute
	}
	return o
}

// Validate checks the window.
func (o AuditOptions) Validate() error {
	o = o.withDefaults()
	if !o.From.Before(o.To) {
		return fmt.Errorf("analytics: audit: --from (%s) must be before --to (%s)", o.From.Format(time.RFC3339), o.To.Format(time.RFC3339))
	}
	if o.PendingThreshold < 0 {
		return fmt.Errorf("analytics: audit: --pending-threshold must be ≥ 0, got %v", o.PendingThreshold)
	}
	return nil
}

// Count is one keyed number (a reason, a message, a topic).
type Count struct {
	Key string `json:"key"`
	N   uint64 `json:"n"`
}

// Delay is the end-to-end delay from an event's record time to the first
// `delivered` answer of each of its plays, in milliseconds.
type Delay struct {
	Plays uint64  `json:"plays"` // delivered plays whose event is in the ledger
	P50MS float64 `json:"p50_ms"`
	P90MS float64 `json:"p90_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
}

// Audit is the audit of a window: finance's numbers. Every play counted is
// a distinct report id; every event or rejection a distinct Kafka record
// (re-inserted rows are never counted twice).
type Audit struct {
	From             time.Time `json:"from"`
	To               time.Time `json:"to"`
	GeneratedAt      time.Time `json:"generated_at"`
	PendingThreshold string    `json:"pending_threshold"`

	// LedgerAsOf is the snapshot every number was read from: rows inserted
	// into the ledger up to this second (see Auditor.snapshot).
	LedgerAsOf time.Time `json:"ledger_as_of"`

	EventsReceived   uint64  `json:"events_received"`           // records of the events topic + events refused at the ingest gateway
	EventsAtGateway  uint64  `json:"events_refused_at_gateway"` // of which refused by the ingest gateway (never on the topic; also in rejected)
	EventsNotJSON    uint64  `json:"events_not_json"`           // of which not a JSON object
	EventsRejected   uint64  `json:"events_rejected"`           // distinct events rejected (offset_beyond_mix excluded: see EventsWithoutPlays)
	RejectedByReason []Count `json:"rejected_by_reason"`        // by the first violation's reason
	// EventsWithoutPlays are valid events that yielded no track play: a
	// segment starting at or past the end of its mix (the split rule of docs/design.md:
	// valid, zero plays; ledgers written before that rule counted them as
	// offset_beyond_mix rejections, which are counted here instead), or
	// lying before a listing's first track. An event not enriched yet is
	// counted here until its plays arrive.
	EventsWithoutPlays uint64 `json:"events_without_plays"`

	PlayRecords       uint64 `json:"play_records"`        // records of the reports topic (re-derivations included)
	PlaysDerived      uint64 `json:"plays_derived"`       // distinct report ids
	PlaysBelowMinimum uint64 `json:"plays_below_minimum"` // derived, not reportable (too short)
	PlaysReportable   uint64 `json:"plays_reportable"`

	Delivered              uint64  `json:"delivered"`       // reportable plays with a `delivered` answer
	RejectedByAPI          uint64  `json:"rejected_by_api"` // reportable plays rejected (400), never delivered
	RejectedByAPIByMessage []Count `json:"rejected_by_api_by_message"`
	StandbyAnswered        uint64  `json:"standby_answered"`         // plays answered by standby at least once
	StandbyThenDelivered   uint64  `json:"standby_then_delivered"`   // … and delivered later
	Pending                uint64  `json:"pending"`                  // reportable, no final outcome yet
	PendingOverdue         uint64  `json:"pending_overdue"`          // pending, derived longer ago than the threshold
	Parked                 uint64  `json:"parked"`                   // pending plays the reporter parked (a parked answer, none final since): never delivered
	DeliveredTwice         uint64  `json:"delivered_more_than_once"` // more than one distinct `delivered` record
	// PossiblyTwice: delivered once on record, but an earlier post's fate
	// is unknown (it may have reached the partner: a timeout, a connection
	// lost after sending, a malformed or edge answer, a crash; the delivered
	// record says in_doubt). Plays, not copies: see PossibleExtraCopies.
	PossiblyTwice uint64 `json:"possibly_delivered_twice"`
	// PossibleExtraCopies bounds from above the copies the partner may hold
	// beyond one per play (copies.go): per play, its delivered records plus
	// its posts whose fate is unknown, minus one. The partner's duplicates
	// of the window's plays never exceed it. PlaysWithExtraCopies are the
	// plays it comes from (--list extra-copies), DoubtfulPostsByCause the
	// posts whose fate is unknown by recorded cause (timeout,
	// connection_lost, malformed_answer, edge_answer, cancelled, crash):
	// the reporter's, and a replay's of a play the reporter never delivered.
	PossibleExtraCopies   uint64  `json:"possible_extra_copies"`
	PlaysWithExtraCopies  uint64  `json:"plays_with_possible_extra_copies"`
	DoubtfulPostsByCause  []Count `json:"doubtful_posts_by_cause"`
	BelowMinimumDelivered uint64  `json:"below_minimum_delivered"`    // should never happen
	Malformed             []Count `json:"malformed_records_by_topic"` // records not decodable, by topic

	// Per partner target (partners.go): plays delivered only to sandbox
	// targets are not real deliveries; DeliveredReal = Delivered − DeliveredToSandbox.
	DeliveredToSandbox uint64         `json:"delivered_to_sandbox"`
	DeliveredReal      uint64         `json:"delivered_real"`
	ByPartner          []PartnerCount `json:"deliveries_by_partner"`

	Delay Delay `json:"delay"`

	// Replays are the operator's re-deliveries (`playpipe replay` and
	// `playpipe redrive`) that answered plays of the window, one per replay
	// id. Their deliveries count a play as delivered but are never counted
	// in DeliveredTwice (nor PossiblyTwice): they were meant to be sent again.
	Replays []ReplayCount `json:"replays"`

	// Path says how the figures of the plays were read: in slices of
	// report ids, or in one pass (--exact). The figures are the same
	// either way.
	Path string `json:"path"`

	// Generations are the topics of which the window holds records of more
	// than one generation (a topic created again: its offsets restarted),
	// or records the audit cannot tell apart (generations.go).
	Generations []TopicGenerations `json:"topic_generations"`
}

// ReplayCount is one replay (or redrive) of the plays of a window.
type ReplayCount struct {
	ID     string `json:"replay_id"`
	Reason string `json:"reason"`
	// Plays: distinct plays it posted; Delivered / Rejected: of which
	// answered delivered / rejected (400).
	Plays     uint64 `json:"plays"`
	Delivered uint64 `json:"delivered"`
	Rejected  uint64 `json:"rejected"`
	// DeliveredTwice: plays this replay delivered more than once (a re-run
	// of the same replay id must not send again): fails the audit.
	DeliveredTwice uint64    `json:"delivered_more_than_once"`
	First          time.Time `json:"first_answer"`
	Last           time.Time `json:"last_answer"`
}

// Problems lists what should fail a cron or CI check: overdue pending plays,
// plays delivered more than once, and plays below the minimum that were
// delivered. Empty means the window is clean.
func (r Audit) Problems() []string {
	var out []string
	if r.PendingOverdue > 0 {
		out = append(out, fmt.Sprintf("%d plays pending for longer than %s (--list pending-overdue)", r.PendingOverdue, r.PendingThreshold))
	}
	if r.Parked > 0 {
		out = append(out, fmt.Sprintf("%d plays parked by the reporter: the partner keeps failing them; retried slowly, or re-send them with playpipe redrive --parked (--list parked)", r.Parked))
	}
	if r.DeliveredTwice > 0 {
		out = append(out, fmt.Sprintf("%d plays delivered more than once (--list delivered-twice)", r.DeliveredTwice))
	}
	if r.PossiblyTwice > 0 {
		out = append(out, fmt.Sprintf("%d plays delivered once on record may have been delivered more than once (an earlier post's fate unknown): check them against the partner's records (--list possibly-twice)", r.PossiblyTwice))
	}
	if p := r.copiesProblem(); p != "" {
		out = append(out, p)
	}
	for _, rp := range r.Replays {
		if rp.DeliveredTwice > 0 {
			out = append(out, fmt.Sprintf("%d plays delivered more than once by replay %s (--list replay:%s)", rp.DeliveredTwice, rp.ID, rp.ID))
		}
	}
	if r.BelowMinimumDelivered > 0 {
		out = append(out, fmt.Sprintf("%d plays below the minimum length were delivered (--list below-minimum-delivered)", r.BelowMinimumDelivered))
	}
	out = append(out, r.generationProblems()...)
	return out
}

// Auditor runs the audit queries on a ledger database.
type Auditor struct {
	conn   driver.Conn
	db     string
	limits Limits
	// progress serializes the progress lines of queries run at once (the
	// slices, sliceWorkers).
	progress sync.Mutex
}

// NewAuditor returns an auditor of the ledger in database db.
func NewAuditor(conn driver.Conn, db string) (*Auditor, error) {
	if !identRE.MatchString(db) {
		return nil, fmt.Errorf("analytics: audit: database %q is not an identifier", db)
	}
	return &Auditor{conn: conn, db: db, limits: Limits{}.withDefaults()}, nil
}

// window is the SQL condition of [From, To) on kafka_time_ms. Only integers
// formatted here enter the SQL text.
func window(o AuditOptions) string {
	return "kafka_time_ms >= " + strconv.FormatInt(max(0, o.From.UnixMilli()), 10) +
		" AND kafka_time_ms < " + strconv.FormatInt(max(0, o.To.UnixMilli()), 10) + asOf(o)
}

// asOf is the snapshot condition on inserted_at (with a leading AND).
func asOf(o AuditOptions) string {
	if o.asOf <= 0 {
		return ""
	}
	return " AND inserted_at <= toDateTime(" + strconv.FormatInt(o.asOf, 10) + ")"
}

// eventKey is an event id as the set of every played event holds it: its
// 128-bit SipHash, the form in which uniqExact holds the Strings it counts
// (so every distinct count of the audit already takes two ids with one
// 128-bit hash for one; a report id is itself 128 bits of a SHA-256). A set
// of 16-byte keys instead of Strings: "events without plays" over 50 M
// plays took 4.4-4.5 s instead of 7.1-7.8 s
// (docs/bench/2026-11-29-2core-audit-quiet.txt, -siphash.txt).
const eventKey = "sipHash128(event_id)"

// rejectionKey identifies the rejected event of a rejection row: its record
// on the events topic (with that topic's generation, src_topic_id), or, for
// an event the ingest gateway refused before it reached Kafka (source
// partition -1), the rejection record itself.
const rejectionKey = "if(src_partition >= 0, tuple(src_topic_id, src_topic, src_partition, src_offset), tuple(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset))"

// snapshot fixes the ledger state one Audit or List reads, so that its
// numbers agree with each other while the sink is still inserting: every
// query is bounded by inserted_at ≤ the newest second in the ledger, read
// once at the start. When that second is the server's current one (the
// ledger is filling), it first waits for the second to end, so no row of it
// can arrive after the queries start. (A sink insert whose rows took their
// inserted_at but were not yet visible when the audit started is the one
// case it cannot see; it is counted by the next audit.)
func (a *Auditor) snapshot(ctx context.Context, o AuditOptions) (AuditOptions, error) {
	var newest, now uint32
	q := `SELECT toUInt32(max(m)), toUInt32(now()) FROM (
    SELECT max(inserted_at) AS m FROM ` + a.db + `.events
    UNION ALL SELECT max(inserted_at) AS m FROM ` + a.db + `.plays
    UNION ALL SELECT max(inserted_at) AS m FROM ` + a.db + `.deliveries
    UNION ALL SELECT max(inserted_at) AS m FROM ` + a.db + `.rejections
    UNION ALL SELECT max(inserted_at) AS m FROM ` + a.db + `.malformed)`
	if err := a.row(withCheck(ctx, o, "snapshot"), q, &newest, &now); err != nil {
		return o, fmt.Errorf("analytics: audit snapshot: %w", err)
	}
	for newest >= now {
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return o, ctx.Err()
		case <-t.C:
		}
		if err := a.row(withCheck(ctx, o, "snapshot"), `SELECT toUInt32(now())`, &now); err != nil {
			return o, fmt.Errorf("analytics: audit snapshot: %w", err)
		}
	}
	o.asOf = max(int64(newest), 1) // 1: an empty ledger, nothing inserted yet
	return o, nil
}

// perReport is one row per play of the window with its outcomes:
// report_id, event_id, below, derived_ms, delivered_n, replay_delivered_n,
// rejected_n, standby_n, delivered_ms, last_outcome, reject_message (the
// message of a 400), the last answer (last_status, last_reason,
// last_message, last_attempt), trace_ids.
// delivered_n counts the live reporter's `delivered` records only;
// replay_delivered_n those of replays (deliveries with a replay_id), which
// make a play delivered but never "delivered more than once".
//
// Portable SQL (docs/audit.md, "Which ClickHouse versions are tested"):
// every joined subquery has an alias (current releases refuse one
// without), and each side is already one row per key, so the ALL join
// means the same on every version (ANY INNER does not: since 20.x it also
// keeps one left row per key).
func (a *Auditor) perReport(o AuditOptions) string { return a.perReportIn(o, "1 = 1") }

// perReportIn is perReport of the plays whose report id meets rng (a
// slice's range: sliceRange).
func (a *Auditor) perReportIn(o AuditOptions, rng string) string {
	w := window(o) + " AND " + rng
	return `(SELECT report_id, any(event_id) AS event_id, max(below_minimum) AS below, min(kafka_time_ms) AS derived_ms,
        minIf(event_at_ms, event_at_ms > 0) AS carried_ms
     FROM ` + a.db + `.plays WHERE ` + w + ` GROUP BY report_id) AS per_play
ALL LEFT JOIN
    (SELECT report_id,
        uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, outcome = 'delivered' AND replay_id = '') AS delivered_n,
        uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, outcome = 'delivered' AND replay_id != '') AS replay_delivered_n,
        countIf(outcome = 'rejected') AS rejected_n,
        countIf(outcome = 'standby') AS standby_n,
        maxIf(in_doubt, outcome = 'delivered' AND replay_id = '') AS doubt_delivered,
        uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, doubt_cause != '' AND replay_id = '') AS doubt_n,
        groupUniqArrayIf(doubt_cause, doubt_cause != '' AND replay_id = '') AS doubt_causes,
        uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, doubt_cause != '' AND replay_id != '') AS replay_doubt_n,
        groupUniqArrayIf(doubt_cause, doubt_cause != '' AND replay_id != '') AS replay_doubt_causes,
        minIf(at_ms, outcome = 'delivered') AS delivered_ms,
        argMax(outcome, at_ms) AS last_outcome,
        anyIf(message, outcome = 'rejected') AS reject_message,
        countIf(outcome = '` + schemas.OutcomeParked + `') AS parked_n,
        argMax(http_status, at_ms) AS last_status,
        argMax(retry_reason, at_ms) AS last_reason,
        argMax(message, at_ms) AS last_message,
        argMax(attempt, at_ms) AS last_attempt,
        groupUniqArrayIf(trace_id, trace_id != '') AS trace_ids,
        groupUniqArrayIf(trace_id, trace_id != '' AND outcome = 'delivered') AS delivered_trace_ids
     FROM ` + a.db + `.deliveries
     WHERE ` + rng + ` AND report_id IN (SELECT report_id FROM ` + a.db + `.plays WHERE ` + w + `)` + asOf(o) + `
     GROUP BY report_id) AS per_play_outcomes
USING report_id`
}

// condRealReject excludes legacy offset_beyond_mix rejections: by docs/design.md's
// split rule such an event is valid with zero plays (docs/consumer.md).
const condRealReject = "reason != 'offset_beyond_mix'"

// Outcome conditions over perReport's columns. A `delivered` answer is
// final and wins over a `rejected` one; standby and retry are intermediate.
const (
	condReportable = "below = 0"
	condDelivered  = "below = 0 AND (delivered_n > 0 OR replay_delivered_n > 0)"
	condRejected   = "below = 0 AND delivered_n = 0 AND replay_delivered_n = 0 AND rejected_n > 0"
	condPending    = "below = 0 AND delivered_n = 0 AND replay_delivered_n = 0 AND rejected_n = 0"
	condParked     = condPending + " AND parked_n > 0"
	condStandby    = "below = 0 AND standby_n > 0"
	condStandbyDel = "below = 0 AND standby_n > 0 AND (delivered_n > 0 OR replay_delivered_n > 0)"
	condTwice      = "delivered_n > 1"
	condDoubt      = "below = 0 AND delivered_n = 1 AND doubt_delivered = 1"
	condBelowDel   = "below = 1 AND (delivered_n > 0 OR replay_delivered_n > 0)"
)

func (o AuditOptions) overdueCutoff() string {
	return strconv.FormatInt(o.Now.Add(-o.PendingThreshold).UnixMilli(), 10)
}

// prepare validates o, fills in its defaults and pins it to the ledger's
// current snapshot (see snapshot).
func (a *Auditor) prepare(ctx context.Context, o AuditOptions) (AuditOptions, error) {
	if err := o.Validate(); err != nil {
		return o, err
	}
	v, err := a.schemaVersion(ctx)
	if err != nil {
		return o, err
	}
	o.schema = v
	return a.snapshot(ctx, o.withDefaults())
}

// Audit computes the report of a window.
func (a *Auditor) Audit(ctx context.Context, o AuditOptions) (*Audit, error) {
	o, err := a.prepare(ctx, o)
	if err != nil {
		return nil, err
	}
	r := &Audit{From: o.From.UTC(), To: o.To.UTC(), GeneratedAt: o.Now.UTC(), PendingThreshold: o.PendingThreshold.String(),
		LedgerAsOf: time.Unix(o.asOf, 0).UTC()}
	w := window(o)

	if err := a.row(withCheck(ctx, o, "events received"), `SELECT uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset), uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, parsed = 0)
FROM `+a.db+`.events WHERE `+w, &r.EventsReceived, &r.EventsNotJSON); err != nil {
		return nil, fmt.Errorf("analytics: audit events: %w", err)
	}
	// "Received" and "rejected" count the same population: an event the
	// ingest gateway refused never reached the events topic, so it is added
	// to the received (as refused at the gateway) as well as rejected.
	if err := a.row(withCheck(ctx, o, "refused at the gateway"), `SELECT uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset) FROM `+a.db+`.rejections WHERE `+w+` AND src_partition < 0`,
		&r.EventsAtGateway); err != nil {
		return nil, fmt.Errorf("analytics: audit rejections: %w", err)
	}
	r.EventsReceived += r.EventsAtGateway
	// A rejection is counted once per rejected event (rejectionKey), however
	// many times it was published. Legacy offset_beyond_mix rejections are
	// valid events (EventsWithoutPlays).
	if r.RejectedByReason, err = a.counts(withCheck(ctx, o, "rejected by reason"), `SELECT reason, uniqExact(`+rejectionKey+`) AS n
FROM `+a.db+`.rejections WHERE `+w+` AND `+condRealReject+` GROUP BY reason ORDER BY n DESC, reason`); err != nil {
		return nil, fmt.Errorf("analytics: audit rejections: %w", err)
	}
	if err := a.row(withCheck(ctx, o, "events rejected"), `SELECT uniqExact(`+rejectionKey+`) FROM `+a.db+`.rejections WHERE `+w+` AND `+condRealReject, &r.EventsRejected); err != nil {
		return nil, fmt.Errorf("analytics: audit rejections: %w", err)
	}
	// Valid events of the window without a play, as of the snapshot (the
	// rejections and plays they are matched against are bounded by it too,
	// or a play inserted after it would make the counts disagree). The
	// played event ids are matched by their 128-bit SipHash (eventKey).
	if err := a.row(withCheck(ctx, o, "events without plays"), `SELECT uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset) FROM `+a.db+`.events
WHERE `+w+` AND parsed = 1
  AND (kafka_topic_id, kafka_topic, kafka_partition, kafka_offset) NOT IN (SELECT src_topic_id, src_topic, src_partition, src_offset FROM `+a.db+`.rejections WHERE `+condRealReject+asOf(o)+`)
  AND `+eventKey+` NOT IN (SELECT `+eventKey+` FROM `+a.db+`.plays WHERE 1 = 1`+asOf(o)+`)`, &r.EventsWithoutPlays); err != nil {
		return nil, fmt.Errorf("analytics: audit events without plays: %w", err)
	}
	if r.Malformed, err = a.counts(withCheck(ctx, o, "malformed"), `SELECT kafka_topic, uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset) AS n
FROM `+a.db+`.malformed WHERE `+w+` GROUP BY kafka_topic ORDER BY kafka_topic`); err != nil {
		return nil, fmt.Errorf("analytics: audit malformed: %w", err)
	}
	plan, path, err := a.plan(ctx, o)
	if err != nil {
		return nil, err
	}
	r.Path = path
	if plan != nil {
		err = a.auditSliced(ctx, o, r, plan)
	} else {
		err = a.exactPlays(withCheck(ctx, o, "plays (exact path)"), o, r)
	}
	if err != nil {
		return nil, err
	}
	if err := a.generations(withCheck(ctx, o, "topic generations"), o, r); err != nil {
		return nil, err
	}
	return r, nil
}

// exactPlays fills the figures of the window's plays from the raw ledger
// in one pass (Limits.Exact): the queries
// every figure of auditSliced is checked against.
func (a *Auditor) exactPlays(ctx context.Context, o AuditOptions, r *Audit) error {
	w := window(o)
	var err error
	if err := a.row(ctx, `SELECT uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset) FROM `+a.db+`.plays WHERE `+w, &r.PlayRecords); err != nil {
		return fmt.Errorf("analytics: audit plays: %w", err)
	}
	cutoff := o.overdueCutoff()
	if err := a.row(ctx, `SELECT count(), countIf(below = 1), countIf(`+condReportable+`),
    countIf(`+condDelivered+`), countIf(`+condRejected+`), countIf(`+condStandby+`), countIf(`+condStandbyDel+`),
    countIf(`+condPending+`), countIf(`+condPending+` AND derived_ms < `+cutoff+`), countIf(`+condTwice+`), countIf(`+condBelowDel+`), countIf(`+condDoubt+`),
    countIf(`+condParked+`)
FROM `+a.perReport(o),
		&r.PlaysDerived, &r.PlaysBelowMinimum, &r.PlaysReportable, &r.Delivered, &r.RejectedByAPI, &r.StandbyAnswered,
		&r.StandbyThenDelivered, &r.Pending, &r.PendingOverdue, &r.DeliveredTwice, &r.BelowMinimumDelivered, &r.PossiblyTwice,
		&r.Parked); err != nil {
		return fmt.Errorf("analytics: audit plays: %w", err)
	}
	if r.RejectedByAPIByMessage, err = a.counts(ctx, `SELECT reject_message, count() AS n FROM `+a.perReport(o)+`
WHERE `+condRejected+` GROUP BY reject_message ORDER BY n DESC, reject_message`); err != nil {
		return fmt.Errorf("analytics: audit rejected by API: %w", err)
	}
	if err := a.copies(ctx, o, r); err != nil {
		return err
	}
	if err := a.partners(ctx, o, r); err != nil {
		return err
	}
	if r.Delay, err = a.delay(ctx, o); err != nil {
		return err
	}
	if r.Replays, err = a.replays(ctx, o); err != nil {
		return err
	}
	return nil
}

// replays sums up the replays that answered plays of the window.
func (a *Auditor) replays(ctx context.Context, o AuditOptions) ([]ReplayCount, error) {
	out := []ReplayCount{}
	err := a.query(ctx, `SELECT replay_id, any(replay_reason), uniqExact(report_id),
    uniqExactIf(report_id, outcome = 'delivered'), uniqExactIf(report_id, outcome = 'rejected'),
    toUInt64(uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, outcome = 'delivered') - uniqExactIf(report_id, outcome = 'delivered')),
    min(at_ms), max(at_ms)
FROM `+a.db+`.deliveries
WHERE replay_id != '' AND report_id IN (SELECT report_id FROM `+a.db+`.plays WHERE `+window(o)+`)`+asOf(o)+`
GROUP BY replay_id ORDER BY min(at_ms), replay_id`, func(rows driver.Rows) error {
		var rc ReplayCount
		var first, last int64
		if err := rows.Scan(&rc.ID, &rc.Reason, &rc.Plays, &rc.Delivered, &rc.Rejected, &rc.DeliveredTwice, &first, &last); err != nil {
			return err
		}
		rc.First, rc.Last = time.UnixMilli(first).UTC(), time.UnixMilli(last).UTC()
		out = append(out, rc)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("analytics: audit replays: %w", err)
	}
	return out, nil
}
