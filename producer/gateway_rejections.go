package producer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/schemas"
)

// ReasonTooLarge is the reason of an event larger than the gateway's event
// size limit (GatewayConfig.MaxEventBytes, --max-event-bytes). The consumer
// uses the same reason for the events it refuses by size.
const ReasonTooLarge = "too_large"

// Bounds of the rejection records the gateway writes. Kafka refuses records
// over 1 MiB (message.max.bytes; franz-go's default batch limit is 1 000 012
// bytes), and a refused record that can never be written turns an answer
// into "retry" forever; so every record is bounded well below that.
const (
	// RejectionRawBound is the most bytes of a refused event kept in the raw
	// field of its rejection record (less when escaping would push the
	// record over MaxRejectionRecordBytes). The record always carries the
	// full length and SHA-256 of the event.
	RejectionRawBound = 64 << 10
	// MaxRejectionRecordBytes bounds the encoded value of a rejection record
	// the gateway writes. JSON escaping can grow the raw bytes six-fold
	// (a control byte becomes \u0001), so the raw part is cut until the
	// encoded record fits.
	MaxRejectionRecordBytes = 512 << 10
	// maxDetailBytes bounds each violation's detail in a rejection record.
	maxDetailBytes = 512
)

// ingestRejection is the rejection record the gateway writes: a
// schemas.Rejection whose raw bytes are bounded, plus their full length,
// their SHA-256 and whether Raw holds only a prefix of them.
//
// The fields are the gateway's own until schemas.Rejection carries bounded
// raw fields itself; decoders of schemas.Rejection ignore them (unknown
// fields are allowed in every playpipe record).
type ingestRejection struct {
	schemas.Rejection
	// RawLen is the length of the event in bytes, whatever Raw holds.
	RawLen int `json:"raw_len"`
	// RawSHA256 is the hex SHA-256 of the whole event.
	RawSHA256 string `json:"raw_sha256"`
	// RawTruncated is true when Raw holds only a prefix of the event (cut at
	// a UTF-8 character boundary when the event is valid UTF-8).
	RawTruncated bool `json:"raw_truncated,omitempty"`
}

// encodeRejection returns the JSON of the bounded rejection record of raw:
// at most MaxRejectionRecordBytes long, whatever raw and vs hold.
func encodeRejection(raw []byte, eventID string, vs []schemas.Violation, src schemas.Source, atMS int64) ([]byte, error) {
	sum := sha256.Sum256(raw)
	valid := utf8.Valid(raw)
	keep := min(len(raw), RejectionRawBound)
	trimmed := false
	for {
		cut := raw[:keep]
		if valid { // keep the prefix valid UTF-8, or it would be stored as base64
			for len(cut) > 0 && len(cut) < len(raw) && !utf8.RuneStart(raw[len(cut)]) {
				cut = cut[:len(cut)-1]
			}
		}
		rej := ingestRejection{
			Rejection:    schemas.NewRejection(cut, eventID, vs, src, atMS),
			RawLen:       len(raw),
			RawSHA256:    hex.EncodeToString(sum[:]),
			RawTruncated: len(cut) < len(raw),
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false) // '<' stays one byte, not six
		if err := enc.Encode(&rej); err != nil {
			return nil, fmt.Errorf("producer: encode rejection: %w", err)
		}
		val := bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
		if len(val) <= MaxRejectionRecordBytes {
			return val, nil
		}
		switch {
		case keep > 0:
			keep /= 2
		case !trimmed: // the violations alone are too long: shorten their details
			vs = trimViolations(vs)
			trimmed = true
		default:
			return nil, fmt.Errorf("producer: rejection record of %d bytes exceeds %d bytes even without the raw event", len(val), MaxRejectionRecordBytes)
		}
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

// writeRecords produces recs through the Publisher's client and waits until
// Kafka acknowledged or failed each; errs[i] is the error of recs[i]. Like
// Publish, it fails with ErrClosed once the Publisher is closed, and Close
// waits for it.
func (p *Publisher) writeRecords(ctx context.Context, recs []*kgo.Record) []error {
	errs := make([]error, len(recs))
	if len(recs) == 0 {
		return errs
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		for i := range errs {
			errs[i] = ErrClosed
		}
		return errs
	}
	p.inflight.Add(1)
	p.mu.Unlock()
	defer p.inflight.Done()
	var wg sync.WaitGroup
	for i, rec := range recs {
		wg.Add(1)
		p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				errs[i] = &PublishError{Topic: rec.Topic, Err: err}
			}
			wg.Done()
		})
	}
	wg.Wait()
	return errs
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
	for j, err := range g.cfg.Publisher.writeRecords(ctx, recs) {
		errs[idx[j]] = err
	}
	return errs
}

// errRejectionLost marks an answer whose rejection record is not on Kafka.
var errRejectionLost = errors.New("refused, but its rejection record could not be written to Kafka")
