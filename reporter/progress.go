package reporter

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// progress is what the reporter knows of one partition beyond its commit
// point, stored in the offset commit's metadata so that it survives the
// process (the approach of Confluent's Parallel Consumer, plus a pointer
// into the deliveries log for what happened after the commit).
//
// A committed progress is valid for any later restart: every record the
// reporter produced after taking it has an offset at or past LogOffset in
// the deliveries partition LogPartition (one producer, acknowledged in
// order), so reading that log tail on top of the progress gives the state
// at the crash. A commit that fails therefore costs only a longer tail.
type progress struct {
	// Base is the committed offset: every record below it is final.
	Base int64
	// LogPartition and LogOffset locate the tail of the deliveries log to
	// read on top of this progress: the first offset the reporter had not
	// seen acknowledged when it was taken.
	LogPartition int32
	LogOffset    int64
	// Done holds the offsets at or past Base that were final (their
	// Delivery record acknowledged, or final without one), sorted.
	Done []int64
	// Doubt holds the offsets at or past Base whose report may have reached
	// the partner without its answer being recorded: a post in flight, an
	// abandoned post, or a report already in doubt after a crash. Sorted.
	Doubt []int64
}

// progressPrefix starts every metadata string this version writes; others
// (franz-go writes the member id, older playpipe versions nothing) decode
// as "no progress".
const progressPrefix = "pp1."

// errNoProgress: the metadata was not written by this encoder.
var errNoProgress = errors.New("no playpipe progress in the commit metadata")

// Encodings of the Done set.
const (
	encRuns   = 0 // alternating run lengths, starting with a run of not-done offsets
	encBitset = 1 // one bit per offset from Base, least significant bit first
)

// encodeProgress returns the metadata string of p: the prefix and the
// unpadded URL-safe base64 of a varint encoding, with the Done set as runs
// or as a bitset, whichever is shorter. Its length is at most
// progressSize(span, len(Doubt)) for Done offsets below Base+span.
func encodeProgress(p *progress) string {
	b := make([]byte, 0, 64)
	b = append(b, 1) // format version
	b = binary.AppendUvarint(b, uint64(p.LogPartition))
	b = binary.AppendUvarint(b, uint64(p.LogOffset))
	var span int64
	if n := len(p.Done); n > 0 {
		span = p.Done[n-1] - p.Base + 1
	}
	b = binary.AppendUvarint(b, uint64(span))
	runs := appendRuns(nil, p.Base, p.Done)
	if bitsetLen := (span + 7) / 8; int64(len(runs)) <= bitsetLen {
		b = append(b, encRuns)
		b = binary.AppendUvarint(b, uint64(len(runs)))
		b = append(b, runs...)
	} else {
		b = append(b, encBitset)
		bits := make([]byte, bitsetLen)
		for _, o := range p.Done {
			i := o - p.Base
			bits[i/8] |= 1 << (i % 8)
		}
		b = append(b, bits...)
	}
	b = binary.AppendUvarint(b, uint64(len(p.Doubt)))
	prev := p.Base
	for _, o := range p.Doubt {
		b = binary.AppendUvarint(b, uint64(o-prev))
		prev = o
	}
	return progressPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// appendRuns appends the Done set as alternating uvarint run lengths from
// base: not done, done, not done, …
func appendRuns(dst []byte, base int64, done []int64) []byte {
	next := base // first offset not yet covered by a run
	for i := 0; i < len(done); {
		j := i + 1
		for j < len(done) && done[j] == done[j-1]+1 {
			j++
		}
		dst = binary.AppendUvarint(dst, uint64(done[i]-next))
		dst = binary.AppendUvarint(dst, uint64(j-i))
		next = done[j-1] + 1
		i = j
	}
	return dst
}

// progressSize bounds the length of an encoded progress whose Done offsets
// lie below Base+span and that holds doubts entries: the bitset bound,
// since the encoder never picks runs when they are longer.
func progressSize(span int64, doubts int) int {
	raw := 1 + 3*binary.MaxVarintLen64 + 1 + int((span+7)/8) + binary.MaxVarintLen64 + doubts*binary.MaxVarintLen64
	return len(progressPrefix) + base64.RawURLEncoding.EncodedLen(raw)
}

// decodeProgress parses metadata written by encodeProgress for the
// committed offset base. It returns errNoProgress for metadata of another
// writer, and an error for corrupt metadata.
func decodeProgress(meta string, base int64) (*progress, error) {
	s, ok := strings.CutPrefix(meta, progressPrefix)
	if !ok {
		return nil, errNoProgress
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("progress metadata: %w", err)
	}
	d := decoder{b: b}
	if v := d.byte(); v != 1 {
		return nil, fmt.Errorf("progress metadata: unknown format %d", v)
	}
	p := &progress{Base: base}
	p.LogPartition = int32(d.uvarint(1 << 31))
	p.LogOffset = int64(d.uvarint(1 << 62))
	span := int64(d.uvarint(1 << 40))
	switch d.byte() {
	case encRuns:
		n := int(d.uvarint(uint64(len(b))))
		end := d.i + n
		if end > len(b) {
			return nil, errors.New("progress metadata: runs past the end")
		}
		next := base
		for d.err == nil && d.i < end {
			next += int64(d.uvarint(uint64(span)))
			run := int64(d.uvarint(uint64(span)))
			if d.err == nil && (run == 0 || next+run > base+span) {
				d.err = errors.New("progress metadata: run outside the span")
			}
			for range run {
				p.Done = append(p.Done, next)
				next++
			}
		}
	case encBitset:
		n := int((span + 7) / 8)
		if d.i+n > len(b) {
			return nil, errors.New("progress metadata: bitset past the end")
		}
		for i, c := range b[d.i : d.i+n] {
			for bit := range 8 {
				if c&(1<<bit) != 0 {
					p.Done = append(p.Done, base+int64(i*8+bit))
				}
			}
		}
		d.i += n
	default:
		return nil, errors.New("progress metadata: unknown done-set encoding")
	}
	n := int(d.uvarint(uint64(len(b))))
	prev := base
	for range n {
		if d.err != nil {
			break
		}
		prev += int64(d.uvarint(1 << 40))
		p.Doubt = append(p.Doubt, prev)
	}
	if d.err != nil {
		return nil, fmt.Errorf("progress metadata: %w", d.err)
	}
	if d.i != len(b) {
		return nil, errors.New("progress metadata: trailing bytes")
	}
	if !slices.IsSorted(p.Done) {
		return nil, errors.New("progress metadata: done set not sorted")
	}
	return p, nil
}

// decoder reads varints, remembering the first error.
type decoder struct {
	b   []byte
	i   int
	err error
}

func (d *decoder) byte() byte {
	if d.err != nil || d.i >= len(d.b) {
		d.err = errors.New("truncated")
		return 0xff
	}
	c := d.b[d.i]
	d.i++
	return c
}

// uvarint reads a uvarint no larger than limit.
func (d *decoder) uvarint(limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.i:])
	if n <= 0 {
		d.err = errors.New("bad varint")
		return 0
	}
	if v > limit {
		d.err = fmt.Errorf("value %d over its bound %d", v, limit)
		return 0
	}
	d.i += n
	return v
}
