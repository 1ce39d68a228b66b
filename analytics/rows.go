package analytics

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// Ledger table names.
const (
	TableEvents     = "events"
	TablePlays      = "plays"
	TableDeliveries = "deliveries"
	TableRejections = "rejections"
	TableMalformed  = "malformed"
)

// loc is the Kafka location, topic generation and time columns every table
// starts with.
type loc struct {
	topic   []string
	part    []int32
	offset  []int64
	topicID []string
	ts      []time.Time
	tsMS    []uint64
}

const locCols = "kafka_topic, kafka_partition, kafka_offset, kafka_topic_id, kafka_time, kafka_time_ms"

// topicIDString is a topic id as Kafka prints it (Uuid.toString: base64url
// without padding), or "" for the zero id (a broker without topic ids).
func topicIDString(id [16]byte) string {
	if id == ([16]byte{}) {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(id[:])
}

func (l *loc) add(r *kgo.Record, topicID string) {
	l.topic = append(l.topic, r.Topic)
	l.part = append(l.part, r.Partition)
	l.offset = append(l.offset, r.Offset)
	l.topicID = append(l.topicID, topicID)
	l.ts = append(l.ts, r.Timestamp)
	ms := r.Timestamp.UnixMilli()
	if ms < 0 {
		ms = 0
	}
	l.tsMS = append(l.tsMS, uint64(ms))
}

func (l *loc) cols() []any { return []any{l.topic, l.part, l.offset, l.topicID, l.ts, l.tsMS} }

func (l *loc) n() int { return len(l.offset) }

// table is the column buffer of one ledger table.
type table interface {
	name() string
	columns() string // the INSERT column list
	values() []any   // one slice per column, in columns() order
	n() int
	reset(n int)       // empty, keeping capacity, with room for n rows
	strs() []*[]string // the String columns
}

type eventsRows struct {
	loc
	key, traceID         []string
	parsed               []uint8
	eventID              []string
	mixID, startedAt     []int64
	offsetMS, durationMS []int64
	userID, country      []string
	raw                  []string
}

func (t *eventsRows) name() string { return TableEvents }
func (t *eventsRows) columns() string {
	return locCols + ", kafka_key, trace_id, parsed, event_id, mix_id, started_at_ms, offset_ms, duration_ms, user_id, country, raw"
}
func (t *eventsRows) values() []any {
	return append(t.cols(), t.key, t.traceID, t.parsed, t.eventID, t.mixID, t.startedAt, t.offsetMS, t.durationMS, t.userID, t.country, t.raw)
}

func (t *eventsRows) add(r *kgo.Record, topicID string, f *schemas.PlayerEvent) {
	t.loc.add(r, topicID)
	raw := recordString(r.Value) // no copy: the decoded strings and the columns are views of it
	parsed := decodeEvent(r.Value, raw, f)
	t.key = append(t.key, recordString(r.Key))
	t.traceID = append(t.traceID, traceIDOf(r))
	t.parsed = append(t.parsed, parsed)
	t.eventID = append(t.eventID, f.EventID)
	t.mixID = append(t.mixID, f.MixID)
	t.startedAt = append(t.startedAt, f.StartedAt)
	t.offsetMS = append(t.offsetMS, f.OffsetMS)
	t.durationMS = append(t.durationMS, f.DurationMS)
	t.userID = append(t.userID, f.UserID)
	t.country = append(t.country, f.Country)
	t.raw = append(t.raw, raw)
}

// decodeEvent decodes the columns of an event into *ev (raw is string(b),
// whose substrings the decoded strings are; ev is the batch's scratch value,
// so that decoding allocates nothing) and reports whether it parsed. Only a
// JSON object is parsed: an array, null, a number or a string is "not JSON"
// to the audit (encoding/json would accept null, and report arrays and
// numbers as type errors of a valid document); a field of the wrong type is
// left empty (the event itself is in rejections, with its reason). When it
// did not parse *ev is the zero value.
func decodeEvent(b []byte, raw string, ev *schemas.PlayerEvent) uint8 {
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		*ev = schemas.PlayerEvent{}
		return 0
	}
	if err := lenient(schemas.DecodePlayerEvent(raw, ev)); err != nil {
		*ev = schemas.PlayerEvent{}
		return 0
	}
	return 1
}

type playsRows struct {
	loc
	traceID                                  []string
	v                                        []int32
	reportID, eventID                        []string
	mixID                                    []int64
	position                                 []int32
	overlapMS                                []int64
	belowMin, noUserID, standbyListing       []uint8
	derivedAt, trackID, playedAt, playLength []int64
	userID, country, isrc, record            []string
	eventAt                                  []uint64
}

func (t *playsRows) name() string { return TablePlays }
func (t *playsRows) columns() string {
	return locCols + ", trace_id, v, report_id, event_id, mix_id, position, overlap_ms, below_minimum, no_user_id, standby_listing, derived_at_ms, track_id, played_at_ms, play_length, user_id, country, isrc, record, event_at_ms"
}
func (t *playsRows) values() []any {
	return append(t.cols(), t.traceID, t.v, t.reportID, t.eventID, t.mixID, t.position, t.overlapMS, t.belowMin, t.noUserID, t.standbyListing,
		t.derivedAt, t.trackID, t.playedAt, t.playLength, t.userID, t.country, t.isrc, t.record, t.eventAt)
}

func (t *playsRows) add(r *kgo.Record, topicID string, p *schemas.TrackPlay, raw string) {
	t.loc.add(r, topicID)
	t.traceID = append(t.traceID, traceIDOf(r))
	t.v = append(t.v, int32(p.V))
	t.reportID = append(t.reportID, p.ReportID)
	t.eventID = append(t.eventID, p.EventID)
	t.mixID = append(t.mixID, p.MixID)
	t.position = append(t.position, int32(p.Position))
	t.overlapMS = append(t.overlapMS, p.OverlapMS)
	t.belowMin = append(t.belowMin, b2u(p.BelowMinimum))
	t.noUserID = append(t.noUserID, b2u(p.NoUserID))
	t.standbyListing = append(t.standbyListing, b2u(p.StandbyListing))
	t.derivedAt = append(t.derivedAt, p.DerivedAt)
	t.trackID = append(t.trackID, p.Report.TrackID)
	t.playedAt = append(t.playedAt, p.Report.PlayedAt)
	t.playLength = append(t.playLength, p.Report.PlayLength)
	t.userID = append(t.userID, p.Report.UserID)
	t.country = append(t.country, p.Report.Country)
	t.isrc = append(t.isrc, p.Report.ISRC)
	t.record = append(t.record, raw)
	t.eventAt = append(t.eventAt, uint64(max(0, p.EventAt)))
}

type deliveriesRows struct {
	loc
	v                          []int32
	reportID, eventID, outcome []string
	attempt, httpStatus        []int32
	servedBy, partner, message []string
	fields                     [][]string
	retryReason                []string
	latencyUS                  []int64
	traceID                    []string
	replay, inDoubt            []uint8
	replayID, replayReason     []string
	atMS                       []int64
	doubtCause                 []string
}

func (t *deliveriesRows) name() string { return TableDeliveries }
func (t *deliveriesRows) columns() string {
	return locCols + ", v, report_id, event_id, outcome, attempt, http_status, served_by, partner, message, fields, retry_reason, latency_us, trace_id, replay, in_doubt, replay_id, replay_reason, at_ms, doubt_cause"
}
func (t *deliveriesRows) values() []any {
	return append(t.cols(), t.v, t.reportID, t.eventID, t.outcome, t.attempt, t.httpStatus, t.servedBy, t.partner, t.message, t.fields, t.retryReason, t.latencyUS, t.traceID, t.replay, t.inDoubt, t.replayID, t.replayReason, t.atMS, t.doubtCause)
}

func (t *deliveriesRows) add(r *kgo.Record, topicID string, d *schemas.Delivery) {
	t.loc.add(r, topicID)
	t.v = append(t.v, int32(d.V))
	t.reportID = append(t.reportID, d.ReportID)
	t.eventID = append(t.eventID, d.EventID)
	t.outcome = append(t.outcome, d.Outcome)
	t.attempt = append(t.attempt, int32(d.Attempt))
	t.httpStatus = append(t.httpStatus, int32(d.HTTPStatus))
	t.servedBy = append(t.servedBy, d.ServedBy)
	t.partner = append(t.partner, d.Partner)
	t.message = append(t.message, d.Message)
	f := d.Fields
	if f == nil {
		f = []string{}
	}
	t.fields = append(t.fields, f)
	t.retryReason = append(t.retryReason, d.Reason)
	t.latencyUS = append(t.latencyUS, d.LatencyUS)
	tid := d.TraceID
	if tid == "" {
		tid = traceIDOf(r)
	}
	t.traceID = append(t.traceID, tid)
	t.replay = append(t.replay, b2u(d.Replay))
	t.inDoubt = append(t.inDoubt, b2u(d.InDoubt))
	t.replayID = append(t.replayID, d.ReplayID)
	t.replayReason = append(t.replayReason, d.ReplayReason)
	t.atMS = append(t.atMS, d.At)
	t.doubtCause = append(t.doubtCause, d.DoubtCause)
}

type rejectionsRows struct {
	loc
	traceID           []string
	v                 []int32
	eventID, reason   []string
	vReasons, vFields [][]string
	vDetails          [][]string
	srcTopic          []string
	srcPart           []int32
	srcOffset, atMS   []int64
	srcTopicID        []string
	raw               []string
}

func (t *rejectionsRows) name() string { return TableRejections }
func (t *rejectionsRows) columns() string {
	return locCols + ", trace_id, v, event_id, reason, violation_reasons, violation_fields, violation_details, src_topic, src_partition, src_offset, src_topic_id, at_ms, raw"
}
func (t *rejectionsRows) values() []any {
	return append(t.cols(), t.traceID, t.v, t.eventID, t.reason, t.vReasons, t.vFields, t.vDetails, t.srcTopic, t.srcPart, t.srcOffset, t.srcTopicID, t.atMS, t.raw)
}

func (t *rejectionsRows) add(r *kgo.Record, topicID, srcTopicID string, j *schemas.Rejection) {
	t.loc.add(r, topicID)
	t.traceID = append(t.traceID, traceIDOf(r))
	t.v = append(t.v, int32(j.V))
	t.eventID = append(t.eventID, j.EventID)
	t.reason = append(t.reason, j.Reason)
	n := len(j.Violations)
	reasons, fields, details := make([]string, n), make([]string, n), make([]string, n)
	for i, v := range j.Violations {
		reasons[i], fields[i], details[i] = v.Reason, v.Field, v.Detail
	}
	t.vReasons = append(t.vReasons, reasons)
	t.vFields = append(t.vFields, fields)
	t.vDetails = append(t.vDetails, details)
	t.srcTopic = append(t.srcTopic, j.Source.Topic)
	t.srcPart = append(t.srcPart, j.Source.Partition)
	t.srcOffset = append(t.srcOffset, j.Source.Offset)
	if j.Source.Partition < 0 {
		srcTopicID = "" // refused at the ingest gateway: never on a topic
	}
	t.srcTopicID = append(t.srcTopicID, srcTopicID)
	t.atMS = append(t.atMS, j.At)
	raw := j.Raw
	if j.RawBase64 {
		if b, err := base64.StdEncoding.DecodeString(j.Raw); err == nil {
			raw = string(b)
		}
	}
	t.raw = append(t.raw, raw)
}

type malformedRows struct {
	loc
	key, errText, raw []string
}

func (t *malformedRows) name() string    { return TableMalformed }
func (t *malformedRows) columns() string { return locCols + ", kafka_key, error, raw" }
func (t *malformedRows) values() []any   { return append(t.cols(), t.key, t.errText, t.raw) }

func (t *malformedRows) add(r *kgo.Record, topicID string, err error) {
	t.loc.add(r, topicID)
	t.key = append(t.key, recordString(r.Key))
	t.errText = append(t.errText, err.Error())
	t.raw = append(t.raw, recordString(r.Value))
}

// batch is the rows of a set of records, one buffer per table, plus the
// offsets to commit once every table's rows are in ClickHouse.
type batch struct {
	topics     kafkax.Topics
	events     eventsRows
	plays      playsRows
	deliveries deliveriesRows
	rejections rejectionsRows
	malformed  malformedRows
	records    int
	// Decoding scratch, reused record after record so that the decoded
	// value does not cost an allocation per record.
	event    schemas.PlayerEvent
	play     schemas.TrackPlay
	delivery schemas.Delivery
	reject   schemas.Rejection
	// next is the offset to commit per topic and partition (last + 1).
	next map[string]map[int32]kgo.EpochOffset
	// topicIDs is the id of each topic as the reader last saw it (its
	// fetches and metadata; nil or missing: unknown). A rejection's source
	// generation (src_topic_id) is the events topic's id here.
	topicIDs map[string]string
}

func newBatch(t kafkax.Topics) *batch {
	return &batch{topics: t, next: map[string]map[int32]kgo.EpochOffset{}}
}

// reset empties b for reuse, keeping the columns' capacity.
func (b *batch) reset() {
	for _, t := range b.tables() {
		t.reset(0)
	}
	b.records = 0
	clear(b.next)
}

// room is the size of a batch's columns: rows per table.
type room struct {
	rows [5]int // per table, in tables() order
}

// size returns the rows of each table.
func (b *batch) size() room {
	var r room
	for i, t := range b.tables() {
		r.rows[i] = t.n()
	}
	return r
}

// max is the larger of r and o, table by table.
func (r room) max(o room) room {
	for i := range r.rows {
		r.rows[i] = max(r.rows[i], o.rows[i])
	}
	return r
}

// reserve gives the columns of an empty b room for r's rows, so that it
// does not grow its columns row by row (each growth copies the column: a
// tenth of the sink's CPU while its batches were new).
func (b *batch) reserve(r room) {
	for i, t := range b.tables() {
		t.reset(r.rows[i])
	}
}

// trunc empties the column slices, keeping their capacity, and gives them
// room for n rows. The old values are zeroed first: a String or
// Array(String) column's values are views of fetched record bytes
// (recordString), which they would otherwise keep alive.
func trunc[T any](n int, cols ...*[]T) {
	for _, c := range cols {
		clear(*c)
		*c = slices.Grow((*c)[:0], n)
	}
}

// strs are the String columns of l.
func (l *loc) strs() []*[]string { return []*[]string{&l.topic, &l.topicID} }

func (l *loc) reset(n int) {
	trunc(n, l.strs()...)
	trunc(n, &l.part)
	trunc(n, &l.offset)
	trunc(n, &l.ts)
	trunc(n, &l.tsMS)
}

func (t *eventsRows) strs() []*[]string {
	return append(t.loc.strs(), &t.key, &t.traceID, &t.eventID, &t.userID, &t.country, &t.raw)
}

func (t *eventsRows) reset(n int) {
	t.loc.reset(n)
	trunc(n, t.strs()...)
	trunc(n, &t.parsed)
	trunc(n, &t.mixID, &t.startedAt, &t.offsetMS, &t.durationMS)
}

func (t *playsRows) strs() []*[]string {
	return append(t.loc.strs(), &t.traceID, &t.reportID, &t.eventID, &t.userID, &t.country, &t.isrc, &t.record)
}

func (t *playsRows) reset(n int) {
	t.loc.reset(n)
	trunc(n, t.strs()...)
	trunc(n, &t.v, &t.position)
	trunc(n, &t.mixID, &t.overlapMS, &t.derivedAt, &t.trackID, &t.playedAt, &t.playLength)
	trunc(n, &t.belowMin, &t.noUserID, &t.standbyListing)
	trunc(n, &t.eventAt)
}

func (t *deliveriesRows) strs() []*[]string {
	return append(t.loc.strs(), &t.reportID, &t.eventID, &t.outcome, &t.servedBy, &t.partner, &t.message, &t.retryReason, &t.traceID, &t.replayID, &t.replayReason, &t.doubtCause)
}

func (t *deliveriesRows) reset(n int) {
	t.loc.reset(n)
	trunc(n, t.strs()...)
	trunc(n, &t.v, &t.attempt, &t.httpStatus)
	trunc(n, &t.fields)
	trunc(n, &t.latencyUS, &t.atMS)
	trunc(n, &t.replay, &t.inDoubt)
}

func (t *rejectionsRows) strs() []*[]string {
	return append(t.loc.strs(), &t.traceID, &t.eventID, &t.reason, &t.srcTopic, &t.srcTopicID, &t.raw)
}

func (t *rejectionsRows) reset(n int) {
	t.loc.reset(n)
	trunc(n, t.strs()...)
	trunc(n, &t.vReasons, &t.vFields, &t.vDetails)
	trunc(n, &t.v, &t.srcPart)
	trunc(n, &t.srcOffset, &t.atMS)
}

func (t *malformedRows) strs() []*[]string {
	return append(t.loc.strs(), &t.key, &t.errText, &t.raw)
}

func (t *malformedRows) reset(n int) {
	t.loc.reset(n)
	trunc(n, t.strs()...)
}

func (b *batch) tables() []table {
	return []table{&b.events, &b.plays, &b.deliveries, &b.rejections, &b.malformed}
}

// add decodes one record into its table. It never fails: a record that is
// not what its topic promises goes to the malformed table (or, for events,
// to events with parsed = 0).
func (b *batch) add(r *kgo.Record) { b.addGen(r, b.topicIDs[r.Topic]) }

// addGen is add of a record of the topic generation topicID (its fetch's
// topic id; "" when the broker reports none).
func (b *batch) addGen(r *kgo.Record, topicID string) {
	b.records++
	ps := b.next[r.Topic]
	if ps == nil {
		ps = map[int32]kgo.EpochOffset{}
		b.next[r.Topic] = ps
	}
	if cur, ok := ps[r.Partition]; !ok || r.Offset+1 > cur.Offset {
		ps[r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
	}
	switch r.Topic {
	case b.topics.Events:
		b.events.add(r, topicID, &b.event)
	case b.topics.Reports:
		raw := recordString(r.Value) // no copy: the decoded strings are slices of it
		p := &b.play
		if err := lenient(schemas.DecodeTrackPlay(raw, p)); err != nil {
			b.malformed.add(r, topicID, err)
			return
		}
		if p.ReportID == "" {
			b.malformed.add(r, topicID, errors.New("track play without report_id"))
			return
		}
		b.plays.add(r, topicID, p, raw)
	case b.topics.Deliveries:
		if kafkax.HasHeader(r, schemas.HeaderLease) {
			return // the reporter's lease markers: not deliveries (schemas.HeaderLease)
		}
		d := &b.delivery
		if err := lenient(schemas.DecodeDelivery(recordString(r.Value), d)); err != nil {
			b.malformed.add(r, topicID, err)
			return
		}
		if d.ReportID == "" {
			b.malformed.add(r, topicID, errors.New("delivery without report_id"))
			return
		}
		b.deliveries.add(r, topicID, d)
	case b.topics.Rejected:
		j := &b.reject
		if err := lenient(schemas.DecodeRejection(recordString(r.Value), j)); err != nil {
			b.malformed.add(r, topicID, err)
			return
		}
		b.rejections.add(r, topicID, b.topicIDs[j.Source.Topic], j)
	default:
		b.malformed.add(r, topicID, errors.New("record of a topic the sink does not know"))
	}
}

// lenient is the sink's reading of a record decoder's error: a field of the
// wrong type is left as encoding/json leaves it (the record's bytes are
// kept verbatim anyway); only bytes that are not a JSON object are an error.
func lenient(err error) error {
	if err == nil {
		return nil // before errors.As: its target escapes (an allocation per record)
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return nil
	}
	return err
}

// recordString returns the bytes of a fetched record (its key, value or a
// header's value) as a string without copying them, for the decoders (whose
// strings are then slices of it) and for the String columns, which keep
// such views until the batch is inserted (the driver's Append copies them
// into its own columns) and zero them when the batch is reset (trunc).
// The bytes are the project's: PollRecords hands each record to the caller.
// That is safe because nothing writes to them afterwards: franz-go
// allocates every fetch's buffers anew and never reuses them (the sink
// configures no kgo.WithPools), and the sink never modifies a record. The
// views pin the fetched buffers of a batch's records until the batch is
// inserted and reset, which the queue bounds (SinkConfig.QueueBatches: at
// most QueueBatches + 2 batches' records); the decoding scratch values keep
// the last record of their type.
func recordString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// traceIDOf returns the trace id of a W3C traceparent header
// (00-<32 hex trace id>-<16 hex span id>-<flags>), or "".
func traceIDOf(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == "traceparent" && len(h.Value) >= 55 && h.Value[2] == '-' && h.Value[35] == '-' {
			return recordString(h.Value[3:35])
		}
	}
	return ""
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
