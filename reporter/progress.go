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

// Encodings of the states (format 2) and of the Done set (format 1, still
// read: the commits of earlier versions).
const (
	encRuns   = 0 // format 2: runs of states; format 1: alternating run lengths, starting with not-done
	encBitset = 1 // format 1: one bit per offset from Base, least significant bit first
	encPacked = 1 // format 2: five states a byte, base 3, the first offset least significant
)

// encodeProgress returns the metadata string of p: the prefix and the
// unpadded URL-safe base64 of a varint encoding (format 2). Every offset of
// the span [Base, last Done or Doubt offset] has one of three states
// (pending, done, doubt), written as runs (uvarint length<<2 | state) or
// packed five to a byte (base 3), whichever is shorter. Its length is at
// most progressSize(span). An offset in both sets is done.
func encodeProgress(p *progress) string {
	var span int64
	if n := len(p.Done); n > 0 {
		span = max(span, p.Done[n-1]-p.Base+1)
	}
	if n := len(p.Doubt); n > 0 {
		span = max(span, p.Doubt[n-1]-p.Base+1)
	}
	states := make([]byte, span)
	for _, o := range p.Doubt {
		if o >= p.Base {
			states[o-p.Base] = stDoubt
		}
	}
	for _, o := range p.Done {
		if o >= p.Base {
			states[o-p.Base] = stDone
		}
	}
	b := make([]byte, 0, 64)
	b = append(b, 2) // format version
	b = binary.AppendUvarint(b, uint64(p.LogPartition))
	b = binary.AppendUvarint(b, uint64(p.LogOffset))
	b = binary.AppendUvarint(b, uint64(span))
	runs := appendStateRuns(nil, states)
	if packedLen := (span + 4) / 5; int64(len(runs)) <= packedLen {
		b = append(b, encRuns)
		b = append(b, runs...)
	} else {
		b = append(b, encPacked)
		for i := 0; i < len(states); i += 5 {
			var c byte
			for k := min(i+5, len(states)) - 1; k >= i; k-- {
				c = c*3 + states[k]
			}
			b = append(b, c)
		}
	}
	return progressPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// States of one offset past the commit point (format 2).
const (
	stPending = 0 // fetched or not, no outcome: posted as usual
	stDone    = 1 // final: never posted again
	stDoubt   = 2 // may be at the partner unrecorded: posted again, labelled
)

// appendStateRuns appends states as runs: uvarint(length<<2 | state).
func appendStateRuns(dst, states []byte) []byte {
	for i := 0; i < len(states); {
		j := i + 1
		for j < len(states) && states[j] == states[i] {
			j++
		}
		dst = binary.AppendUvarint(dst, uint64(j-i)<<2|uint64(states[i]))
		i = j
	}
	return dst
}

// progressHeader bounds the bytes of a format-2 progress before its states:
// version, log partition, log offset, span and encoding.
const progressHeader = 1 + 3*binary.MaxVarintLen64 + 1

// progressSize bounds the length of an encoded progress over span offsets:
// the packed bound, since the encoder never picks runs when they are longer.
func progressSize(span int64) int {
	return len(progressPrefix) + base64.RawURLEncoding.EncodedLen(progressHeader+int((span+4)/5))
}

// progressWindow is the largest span whose progress always fits max bytes
// of commit metadata: how far past its commit point a partition may have
// reports leased or final (lease.go holds the rest back). 15 185 offsets
// for Kafka's default 4 096 bytes.
func progressWindow(max int) int64 {
	raw := (max - len(progressPrefix)) * 3 / 4 // base64 without padding: 4 characters per 3 bytes
	if raw <= progressHeader {
		return 0
	}
	span := int64(raw-progressHeader) * 5
	for span > 0 && progressSize(span) > max {
		span--
	}
	return span
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
	switch v := d.byte(); v {
	case 1:
		return decodeV1(&d, b, base)
	case 2:
		return decodeV2(&d, b, base)
	default:
		return nil, fmt.Errorf("progress metadata: unknown format %d", v)
	}
}

// decodeV2 parses the rest of a format-2 progress (encodeProgress).
func decodeV2(d *decoder, b []byte, base int64) (*progress, error) {
	p := &progress{Base: base}
	p.LogPartition = int32(d.uvarint(1 << 31))
	p.LogOffset = int64(d.uvarint(1 << 62))
	span := int64(d.uvarint(1 << 24)) // far above any window: a bound against corrupt input
	note := func(o int64, st byte) {
		switch st {
		case stDone:
			p.Done = append(p.Done, o)
		case stDoubt:
			p.Doubt = append(p.Doubt, o)
		}
	}
	switch d.byte() {
	case encRuns:
		next := base
		for d.err == nil && next < base+span {
			v := d.uvarint(uint64(span)<<2 | 3)
			n, st := int64(v>>2), byte(v&3)
			if d.err == nil && (n == 0 || st > stDoubt || next+n > base+span) {
				d.err = errors.New("run outside the span")
			}
			if d.err == nil && st != stPending {
				for o := next; o < next+n; o++ {
					note(o, st)
				}
			}
			next += n
		}
	case encPacked:
		n := int((span + 4) / 5)
		if d.err == nil && d.i+n > len(b) {
			return nil, errors.New("progress metadata: packed states past the end")
		}
		for i := 0; d.err == nil && i < n; i++ {
			c := b[d.i+i]
			if c >= 243 { // 3^5: not written by the encoder
				d.err = errors.New("packed states out of range")
			}
			for t := range int64(5) {
				k := int64(i)*5 + t
				st := c % 3
				c /= 3
				if k >= span {
					if st != stPending {
						d.err = errors.New("packed state past the span")
					}
					continue
				}
				note(base+k, st)
			}
		}
		d.i += n
	default:
		return nil, errors.New("progress metadata: unknown state encoding")
	}
	if d.err != nil {
		return nil, fmt.Errorf("progress metadata: %w", d.err)
	}
	if d.i != len(b) {
		return nil, errors.New("progress metadata: trailing bytes")
	}
	return p, nil
}

// decodeV1 parses the rest of a format-1 progress (written by versions
// before the three-state encoding; still read after an upgrade).
func decodeV1(d *decoder, b []byte, base int64) (*progress, error) {
	p := &progress{Base: base}
	p.LogPartition = int32(d.uvarint(1 << 31))
	p.LogOffset = int64(d.uvarint(1 << 62))
	// The bound of format 2's span (far above any window an earlier version
	// leased within): every offset of a run is expanded into Done, so a
	// corrupt span of up to 2^40 offsets would take hours and terabytes.
	span := int64(d.uvarint(1 << 24))
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
				d.err = errors.New("run outside the span")
			}
			if d.err != nil {
				break // a run that failed its bounds check is not expanded
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
