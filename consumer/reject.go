package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/schemas"
)

func (p *processor) reject(ctx context.Context, it *item, nowMS int64) {
	p.rejectBounded(ctx, it, nowMS, schemas.MaxRejectionRaw)
}

// rejectBounded is reject keeping at most maxRaw encoded bytes of the event.
func (p *processor) rejectBounded(ctx context.Context, it *item, nowMS int64, maxRaw int) {
	src := schemas.Source{Topic: it.rec.Topic, Partition: it.rec.Partition, Offset: it.rec.Offset}
	rej := schemas.NewRejectionBounded(it.rec.Value, it.ev.EventID, it.vs, src, nowMS, maxRaw)
	if rej.EventID == "" {
		rej.EventID = bestEffortEventID(it.rec.Value)
	}
	b, err := json.Marshal(rej)
	if err != nil { // cannot happen: plain strings and integers
		b = []byte(`{"v":1,"reason":"` + rej.Reason + `"}`)
	}
	r := p.newRecord(p.topics.Rejected)
	r.Key = it.rec.Key
	r.Value = b
	telemetry.Inject(ctx, r)
	p.out = append(p.out, r)
	p.pending.Rejected++
	p.rejectedByReason[rej.Reason]++
}

// bestEffortEventID reads event_id from an event that failed validation, so
// the ledger can name it: the first member spelled exactly "event_id" (as
// ParseEvent reads keys: a case variant such as "EVENT_ID" is not it); ""
// when it has none usable.
func bestEffortEventID(raw []byte) string {
	if !json.Valid(raw) {
		return "" // a truncated copy may start like another, valid event
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return ""
		}
		if tok == "event_id" {
			var s string
			if json.Unmarshal(v, &s) != nil || len(s) > schemas.MaxEventIDLen {
				return ""
			}
			return s
		}
	}
	return ""
}

// mixViolation is the violation of an event whose mix lookup gave err (one
// of the rejectsEvents errors).
func mixViolation(id int64, err error) []schemas.Violation {
	if errors.Is(err, ErrMixUnavailable) {
		return []schemas.Violation{{Field: "mix_id", Reason: schemas.ReasonMixUnavailable, Detail: trunc(err.Error(), 300)}}
	}
	return []schemas.Violation{{Field: "mix_id", Reason: schemas.ReasonUnknownMix,
		Detail: fmt.Sprintf("the partner API answered 404 for mix %d", id)}}
}
