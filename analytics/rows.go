package analytics

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"time"

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

// loc is the Kafka location and time columns every table starts with.
type loc struct {
	topic  []string
	part   []int32
	offset []int64
	ts     []time.Time
	tsMS   []uint64
}

const locCols = "kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms"

func (l *loc) add(r *kgo.Record) {
	l.topic = append(l.topic, r.Topic)
	l.part = append(l.part, r.Partition)
	l.offset = append(l.offset, r.Offset)
	l.ts = append(l.ts, r.Timestamp)
	ms := r.Timestamp.UnixMilli()
	if ms < 0 {
		ms = 0
	}
	l.tsMS = append(l.tsMS, uint64(ms))
}

func (l *loc) cols() []any { return []any{l.topic, l.part, l.offset, l.ts, l.tsMS} }

func (l *loc) n() int { return len(l.topic) }

// table is the column buffer of one ledger table.
type table interface {
	name() string
	columns() string // the INSERT column list
	values() []any   // one slice per column, in columns() order
	n() int
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

// eventFields are the columns extracted from an event; a field of the wrong
// type is left empty (the event itself is in rejections, with its reason).
type eventFields struct {
	EventID    string `json:"event_id"`
	MixID      int64  `json:"mix_id"`
	StartedAt  int64  `json:"started_at"`
	OffsetMS   int64  `json:"offset_ms"`
	DurationMS int64  `json:"duration_ms"`
	UserID     string `json:"user_id"`
	Country    string `json:"country"`
}

func (t *eventsRows) add(r *kgo.Record) {
	t.loc.add(r)
	var f eventFields
	parsed := uint8(0)
	err := json.Unmarshal(r.Value, &f)
	var typeErr *json.UnmarshalTypeError
	if err == nil || errors.As(err, &typeErr) {
		parsed = 1
	}
	t.key = append(t.key, string(r.Key))
	t.traceID = append(t.traceID, traceIDOf(r))
	t.parsed = append(t.parsed, parsed)
	t.eventID = append(t.eventID, f.EventID)
	t.mixID = append(t.mixID, f.MixID)
	t.startedAt = append(t.startedAt, f.StartedAt)
	t.offsetMS = append(t.offsetMS, f.OffsetMS)
	t.durationMS = append(t.durationMS, f.DurationMS)
	t.userID = append(t.userID, f.UserID)
	t.country = append(t.country, f.Country)
	t.raw = append(t.raw, string(r.Value))
}

type playsRows struct {
	loc
	traceID                                    []string
	v                                          []int32
	reportID, eventID                          []string
	mixID                                      []int64
	position                                   []int32
	overlapMS                                  []int64
	belowMin, noUserID, standbyListing         []uint8
	derivedAt, trackID, playedAt, playLength   []int64
	userID, country, os, device                []string
	vendor                                     []int64
	sourceStream, sourceDetail, isrc, reportJS []string
}

func (t *playsRows) name() string { return TablePlays }
func (t *playsRows) columns() string {
	return locCols + ", trace_id, v, report_id, event_id, mix_id, position, overlap_ms, below_minimum, no_user_id, standby_listing, derived_at_ms, track_id, played_at_ms, play_length, user_id, country, os, device, vendor, source_stream, source_detail, isrc, report_json"
}
func (t *playsRows) values() []any {
	return append(t.cols(), t.traceID, t.v, t.reportID, t.eventID, t.mixID, t.position, t.overlapMS, t.belowMin, t.noUserID, t.standbyListing,
		t.derivedAt, t.trackID, t.playedAt, t.playLength, t.userID, t.country, t.os, t.device, t.vendor, t.sourceStream, t.sourceDetail, t.isrc, t.reportJS)
}

// playRecord decodes a TrackPlay keeping the report's exact bytes.
type playRecord struct {
	schemas.TrackPlay
	Report json.RawMessage `json:"report"`
}

func (t *playsRows) add(r *kgo.Record, p *playRecord, rep *reportFields) {
	t.loc.add(r)
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
	t.trackID = append(t.trackID, rep.TrackID)
	t.playedAt = append(t.playedAt, rep.PlayedAt)
	t.playLength = append(t.playLength, rep.PlayLength)
	t.userID = append(t.userID, rep.UserID)
	t.country = append(t.country, rep.Country)
	t.os = append(t.os, rep.OS)
	t.device = append(t.device, rep.Device)
	t.vendor = append(t.vendor, rep.Vendor)
	t.sourceStream = append(t.sourceStream, rep.SourceStream)
	t.sourceDetail = append(t.sourceDetail, rep.SourceDetail)
	t.isrc = append(t.isrc, rep.ISRC)
	t.reportJS = append(t.reportJS, string(p.Report))
}

// reportFields are the columns taken from the report body (lenient: a field
// of the wrong type is left empty, the body itself is kept verbatim).
type reportFields struct {
	TrackID      int64  `json:"trackid"`
	PlayedAt     int64  `json:"playedat"`
	PlayLength   int64  `json:"playlength"`
	SourceStream string `json:"sourcestream"`
	SourceDetail string `json:"sourcedetail"`
	OS           string `json:"os"`
	Device       string `json:"device"`
	Country      string `json:"country"`
	Vendor       int64  `json:"vendor"`
	UserID       string `json:"userid"`
	ISRC         string `json:"isrc"`
}

type deliveriesRows struct {
	loc
	v                          []int32
	reportID, eventID, outcome []string
	attempt, httpStatus        []int32
	servedBy, message          []string
	fields                     [][]string
	retryReason                []string
	latencyUS                  []int64
	traceID                    []string
	replay                     []uint8
	atMS                       []int64
}

func (t *deliveriesRows) name() string { return TableDeliveries }
func (t *deliveriesRows) columns() string {
	return locCols + ", v, report_id, event_id, outcome, attempt, http_status, served_by, message, fields, retry_reason, latency_us, trace_id, replay, at_ms"
}
func (t *deliveriesRows) values() []any {
	return append(t.cols(), t.v, t.reportID, t.eventID, t.outcome, t.attempt, t.httpStatus, t.servedBy, t.message, t.fields, t.retryReason, t.latencyUS, t.traceID, t.replay, t.atMS)
}

func (t *deliveriesRows) add(r *kgo.Record, d *schemas.Delivery) {
	t.loc.add(r)
	t.v = append(t.v, int32(d.V))
	t.reportID = append(t.reportID, d.ReportID)
	t.eventID = append(t.eventID, d.EventID)
	t.outcome = append(t.outcome, d.Outcome)
	t.attempt = append(t.attempt, int32(d.Attempt))
	t.httpStatus = append(t.httpStatus, int32(d.HTTPStatus))
	t.servedBy = append(t.servedBy, d.ServedBy)
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
	t.atMS = append(t.atMS, d.At)
}

type rejectionsRows struct {
	loc
	traceID           []string
	v                 []int32
	eventID, reason   []string
	vReasons, vFields [][]string
	violationsJSON    []string
	srcTopic          []string
	srcPart           []int32
	srcOffset, atMS   []int64
	raw               []string
}

func (t *rejectionsRows) name() string { return TableRejections }
func (t *rejectionsRows) columns() string {
	return locCols + ", trace_id, v, event_id, reason, violation_reasons, violation_fields, violations_json, src_topic, src_partition, src_offset, at_ms, raw"
}
func (t *rejectionsRows) values() []any {
	return append(t.cols(), t.traceID, t.v, t.eventID, t.reason, t.vReasons, t.vFields, t.violationsJSON, t.srcTopic, t.srcPart, t.srcOffset, t.atMS, t.raw)
}

// rejectionRecord keeps the violations' exact JSON.
type rejectionRecord struct {
	schemas.Rejection
	ViolationsRaw json.RawMessage `json:"violations"`
}

func (t *rejectionsRows) add(r *kgo.Record, j *rejectionRecord) {
	t.loc.add(r)
	t.traceID = append(t.traceID, traceIDOf(r))
	t.v = append(t.v, int32(j.V))
	t.eventID = append(t.eventID, j.EventID)
	t.reason = append(t.reason, j.Reason)
	var vs []schemas.Violation
	_ = json.Unmarshal(j.ViolationsRaw, &vs)
	reasons, fields := make([]string, len(vs)), make([]string, len(vs))
	for i, v := range vs {
		reasons[i], fields[i] = v.Reason, v.Field
	}
	t.vReasons = append(t.vReasons, reasons)
	t.vFields = append(t.vFields, fields)
	t.violationsJSON = append(t.violationsJSON, string(j.ViolationsRaw))
	t.srcTopic = append(t.srcTopic, j.Source.Topic)
	t.srcPart = append(t.srcPart, j.Source.Partition)
	t.srcOffset = append(t.srcOffset, j.Source.Offset)
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

func (t *malformedRows) add(r *kgo.Record, err error) {
	t.loc.add(r)
	t.key = append(t.key, string(r.Key))
	t.errText = append(t.errText, err.Error())
	t.raw = append(t.raw, string(r.Value))
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
	// next is the offset to commit per topic and partition (last + 1).
	next map[string]map[int32]kgo.EpochOffset
}

func newBatch(t kafkax.Topics) *batch {
	return &batch{topics: t, next: map[string]map[int32]kgo.EpochOffset{}}
}

func (b *batch) tables() []table {
	return []table{&b.events, &b.plays, &b.deliveries, &b.rejections, &b.malformed}
}

// add decodes one record into its table. It never fails: a record that is
// not what its topic promises goes to the malformed table (or, for events,
// to events with parsed = 0).
func (b *batch) add(r *kgo.Record) {
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
		b.events.add(r)
	case b.topics.Reports:
		var p playRecord
		if err := json.Unmarshal(r.Value, &p); err != nil {
			b.malformed.add(r, err)
			return
		}
		if p.ReportID == "" {
			b.malformed.add(r, errors.New("track play without report_id"))
			return
		}
		var rep reportFields
		_ = json.Unmarshal(p.Report, &rep) // lenient: the body is kept verbatim
		b.plays.add(r, &p, &rep)
	case b.topics.Deliveries:
		var d schemas.Delivery
		if err := json.Unmarshal(r.Value, &d); err != nil {
			b.malformed.add(r, err)
			return
		}
		if d.ReportID == "" {
			b.malformed.add(r, errors.New("delivery without report_id"))
			return
		}
		b.deliveries.add(r, &d)
	case b.topics.Rejected:
		var j rejectionRecord
		if err := json.Unmarshal(r.Value, &j); err != nil {
			b.malformed.add(r, err)
			return
		}
		b.rejections.add(r, &j)
	default:
		b.malformed.add(r, errors.New("record of a topic the sink does not know"))
	}
}

// traceIDOf returns the trace id of a W3C traceparent header
// (00-<32 hex trace id>-<16 hex span id>-<flags>), or "".
func traceIDOf(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == "traceparent" && len(h.Value) >= 55 && h.Value[2] == '-' && h.Value[35] == '-' {
			return string(h.Value[3:35])
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
