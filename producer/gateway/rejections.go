package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/schemas"
)

// ReasonTooLarge is the reason of an event larger than the gateway's event
// size limit (Config.MaxEventBytes, --max-event-bytes): the
// consumer's reason for the events it refuses by size.
const ReasonTooLarge = schemas.ReasonTooLarge

// Bounds of the rejection records the gateway writes. Kafka refuses records
// over 1 MiB (message.max.bytes; franz-go's default batch limit is 1 000 012
// bytes), and a refused record that can never be written turns an answer
// into "retry" forever; so every record is bounded well below that.
const (
	// RejectionRawBound is the most bytes of a refused event kept in the raw
	// field of its rejection record (schemas.MaxRejectionRaw of JSON-encoded
	// text). The record always carries the full length and SHA-256 of the
	// event.
	RejectionRawBound = schemas.MaxRejectionRaw
	// MaxRejectionRecordBytes bounds the encoded value of a rejection record
	// the gateway writes: the bounded raw field plus the violations, whose
	// details are cut when they alone would pass it.
	MaxRejectionRecordBytes = 512 << 10
	// maxDetailBytes bounds each violation's detail in a rejection record.
	maxDetailBytes = 512
)

// encodeRejection returns the JSON of the bounded rejection record of raw
// (schemas.NewRejection): at most MaxRejectionRecordBytes long, whatever raw
// and vs hold.
func encodeRejection(raw []byte, eventID string, vs []schemas.Violation, src schemas.Source, atMS int64) ([]byte, error) {
	for trimmed := false; ; trimmed = true {
		val, err := json.Marshal(schemas.NewRejection(raw, eventID, vs, src, atMS))
		if err != nil {
			return nil, fmt.Errorf("gateway: encode rejection: %w", err)
		}
		if len(val) <= MaxRejectionRecordBytes {
			return val, nil
		}
		if trimmed {
			return nil, fmt.Errorf("gateway: rejection record of %d bytes exceeds %d bytes even with its details cut", len(val), MaxRejectionRecordBytes)
		}
		vs = trimViolations(vs) // the violations alone are too long: shorten their details
	}
}

// trimViolations returns vs with at most 32 violations, each detail cut to maxDetailBytes.
func trimViolations(vs []schemas.Violation) []schemas.Violation {
	out := make([]schemas.Violation, 0, min(len(vs), 32))
	for i, v := range vs {
		if i == 32 {
			break
		}
		if len(v.Detail) > maxDetailBytes {
			d := v.Detail[:maxDetailBytes]
			for len(d) > 0 && !utf8.ValidString(d) {
				d = d[:len(d)-1]
			}
			v.Detail = d + "…"
		}
		if len(v.Field) > maxDetailBytes {
			v.Field = v.Field[:maxDetailBytes]
		}
		out = append(out, v)
	}
	return out
}

// refusal is one refused event of a request whose rejection record the
// gateway writes.
type refusal struct {
	index   int // in the request
	raw     []byte
	eventID string
	vs      []schemas.Violation
}

// recordRefusals writes the bounded rejection record of every refusal to the
// rejected topic (source "ingest", partition and offset -1, key = the event
// id when it has one) and returns, per refusal, the error of its record.
func (g *Gateway) recordRefusals(ctx context.Context, fleet string, refused []refusal, atMS int64) []error {
	errs := make([]error, len(refused))
	recs := make([]*kgo.Record, 0, len(refused))
	idx := make([]int, 0, len(refused))
	src := schemas.Source{Topic: IngestSource, Partition: -1, Offset: -1}
	for i, r := range refused {
		val, err := encodeRejection(r.raw, r.eventID, r.vs, src, atMS)
		if err != nil { // cannot happen for these bounds; never drop silently
			errs[i] = err
			continue
		}
		rec := &kgo.Record{Topic: g.cfg.RejectedTopic, Value: val}
		if r.eventID != "" {
			rec.Key = []byte(r.eventID) // without one, spread over partitions
		}
		telemetry.Inject(ctx, rec)
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "fleet", Value: []byte(fleet)})
		recs = append(recs, rec)
		idx = append(idx, i)
	}
	for j, err := range g.cfg.Publisher.WriteRecords(ctx, recs) {
		errs[idx[j]] = err
	}
	return errs
}

// errRejectionLost marks an answer whose rejection record is not on Kafka.
var errRejectionLost = errors.New("refused, but its rejection record could not be written to Kafka")
