package analytics

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// A record's identity in the ledger is (kafka_topic_id, kafka_topic,
// kafka_partition, kafka_offset): a Kafka location names a record only
// within one life of its topic (a topic deleted and created again, or a
// broker that came back empty, starts its offsets again at 0), so the
// topic's id (KIP-516), which the broker gives every topic it creates, is
// part of it: every count of the audit is over distinct identities, and
// the sorting keys hold it (migration 6). docs/audit.md, "A record's
// identity".

// TopicGenerations is a topic of which the window holds records of more
// than one generation (topic id), or locations whose records cannot be
// told apart.
type TopicGenerations struct {
	Topic       string            `json:"topic"`
	Generations []TopicGeneration `json:"generations"`
	// Clashes are locations holding two different records under one
	// identity: two lives of the topic on a broker that reports no topic
	// ids (both '') — the counts cannot tell them apart. A problem.
	Clashes uint64 `json:"locations_with_two_records"`
	// UnknownOverlaps are locations holding a row of the unknown generation
	// ('': written before schema version 6) and a row of a known one with
	// the same content: probably one record copied before and after the
	// upgrade, counted twice. A problem.
	UnknownOverlaps uint64 `json:"locations_unknown_and_known"`
}

// TopicGeneration is one generation of a topic in the window.
type TopicGeneration struct {
	ID      string    `json:"topic_id"` // "": unknown (rows before schema version 6, or a broker without topic ids)
	First   time.Time `json:"first_record"`
	Records uint64    `json:"records"` // distinct locations of this generation in the window
}

// generationSources are the ledger tables with the expression of a row's
// content (what two records at one location would differ in).
var generationSources = []struct{ table, content string }{
	{TableEvents, "cityHash64(raw, kafka_key)"},
	{TablePlays, "cityHash64(record)"},
	{TableDeliveries, "cityHash64(report_id, outcome, attempt, at_ms, trace_id, message)"},
	{TableRejections, "cityHash64(raw, reason, event_id, at_ms)"},
	{TableMalformed, "cityHash64(raw, kafka_key, error)"},
}

// maxGenerations bounds the generations (and contents) of one location
// the audit tells apart: a location of more is counted as of this many.
const maxGenerations = "8"

// generations finds the topics of the window with more than one
// generation, or with locations that hold records it cannot tell apart.
func (a *Auditor) generations(ctx context.Context, o AuditOptions, r *Audit) error {
	// First the generations of each topic of the window, one scan with a
	// group per (topic, id). A topic of one known generation is counted
	// unambiguously (its id and location name one record) and is not
	// reported: only the topics with an unknown generation ('') or more
	// than one are read further.
	detail, err := a.generationTopics(ctx, o)
	if err != nil || len(detail) == 0 {
		return err
	}
	// Their records are grouped by location in parts (offset modulo
	// parts): a location lies in one part, so the counts add up, and no
	// query groups more than about 2·SliceReports records.
	parts := 1 + (2*r.PlayRecords+r.EventsReceived)/(2*a.limits.withDefaults().SliceReports)
	topics := make([]string, 0, len(detail))
	for _, t := range detail {
		topics = append(topics, quoteSQL(t))
	}
	inTopics := " AND kafka_topic IN (" + strings.Join(topics, ", ") + ")"
	byTopic := map[string]*TopicGenerations{}
	byGen := map[string]*TopicGeneration{}
	var order []string
	get := func(topic string) *TopicGenerations {
		tg := byTopic[topic]
		if tg == nil {
			tg = &TopicGenerations{Topic: topic, Generations: []TopicGeneration{}}
			byTopic[topic] = tg
			order = append(order, topic)
		}
		return tg
	}
	var gensOrder []string
	for part := uint64(0); part < parts; part++ {
		w := window(o) + inTopics
		if parts > 1 {
			w += fmt.Sprintf(" AND kafka_offset %% %d = %d", parts, part)
		}
		var gens, locs []string
		for _, s := range generationSources {
			gens = append(gens, `SELECT kafka_topic, kafka_topic_id, kafka_partition, kafka_offset, kafka_time_ms FROM `+a.db+`.`+s.table+` WHERE `+w)
			// Per location: its distinct generations and contents, exact up
			// to maxGenerations each (uniqUpTo's small fixed state, not a
			// hash set per location: this groups every record of the
			// window), and whether the unknown generation ('', the least
			// string) is one.
			locs = append(locs, `SELECT kafka_topic, kafka_partition, kafka_offset, min(kafka_topic_id) = '' AS unknown,
        uniqUpTo(`+maxGenerations+`)(kafka_topic_id) AS ids, uniqUpTo(`+maxGenerations+`)(`+s.content+`) AS contents
    FROM `+a.db+`.`+s.table+` WHERE `+w+` GROUP BY kafka_topic, kafka_partition, kafka_offset`)
		}
		err = a.query(ctx, `SELECT CAST(kafka_topic AS String) AS topic, kafka_topic_id, min(kafka_time_ms) AS first, uniqExact(kafka_partition, kafka_offset)
FROM (`+strings.Join(gens, "\n    UNION ALL ")+`) AS records
GROUP BY topic, kafka_topic_id ORDER BY topic, first, kafka_topic_id`, func(rows driver.Rows) error {
			var topic string
			var g TopicGeneration
			var first uint64
			if err := rows.Scan(&topic, &g.ID, &first, &g.Records); err != nil {
				return err
			}
			g.First = time.UnixMilli(int64(first)).UTC()
			get(topic)
			key := topic + "\x00" + g.ID
			if p := byGen[key]; p != nil {
				p.Records += g.Records
				if g.First.Before(p.First) {
					p.First = g.First
				}
				return nil
			}
			byGen[key] = &g
			gensOrder = append(gensOrder, key)
			return nil
		})
		if err != nil {
			return fmt.Errorf("analytics: audit generations: %w", err)
		}
		err = a.query(ctx, `SELECT CAST(kafka_topic AS String) AS topic,
    countIf(ids = 1 AND contents > 1),
    countIf(unknown AND ids > 1 AND contents < ids)
FROM (`+strings.Join(locs, "\n    UNION ALL ")+`) AS locations
GROUP BY topic ORDER BY topic`, func(rows driver.Rows) error {
			var topic string
			var clashes, unknown uint64
			if err := rows.Scan(&topic, &clashes, &unknown); err != nil {
				return err
			}
			if clashes > 0 || unknown > 0 {
				tg := get(topic)
				tg.Clashes += clashes
				tg.UnknownOverlaps += unknown
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("analytics: audit generations: %w", err)
		}
	}
	// Each topic's generations by first record, then id (as one query
	// over the whole window orders them).
	for _, key := range gensOrder {
		topic, _, _ := strings.Cut(key, "\x00")
		tg := byTopic[topic]
		tg.Generations = append(tg.Generations, *byGen[key])
	}
	for _, tg := range byTopic {
		sort.Slice(tg.Generations, func(i, j int) bool {
			gi, gj := tg.Generations[i], tg.Generations[j]
			if !gi.First.Equal(gj.First) {
				return gi.First.Before(gj.First)
			}
			return gi.ID < gj.ID
		})
	}
	sort.Strings(order)
	r.Generations = []TopicGenerations{}
	for _, t := range order {
		if tg := byTopic[t]; len(tg.Generations) > 1 || tg.Clashes > 0 || tg.UnknownOverlaps > 0 {
			r.Generations = append(r.Generations, *tg)
		}
	}
	return nil
}

// generationTopics are the topics of the window with the unknown
// generation (the empty id) or more than one, in order.
func (a *Auditor) generationTopics(ctx context.Context, o AuditOptions) ([]string, error) {
	var gens []string
	for _, s := range generationSources {
		gens = append(gens, `SELECT kafka_topic, kafka_topic_id FROM `+a.db+`.`+s.table+` WHERE `+window(o))
	}
	var out []string
	err := a.query(ctx, `SELECT topic FROM (
    SELECT CAST(kafka_topic AS String) AS topic, groupUniqArray(kafka_topic_id) AS ids
    FROM (`+strings.Join(gens, "\n    UNION ALL ")+`) AS records GROUP BY topic)
WHERE length(ids) > 1 OR has(ids, '') ORDER BY topic`, func(rows driver.Rows) error {
		var t string
		if err := rows.Scan(&t); err != nil {
			return err
		}
		out = append(out, t)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("analytics: audit generations: %w", err)
	}
	return out, nil
}

// generationNotes are the audit's lines about topics with more than one
// generation in the window: what happened and how it was counted.
func (r Audit) generationNotes() []string {
	var out []string
	for _, tg := range r.Generations {
		if len(tg.Generations) < 2 {
			continue
		}
		var gs []string
		for _, g := range tg.Generations {
			id := g.ID
			if id == "" {
				id = "unknown (rows before schema version 6, or a broker without topic ids)"
			}
			gs = append(gs, fmt.Sprintf("id %s from %s, %d records", id, g.First.Format(time.RFC3339), g.Records))
		}
		out = append(out, fmt.Sprintf("topic %s holds %d generations in the window (the topic was created again, its offsets restarted: %s); every record is counted once by (topic id, partition, offset)",
			tg.Topic, len(tg.Generations), strings.Join(gs, "; ")))
	}
	return out
}

// generationProblems are the locations whose records the audit cannot
// tell apart: its counts are ambiguous there.
func (r Audit) generationProblems() []string {
	var out []string
	for _, tg := range r.Generations {
		if tg.Clashes > 0 {
			out = append(out, fmt.Sprintf("topic %s: %d locations hold two different records of one generation (the topic re-created on a broker without topic ids?): the counts of the window cannot tell them apart", tg.Topic, tg.Clashes))
		}
		if tg.UnknownOverlaps > 0 {
			out = append(out, fmt.Sprintf("topic %s: %d records are in the ledger under an unknown generation (before schema version 6) and a known one: they may be counted twice", tg.Topic, tg.UnknownOverlaps))
		}
	}
	return out
}

// generationRows are the CSV rows of the topics with more than one
// generation or records it cannot tell apart: per generation its records
// (key "<topic> <id>", the id "unknown" for the empty one), and the two
// counts.
func (r Audit) generationRows() [][]string {
	var out [][]string
	for _, tg := range r.Generations {
		for _, g := range tg.Generations {
			id := g.ID
			if id == "" {
				id = "unknown"
			}
			out = append(out, []string{"generations", "records of a topic generation (topic id) since " + g.First.Format(time.RFC3339), tg.Topic + " " + id, strconv.FormatUint(g.Records, 10), ""})
		}
		out = append(out, []string{"generations", "locations with two records of one generation", tg.Topic, strconv.FormatUint(tg.Clashes, 10), ""},
			[]string{"generations", "records under the unknown and a known generation", tg.Topic, strconv.FormatUint(tg.UnknownOverlaps, 10), ""})
	}
	return out
}
